//! A series is its label set. The kernel counts per cgroup, and a pod's
//! container is a new cgroup at every restart, so several cgroups can end
//! up with one label set: a crash-looping container's five instances all
//! carry `container="worker"`. What a scrape shows is keyed by labels,
//! never by cgroup:
//!
//! - a counter is the sum over every cgroup with that label set, plus what
//!   purged cgroups left to it, so it never goes down while its pod is on
//!   the node, through restarts, relabels and purges;
//! - a gauge shows one cgroup's value, the live one (the newest tracked
//!   cgroup among live ones, else the newest gone one): a restarted
//!   container's VRAM or CPU quota is what it has now, not a sum with the
//!   dead instance's last reading.
//!
//! Labels are bound late. A cgroup's labels are resolved again on every
//! refresh, gone or not, for as long as its series are kept (the series
//! grace), and a better naming replaces a worse one (see
//! [`Naming`]): a container that crashed before kubelet reported its ID
//! moves from its short ID to its name once the API names it. Its count
//! moves with it, whole: at every render each cgroup's count is in exactly
//! one label set, so nothing is counted twice or lost. The short-ID series
//! simply ends.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use crate::attribution::labels::{Liveness, Naming, Resolved, WorkloadLabels};

/// Label values of a cgroup that has none (over the cap, or never resolved).
pub const NO_LABELS: [&str; 6] = ["", "", "", "", "", ""];

/// What a tracked cgroup's series are labelled with now.
#[derive(Debug)]
pub struct Tracked {
    pub labels: WorkloadLabels,
    pub naming: Naming,
    pub gone_since: Option<Instant>,
    /// Admission order: the newest of a label set's cgroups shows gauges.
    seq: u64,
    admitted_at: Instant,
}

/// Every cgroup with series, under the cardinality cap.
#[derive(Debug, Default)]
pub struct Series {
    tracked: HashMap<u64, Tracked>,
    next_seq: u64,
    pub max_cgroups: usize,
    /// Cgroups refused by the cap.
    pub overflow: u64,
    /// How long a per-pod series with provisional labels is held back (see
    /// [`Series::shown_labels`]).
    pub provisional_hold: Duration,
}

/// kubelet reports a container's ID within a second or two of its start
/// (its PLEG relist runs every second), and the watch brings it here at
/// once: five seconds covers a busy node. A container the API still has
/// not named by then is shown under its short ID.
pub const PROVISIONAL_HOLD: Duration = Duration::from_secs(5);

/// What admitting a cgroup did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Known,
    New,
    Refused,
}

impl Admission {
    pub fn admitted(self) -> bool {
        self != Admission::Refused
    }
}

/// What a refresh did to one cgroup.
pub struct Rebound {
    pub relabelled: bool,
    /// How long the cgroup has been gone, if it is.
    pub gone_for: Option<Duration>,
}

impl Series {
    pub fn new(max_cgroups: usize) -> Self {
        Self { max_cgroups, provisional_hold: PROVISIONAL_HOLD, ..Default::default() }
    }

    /// Admits a cgroup under the cardinality cap.
    pub fn admit(&mut self, cgroup: u64) -> Admission {
        if self.tracked.contains_key(&cgroup) {
            return Admission::Known;
        }
        if self.tracked.len() >= self.max_cgroups {
            self.overflow += 1;
            return Admission::Refused;
        }
        self.next_seq += 1;
        // Unlabelled until the next refresh binds its labels: held back
        // until then, rather than shown under empty labels for a second.
        let tracked = Tracked {
            labels: WorkloadLabels::default(),
            naming: Naming::Unlisted,
            gone_since: None,
            seq: self.next_seq,
            admitted_at: Instant::now(),
        };
        self.tracked.insert(cgroup, tracked);
        Admission::New
    }

    pub fn get(&self, cgroup: u64) -> Option<&Tracked> {
        self.tracked.get(&cgroup)
    }

    pub fn contains(&self, cgroup: u64) -> bool {
        self.tracked.contains_key(&cgroup)
    }

    pub fn len(&self) -> usize {
        self.tracked.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tracked.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&u64, &Tracked)> {
        self.tracked.iter()
    }

    pub fn cgroups(&self) -> Vec<u64> {
        self.tracked.keys().copied().collect()
    }

    /// The cgroup's label values (empty ones when untracked).
    pub fn labels(&self, cgroup: u64) -> [&str; 6] {
        self.tracked.get(&cgroup).map_or(NO_LABELS, |t| t.labels.values())
    }

