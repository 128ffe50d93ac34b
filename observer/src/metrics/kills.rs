//! When each pod last had a process killed by the OOM killer or by a crash:
//! what a cascade is read from (one workload's pods killed one after
//! another, as a poison job redelivered from worker to worker kills them).
//!
//! A gauge of the latest kill's time rather than a rule over the kill
//! counters: a per-pod counter is born at its first event's value, so
//! `increase()` misses a pod's first kill, which in a cascade is each
//! pod's only one; a timestamp is read right from its first sample, and
//! `max_over_time` keeps a pod deleted within the window.
use std::collections::BTreeMap;

use super::{
    context::{workload_values, Render},
    decl::{decl, Kind::Gauge, MetricDecl, Scope::Workload},
    families::FamilySet,
    series::OnNode,
};
use crate::attribution::labels::WorkloadLabels;

pub const LAST_KILL: MetricDecl = decl(
    "last_kill_timestamp_seconds",
    "Unix time of the latest process of the pod killed by the OOM killer (oom_kill) or by a fault or abort in its native code (crash): distinct pods of one workload with recent times are a cascade (deploy/prometheus/rules.yaml, CanaryscopeKillCascade).",
    Gauge,
    Workload,
    &["cause"],
);

/// The latest kill per label set and cause: the newest over the label
/// set's cgroups, those purged included, while the pod is on the node.
#[derive(Default)]
pub struct Kills {
    live: BTreeMap<(u64, &'static str), u64>,
    retired: BTreeMap<(WorkloadLabels, &'static str), u64>,
}

impl Kills {
    /// A kill of `cause` at `ts_ns` (Unix ns) in the cgroup.
    pub fn killed(&mut self, cgroup: u64, cause: &'static str, ts_ns: u64) {
        let slot = self.live.entry((cgroup, cause)).or_default();
        *slot = (*slot).max(ts_ns);
    }

    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels) {
        let keys: Vec<(u64, &str)> = self.live.keys().filter(|(c, _)| *c == cgroup).copied().collect();
        for k in keys {
            if let Some(ts) = self.live.remove(&k) {
                let slot = self.retired.entry((labels.clone(), k.1)).or_default();
                *slot = (*slot).max(ts);
            }
        }
    }

    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.retired.retain(|(labels, _), _| on_node.holds(labels));
    }

    pub fn render(&self, fams: &mut FamilySet, r: &Render) {
        let mut shown: BTreeMap<([&str; 6], &str), u64> = BTreeMap::new();
        let live =
            self.live.iter().filter_map(|((c, cause), ts)| Some(((r.series.shown_labels(*c)?, *cause), *ts)));
        let retired = self.retired.iter().map(|((labels, cause), ts)| ((labels.values(), *cause), *ts));
        for (key, ts) in live.chain(retired) {
            let slot = shown.entry(key).or_default();
            *slot = (*slot).max(ts);
        }
        for ((labels, cause), ts) in shown {
            fams.get(&LAST_KILL).value(&workload_values(labels, &[cause]), ts as f64 * 1e-9);
        }
    }
}
