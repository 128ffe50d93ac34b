//! The exit family's series: native crashes and abnormal exits per pod,
//! counted as their events come.
use super::decl::{decl, Kind::Counter, MetricDecl, Scope::Workload};
use super::{
    context::{workload_values, Render},
    families::FamilySet,
    series::{OnNode, PodCounts},
};
use crate::{
    attribution::labels::WorkloadLabels,
    events::{signal_label, Detail},
};

pub const NATIVE_CRASHES: MetricDecl = decl(
    "native_crashes_total",
    "Processes killed by a fault or abort in native code.",
    Counter,
    Workload,
    &["signal", "library"],
);
pub const ABNORMAL_EXITS: MetricDecl = decl(
    "abnormal_exits_total",
    "Processes that died by a signal or exited with status 137, by cause (oom_kill, rlimit_cpu, fault, abort, sent, kernel, wrapped, unknown); for sent signals the sender's scope (self, same_container, same_pod, other_pod, host, unknown) and, for host kills with Kubernetes, why (pod_deleted, container_restart); none where a label does not apply.",
    Counter,
    Workload,
    &["signal", "cause", "sender_scope", "kill_reason"],
);

/// An abnormal exit's label values after the workload's: signal, cause,
/// sender scope, kill reason. All bounded; never a pid or a comm.
type ExitKey = (String, &'static str, &'static str, &'static str);

/// The value of a label that does not apply to a series.
const NONE: &str = "none";

#[derive(Default)]
pub struct Exits {
    /// By (signal, faulting library's file name).
    crashes: PodCounts<(String, String)>,
    exits: PodCounts<ExitKey>,
}

impl Exits {
    /// Counts a crash or an abnormal exit; other events are not this
    /// family's.
    pub fn record(&mut self, cgroup: u64, detail: &Detail) {
        match detail {
            Detail::Crash { signal, library, .. } => {
                let lib = library.as_deref().map(base_name).unwrap_or("unknown").to_string();
                self.crashes.add(cgroup, (signal_label(*signal), lib), 1);
            }
            Detail::Exit { signal, exit_code, cause, sender, kill_reason, .. } => {
                let label = if *signal != 0 { signal_label(*signal) } else { format!("exit{exit_code}") };
                let scope = sender.as_ref().map(|s| s.scope.as_str()).unwrap_or(NONE);
                let reason = kill_reason.map(|r| r.as_str()).unwrap_or(NONE);
                self.exits.add(cgroup, (label, cause.as_str(), scope, reason), 1);
            }
            _ => {}
        }
    }

    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels) {
        self.crashes.retire(cgroup, labels);
        self.exits.retire(cgroup, labels);
    }

    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.crashes.keep_pods(on_node);
        self.exits.keep_pods(on_node);
    }

    pub fn render_crashes(&self, fams: &mut FamilySet, r: &Render) {
        for ((labels, (signal, library)), n) in self.crashes.shown(r.series) {
            fams.get(&NATIVE_CRASHES).value(&workload_values(labels, &[signal, library]), n as f64);
        }
    }

    pub fn render_exits(&self, fams: &mut FamilySet, r: &Render) {
        for ((labels, (signal, cause, scope, reason)), n) in self.exits.shown(r.series) {
            let v = workload_values(labels, &[signal, cause, scope, reason]);
            fams.get(&ABNORMAL_EXITS).value(&v, n as f64);
        }
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
