//! What the canary judge compares events against, per revision on this
//! node: GPU start-ups attempted and failed, pod-seconds observed and
//! process starts. A count of crashes means little without the number of
//! chances to crash; these are those chances (`canaryscope judge`).
//!
//! Kept per revision, not per pod: the judge compares revisions within a
//! node, and the budget allows a revision four series, not a pod.
//! Per-cgroup state lives only until its cgroup is purged; the revision's
//! totals live while the revision has a pod here, so they never go down.
use super::decl::{decl, Kind::Counter, MetricDecl, Scope::Revision};
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::Instant,
};

use observer_common::gpu::Api;

use super::revision::RevisionKey;
use crate::attribution::labels::WorkloadLabels;

pub const GPU_STARTUPS: MetricDecl = decl(
    "gpu_startups_total",
    "Container starts whose processes called a GPU runtime's initialisation, per revision on this node, by the outermost API layer called (a start-up counts once per container start, whichever layers it went through): the exposure the canary judge weighs start-up failures against.",
    Counter,
    Revision,
    &["api"],
);
pub const GPU_STARTUP_FAILURES: MetricDecl = decl(
    "gpu_startup_failures_total",
    "GPU start-ups (see gpu_startups_total) in which an initialisation call failed, per revision on this node; which call and why is in gpu_init_failures_total per pod.",
    Counter,
    Revision,
    &["api"],
);
pub const POD_SECONDS: MetricDecl = decl(
    "pod_seconds_total",
    "Seconds the revision's pods were observed on this node, summed over its pods (updated in steps of about ten seconds): the exposure of crashes, OOM kills, abnormal exits and other events per pod-second.",
    Counter,
    Revision,
    &[],
);
pub const PROCESS_STARTS: MetricDecl = decl(
    "process_starts_total",
    "Programs started (exec) in the revision's containers on this node, where the GPU family's discovery hooks run.",
    Counter,
    Revision,
    &[],
);

/// Pod-seconds tick every refresh; the exposition is rendered again for
/// them only when a revision's total crosses a multiple of this, so an idle
/// node is not re-rendered each second for a number read over minutes.
const POD_SECONDS_QUANTUM: f64 = 10.0;

/// A refresh gap longer than this (a stopped or starved daemon) does not
/// count as observed time: the pods were not watched meanwhile.
const MAX_GAP_SECS: f64 = 10.0;

/// One container start's GPU start-up.
#[derive(Debug, Clone, PartialEq)]
struct Startup {
    /// The outermost API layer seen initialising (the CUDA runtime over the
    /// driver API over HIP): the one the application called.
    api: Api,
    counted: bool,
    failed: bool,
    failure_counted: bool,
}

/// A revision's exposure on this node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RevisionExposure {
    pub startups: BTreeMap<&'static str, u64>,
    pub startup_failures: BTreeMap<&'static str, u64>,
    pub pod_seconds: f64,
    pub process_starts: u64,
}

impl RevisionExposure {
    /// Pod-seconds in whole quanta: the exposition changes exactly when
    /// [`Exposure::account`] says so, and is the same bytes in between.
    pub fn pod_seconds_shown(&self) -> f64 {
        (self.pod_seconds / POD_SECONDS_QUANTUM).floor() * POD_SECONDS_QUANTUM
    }
}

/// A pod as the exposure counts it: by name, or by its cgroup where there
/// are no pods (without Kubernetes).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum PodId<'a> {
    Named(&'a str),
    Cgroup(u64),
}

/// What one refresh adds to a revision's totals.
#[derive(Default)]
struct RevisionChange {
    /// Its pods live now, each once however many containers it has.
    pods: u32,
    process_starts: u64,
    startups: Vec<&'static str>,
    startup_failures: Vec<&'static str>,
}

