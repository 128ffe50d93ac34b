//! Every metric family the exporter can render, declared once: name, help,
//! type and label names. Rendering takes all four from here, so a family
//! cannot drift from its declaration at one of its use sites, and the
//! documented lists (README, deploy/tools/deploycheck.py) have one place to
//! be checked against.
use Kind::{Counter, Gauge, Histogram};
use Scope::{Node, Revision, Workload};

use crate::attribution::label_names::{LABEL_NAMES, REVISION_LABEL_NAMES};

/// What Prometheus is told the family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Who a family's series belong to, which decides the leading labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A workload (cgroup): `LABEL_NAMES` come first, then the extras.
    Workload,
    /// A revision of a workload on this node: `REVISION_LABEL_NAMES` first.
    /// Its pods share the series, and pods that are gone keep adding to it
    /// while the revision has pods here. The per-pod view (`top`'s source)
    /// renders such a family per pod, with `LABEL_NAMES`.
    Revision,
    /// The node (or the daemon itself): only the extras.
    Node,
}

/// Which exposition is rendered: what Prometheus scrapes, within the
/// series budget, or every family per pod, for `top` and people.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Scrape,
    PerPod,
}

/// One family, as exported.
#[derive(Debug, PartialEq)]
pub struct MetricDecl {
    /// Without the `canaryscope_` prefix.
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub scope: Scope,
    /// Labels after the workload ones (if any), in exposition order.
    pub extra: &'static [&'static str],
    /// For a revision's family, the extras of its per-pod rendering where
    /// they differ: a finer split than the budget allows Prometheus.
    pub per_pod_extra: Option<&'static [&'static str]>,
}

pub const PREFIX: &str = "canaryscope_";

impl MetricDecl {
    /// Label names in exposition order, as Prometheus scrapes them.
    pub fn label_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.label_names_in(View::Scrape)
    }

    /// Label names in exposition order in `view`.
    pub fn label_names_in(&self, view: View) -> impl Iterator<Item = &'static str> + '_ {
        self.owner_label_names(view).iter().chain(self.extra_in(view)).copied()
    }

    /// The labels after the owner's in `view`.
    pub fn extra_in(&self, view: View) -> &'static [&'static str] {
        match (view, self.per_pod_extra) {
            (View::PerPod, Some(extra)) => extra,
            _ => self.extra,
        }
    }

    /// The labels naming who a series belongs to, before the extras.
    pub fn owner_label_names(&self, view: View) -> &'static [&'static str] {
        match (self.scope, view) {
            (Scope::Workload, _) | (Scope::Revision, View::PerPod) => &LABEL_NAMES,
            (Scope::Revision, View::Scrape) => &REVISION_LABEL_NAMES,
            (Scope::Node, _) => &[],
        }
    }
}

const fn decl(
    name: &'static str,
    help: &'static str,
    kind: Kind,
    scope: Scope,
    extra: &'static [&'static str],
) -> MetricDecl {
    MetricDecl { name, help, kind, scope, extra, per_pod_extra: None }
}

pub const GPU_API_CALLS: MetricDecl = decl(
    "gpu_api_calls_total",
    "GPU runtime API calls by result, per revision on this node (a failure's pod and container are in gpu_api_call_failures_total).",
    Counter,
    Revision,
    &["api", "function", "result"],
);
/// Per tier, not per function: a start-up calls twenty or more cold
/// functions, and a histogram each would cost a revision hundreds of series
/// (the per-pod view keeps the function).
pub const GPU_API_CALL_DURATION: MetricDecl = MetricDecl {
    per_pod_extra: Some(&["api", "function"]),
    ..decl(
        "gpu_api_call_duration_seconds",
        "Duration of GPU runtime API calls per revision on this node and tier (cold: init, allocation, synchronous copies and synchronisation; hot: launches, async copies), measured in the kernel; hot calls only where they are timed (--hot-detail timed).",
        Histogram,
        Revision,
        &["api", "tier"],
    )
};
pub const GPU_API_CALL_FAILURES: MetricDecl = decl(
    "gpu_api_call_failures_total",
    "GPU runtime API calls that returned an error, per pod and container, by result.",
    Counter,
    Workload,
    &["api", "function", "result"],
);
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
pub const GPU_INIT_FAILURES: MetricDecl = decl(
    "gpu_init_failures_total",
    "GPU runtime initialisation calls that failed (hipInit, cuInit, the CUDA runtime's cudaGetDeviceCount and cudaSetDevice, device and context setup).",
    Counter,
    Workload,
    &["api", "function", "result"],
);
pub const GPU_DRIVER_VERSION: MetricDecl = decl(
    "gpu_driver_version",
    "The CUDA version the GPU driver reported to the container's processes (cuDriverGetVersion or cudaDriverGetVersion), encoded as CUDA does: 1000 x major + 10 x minor, so 12020 is CUDA 12.2. Beside a cudaErrorInsufficientDriver init failure it tells a runtime newer than the driver from a missing device.",
    Gauge,
    Workload,
    &[],
);
pub const GPU_API_STALLED_CALLS: MetricDecl = decl(
    "gpu_api_stalled_calls",
    "GPU calls in flight longer than the stall threshold.",
    Gauge,
    Workload,
    &["api", "function"],
);
pub const NATIVE_CRASHES: MetricDecl = decl(
    "native_crashes_total",
    "Processes killed by a fault or abort in native code.",
    Counter,
    Workload,
    &["signal", "library"],
);
pub const OOM_KILLS: MetricDecl =
    decl("oom_kills_total", "Processes killed by the OOM killer.", Counter, Workload, &["scope"]);
