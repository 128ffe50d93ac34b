//! The GPU hardware family's series: memory faults, resets and queue
//! evictions, per pod where the driver named the workload's process, and
//! per node otherwise (the driver's context is a kernel worker).
use super::decl::{
    decl,
    Kind::Counter,
    MetricDecl,
    Scope::{Node, Workload},
};
use std::collections::BTreeMap;

use observer_common::kfd::HwKind;

use super::{
    context::{workload_values, Render},
    families::FamilySet,
    series::{OnNode, PodCounts},
};
use crate::attribution::labels::WorkloadLabels;

// Hardware events are reported from a driver worker: they count under the
// workload whose process the driver names (by pasid or pid), and at node
// level when it names none (a whole-device reset).
pub const GPU_MEMORY_FAULTS: MetricDecl = decl(
    "gpu_memory_faults_total",
    "GPU memory faults of the workload's processes, found by their pasid.",
    Counter,
    Workload,
    &[],
);
pub const GPU_RESETS: MetricDecl = decl(
    "gpu_resets_total",
    "GPU resets the driver attributed to the workload's processes.",
    Counter,
    Workload,
    &[],
);
pub const GPU_QUEUE_EVICTIONS: MetricDecl = decl(
    "gpu_queue_evictions_total",
    "KFD queue evictions of the workload's processes.",
    Counter,
    Workload,
    &[],
);
pub const NODE_GPU_MEMORY_FAULTS: MetricDecl = decl(
    "node_gpu_memory_faults_total",
    "GPU memory faults on this node that name no process canaryscope could find.",
    Counter,
    Node,
    &[],
);
pub const NODE_GPU_RESETS: MetricDecl =
    decl("node_gpu_resets_total", "GPU resets on this node that name no process.", Counter, Node, &[]);
pub const NODE_GPU_QUEUE_EVICTIONS: MetricDecl = decl(
    "node_gpu_queue_evictions_total",
    "KFD queue evictions on this node that name no process.",
    Counter,
    Node,
    &[],
);

/// Each kind with its per-pod and its node family.
const KINDS: [(HwKind, &MetricDecl, &MetricDecl); 3] = [
    (HwKind::MemoryFault, &GPU_MEMORY_FAULTS, &NODE_GPU_MEMORY_FAULTS),
    (HwKind::Reset, &GPU_RESETS, &NODE_GPU_RESETS),
    (HwKind::QueueEviction, &GPU_QUEUE_EVICTIONS, &NODE_GPU_QUEUE_EVICTIONS),
];

#[derive(Default)]
pub struct Hardware {
    /// Events the driver attributed to a workload's process, by kind.
    by_pod: PodCounts<u32>,
    /// Every other event, by kind.
    node: BTreeMap<u32, u64>,
}

impl Hardware {
    pub fn on_pod(&mut self, cgroup: u64, kind: HwKind) {
        self.by_pod.add(cgroup, kind as u32, 1);
    }

    pub fn on_node(&mut self, kind: HwKind) {
        *self.node.entry(kind as u32).or_default() += 1;
    }

    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels) {
        self.by_pod.retire(cgroup, labels);
    }

    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.by_pod.keep_pods(on_node);
    }

    pub fn render(&self, fams: &mut FamilySet, r: &Render) {
        let shown = self.by_pod.shown(r.series);
        for (kind, workload, _) in KINDS {
            for ((labels, _), n) in shown.iter().filter(|((_, k), _)| **k == kind as u32) {
                fams.get(workload).value(&workload_values(*labels, &[]), *n as f64);
            }
        }
        for (kind, _, node) in KINDS {
            fams.get(node).value(&[], self.node.get(&(kind as u32)).copied().unwrap_or(0) as f64);
        }
    }
}