impl RevisionChange {
    /// Adds this to `totals`, `elapsed` seconds per live pod; whether the
    /// exposition changes.
    fn apply(self, totals: &mut RevisionExposure, elapsed: f64) -> bool {
        let mut moved = false;
        if elapsed > 0.0 && self.pods > 0 {
            let before = (totals.pod_seconds / POD_SECONDS_QUANTUM).floor();
            totals.pod_seconds += elapsed * f64::from(self.pods);
            moved |= (totals.pod_seconds / POD_SECONDS_QUANTUM).floor() != before;
        }
        if self.process_starts > 0 {
            totals.process_starts += self.process_starts;
            moved = true;
        }
        for api in self.startups {
            *totals.startups.entry(api).or_default() += 1;
            moved = true;
        }
        for api in self.startup_failures {
            *totals.startup_failures.entry(api).or_default() += 1;
            moved = true;
        }
        moved
    }
}

#[derive(Default)]
pub struct Exposure {
    /// By cgroup: a container start is a new cgroup, so one start-up each.
    startups: HashMap<u64, Startup>,
    /// Execs per cgroup since the last refresh.
    pending_starts: HashMap<u64, u64>,
    /// Hashed, not ordered: every refresh looks up each live revision, and
    /// a thousand revisions whose names share long prefixes made an ordered
    /// map's comparisons most of the lookup. Rendering sorts instead.
    totals: HashMap<RevisionKey, RevisionExposure>,
    last_account: Option<Instant>,
    /// Pods seen by the last `account`.
    pods_last: usize,
}

impl Exposure {
    /// A GPU init call (success or failure) in `cgroup`: its container's
    /// start-up, once. A layer further out, seen before the start-up is
    /// counted, names it instead (`cudaGetDeviceCount` calls `cuInit`).
    pub fn init_called(&mut self, cgroup: u64, api: Api) {
        let startup = self.startups.entry(cgroup).or_insert(Startup {
            api,
            counted: false,
            failed: false,
            failure_counted: false,
        });
        if !startup.counted && (api as u32) > (startup.api as u32) {
            startup.api = api;
        }
    }

    /// A GPU init call in `cgroup` failed: its start-up failed.
    pub fn init_failed(&mut self, cgroup: u64, api: Api) {
        self.init_called(cgroup, api);
        if let Some(startup) = self.startups.get_mut(&cgroup) {
            startup.failed = true;
        }
    }

    /// Processes started (exec) in `cgroup` since the last call.
    pub fn processes_started(&mut self, cgroup: u64, count: u64) {
        *self.pending_starts.entry(cgroup).or_default() += count;
    }

