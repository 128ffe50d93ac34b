//! The CPU family's series: run-queue latency per revision from the
//! kernel's histograms, and per pod the CFS numbers of `cpu.stat` and
//! `cpu.max`: counters summed over a label set's cgroups, gauges the live
//! cgroup's.
use super::decl::{
    decl,
    Kind::{Counter, Gauge, Histogram},
    MetricDecl,
    Scope::{Revision, Workload},
};
use std::collections::BTreeMap;

use observer_common::{sched::RunqHistogram, LatencyHistogram};

use super::{
    context::{workload_values, Render},
    families::FamilySet,
    revision::{owner_labels, revision_key, Retired},
    series::{OnNode, PodCounts, PodGauges},
};
use crate::{attribution::labels::WorkloadLabels, cpu::CpuSnapshot};

pub const CPU_RUNQUEUE_LATENCY: MetricDecl = decl(
    "cpu_runqueue_latency_seconds",
    "Time runnable threads waited for a CPU, per revision on this node.",
    Histogram,
    Revision,
    &[],
);
pub const CPU_PERIODS: MetricDecl =
    decl("cpu_periods_total", "CFS bandwidth periods elapsed.", Counter, Workload, &[]);
pub const CPU_THROTTLED_PERIODS: MetricDecl = decl(
    "cpu_throttled_periods_total",
    "CFS periods in which the cgroup was throttled.",
    Counter,
    Workload,
    &[],
);
pub const CPU_THROTTLED_SECONDS: MetricDecl =
    decl("cpu_throttled_seconds_total", "Time the cgroup spent throttled.", Counter, Workload, &[]);
pub const CPU_RUNNABLE_THREADS: MetricDecl =
    decl("cpu_runnable_threads", "Threads of the cgroup that are runnable.", Gauge, Workload, &[]);
pub const CPU_QUOTA_CORES: MetricDecl =
    decl("cpu_quota_cores", "CPU quota of the cgroup in cores.", Gauge, Workload, &[]);

/// The counters of `cpu.stat`, by family, with what one unit is worth.
const COUNTERS: [(&MetricDecl, f64); 3] =
    [(&CPU_PERIODS, 1.0), (&CPU_THROTTLED_PERIODS, 1.0), (&CPU_THROTTLED_SECONDS, 1e-9)];
const GAUGES: [&MetricDecl; 2] = [&CPU_RUNNABLE_THREADS, &CPU_QUOTA_CORES];

#[derive(Default)]
pub struct Cpu {
    /// The kernel's run-queue histograms per cgroup, sorted.
    runq: Vec<(u64, RunqHistogram)>,
    /// By family name: periods, throttled periods, throttled nanoseconds.
    counters: PodCounts<&'static str>,
    /// By family name: runnable threads, quota in cores.
    gauges: PodGauges<&'static str>,
    /// The snapshots last set: an idle node's are the same each second,
    /// and rebuilding five series per cgroup to find that out was a tenth
    /// of an idle daemon's CPU at a thousand pods.
    last_snapshots: Vec<(u64, CpuSnapshot)>,
}

impl Cpu {
    pub fn set_runq(&mut self, now: Vec<(u64, RunqHistogram)>) -> bool {
        let changed = now != self.runq;
        self.runq = now;
        changed
    }

    /// The CFS numbers of admitted cgroups; whether they moved.
    pub fn set_snapshots(&mut self, now: Vec<(u64, CpuSnapshot)>) -> bool {
        if now == self.last_snapshots {
            return false;
        }
        let mut counters = BTreeMap::new();
        let mut gauges = BTreeMap::new();
        for (cgroup, c) in &now {
            let (cgroup, c) = (*cgroup, *c);
            let counted = [c.periods, c.throttled_periods, c.throttled_ns];
            for ((decl, _), n) in COUNTERS.iter().zip(counted) {
                counters.insert((cgroup, decl.name), n);
            }
            for (decl, v) in GAUGES.iter().zip([f64::from(c.runnable), c.quota_cores]) {
                gauges.insert((cgroup, decl.name), v);
            }
        }
        self.last_snapshots = now;
        self.counters.update(counters) | self.gauges.replace(gauges)
    }

    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels, retired: &mut Retired) {
        retired.fold_runq(&revision_key(labels), self.runq.iter().filter(|(c, _)| *c == cgroup));
        self.runq.retain(|(c, _)| *c != cgroup);
        self.counters.retire(cgroup, labels);
        self.gauges.forget(cgroup);
        // The next snapshots are set in full, whatever they hold.
        self.last_snapshots.clear();
    }

    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.counters.keep_pods(on_node);
    }

    pub fn render(&self, fams: &mut FamilySet, r: &Render) {
        let mut runq: BTreeMap<u32, LatencyHistogram> = BTreeMap::new();
        for (owner, _, h) in r.owners.owned(r.view, &self.runq, |c| *c, &r.retired.runq) {
            runq.entry(owner).or_default().add(h);
        }
        for (owner, h) in &runq {
            fams.get(&CPU_RUNQUEUE_LATENCY).latency(&owner_labels(r.owners.get(*owner), r.view, &[]), h);
        }
        // A family at a time: a render passes families on in catalog order.
        let counters = self.counters.shown(r.series);
        for (decl, unit) in COUNTERS {
            for ((labels, _), n) in counters.iter().filter(|((_, name), _)| **name == decl.name) {
                fams.get(decl).value(&workload_values(*labels, &[]), *n as f64 * unit);
            }
        }
        let gauges = self.gauges.shown(r.series);
        for decl in GAUGES {
            for ((labels, _), v) in gauges.iter().filter(|((_, name), _)| **name == decl.name) {
                fams.get(decl).value(&workload_values(*labels, &[]), *v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_snapshots_again_change_nothing_and_new_counts_do() {
        let mut cpu = Cpu::default();
        let idle =
            CpuSnapshot { periods: 10, throttled_periods: 2, throttled_ns: 5, runnable: 0, quota_cores: 0.5 };
        assert!(cpu.set_snapshots(vec![(7, idle)]));
        assert!(!cpu.set_snapshots(vec![(7, idle)]));
        let throttled = CpuSnapshot { periods: 12, throttled_periods: 4, ..idle };
        assert!(cpu.set_snapshots(vec![(7, throttled)]));
    }
}
