//! The memory families' series per pod: OOM kills, counted as their events
//! come, and allocations refused by a memory limit, from the kernel's
//! counters.
use super::decl::{decl, Kind::Counter, MetricDecl, Scope::Workload};
use std::collections::BTreeMap;

use observer_common::memlimit::{MemLimit, MemLimitKey};

use super::{
    context::{workload_values, Render},
    families::FamilySet,
    series::{OnNode, PodCounts},
};
use crate::attribution::labels::WorkloadLabels;

pub const OOM_KILLS: MetricDecl =
    decl("oom_kills_total", "Processes killed by the OOM killer.", Counter, Workload, &["scope"]);
pub const MEMORY_LIMIT_REFUSALS: MetricDecl = decl(
    "memory_limit_refusals_total",
    "mmap, mremap and brk calls refused because of the process's RLIMIT_AS (as) or RLIMIT_DATA (data), counted in the kernel; one allocation may count several times (glibc retries a refused mmap through brk and mmap again).",
    Counter,
    Workload,
    &["limit"],
);

#[derive(Default)]
pub struct Oom {
    /// By the OOM's scope (memcg, global).
    kills: PodCounts<&'static str>,
    /// By the limit's number in the kernel's counters.
    refusals: PodCounts<u32>,
}

impl Oom {
    pub fn killed(&mut self, cgroup: u64, scope: &'static str) {
        self.kills.add(cgroup, scope, 1);
    }

    /// The kernel's refusal counters of admitted cgroups; whether they moved.
    pub fn set_refusals(&mut self, now: Vec<(MemLimitKey, u64)>) -> bool {
        let now: BTreeMap<(u64, u32), u64> =
            now.into_iter().map(|(k, n)| ((k.cgroup_id, k.limit), n)).collect();
        self.refusals.update(now)
    }

    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels) {
        self.kills.retire(cgroup, labels);
        self.refusals.retire(cgroup, labels);
    }

    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.kills.keep_pods(on_node);
        self.refusals.keep_pods(on_node);
    }

    pub fn render_kills(&self, fams: &mut FamilySet, r: &Render) {
        for ((labels, scope), n) in self.kills.shown(r.series) {
            fams.get(&OOM_KILLS).value(&workload_values(labels, &[scope]), n as f64);
        }
    }

    pub fn render_refusals(&self, fams: &mut FamilySet, r: &Render) {
        for ((labels, limit), n) in self.refusals.shown(r.series) {
            // An unknown limit number (a newer kernel side) is skipped, not
            // mislabelled.
            let Some(limit) = MemLimit::from_u32(*limit) else { continue };
            fams.get(&MEMORY_LIMIT_REFUSALS).value(&workload_values(labels, &[limit.as_str()]), n as f64);
        }
    }
}
