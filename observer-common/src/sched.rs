//! Scheduler: run-queue latency per cgroup, aggregated in the kernel.

/// Wakeup timestamps per thread (hash tid -> boot ns).
pub const WAKEUPS_MAP: &str = "RUNQ_WAKEUPS";
/// Per-CPU log2 histogram of run-queue latency per cgroup.
pub const RUNQ_MAP: &str = "RUNQ_LATENCY";

pub const MAX_WAKEUPS: u32 = 65536;
pub const MAX_RUNQ_CGROUPS: u32 = 8192;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RunqHistogram {
    pub count: u64,
    pub total_ns: u64,
    pub buckets: [u64; crate::LATENCY_BUCKETS],
}

impl Default for RunqHistogram {
    fn default() -> Self {
        Self { count: 0, total_ns: 0, buckets: [0; crate::LATENCY_BUCKETS] }
    }
}
