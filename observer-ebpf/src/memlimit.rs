//! Memory-limit refusals: mmap, mremap and brk of a process with a finite
//! RLIMIT_AS or RLIMIT_DATA that fail because the limit would be exceeded.
//! No signal follows such a refusal, so it is seen here or not at all.
//!
//! Counted per cgroup and limit in a per-CPU map; the ring carries at most
//! one record per process per second, so a process retrying in a loop costs
//! one record a second and an exact count.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task},
    macros::{map, tracepoint},
    maps::{LruHashMap, PerCpuHashMap},
    programs::TracePointContext,
};
use observer_common::{
    exit::{RLIMIT_SIZE, RLIM_INFINITY},
    memlimit::{
        refused_by, MemLimitEvent, MemLimitKey, MemPending, MemSyscall, ENOMEM, MAP_SHARED,
        MAX_MEM_LIMIT_KEYS, MAX_MEM_PENDING, MAX_MEM_RECORDED, PROT_WRITE, RECORD_EVERY_NS, RLIMIT_AS,
        RLIMIT_DATA,
    },
    EventKind,
};

use crate::{
    common::{current_header, emit},
    kernel::{offsets, read},
};

#[map(name = "MEM_LIMIT_REFUSALS")] // observer_common::memlimit::MEM_LIMIT_MAP
static MEM_LIMIT_REFUSALS: PerCpuHashMap<MemLimitKey, u64> =
    PerCpuHashMap::with_max_entries(MAX_MEM_LIMIT_KEYS, 0);

/// Calls in flight of limited processes (tid -> what was asked). LRU: a
/// thread that never returns (killed in the call) must not keep its slot.
#[map(name = "MEM_PENDING")]
static MEM_PENDING: LruHashMap<u32, MemPending> = LruHashMap::with_max_entries(MAX_MEM_PENDING, 0);

/// When each process last sent a record (tgid -> boot ns).
#[map(name = "MEM_RECORDED")]
static MEM_RECORDED: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_MEM_RECORDED, 0);

/// The current process's soft RLIMIT_AS and RLIMIT_DATA.
///
/// match-proto: struct signal_struct *task_struct::signal; struct rlimit
/// signal_struct::rlim[RLIM_NLIMITS] (rlim_cur first).
#[inline(always)]
fn current_limits() -> Result<(u64, u64), i64> {
    let o = offsets();
    if o.have_rlimit == 0 || o.have_mm == 0 {
        return Err(-1);
    }
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let signal: *const u8 = read(task, o.task_signal)?;
    let as_limit: u64 = read(signal, o.signal_rlim + RLIMIT_AS * RLIMIT_SIZE)?;
    let data_limit: u64 = read(signal, o.signal_rlim + RLIMIT_DATA * RLIMIT_SIZE)?;
    Ok((as_limit, data_limit))
}

/// Notes a call of a process with a finite limit; every other process
/// stops here, after three reads.
#[inline(always)]
fn enter(syscall: MemSyscall, requested: u64, data: bool) -> u32 {
    let Ok((as_limit, data_limit)) = current_limits() else { return 0 };
    if as_limit == RLIM_INFINITY && data_limit == RLIM_INFINITY {
        return 0;
    }
    let pending = MemPending { syscall: syscall as u32, data: data as u32, requested };
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = MEM_PENDING.insert(&tid, &pending, 0);
    0
}

