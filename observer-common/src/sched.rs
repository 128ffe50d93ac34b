//! Scheduler: run-queue latency per cgroup, aggregated in the kernel.

/// Per-CPU log2 histogram of run-queue latency per cgroup.
pub const RUNQ_MAP: &str = "RUNQ_LATENCY";

/// Threads with a pending wakeup timestamp (hash tid -> boot ns).
pub const MAX_WAKEUPS: u32 = 65536;
pub const MAX_RUNQ_CGROUPS: u32 = 8192;

/// Per key: count, total and log2 histogram of durations.
pub type RunqHistogram = crate::LatencyHistogram;