    /// Adds what happened since the last refresh to the revisions of the
    /// live cgroups `live` (their labels are known now), and the time since
    /// then to each live pod. Returns whether a total moved enough to render.
    ///
    /// Runs every refresh over every tracked cgroup, so it gathers by
    /// revision with borrowed label values first and touches each
    /// revision's totals once: per cgroup, owned keys and a search of the
    /// totals were most of an idle daemon's CPU at a thousand pods.
    pub fn account<'a>(
        &mut self,
        now: Instant,
        live: impl Iterator<Item = (u64, &'a WorkloadLabels)>,
    ) -> bool {
        let elapsed = self
            .last_account
            .map(|last| now.saturating_duration_since(last).as_secs_f64())
            .filter(|s| *s <= MAX_GAP_SECS)
            .unwrap_or(0.0);
        self.last_account = Some(now);
        // Sized for a refresh like the last: growing a table rehashes every
        // key, and these keys are four label values long.
        let mut pods_seen: HashSet<([&str; 4], PodId<'_>)> = HashSet::with_capacity(self.pods_last);
        let mut changes: HashMap<[&str; 4], RevisionChange> = HashMap::with_capacity(self.totals.len());
        for (cgroup, labels) in live {
            let [namespace, pod, _container, workload, revision, track] = labels.values();
            let key = [namespace, workload, revision, track];
            // Without Kubernetes every cgroup is its own pod.
            let pod = if pod.is_empty() { PodId::Cgroup(cgroup) } else { PodId::Named(pod) };
            let change = changes.entry(key).or_default();
            if pods_seen.insert((key, pod)) {
                change.pods += 1;
            }
            change.process_starts += self.pending_starts.remove(&cgroup).unwrap_or(0);
            if let Some(startup) = self.startups.get_mut(&cgroup) {
                if !startup.counted {
                    startup.counted = true;
                    change.startups.push(startup.api.as_str());
                }
                if startup.failed && !startup.failure_counted {
                    startup.failure_counted = true;
                    change.startup_failures.push(startup.api.as_str());
                }
            }
        }
        // Starts in cgroups that are not tracked belong to no workload here.
        self.pending_starts.clear();
        self.pods_last = pods_seen.len();
        let mut moved = false;
        for (key, change) in changes {
            let totals = self.totals.entry(key.map(str::to_string)).or_default();
            moved |= change.apply(totals, elapsed);
        }
        moved
    }

    /// A purged cgroup's state goes; its revision keeps what it counted.
    pub fn forget(&mut self, cgroup: u64) {
        self.startups.remove(&cgroup);
        self.pending_starts.remove(&cgroup);
    }

    /// Keeps the totals of revisions that still have a pod on the node.
    pub fn keep_only(&mut self, live: &HashSet<RevisionKey>) {
        self.totals.retain(|k, _| live.contains(k));
    }

    /// The revisions' totals in the order of their keys, so that renders
    /// of the same totals are the same bytes.
    pub fn totals(&self) -> impl Iterator<Item = (&RevisionKey, &RevisionExposure)> {
        let mut sorted: Vec<_> = self.totals.iter().collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        sorted.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::attribution::labels::WorkloadLabels;

    fn labels(pod: &str, revision: &str) -> WorkloadLabels {
        WorkloadLabels {
            namespace: "ns".into(),
            pod: pod.into(),
            container: "worker".into(),
            workload: "infer".into(),
            revision: revision.into(),
            track: "canary".into(),
        }
    }

    #[test]
    fn a_start_up_counts_once_per_container_start_under_its_outermost_api() {
        let mut e = Exposure::default();
        let (a, b) = (labels("p1", "r1"), labels("p2", "r1"));
        let t0 = Instant::now();
        // The runtime's init call calls the driver's: one start-up, cudart.
        e.init_failed(1, Api::Cuda);
        e.init_called(1, Api::Cudart);
        e.init_called(1, Api::Cuda);
        e.init_called(2, Api::Hip);
        assert!(e.account(t0, [(1, &a), (2, &b)].into_iter()));
        // Later calls of the same container start add nothing.
        e.init_called(1, Api::Cudart);
        e.init_failed(2, Api::Hip);
        e.account(t0 + Duration::from_secs(1), [(1, &a), (2, &b)].into_iter());
        let (_, totals) = e.totals().next().expect("one revision");
        assert_eq!(totals.startups, BTreeMap::from([("cudart", 1), ("hip", 1)]));
        assert_eq!(totals.startup_failures, BTreeMap::from([("cudart", 1), ("hip", 1)]));
        // A restarted container is a new cgroup: a second start-up.
        e.forget(1);
        e.init_called(3, Api::Cudart);
        e.account(t0 + Duration::from_secs(2), [(2, &b), (3, &a)].into_iter());
        let (_, totals) = e.totals().next().expect("one revision");
        assert_eq!(totals.startups["cudart"], 2);
    }

    #[test]
    fn pod_seconds_count_each_pod_once_and_no_unwatched_gap() {
        let mut e = Exposure::default();
        let (c1, c2, other) = (labels("p1", "r1"), labels("p1", "r1"), labels("p2", "r1"));
        let t0 = Instant::now();
        e.account(t0, [(1, &c1), (2, &c2), (3, &other)].into_iter());
        // Two containers of one pod and a second pod: two pod-seconds.
        e.account(t0 + Duration::from_secs(1), [(1, &c1), (2, &c2), (3, &other)].into_iter());
        // A minute without a refresh was not observed.
        e.account(t0 + Duration::from_secs(61), [(1, &c1)].into_iter());
        e.processes_started(1, 3);
        e.processes_started(9, 5); // untracked: nobody's
        e.account(t0 + Duration::from_secs(62), [(1, &c1)].into_iter());
        let (_, totals) = e.totals().next().expect("one revision");
        assert!((totals.pod_seconds - 3.0).abs() < 1e-9, "{}", totals.pod_seconds);
        assert_eq!(totals.process_starts, 3);
        e.keep_only(&HashSet::new());
        assert_eq!(e.totals().count(), 0);
    }
}
