//! The KFD family's series: ioctls and their durations per revision from
//! the kernel's aggregates, failed ioctls per pod.
use super::decl::{
    decl,
    Kind::{Counter, Histogram},
    MetricDecl,
    Scope::{Revision, Workload},
};
use std::collections::BTreeMap;

use observer_common::{
    kfd::{KfdStats, KfdStatsKey},
    LatencyHistogram,
};

use super::{
    context::{workload_values, Render},
    families::FamilySet,
    revision::{owner_labels, revision_key, Retired},
    series::{OnNode, PodCounts},
};
use crate::{attribution::labels::WorkloadLabels, events::kfd_ioctl_label, names::errno_name};

pub const KFD_IOCTLS: MetricDecl = decl(
    "kfd_ioctls_total",
    "AMD KFD driver ioctls by result, per revision on this node.",
    Counter,
    Revision,
    &["ioctl", "result"],
);
pub const KFD_IOCTL_FAILURES: MetricDecl = decl(
    "kfd_ioctl_failures_total",
    "AMD KFD driver ioctls that failed, per pod and container, by errno.",
    Counter,
    Workload,
    &["ioctl", "result"],
);
pub const KFD_IOCTL_DURATION: MetricDecl = decl(
    "kfd_ioctl_duration_seconds",
    "Duration of AMD KFD driver ioctls per revision on this node.",
    Histogram,
    Revision,
    &["ioctl"],
);

#[derive(Default)]
pub struct Kfd {
    /// The kernel's per-cgroup aggregates, sorted by key.
    stats: Vec<(KfdStatsKey, KfdStats)>,
    /// Failed ioctls per pod by (ioctl number, result), kept through purges.
    failures: PodCounts<(u32, i32)>,
}

impl Kfd {
    /// The kernel's aggregates of admitted cgroups, sorted; whether they moved.
    pub fn set_stats(&mut self, now: Vec<(KfdStatsKey, KfdStats)>) -> bool {
        let failures: BTreeMap<(u64, (u32, i32)), u64> = now
            .iter()
            .filter(|(k, _)| k.result != 0)
            .map(|(k, s)| ((k.cgroup_id, (k.nr, k.result)), s.count))
            .collect();
        let changed = self.failures.update(failures) | (now != self.stats);
        self.stats = now;
        changed
    }

    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels, retired: &mut Retired) {
        retired.fold_kfd(&revision_key(labels), self.stats.iter().filter(|(k, _)| k.cgroup_id == cgroup));
        self.stats.retain(|(k, _)| k.cgroup_id != cgroup);
        self.failures.retire(cgroup, labels);
    }

    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.failures.keep_pods(on_node);
    }

    /// As GPU calls: counters per result and durations per ioctl per
    /// revision, failures also per pod.
    pub fn render(&self, fams: &mut FamilySet, r: &Render) {
        let mut ioctls: BTreeMap<(u32, u32, i32), u64> = BTreeMap::new();
        let mut by_ioctl: BTreeMap<(u32, u32), LatencyHistogram> = BTreeMap::new();
        for (owner, k, s) in r.owners.owned(r.view, &self.stats, |k| k.cgroup_id, &r.retired.kfd) {
            *ioctls.entry((owner, k.nr, k.result)).or_default() += s.count;
            by_ioctl.entry((owner, k.nr)).or_default().add(s);
        }
        for ((owner, nr, result), count) in &ioctls {
            let (ioctl, result) = (kfd_ioctl_label(*nr), errno(*result));
            let v = owner_labels(r.owners.get(*owner), r.view, &[ioctl.as_str(), &result]);
            fams.get(&KFD_IOCTLS).value(&v, *count as f64);
        }
        for ((labels, (nr, result)), n) in self.failures.shown(r.series) {
            let (ioctl, result) = (kfd_ioctl_label(*nr), errno(*result));
            fams.get(&KFD_IOCTL_FAILURES).value(&workload_values(labels, &[&ioctl, &result]), n as f64);
        }
        for ((owner, nr), merged) in &by_ioctl {
            let ioctl = kfd_ioctl_label(*nr);
            let v = owner_labels(r.owners.get(*owner), r.view, &[&ioctl]);
            fams.get(&KFD_IOCTL_DURATION).latency(&v, merged);
        }
    }
}

/// An ioctl's result as a label: 0, or the errno's name.
fn errno(result: i32) -> String {
    match result {
        0 => "0".to_string(),
        r => errno_name(-r).map(str::to_string).unwrap_or_else(|| r.to_string()),
    }
}