    /// The labels a per-pod series of the cgroup is shown under, or `None`
    /// while they are provisional and the cgroup is younger than the hold:
    /// a series shown under a short ID and then renamed would end at its
    /// count, and a range query over the pod (`increase`, `sum_over_time`)
    /// would count those events twice. Held back a few seconds, they are
    /// shown once, under the name.
    pub fn shown_labels(&self, cgroup: u64) -> Option<[&str; 6]> {
        match self.tracked.get(&cgroup) {
            Some(t) if t.naming.provisional() && t.admitted_at.elapsed() < self.provisional_hold => None,
            Some(t) => Some(t.labels.values()),
            None => Some(NO_LABELS),
        }
    }

    /// Whether the cgroup's revision is not known yet (no labels bound, or
    /// its pod not listed) and it is younger than the hold: its entries
    /// stay out of revision-scoped series until it is, rather than adding
    /// to a provisional revision's series that would drop them later.
    pub fn revision_held(&self, cgroup: u64) -> bool {
        self.tracked
            .get(&cgroup)
            .is_some_and(|t| t.naming == Naming::Unlisted && t.admitted_at.elapsed() < self.provisional_hold)
    }

    /// Whether a cgroup's labels are provisional: its series may appear or
    /// move at a refresh without any new event.
    pub fn any_provisional(&self) -> bool {
        self.tracked.values().any(|t| t.naming.provisional())
    }

    /// Which of a label set's cgroups shows a gauge: live before gone,
    /// then the newest.
    pub fn precedence(&self, cgroup: u64) -> (bool, u64) {
        self.tracked.get(&cgroup).map_or((false, 0), |t| (t.gone_since.is_none(), t.seq))
    }

    /// Binds the cgroup's labels to what attribution resolved now. A live
    /// cgroup takes them as they are. A gone one takes them when they are
    /// named at least as well as what it has: the API may name its
    /// container late, but a pod deleted from the API must not turn its
    /// last good labels back into a uid and a short ID.
    pub fn rebind(&mut self, cgroup: u64, resolved: Resolved, now: Instant) -> Rebound {
        let Some(t) = self.tracked.get_mut(&cgroup) else {
            return Rebound { relabelled: false, gone_for: None };
        };
        let take = match resolved.liveness {
            Liveness::Live => true,
            Liveness::Gone => resolved.naming >= t.naming,
        };
        let relabelled = take && t.labels != resolved.labels;
        if take {
            t.labels = resolved.labels;
            t.naming = resolved.naming;
        }
        let gone_for = match resolved.liveness {
            Liveness::Live => {
                t.gone_since = None;
                None
            }
            Liveness::Gone => Some(now.saturating_duration_since(*t.gone_since.get_or_insert(now))),
        };
        Rebound { relabelled, gone_for }
    }

    pub fn remove(&mut self, cgroup: u64) -> Option<Tracked> {
        self.tracked.remove(&cgroup)
    }

    /// The pods that still have a tracked cgroup here.
    pub fn pods(&self) -> HashSet<PodKey> {
        self.tracked.values().map(|t| pod_key(&t.labels)).collect()
    }
}

/// Who a per-pod series belongs to: namespace, pod and workload (a pod
/// outside Kubernetes is its cgroup path, in `workload`). While the pod is
/// on the node, what its purged cgroups counted stays in its series.
pub type PodKey = (String, String, String);

pub fn pod_key(labels: &WorkloadLabels) -> PodKey {
    (labels.namespace.clone(), labels.pod.clone(), labels.workload.clone())
}

/// Which pods are on the node: those with a tracked cgroup, and those the
/// API still lists here (a crash-looping pod waits in back-off with no
/// container for up to five minutes, longer than a series grace).
pub struct OnNode<'a> {
    pub tracked: HashSet<PodKey>,
    /// (namespace, pod) of the pods the pod cache holds.
    pub listed: &'a HashSet<(String, String)>,
}

impl OnNode<'_> {
    pub fn holds(&self, labels: &WorkloadLabels) -> bool {
        self.tracked.contains(&pod_key(labels))
            || (!labels.pod.is_empty()
                && self.listed.contains(&(labels.namespace.clone(), labels.pod.clone())))
    }
}

/// A per-pod counter family: counts by cgroup and key as recorded, shown
/// by label set and key, summed.
#[derive(Debug)]
pub struct PodCounts<K> {
    live: BTreeMap<(u64, K), u64>,
    /// What purged cgroups counted, by the labels they had at the end.
    retired: BTreeMap<(WorkloadLabels, K), u64>,
}

impl<K> Default for PodCounts<K> {
    fn default() -> Self {
        Self { live: BTreeMap::new(), retired: BTreeMap::new() }
    }
}

impl<K: Ord + Clone + MinKey> PodCounts<K> {
    /// Counts `n` more for the cgroup's `key` (events).
    pub fn add(&mut self, cgroup: u64, key: K, n: u64) {
        *self.live.entry((cgroup, key)).or_default() += n;
    }

