//! Types shared by canaryscope's eBPF programs and its userspace observer.
//!
//! Everything here is `#[repr(C)]`, `Copy` and explicitly padded so that the
//! kernel side and userspace agree byte for byte. Every number both sides
//! interpret (event kinds, flags, states, map sizes, time windows) is
//! defined here once, and so is every name userspace looks up. The kernel
//! side has to spell those names again (aya-ebpf's `#[map(name = ...)]`
//! takes only a literal, and a load-time global is named by its static),
//! each next to a comment naming its constant here: see [`USERSPACE_MAPS`]
//! and [`USERSPACE_GLOBALS`].
#![no_std]

/// Declares a `#[repr(u32)]` enum that records carry as a plain `u32`,
/// with its `from_u32`, so each variant's number is written once.
macro_rules! wire_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $value:literal,)+ }) => {
        $(#[$meta])*
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        impl $name {
            /// The variant of a number read from a record, if any.
            pub fn from_u32(v: u32) -> Option<Self> {
                $(if v == $value {
                    return Some(Self::$variant);
                })+
                None
            }
        }
    };
}

/// A cgroup path as a kernel-side map key: its bytes NUL-padded to `LEN`,
/// the form `bpf_probe_read_kernel_str` leaves the tracepoint's path in.
/// `None` when the path and its NUL do not fit.
pub fn path_key<const LEN: usize>(path: &str) -> Option<[u8; LEN]> {
    let bytes = path.as_bytes();
    if bytes.len() >= LEN {
        return None;
    }
    let mut key = [0u8; LEN];
    key[..bytes.len()].copy_from_slice(bytes);
    Some(key)
}

pub mod crash;
pub mod discovery;
pub mod exit;
pub mod gpu;
pub mod http;
pub mod kernel;
pub mod kfd;
pub mod library_load;
pub mod memlimit;
pub mod oom;
pub mod runs;
pub mod sched;

/// Ring buffer carrying rare events (failures, stalls, crashes, kills) to userspace.
pub const EVENTS_MAP: &str = "EVENTS";
/// Per-CPU count of events the kernel side could not reserve ring-buffer space for.
pub const LOST_MAP: &str = "EVENTS_LOST";
/// Per CPU, how many times a latency aggregate (GPU calls, KFD ioctls,
/// run-queue waits) was updated: the daemon reads those maps only when it
/// moved, so an idle node with a thousand pods costs no map walks.
pub const AGGREGATES_GENERATION_MAP: &str = "AGG_GENERATION";

/// Every map userspace opens by name. The kernel side must define each one
/// under exactly this name; a test on the built object checks it.
pub const USERSPACE_MAPS: &[&str] = &[
    EVENTS_MAP,
    LOST_MAP,
    AGGREGATES_GENERATION_MAP,
    gpu::INFLIGHT_MAP,
    gpu::STATS_MAP,
    gpu::SLOT_COOKIES_MAP,
    gpu::DRIVER_VERSIONS_MAP,
    kfd::KFD_STATS_MAP,
    sched::RUNQ_MAP,
    sched::RUNQ_CGROUPS_MAP,
    sched::RUNQ_ROOTS_MAP,
    memlimit::MEM_LIMIT_MAP,
    discovery::GPU_FILES_KNOWN_MAP,
    discovery::HELD_MAP,
    discovery::HOT_CGROUPS_MAP,
    discovery::HOT_TGIDS_MAP,
    http::HTTP_RING_MAP,
    http::HTTP_LOST_MAP,
];

/// Every load-time global userspace sets (`EbpfLoader::override_global`):
/// each is a `#[no_mangle]` static of that name on the kernel side.
pub const USERSPACE_GLOBALS: &[&str] = &[
    gpu::GLOBAL_EMIT_ALL,
    gpu::GLOBAL_SLOW_NS,
    kernel::GLOBAL_OFFSETS,
    kfd::GLOBAL_KFD_RDEV,
    discovery::GLOBAL_HOLD,
];

/// Size of the events ring buffer. Events are rare by design (failures only),
/// so 1 MiB holds several thousand of them between two userspace drains.
pub const EVENTS_RING_BYTES: u32 = 1 << 20;

wire_enum! {
    /// What a ring-buffer record holds; the first field of every record.
    pub enum EventKind {
        GpuCall = 1,
        KfdIoctl = 3,
        OomVictim = 4,
        Exit = 5,
        LibraryMap = 6,
        GpuHardware = 7,
        Exec = 8,
        GpuMap = 9,
        MemoryLimitRefusal = 10,
        LibraryLoadFailed = 11,
        RunExec = 12,
    }
}

/// Common head of every event record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventHeader {
    /// An [`EventKind`] as a number.
    pub kind: u32,
    /// Thread-group id (the process id as users know it).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_boot_ns()`: converted to wall-clock time in userspace.
    pub ts_boot_ns: u64,
    /// cgroup2 id (inode number of the cgroup directory).
    pub cgroup_id: u64,
    pub comm: [u8; 16],
}

/// Index of log2 latency buckets: bucket `i` counts durations in
/// `[2^i, 2^(i+1))` microseconds (bucket 0 also takes everything below 1 µs).
pub const LATENCY_BUCKETS: usize = 32;

/// Upper bound in seconds of latency bucket `i` (used for Prometheus `le`).
pub fn bucket_upper_seconds(i: usize) -> f64 {
    // Durations are shifted by 10 bits (1.024 µs units) in the kernel to
    // avoid a division; the bounds here follow the same unit.
    ((1u64 << (i + 1)) as f64) * 1024e-9
}