pub const ABNORMAL_EXITS: MetricDecl = decl(
    "abnormal_exits_total",
    "Processes that died by a signal or exited with status 137, by cause (oom_kill, rlimit_cpu, fault, abort, sent, kernel, wrapped, unknown); for sent signals the sender's scope (self, same_container, same_pod, other_pod, host, unknown) and, for host kills with Kubernetes, why (pod_deleted, container_restart); none where a label does not apply.",
    Counter,
    Workload,
    &["signal", "cause", "sender_scope", "kill_reason"],
);
pub const MEMORY_LIMIT_REFUSALS: MetricDecl = decl(
    "memory_limit_refusals_total",
    "mmap, mremap and brk calls refused because of the process's RLIMIT_AS (as) or RLIMIT_DATA (data), counted in the kernel; one allocation may count several times (glibc retries a refused mmap through brk and mmap again).",
    Counter,
    Workload,
    &["limit"],
);
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
// VRAM, read from KFD's and amdgpu's sysfs each second (README: stranded
// VRAM): per container while its processes hold it; what dead processes
// left per revision whose process died abnormally, else per node.
pub const GPU_VRAM: MetricDecl = decl(
    "gpu_vram_bytes",
    "VRAM the container's live processes hold per GPU (gpu: KFD's gpu_id), summed from KFD's vram_<gpu_id> per process each second; 0 once they hold none.",
    Gauge,
    Workload,
    &["gpu"],
);
pub const GPU_VRAM_STRANDED: MetricDecl = decl(
    "gpu_vram_stranded_bytes_total",
    "VRAM still held on a GPU, beyond its baseline, 30 s after a process of the revision that held it died abnormally (crash, OOM kill, a fatal signal), per revision on this node: each such death adds what it left, at most what it held.",
    Counter,
    Revision,
    &[],
);
pub const NODE_GPU_VRAM_STRANDED: MetricDecl = decl(
    "node_gpu_vram_stranded_bytes",
    "VRAM on each GPU (gpu: KFD's gpu_id) that no live process holds, beyond the GPU's baseline, left by processes that are gone; only for GPUs whose used memory can be read.",
    Gauge,
    Node,
    &["gpu"],
);
pub const NODE_GPU_VRAM_STRANDED_UNATTRIBUTED: MetricDecl = decl(
    "node_gpu_vram_stranded_unattributed_bytes_total",
    "Stranded VRAM put on no pod: left by a process that exited without an abnormal death, or whose pod is not known.",
    Counter,
    Node,
    &[],
);
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

/// Every family, in exposition order: the groups a render builds one at
/// a time (`Metrics::families_by_group`) are contiguous here.
pub const CATALOG: &[&MetricDecl] = &[
    &GPU_API_CALLS,
    &GPU_API_CALL_DURATION,
    &GPU_API_CALL_FAILURES,
    &GPU_INIT_FAILURES,
    &GPU_DRIVER_VERSION,
    &GPU_API_STALLED_CALLS,
    &NATIVE_CRASHES,
    &OOM_KILLS,
    &ABNORMAL_EXITS,
    &GPU_STARTUPS,
    &GPU_STARTUP_FAILURES,
    &POD_SECONDS,
    &PROCESS_STARTS,
    &KFD_IOCTLS,
    &KFD_IOCTL_FAILURES,
    &KFD_IOCTL_DURATION,
    &GPU_MEMORY_FAULTS,
    &GPU_RESETS,
    &GPU_QUEUE_EVICTIONS,
    &NODE_GPU_MEMORY_FAULTS,
    &NODE_GPU_RESETS,
    &NODE_GPU_QUEUE_EVICTIONS,
    &GPU_VRAM,
    &GPU_VRAM_STRANDED,
    &NODE_GPU_VRAM_STRANDED,
    &NODE_GPU_VRAM_STRANDED_UNATTRIBUTED,
    &MEMORY_LIMIT_REFUSALS,
    &CPU_RUNQUEUE_LATENCY,
    &CPU_PERIODS,
    &CPU_THROTTLED_PERIODS,
    &CPU_THROTTLED_SECONDS,
    &CPU_RUNNABLE_THREADS,
    &CPU_QUOTA_CORES,
    &PROBE_ATTACHED,
    &GPU_HOT_PROBED_PROCESSES,
    &READINESS_GATE_ENABLED,
    &READINESS_GATE_PODS,
    &READINESS_GATE_PENDING,
    &READINESS_GATE_PATCHES,
    &EVENTS_LOST,
    &DECODE_ERRORS,
    &RING_EVENTS,
    &SERIES_OVERFLOW,
    &TRACKED_CGROUPS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_label_names_do_not_repeat() {
        let mut names: Vec<&str> = CATALOG.iter().map(|d| d.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), CATALOG.len(), "a family is declared twice");
        for d in CATALOG {
            let mut labels: Vec<&str> = d.label_names().collect();
            labels.sort_unstable();
            labels.dedup();
            assert_eq!(labels.len(), d.label_names().count(), "{} repeats a label", d.name);
            assert!(!labels.contains(&"le"), "{}: `le` is the histogram's own label", d.name);
        }
    }
}
