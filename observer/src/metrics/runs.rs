//! The runs family's series: per revision and executable, how long runs
//! took and how they ended (see `pipeline::runs` for what a run is).
//!
//! Executables are named by base name, at most [`MAX_EXECUTABLES`] on a
//! node at a time; runs of any further executable count under
//! `executable="other"` (a name is freed once no series holds it, when its
//! revisions have left the node).
use std::collections::{HashMap, HashSet};

use super::{
    context::Render,
    decl::{
        decl,
        Kind::{Counter, Histogram},
        MetricDecl,
        Scope::Revision,
    },
    families::FamilySet,
    revision::{add_count, owner_labels, revision_key, ByRevision, Durations, RevisionKey},
};
use crate::{attribution::labels::WorkloadLabels, exit_cause::RunEnding};

pub const RUN_DURATION: MetricDecl = decl(
    "run_duration_seconds",
    "Runs of programs the revision's pods started on this node (a process that exec'd an executable its parent in the same container does not run, not a shell, started by the container's long-lived process), from exec to exit, by executable base name (other past 16 names on the node); runs killed from outside their pod are not in it.",
    Histogram,
    Revision,
    &["executable"],
);
pub const RUN_ENDINGS: MetricDecl = decl(
    "run_endings_total",
    "How the revision's runs ended on this node, by executable and ending: exit_zero, exit_nonzero, memory_limit (an allocation refused by RLIMIT_AS or RLIMIT_DATA before it ended), oom_kill, rlimit_cpu, sent (a signal from its own pod: a wrapper's timeout), sent_outside (from the host or another pod), or another cause of death (fault, abort, kernel, wrapped, unknown).",
    Counter,
    Revision,
    &["executable", "ending"],
);

/// Executable names with series of their own on a node at a time.
pub const MAX_EXECUTABLES: usize = 16;
/// The `executable` of runs past the cap.
pub const OTHER: &str = "other";
/// The id of [`OTHER`].
const OTHER_ID: u32 = u32::MAX;

/// Upper bounds in seconds: 1, 2.5 and 5 ms, then a factor 1.25 apart from
/// 10 ms to 443 s (10 ms x 1.25^48). A run 1.25 times as long as another
/// lands one bucket higher wherever they are compared: the judge tests the
/// tolerated slowdown by shifting the canary's counts one bucket down.
/// Fixed: `rate()` and `histogram_quantile` need the same set at every
/// scrape.
pub fn bounds() -> &'static [f64] {
    static BOUNDS: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    BOUNDS.get_or_init(|| {
        let mut b = vec![0.001, 0.0025, 0.005];
        b.extend((0..=48).map(|k| 0.01 * 1.25f64.powi(k)));
        b
    })
}

/// Executable names by id, at most [`MAX_EXECUTABLES`] in use.
#[derive(Default)]
struct Names {
    slots: Vec<Option<String>>,
    ids: HashMap<String, u32>,
}

impl Names {
    /// The id of `name`, given one if a slot is free, else [`OTHER_ID`].
    fn id(&mut self, name: &str) -> u32 {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let free = self.slots.iter().position(Option::is_none);
        let id = match free {
            Some(i) => i,
            None if self.slots.len() < MAX_EXECUTABLES => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            None => return OTHER_ID,
        };
        self.slots[id] = Some(name.to_string());
        self.ids.insert(name.to_string(), id as u32);
        id as u32
    }

    fn name(&self, id: u32) -> &str {
        self.slots.get(id as usize).and_then(Option::as_deref).unwrap_or(OTHER)
    }

    /// Frees every name but those in `used`.
    fn keep(&mut self, used: &HashSet<u32>) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if !used.contains(&(i as u32)) {
                if let Some(name) = slot.take() {
                    self.ids.remove(&name);
                }
            }
        }
    }
}

#[derive(Default)]
pub struct Runs {
    names: Names,
    durations: ByRevision<u32, Durations>,
    endings: ByRevision<(u32, RunEnding), u64>,
}

