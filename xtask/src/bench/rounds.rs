//! What the overhead cases (gpu_calls.rs, launch_loop.rs, sched.rs) share:
//! interleaved rounds over their configurations, and the diagnostic pass
//! that reads each observer's in-kernel program time.
//!
//! Rounds are interleaved, the order rotating every round, so a drift in
//! the host (frequency, other work, caches) hits every configuration alike
//! instead of whichever ran last; the report takes medians over the rounds.
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Instant,
};

use anyhow::Result;

use super::{bpf_stats::profile_programs, div, median, report::num, Env, Row};

/// One way an overhead case runs its workload: bare, under canaryscope,
/// under a peer, under the floor.
pub(super) trait Config: Copy + Ord {
    /// The name in the progress lines and in the report's samples.
    fn label(self) -> &'static str;
}

/// The figures of every round, per configuration.
pub(super) struct Rounds<C> {
    samples: BTreeMap<C, Vec<f64>>,
}

impl<C: Config> Rounds<C> {
    /// Runs `rounds` rounds of `configs`, printing each figure in `unit`.
    /// `measure(cfg, round, last)` gives the figure, or `None` when the
    /// configuration cannot run: it is then left out of the later rounds.
    pub(super) fn run(
        configs: &[C],
        rounds: usize,
        unit: &str,
        mut measure: impl FnMut(C, usize, bool) -> Result<Option<f64>>,
    ) -> Result<Rounds<C>> {
        let mut samples: BTreeMap<C, Vec<f64>> = BTreeMap::new();
        let mut disabled = BTreeSet::new();
        for round in 0..rounds {
            let mut order = configs.to_vec();
            order.rotate_left(round % configs.len());
            let last = round + 1 == rounds;
            for cfg in order {
                if disabled.contains(&cfg) {
                    continue;
                }
                let t = Instant::now();
                let Some(v) = measure(cfg, round, last)? else {
                    disabled.insert(cfg);
                    continue;
                };
                eprintln!(
                    "    round {}/{} {:<12} {:>10} {unit} ({:.1?})",
                    round + 1,
                    rounds,
                    cfg.label(),
                    num(v),
                    t.elapsed()
                );
                samples.entry(cfg).or_default().push(v);
            }
        }
        Ok(Rounds { samples })
    }

    pub(super) fn median(&self, cfg: C) -> Option<f64> {
        self.samples.get(&cfg).and_then(|s| median(s))
    }

    /// Every figure into `row`'s samples, by configuration.
    pub(super) fn add_samples(&self, row: &mut Row) {
        for (cfg, s) in &self.samples {
            row.samples.push((cfg.label().into(), s.clone()));
        }
    }

    /// The figures of `configs` only, for a case that reports its
    /// configurations in more than one row.
    pub(super) fn add_samples_of(&self, row: &mut Row, configs: &[C]) {
        for (cfg, s) in self.samples.iter().filter(|(c, _)| configs.contains(c)) {
            row.samples.push((cfg.label().into(), s.clone()));
        }
    }
}

/// The diagnostic row of an overhead case: in-kernel BPF program time per
/// unit of work (a call, a round trip) of each observer, from a separate
/// run of `units` units with the statistics on, once, in the last round.
pub(super) struct ProgTime<C> {
    row: Row,
    units: u64,
    per_unit: BTreeMap<C, f64>,
}

impl<C: Config> ProgTime<C> {
    pub(super) fn new(name: &str, unit: &str, units: u64) -> ProgTime<C> {
        ProgTime { row: Row::new(name, unit), units, per_unit: BTreeMap::new() }
    }

    /// Times `pid`'s programs while `work(units)` runs; a note `what: ...`
    /// lists the programs that ran.
    pub(super) fn measure(
        &mut self,
        env: &Env,
        cfg: C,
        pid: u32,
        what: &str,
        work: impl FnOnce(u64) -> Result<f64>,
    ) -> Result<()> {
        let units = self.units;
        if let Some((ns, lines)) = profile_programs(env, pid, || work(units).map(|_| ()))? {
            self.per_unit.insert(cfg, ns as f64 / units as f64);
            self.row.notes.push(format!("{what}: {}", lines.join("; ")));
        }
        Ok(())
    }

    /// The row, with `note` (what was measured and how) before the
    /// programs' notes; `floor` where the case has one.
    pub(super) fn into_row(
        self,
        canaryscope: C,
        peer: C,
        floor: Option<C>,
        peer_tool: Option<String>,
        note: String,
    ) -> Row {
        let get = |c: C| self.per_unit.get(&c).copied();
        let mut row = Row {
            canaryscope: get(canaryscope),
            peer: get(peer),
            peer_tool,
            floor: floor.and_then(get),
            ..self.row
        };
        row.ratio("canaryscope_vs_peer", div(row.canaryscope, row.peer));
        row.ratio("canaryscope_vs_floor", div(row.canaryscope, row.floor));
        row.notes.insert(0, note);
        row
    }
}