/// The call returned `ret`: if it failed because of a limit, count it and
/// maybe send a record.
#[inline(always)]
fn exit(ret: i64) -> Result<u32, i64> {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: read-only map lookup; the value is copied out before removal.
    let Some(pending) = (unsafe { MEM_PENDING.get(&tid) }).copied() else { return Ok(0) };
    let _ = MEM_PENDING.remove(&tid);
    let growth = if pending.syscall == MemSyscall::Brk as u32 {
        // brk returns the old break when it refuses to move it, the new one
        // when it moved: a return below the request is a refusal, and the
        // growth asked for is from the old break.
        let old = ret as u64;
        if old >= pending.requested {
            return Ok(0);
        }
        pending.requested - old
    } else {
        if ret != ENOMEM {
            return Ok(0);
        }
        pending.requested
    };
    let o = offsets();
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let mm: *const u8 = read(task, o.task_mm)?;
    let total_vm: u64 = read(mm, o.mm_total_vm)?;
    let data_vm: u64 = read(mm, o.mm_data_vm)?;
    let (as_limit, data_limit) = current_limits()?;
    let Some((limit, limit_bytes)) =
        refused_by(total_vm, data_vm, growth, pending.data != 0, as_limit, data_limit)
    else {
        return Ok(0);
    };
    let header = current_header(EventKind::MemoryLimitRefusal as u32);
    let key = MemLimitKey { cgroup_id: header.cgroup_id, limit: limit as u32, _pad: 0 };
    match MEM_LIMIT_REFUSALS.get_ptr_mut(&key) {
        // SAFETY: per-CPU value; no other writer on this CPU.
        Some(n) => unsafe { *n += 1 },
        None => {
            // A full map loses the count, never the program.
            let _ = MEM_LIMIT_REFUSALS.insert(&key, &1, 0);
        }
    }
    let tgid = header.pid;
    // The record's own timestamp paces the records, so the times a reader
    // sees are a full second apart, whatever ran between the two reads.
    let now = header.ts_boot_ns;
    // SAFETY: read-only map lookup.
    if let Some(last) = unsafe { MEM_RECORDED.get(&tgid) } {
        if now.saturating_sub(*last) < RECORD_EVERY_NS {
            return Ok(0);
        }
    }
    let _ = MEM_RECORDED.insert(&tgid, &now, 0);
    emit(&MemLimitEvent {
        header,
        limit: limit as u32,
        syscall: pending.syscall,
        requested_bytes: observer_common::memlimit::page_align(growth),
        limit_bytes,
    });
    Ok(0)
}

/// The return value of a syscall exit tracepoint (fixed layout: ret at 16).
#[inline(always)]
fn ret_of(ctx: &TracePointContext) -> i64 {
    // SAFETY: fixed syscall tracepoint layout.
    unsafe { ctx.read_at(16) }.unwrap_or(0)
}

/// syscalls:sys_enter_mmap: len at 24, prot at 32, flags at 40.
#[tracepoint(category = "syscalls", name = "sys_enter_mmap")]
pub fn memlimit_mmap_enter(ctx: TracePointContext) -> u32 {
    // SAFETY: fixed syscall tracepoint layout.
    let len: u64 = unsafe { ctx.read_at(24) }.unwrap_or(0);
    let prot: u64 = unsafe { ctx.read_at(32) }.unwrap_or(0);
    let flags: u64 = unsafe { ctx.read_at(40) }.unwrap_or(0);
    // Only private writable mappings count against RLIMIT_DATA.
    let data = prot & PROT_WRITE != 0 && flags & MAP_SHARED == 0;
    enter(MemSyscall::Mmap, len, data)
}

#[tracepoint(category = "syscalls", name = "sys_exit_mmap")]
pub fn memlimit_mmap_exit(ctx: TracePointContext) -> u32 {
    exit(ret_of(&ctx)).unwrap_or(1)
}

/// syscalls:sys_enter_mremap: old_len at 24, new_len at 32. Shrinking
/// cannot hit a limit.
#[tracepoint(category = "syscalls", name = "sys_enter_mremap")]
pub fn memlimit_mremap_enter(ctx: TracePointContext) -> u32 {
    // SAFETY: fixed syscall tracepoint layout.
    let old_len: u64 = unsafe { ctx.read_at(24) }.unwrap_or(0);
    let new_len: u64 = unsafe { ctx.read_at(32) }.unwrap_or(0);
    if new_len <= old_len {
        return 0;
    }
    // The mapping's own flags are not known here; a grown heap mapping
    // (realloc) is private and writable, so it counts as data.
    enter(MemSyscall::Mremap, new_len - old_len, true)
}

#[tracepoint(category = "syscalls", name = "sys_exit_mremap")]
pub fn memlimit_mremap_exit(ctx: TracePointContext) -> u32 {
    exit(ret_of(&ctx)).unwrap_or(1)
}

/// syscalls:sys_enter_brk: the requested break at 16 (0 asks for the
/// current one and is never refused).
#[tracepoint(category = "syscalls", name = "sys_enter_brk")]
pub fn memlimit_brk_enter(ctx: TracePointContext) -> u32 {
    // SAFETY: fixed syscall tracepoint layout.
    let brk: u64 = unsafe { ctx.read_at(16) }.unwrap_or(0);
    if brk == 0 {
        return 0;
    }
    enter(MemSyscall::Brk, brk, true)
}

#[tracepoint(category = "syscalls", name = "sys_exit_brk")]
pub fn memlimit_brk_exit(ctx: TracePointContext) -> u32 {
    exit(ret_of(&ctx)).unwrap_or(1)
}