impl Runs {
    pub fn ended(&mut self, cgroup: u64, executable: &str, duration_ns: u64, ending: RunEnding) {
        let name = if executable.is_empty() { "unknown" } else { executable };
        let id = self.names.id(name);
        *self.endings.entry(cgroup, (id, ending)) += 1;
        // Killed from outside (its pod deleted), a run did not take its course.
        if ending != RunEnding::SentOutside {
            self.durations.entry(cgroup, id).record(bounds(), duration_ns);
        }
    }

    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels) {
        let revision = revision_key(labels);
        self.durations.retire(cgroup, &revision, Durations::add);
        self.endings.retire(cgroup, &revision, add_count);
    }

    /// Forgets what purged pods left to revisions no longer on the node,
    /// and the names no series holds any more.
    pub fn keep_revisions(&mut self, live: &HashSet<RevisionKey>) {
        self.durations.keep_revisions(live);
        self.endings.keep_revisions(live);
        let used = self.durations.keys().copied().chain(self.endings.keys().map(|(id, _)| *id)).collect();
        self.names.keep(&used);
    }

    pub fn render(&self, fams: &mut FamilySet, r: &Render) {
        let bounds = bounds();
        for ((owner, id), d) in self.durations.shown(r, Durations::add) {
            let (cumulative, count, sum) = d.cumulative(bounds);
            let v = owner_labels(&owner, r.view, &[self.names.name(id)]);
            fams.get(&RUN_DURATION).histogram(&v, bounds, &cumulative, count, sum);
        }
        for ((owner, (id, ending)), n) in self.endings.shown(r, add_count) {
            let v = owner_labels(&owner, r.view, &[self.names.name(id), ending.as_str()]);
            fams.get(&RUN_ENDINGS).value(&v, n as f64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_a_quarter_longer_is_a_bucket_longer_from_10ms_to_443s() {
        let b = bounds();
        assert!(b.windows(2).all(|w| w[0] < w[1]));
        let from = b.iter().position(|x| (*x - 0.01).abs() < 1e-12).expect("10 ms is a bound");
        for w in b[from..].windows(2) {
            assert!((w[1] / w[0] - 1.25).abs() < 1e-9, "{w:?}");
        }
        let last = *b.last().expect("bounds");
        assert!((last - 0.01 * 1.25f64.powi(48)).abs() < 1e-6 && last > 440.0, "{last}");
    }

    #[test]
    fn names_past_the_cap_are_other_and_freed_names_are_reused() {
        let mut names = Names::default();
        let ids: Vec<u32> = (0..MAX_EXECUTABLES).map(|i| names.id(&format!("solver{i}"))).collect();
        assert_eq!(ids, (0..MAX_EXECUTABLES as u32).collect::<Vec<_>>());
        assert_eq!(names.id("solver3"), 3, "a name keeps its id");
        assert_eq!(names.id("one-too-many"), OTHER_ID);
        assert_eq!(names.name(OTHER_ID), OTHER);
        names.keep(&HashSet::from([0, 1]));
        assert_eq!(names.id("one-too-many"), 2, "a freed slot takes the next name");
        assert_eq!(names.name(2), "one-too-many");
        assert_eq!(names.name(0), "solver0");
    }

    #[test]
    fn durations_land_in_their_buckets() {
        let mut d = Durations::default();
        d.record(bounds(), 12_000_000);
        d.record(bounds(), 12_500_000);
        d.record(bounds(), 500_000_000_000);
        let (cumulative, count, sum) = d.cumulative(bounds());
        let i = bounds().iter().position(|b| *b >= 0.0125).expect("a bound");
        assert_eq!((cumulative[i - 1], cumulative[i]), (0, 2));
        assert_eq!((*cumulative.last().expect("buckets"), count), (2, 3), "500 s is past the last bound");
        assert!((sum - 500.0245).abs() < 1e-9);
    }
}
