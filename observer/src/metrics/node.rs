//! The node's own series: probes, hot-call selection, the readiness gate,
//! the pipeline's counters and the series budget.
use super::decl::{
    decl,
    Kind::{Counter, Gauge},
    MetricDecl,
    Scope::Node,
};
use std::collections::BTreeMap;

use super::{families::FamilySet, series::Series};
use crate::{
    discovery::hot::{HotCounts, Reason},
    gate::patcher::Summary as GateSummary,
    probes::ProbeStatus,
};

pub const PROBE_ATTACHED: MetricDecl = decl(
    "probe_attached",
    "Whether a probe is attached (1) or could not be (0) on this node.",
    Gauge,
    Node,
    &["probe", "target"],
);
pub const GPU_HOT_PROBED_PROCESSES: MetricDecl = decl(
    "gpu_hot_probed_processes",
    "Processes whose hot GPU calls (launches, asynchronous copies) are trapped, by why they were selected: canary, gpu_trouble (a GPU failure, stall or crash in their cgroup within the hot window) or all.",
    Gauge,
    Node,
    &["reason"],
);
pub const READINESS_GATE_ENABLED: MetricDecl = decl(
    "readiness_gate_enabled",
    "Whether the daemon keeps the canaryscope.io/gpu-runtime condition of pods that declare that readiness gate (1) or not (0: no Kubernetes, or --no-readiness-gate).",
    Gauge,
    Node,
    &[],
);
pub const READINESS_GATE_PODS: MetricDecl = decl(
    "readiness_gate_pods",
    "Pods on this node that declare the canaryscope.io/gpu-runtime readiness gate, by the condition the API server holds: true, false, or none (not set yet).",
    Gauge,
    Node,
    &["condition"],
);
pub const READINESS_GATE_PENDING: MetricDecl = decl(
    "readiness_gate_pending_patches",
    "Gated pods whose condition in the API server differs from the daemon's judgement (a patch waits for the per-pod rate limit or is being retried).",
    Gauge,
    Node,
    &[],
);
pub const READINESS_GATE_PATCHES: MetricDecl = decl(
    "readiness_gate_patches_total",
    "Patches of pods/status for the readiness gate, by result: ok or error (retried with backoff).",
    Counter,
    Node,
    &["result"],
);
pub const EVENTS_LOST: MetricDecl = decl(
    "events_lost_total",
    "Events dropped in the kernel because the ring buffer was full.",
    Counter,
    Node,
    &[],
);
pub const DECODE_ERRORS: MetricDecl = decl(
    "decode_errors_total",
    "Ring-buffer records that could not be decoded (a kernel/userspace layout mismatch); their events are lost.",
    Counter,
    Node,
    &[],
);
pub const RING_EVENTS: MetricDecl = decl(
    "ring_events_total",
    "Records received from the kernel ring buffer, by kind.",
    Counter,
    Node,
    &["kind"],
);
pub const SERIES_OVERFLOW: MetricDecl = decl(
    "series_overflow_total",
    "Updates dropped because the per-node cgroup cap was reached.",
    Counter,
    Node,
    &[],
);
pub const TRACKED_CGROUPS: MetricDecl =
    decl("tracked_cgroups", "Cgroups with series on this node.", Gauge, Node, &[]);

/// One answer per label set: two files can share a path (two containers'
/// images, a process in another root), each with a status of its own, and
/// an exposition must not hold two samples with one label set. A label
/// set is attached only if every probe under it is.
fn probes_by_label(probes: &[ProbeStatus]) -> BTreeMap<(&'static str, &str), bool> {
    let mut by_label: BTreeMap<(&'static str, &str), bool> = BTreeMap::new();
    for p in probes {
        *by_label.entry((p.probe, p.target.as_str())).or_insert(true) &= p.attached;
    }
    by_label
}

#[derive(Default, PartialEq)]
pub struct NodeState {
    pub probes: Vec<ProbeStatus>,
    /// GPU processes with hot-call probes, by reason (set by the daemon loop).
    pub hot: HotCounts,
    /// The readiness gate's numbers; `None` when it is off.
    pub gate: Option<GateSummary>,
    pub events_lost: u64,
    /// Ring-buffer records that failed to decode (set by the daemon loop).
    pub decode_errors: u64,
    /// Ring-buffer records received, by kind (shows that aggregation works).
    pub records: BTreeMap<&'static str, u64>,
}

impl NodeState {
    pub fn render(&self, fams: &mut FamilySet, series: &Series) {
        for ((probe, target), attached) in probes_by_label(&self.probes) {
            fams.get(&PROBE_ATTACHED).value(&[probe, target], if attached { 1.0 } else { 0.0 });
        }
        // The daemon's two reasons always have a series, so a rule can
        // tell "none selected" from "not exported".
        for reason in [Reason::Canary, Reason::GpuTrouble] {
            if !self.hot.contains_key(&reason) {
                fams.get(&GPU_HOT_PROBED_PROCESSES).value(&[reason.as_str()], 0.0);
            }
        }
        for (reason, n) in &self.hot {
            fams.get(&GPU_HOT_PROBED_PROCESSES).value(&[reason.as_str()], *n as f64);
        }
        fams.get(&READINESS_GATE_ENABLED).value(&[], if self.gate.is_some() { 1.0 } else { 0.0 });
        if let Some(gate) = &self.gate {
            for (condition, n) in
                [("true", gate.pods_true), ("false", gate.pods_false), ("none", gate.pods_none)]
            {
                fams.get(&READINESS_GATE_PODS).value(&[condition], n as f64);
            }
            fams.get(&READINESS_GATE_PENDING).value(&[], gate.pending as f64);
            fams.get(&READINESS_GATE_PATCHES).value(&["ok"], gate.patches_ok as f64);
            fams.get(&READINESS_GATE_PATCHES).value(&["error"], gate.patches_failed as f64);
        }
        fams.get(&EVENTS_LOST).value(&[], self.events_lost as f64);
        fams.get(&DECODE_ERRORS).value(&[], self.decode_errors as f64);
        for (kind, n) in &self.records {
            fams.get(&RING_EVENTS).value(&[kind], *n as f64);
        }
        fams.get(&SERIES_OVERFLOW).value(&[], series.overflow as f64);
        fams.get(&TRACKED_CGROUPS).value(&[], series.len() as f64);
    }
}
