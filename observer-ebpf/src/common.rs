//! Ring buffer, lost-event counter and helpers every probe family uses.

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns,
    },
    macros::map,
    maps::{PerCpuArray, PerCpuHashMap, RingBuf},
};
use observer_common::{EventHeader, LatencyHistogram, EVENTS_RING_BYTES};

#[map(name = "EVENTS")] // observer_common::EVENTS_MAP
pub static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// Index 0: events dropped because the ring buffer was full.
#[map(name = "EVENTS_LOST")] // observer_common::LOST_MAP
pub static EVENTS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "AGG_GENERATION")] // observer_common::AGGREGATES_GENERATION_MAP
static AGG_GENERATION: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
pub fn count_lost() {
    if let Some(slot) = EVENTS_LOST.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Header for an event about the current task.
#[inline(always)]
pub fn current_header(kind: u32) -> EventHeader {
    let pid_tgid = bpf_get_current_pid_tgid();
    EventHeader {
        kind,
        pid: (pid_tgid >> 32) as u32,
        tid: pid_tgid as u32,
        _pad: 0,
        // SAFETY: plain helper calls without pointer arguments.
        ts_boot_ns: unsafe { bpf_ktime_get_boot_ns() },
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    }
}

/// Send one event, counting it as lost when the ring buffer is full.
#[inline(always)]
pub fn emit<T: Copy + 'static>(event: &T) {
    match EVENTS.reserve::<T>(0) {
        Some(mut slot) => {
            slot.write(*event);
            slot.submit(0);
        }
        None => count_lost(),
    }
}

/// Send one event and wake the reader at once, whatever its position: for
/// the records userspace must act on before the process gets further (an
/// exec to resolve, a held process to resume).
#[inline(always)]
pub fn emit_urgent<T: Copy + 'static>(event: &T) {
    /// `BPF_RB_FORCE_WAKEUP`
    const FORCE_WAKEUP: u64 = 2;
    match EVENTS.reserve::<T>(0) {
        Some(mut slot) => {
            slot.write(*event);
            slot.submit(FORCE_WAKEUP);
        }
        None => count_lost(),
    }
}

/// Counts one duration under `key` in a per-CPU histogram map (GPU calls,
/// KFD ioctls, run-queue waits), creating the entry on first use.
#[inline(always)]
pub fn record_latency<K>(map: &PerCpuHashMap<K, LatencyHistogram>, key: &K, duration_ns: u64) {
    match map.get_ptr_mut(key) {
        // SAFETY: per-CPU value; no other writer on this CPU.
        Some(histogram) => unsafe { (*histogram).record(duration_ns) },
        None => {
            let mut histogram = LatencyHistogram::default();
            histogram.record(duration_ns);
            // A full map loses the duration, never the program: nothing to do.
            let _ = map.insert(key, &histogram, 0);
        }
    }
    bump_generation();
}

/// Marks the aggregates changed. After the update: a reader that saw this
/// generation saw the update.
#[inline(always)]
pub fn bump_generation() {
    if let Some(generation) = AGG_GENERATION.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *generation += 1 };
    }
}