/// Bucket index of a duration in nanoseconds; branch-light so the verifier
/// and the hot path both stay cheap.
#[inline(always)]
pub fn latency_bucket(duration_ns: u64) -> usize {
    let v = duration_ns >> 10;
    if v == 0 {
        return 0;
    }
    let log2 = 63 - v.leading_zeros() as usize;
    if log2 >= LATENCY_BUCKETS {
        LATENCY_BUCKETS - 1
    } else {
        log2
    }
}

/// What the kernel keeps per key for GPU calls, KFD ioctls and run-queue
/// waits: how many, their total duration and a log2 histogram of them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyHistogram {
    pub count: u64,
    pub total_ns: u64,
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self { count: 0, total_ns: 0, buckets: [0; LATENCY_BUCKETS] }
    }
}

impl LatencyHistogram {
    /// Counts one duration.
    #[inline(always)]
    pub fn record(&mut self, duration_ns: u64) {
        self.count += 1;
        self.total_ns += duration_ns;
        let bucket = latency_bucket(duration_ns);
        // Always true; the check is what lets the verifier accept the index.
        if bucket < self.buckets.len() {
            self.buckets[bucket] += 1;
        }
    }

    /// Adds another histogram (another CPU's share of the same key).
    pub fn add(&mut self, other: &Self) {
        self.count += other.count;
        self.total_ns += other.total_ns;
        for (into, from) in self.buckets.iter_mut().zip(&other.buckets) {
            *into += from;
        }
    }
}

/// Copy a NUL-padded kernel `comm` into a `&str` (lossy on invalid UTF-8).
pub fn comm_str(comm: &[u8]) -> &str {
    let end = comm.iter().position(|b| *b == 0).unwrap_or(comm.len());
    match core::str::from_utf8(&comm[..end]) {
        Ok(s) => s,
        Err(e) => core::str::from_utf8(&comm[..e.valid_up_to()]).unwrap_or(""),
    }
}

#[cfg(feature = "user")]
mod pod_impls {
    // SAFETY: all of these are #[repr(C)], Copy, and made only of integers
    // with explicit padding, so any bit pattern is a valid value.
    unsafe impl aya::Pod for crate::gpu::GpuCallEvent {}
    unsafe impl aya::Pod for crate::gpu::InflightKey {}
    unsafe impl aya::Pod for crate::gpu::InflightStack {}
    unsafe impl aya::Pod for crate::gpu::GpuStatsKey {}
    unsafe impl aya::Pod for crate::gpu::DriverVersion {}
    unsafe impl aya::Pod for crate::LatencyHistogram {}
    unsafe impl aya::Pod for crate::kernel::KernelOffsets {}
    unsafe impl aya::Pod for crate::exit::ExitEvent {}
    unsafe impl aya::Pod for crate::oom::OomVictimEvent {}
    unsafe impl aya::Pod for crate::oom::OomVictimInfo {}
    unsafe impl aya::Pod for crate::crash::CrashInfo {}
    unsafe impl aya::Pod for crate::memlimit::MemLimitKey {}
    unsafe impl aya::Pod for crate::memlimit::MemLimitEvent {}
    unsafe impl aya::Pod for crate::exit::SignalOrigin {}
    unsafe impl aya::Pod for crate::kfd::KfdStatsKey {}
    unsafe impl aya::Pod for crate::kfd::KfdIoctlEvent {}
    unsafe impl aya::Pod for crate::kfd::HwEvent {}
    unsafe impl aya::Pod for crate::discovery::ExecEvent {}
    unsafe impl aya::Pod for crate::discovery::GpuMapEvent {}
    unsafe impl aya::Pod for crate::discovery::GpuFileKey {}
    unsafe impl aya::Pod for crate::library_load::LoadFailedEvent {}
    unsafe impl aya::Pod for crate::runs::RunExecEvent {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_sums_and_adds_up() {
        let mut h = LatencyHistogram::default();
        h.record(500); // below 1 µs: bucket 0
        h.record(3_000); // 2.9 units of 1.024 µs: bucket 1
        h.record(1 << 50); // 13 days: clamped into the last bucket
        assert_eq!(h.count, 3);
        assert_eq!(h.total_ns, 500 + 3_000 + (1 << 50));
        assert_eq!((h.buckets[0], h.buckets[1], h.buckets[LATENCY_BUCKETS - 1]), (1, 1, 1));
        let mut sum = h;
        sum.add(&h);
        assert_eq!(sum.count, 6);
        assert_eq!(sum.buckets[1], 2);
    }

    #[test]
    fn buckets_are_log2_microseconds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1023), 0);
        assert_eq!(latency_bucket(1024), 0);
        assert_eq!(latency_bucket(2048), 1);
        assert_eq!(latency_bucket(1_000_000), 9); // 1 ms ~ 976 units -> 2^9
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS - 1);
        // every duration lies below its bucket's upper bound
        for ns in [1u64, 5_000, 1_000_000, 3_000_000_000] {
            let b = latency_bucket(ns);
            assert!((ns as f64) * 1e-9 < bucket_upper_seconds(b), "{ns}");
        }
    }

    #[test]
    fn userspace_names_are_distinct() {
        for list in [USERSPACE_MAPS, USERSPACE_GLOBALS] {
            for (i, a) in list.iter().enumerate() {
                assert!(!list[i + 1..].contains(a), "{a} twice");
            }
        }
    }

    #[test]
    fn comm_stops_at_nul() {
        assert_eq!(comm_str(b"hip_probe\0\0\0\0\0\0\0"), "hip_probe");
        assert_eq!(comm_str(b"0123456789abcdef"), "0123456789abcdef");
    }
}
