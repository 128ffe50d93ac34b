//! The node's own series: probes, hot-call selection, the readiness gate,
//! the pipeline's counters and the series budget.
use std::collections::BTreeMap;

use super::{
    catalog::{
        DECODE_ERRORS, EVENTS_LOST, GPU_HOT_PROBED_PROCESSES, PROBE_ATTACHED, READINESS_GATE_ENABLED,
        READINESS_GATE_PATCHES, READINESS_GATE_PENDING, READINESS_GATE_PODS, RING_EVENTS, SERIES_OVERFLOW,
        TRACKED_CGROUPS,
    },
    families::FamilySet,
    series::Series,
};
use crate::{
    discovery::hot::{HotCounts, Reason},
    gate::patcher::Summary as GateSummary,
    probes::ProbeStatus,
};

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
        for p in &self.probes {
            fams.get(&PROBE_ATTACHED).value(&[p.probe, &p.target], if p.attached { 1.0 } else { 0.0 });
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
