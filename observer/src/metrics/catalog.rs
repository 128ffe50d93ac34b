//! Every metric family the exporter can render, declared once: name, help,
//! type and label names. Rendering takes all four from here, so a family
//! cannot drift from its declaration at one of its use sites, and the
//! documented lists (docs/daemon.md, deploy/tools/queries.py) have one place to
//! be checked against.
//!
//! The declarations live in each family's file; this is their one list.
pub use super::cpu::{
    CPU_PERIODS, CPU_QUOTA_CORES, CPU_RUNNABLE_THREADS, CPU_RUNQUEUE_LATENCY, CPU_THROTTLED_PERIODS,
    CPU_THROTTLED_SECONDS,
};
pub use super::decl::{Kind, MetricDecl, Scope, View, PREFIX};
pub use super::exits::{ABNORMAL_EXITS, NATIVE_CRASHES};
pub use super::exposure::{GPU_STARTUPS, GPU_STARTUP_FAILURES, POD_SECONDS, PROCESS_STARTS};
pub use super::gpu_calls::{
    GPU_API_CALLS, GPU_API_CALL_DURATION, GPU_API_CALL_FAILURES, GPU_API_STALLED_CALLS, GPU_DRIVER_VERSION,
    GPU_INIT_FAILURES,
};
pub use super::gpu_library_loads::GPU_LIBRARY_LOAD_FAILURES;
pub use super::gpu_never_initialized::GPU_NEVER_INITIALIZED;
pub use super::hardware::{
    GPU_MEMORY_FAULTS, GPU_QUEUE_EVICTIONS, GPU_RESETS, NODE_GPU_MEMORY_FAULTS, NODE_GPU_QUEUE_EVICTIONS,
    NODE_GPU_RESETS,
};
pub use super::http::{
    HTTP_SERVER_FAILED_REQUESTS, HTTP_SERVER_PROBE_REQUESTS, HTTP_SERVER_REQUEST_DURATION,
    HTTP_SERVER_UNPARSED_CONNECTIONS, NODE_HTTP_SEGMENTS_LOST,
};
pub use super::kfd::{KFD_IOCTLS, KFD_IOCTL_DURATION, KFD_IOCTL_FAILURES};
pub use super::kills::LAST_KILL;
pub use super::node::{
    DECODE_ERRORS, EVENTS_LOST, GPU_HOT_PROBED_PROCESSES, PROBE_ATTACHED, READINESS_GATE_ENABLED,
    READINESS_GATE_PATCHES, READINESS_GATE_PENDING, READINESS_GATE_PODS, RING_EVENTS, SERIES_OVERFLOW,
    TRACKED_CGROUPS,
};
pub use super::oom::{MEMORY_LIMIT_REFUSALS, OOM_KILLS};
pub use super::runs::{RUN_DURATION, RUN_ENDINGS};
pub use super::vram::{
    GPU_VRAM, GPU_VRAM_STRANDED, NODE_GPU_VRAM_STRANDED, NODE_GPU_VRAM_STRANDED_UNATTRIBUTED,
};

/// Every family, in exposition order: a render writes each family's
/// series together, family after family in this order (`FamilySet`).
pub const CATALOG: &[&MetricDecl] = &[
    &GPU_API_CALLS,
    &GPU_API_CALL_DURATION,
    &GPU_API_CALL_FAILURES,
    &GPU_INIT_FAILURES,
    &GPU_DRIVER_VERSION,
    &GPU_API_STALLED_CALLS,
    &GPU_LIBRARY_LOAD_FAILURES,
    &GPU_NEVER_INITIALIZED,
    &NATIVE_CRASHES,
    &OOM_KILLS,
    &ABNORMAL_EXITS,
    &LAST_KILL,
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
    &HTTP_SERVER_REQUEST_DURATION,
    &HTTP_SERVER_PROBE_REQUESTS,
    &HTTP_SERVER_UNPARSED_CONNECTIONS,
    &HTTP_SERVER_FAILED_REQUESTS,
    &NODE_HTTP_SEGMENTS_LOST,
    &RUN_DURATION,
    &RUN_ENDINGS,
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
