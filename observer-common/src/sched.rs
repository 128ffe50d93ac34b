//! Scheduler: run-queue latency per cgroup, aggregated in the kernel, for
//! the cgroups canaryscope reports on only.

/// Per-CPU log2 histogram of run-queue latency per cgroup.
pub const RUNQ_MAP: &str = "RUNQ_LATENCY";

/// The cgroups whose tasks pay for run-queue accounting (cgroup id -> 1):
/// the daemon puts in the roots it reports on (the kubepods hierarchy,
/// `run --cgroup` prefixes) and what exists below them; the kernel adds
/// every cgroup created under one of them and removes every one removed.
pub const RUNQ_CGROUPS_MAP: &str = "RUNQ_CGROUPS";

/// The reported roots by path (`/kubepods.slice`, `run --cgroup` prefixes;
/// NUL-padded [`ROOT_PATH_LEN`] bytes -> 1), so that a root created after
/// the daemon started is reported from its creation on.
pub const RUNQ_ROOTS_MAP: &str = "RUNQ_ROOTS";
pub const MAX_RUNQ_ROOTS: u32 = 64;
/// Longest root path the kernel matches at creation (with its NUL); a
/// longer one is reported from the daemon's next look at it instead.
pub const ROOT_PATH_LEN: usize = 128;

/// A root's path as the kernel side's map key.
pub fn root_path_key(path: &str) -> Option<[u8; ROOT_PATH_LEN]> {
    crate::path_key(path)
}

pub const MAX_RUNQ_CGROUPS: u32 = 8192;
/// Reported cgroups: a busy node's pods, their containers and the slices
/// above them.
pub const MAX_REPORTED_CGROUPS: u32 = 16384;

/// Per key: count, total and log2 histogram of durations.
pub type RunqHistogram = crate::LatencyHistogram;
