//! Types shared by canaryscope's eBPF programs and its userspace observer.
//!
//! Everything here is `#[repr(C)]`, `Copy` and explicitly padded so that the
//! kernel side and userspace agree byte for byte. Map names and event kinds
//! live here once and are never spelled as string literals on either side.
#![no_std]

pub mod gpu;
pub mod kfd;
pub mod names;
pub mod sched;
pub mod task;

/// Ring buffer carrying rare events (failures, stalls, crashes, kills) to userspace.
pub const EVENTS_MAP: &str = "EVENTS";
/// Per-CPU count of events the kernel side could not reserve ring-buffer space for.
pub const LOST_MAP: &str = "EVENTS_LOST";

/// Size of the events ring buffer. Events are rare by design (failures only),
/// so 1 MiB holds several thousand of them between two userspace drains.
pub const EVENTS_RING_BYTES: u32 = 1 << 20;

/// What a ring-buffer record holds; the first field of every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    GpuCall = 1,
    KfdIoctl = 3,
    OomVictim = 4,
    Exit = 5,
    LibraryMap = 6,
    GpuHardware = 7,
}

impl EventKind {
    pub fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::GpuCall,
            3 => Self::KfdIoctl,
            4 => Self::OomVictim,
            5 => Self::Exit,
            6 => Self::LibraryMap,
            7 => Self::GpuHardware,
            _ => return None,
        })
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
    unsafe impl aya::Pod for crate::gpu::GpuStats {}
    unsafe impl aya::Pod for crate::task::KernelOffsets {}
    unsafe impl aya::Pod for crate::task::ExitEvent {}
    unsafe impl aya::Pod for crate::task::OomVictimEvent {}
    unsafe impl aya::Pod for crate::task::OomVictimInfo {}
    unsafe impl aya::Pod for crate::task::CrashInfo {}
    unsafe impl aya::Pod for crate::sched::RunqHistogram {}
    unsafe impl aya::Pod for crate::kfd::KfdStatsKey {}
    unsafe impl aya::Pod for crate::kfd::KfdStats {}
    unsafe impl aya::Pod for crate::kfd::KfdIoctlEvent {}
    unsafe impl aya::Pod for crate::kfd::HwEvent {}
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn comm_stops_at_nul() {
        assert_eq!(comm_str(b"hip_probe\0\0\0\0\0\0\0"), "hip_probe");
        assert_eq!(comm_str(b"0123456789abcdef"), "0123456789abcdef");
    }
}