    /// Takes the kernel's or the cgroup files' cumulative counts; whether
    /// anything changed. An entry missing from `now` keeps its last value
    /// until its cgroup is purged: a cgroup removed before its last reading
    /// (a container that died between two refreshes) must not take its
    /// count out of its label set's total.
    pub fn update(&mut self, now: BTreeMap<(u64, K), u64>) -> bool {
        let mut changed = false;
        for (k, n) in now {
            let slot = self.live.entry(k).or_insert(u64::MAX);
            changed |= *slot != n;
            *slot = n;
        }
        changed
    }

    /// Folds a purged cgroup's counts into its label set's.
    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels) {
        let first = (cgroup, K::min_key());
        let keys: Vec<(u64, K)> =
            self.live.range(first..).take_while(|((c, _), _)| *c == cgroup).map(|(k, _)| k.clone()).collect();
        for k in keys {
            if let Some(n) = self.live.remove(&k) {
                *self.retired.entry((labels.clone(), k.1)).or_default() += n;
            }
        }
    }

    /// Forgets what purged cgroups left to pods no longer on the node.
    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.retired.retain(|(labels, _), _| on_node.holds(labels));
    }

    /// Every label set's total, in label order.
    pub fn shown<'a>(&'a self, series: &'a Series) -> BTreeMap<([&'a str; 6], &'a K), u64> {
        let mut out: BTreeMap<([&str; 6], &K), u64> = BTreeMap::new();
        for ((cgroup, k), n) in &self.live {
            let Some(labels) = series.shown_labels(*cgroup) else { continue };
            *out.entry((labels, k)).or_default() += n;
        }
        for ((labels, k), n) in &self.retired {
            *out.entry((labels.values(), k)).or_default() += n;
        }
        out
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.live.is_empty() && self.retired.is_empty()
    }
}

/// Keys whose smallest value is known, so a cgroup's entries are one range
/// of a map ordered by (cgroup, key).
pub trait MinKey {
    fn min_key() -> Self;
}

/// A per-pod gauge family: values by cgroup and key, shown by label set
/// and key as the live cgroup's value.
#[derive(Debug)]
pub struct PodGauges<K> {
    live: BTreeMap<(u64, K), f64>,
}

impl<K> Default for PodGauges<K> {
    fn default() -> Self {
        Self { live: BTreeMap::new() }
    }
}

impl<K: Ord + Clone> PodGauges<K> {
    /// Replaces every value; whether anything changed.
    pub fn replace(&mut self, now: BTreeMap<(u64, K), f64>) -> bool {
        let changed = now != self.live;
        self.live = now;
        changed
    }

    pub fn forget(&mut self, cgroup: u64) {
        self.live.retain(|(c, _), _| *c != cgroup);
    }

    pub fn keys(&self) -> impl Iterator<Item = &(u64, K)> {
        self.live.keys()
    }

    /// Every label set's value, in label order.
    pub fn shown<'a>(&'a self, series: &'a Series) -> BTreeMap<([&'a str; 6], &'a K), f64> {
        // The value with its cgroup's precedence, per label set and key.
        type Best<'a, K> = BTreeMap<([&'a str; 6], &'a K), ((bool, u64), f64)>;
        let mut best: Best<K> = BTreeMap::new();
        for ((cgroup, k), v) in &self.live {
            let Some(labels) = series.shown_labels(*cgroup) else { continue };
            let rank = series.precedence(*cgroup);
            let slot = best.entry((labels, k)).or_insert((rank, *v));
            if rank > slot.0 {
                *slot = (rank, *v);
            }
        }
        best.into_iter().map(|(k, (_, v))| (k, v)).collect()
    }
}

impl MinKey for () {
    fn min_key() -> Self {}
}
impl MinKey for u32 {
    fn min_key() -> Self {
        0
    }
}
impl MinKey for &'static str {
    fn min_key() -> Self {
        ""
    }
}
impl<A: MinKey, B: MinKey> MinKey for (A, B) {
    fn min_key() -> Self {
        (A::min_key(), B::min_key())
    }
}
impl<A: MinKey, B: MinKey, C: MinKey> MinKey for (A, B, C) {
    fn min_key() -> Self {
        (A::min_key(), B::min_key(), C::min_key())
    }
}
impl<A: MinKey, B: MinKey, C: MinKey, D: MinKey> MinKey for (A, B, C, D) {
    fn min_key() -> Self {
        (A::min_key(), B::min_key(), C::min_key(), D::min_key())
    }
}
impl MinKey for String {
    fn min_key() -> Self {
        String::new()
    }
}
impl MinKey for i32 {
    fn min_key() -> Self {
        i32::MIN
    }
}
