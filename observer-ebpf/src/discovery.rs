//! Finding GPU runtime libraries before their first call.
//!
//! - `process_exec`: a new program image; userspace resolves, before `main`
//!   runs, every GPU runtime file that process's loader could find.
//! - `mmap_exec` / `mmap_exec_exit`: a file named like a GPU runtime that
//!   userspace does not know yet is mapped executable. It is reported as
//!   soon as the mapping exists, and with the hold enabled the process is
//!   stopped (SIGSTOP) until userspace has attached its probes and resumes
//!   it. Other executable mappings raise one coalesced event per process.
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_boot_ns,
        bpf_probe_read_kernel_str_bytes, bpf_send_signal,
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{HashMap, LruHashMap},
    programs::{RawTracePointContext, TracePointContext},
};
use observer_common::{
    discovery::{
        ExecEvent, GpuFileKey, GpuMapEvent, PendingGpuMap, GPU_LIBRARY_PREFIXES, HOLD_CGROUP_DEPTH,
        KNOWN_DRIVER, MAX_GPU_FILES_KNOWN, MAX_HELD, MAX_HOT_SCOPES, MMAP_COALESCE_NS,
    },
    discovery::{LibraryMapEvent, LIBRARY_NAME_LEN},
    EventKind,
};

use crate::{
    common::{current_header, emit, emit_urgent},
    gpu::read_global,
    hold_scope::holds,
    kernel::{cgroup_id, cgroup_parent, current_fd_file, offsets, read},
};

/// Load-time global: non-zero when `--hold` asked for processes to be held.
#[unsafe(no_mangle)] // observer_common::discovery::GLOBAL_HOLD
static HOLD_ENABLED: u32 = 0;

/// Last executable-mapping event per process, to coalesce library loads.
#[map(name = "MMAP_LAST")]
static MMAP_LAST: LruHashMap<u32, u64> = LruHashMap::with_max_entries(8192, 0);

/// GPU runtime files userspace has handled, by device and inode.
#[map(name = "GPU_FILES_KNOWN")] // observer_common::discovery::GPU_FILES_KNOWN_MAP
static GPU_FILES_KNOWN: HashMap<GpuFileKey, u32> = HashMap::with_max_entries(MAX_GPU_FILES_KNOWN, 0);

/// Processes stopped until their probes exist: tgid -> boot ns of the stop.
#[map(name = "HELD_PIDS")] // observer_common::discovery::HELD_MAP
static HELD_PIDS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_HELD, 0);

/// Cgroups whose processes get hot-call probes: cgroup id -> 1.
#[map(name = "HOT_CGROUPS")] // observer_common::discovery::HOT_CGROUPS_MAP
static HOT_CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_HOT_SCOPES, 0);

/// Processes that get hot-call probes: tgid -> 1.
#[map(name = "HOT_TGIDS")] // observer_common::discovery::HOT_TGIDS_MAP
static HOT_TGIDS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_HOT_SCOPES, 0);

/// A GPU runtime file being reported, from `mmap` entry to return.
#[map(name = "PENDING_GPU_MAPS")]
static PENDING_GPU_MAPS: HashMap<u32, PendingGpuMap> = HashMap::with_max_entries(1024, 0);

const PROT_EXEC: u64 = 4;
const SIGSTOP: u32 = 19;
const SIGCONT: u32 = 18;

/// match-proto: sched_process_exec(struct task_struct *p, pid_t old_pid,
/// struct linux_binprm *bprm); runs in the new image, before the dynamic
/// loader has mapped anything.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(_ctx: RawTracePointContext) -> i32 {
    emit_urgent(&ExecEvent { header: current_header(EventKind::Exec as u32) });
    0
}

/// syscalls:sys_enter_mmap; the syscall tracepoint layout is fixed by the
/// ABI: nr at 8, then six 8-byte arguments from 16 (prot at 32, fd at 48).
#[tracepoint(category = "syscalls", name = "sys_enter_mmap")]
pub fn mmap_exec(ctx: TracePointContext) -> u32 {
    // SAFETY: fixed syscall tracepoint layout.
    let prot: u64 = unsafe { ctx.read_at(32) }.unwrap_or(0);
    let fd: i64 = unsafe { ctx.read_at(48) }.unwrap_or(-1);
    if prot & PROT_EXEC == 0 || fd < 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    // A GPU runtime file is told by its name here, so that its report is
    // never held back by the coalescing below.
    if let Ok(pending) = gpu_file_to_report(fd as u64, pid_tgid) {
        let _ = PENDING_GPU_MAPS.insert(&(pid_tgid as u32), &pending, 0);
        return 0;
    }
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    // SAFETY: read-only map lookup.
    if let Some(last) = unsafe { MMAP_LAST.get(&tgid) } {
        // One event per window per process; userspace scans the maps after
        // a delay longer than the window (observer_common::discovery).
        if now.saturating_sub(*last) < MMAP_COALESCE_NS {
            return 0;
        }
    }
    let _ = MMAP_LAST.insert(&tgid, &now, 0);
    emit(&LibraryMapEvent { header: current_header(EventKind::LibraryMap as u32) });
    0
}

/// The file behind `fd` when its name is a GPU runtime's and userspace has
/// not handled its inode yet, or has but the process is selected for
/// hot-call probes (those are per process, so each selected process's
/// mapping is news).
///
/// match-proto: struct inode *file::f_inode; unsigned long inode::i_ino;
/// struct super_block *inode::i_sb; dev_t super_block::s_dev; struct dentry
/// *file::f_path.dentry; const unsigned char *dentry::d_name.name.
#[inline(always)]
fn gpu_file_to_report(fd: u64, pid_tgid: u64) -> Result<PendingGpuMap, i64> {
    let o = offsets();
    if o.have_vma == 0 || o.inode_i_sb == 0 {
        return Err(-1);
    }
    let file = current_fd_file(fd)?;
    let inode: *const u8 = read(file, o.file_f_inode)?;
    let ino: u64 = read(inode, o.inode_i_ino)?;
    let sb: *const u8 = read(inode, o.inode_i_sb)?;
    let dev: u32 = read(sb, o.super_block_s_dev)?;
    let key = GpuFileKey { dev, _pad: 0, ino };
    // SAFETY: read-only map lookup.
    let handled = unsafe { GPU_FILES_KNOWN.get(&key) }.copied();
    let known = handled.is_some();
    // A driver library's mapping is news for each process (KNOWN_DRIVER).
    if known && handled != Some(KNOWN_DRIVER) && !selected_for_hot_calls(pid_tgid) {
        return Err(0);
    }
    let dentry: *const u8 = read(file, o.file_f_path_dentry)?;
    let name_ptr: *const u8 = read(dentry, o.dentry_d_name_name)?;
    let mut pending = PendingGpuMap { key, fd: fd as i32, known: known as u32, name: [0; LIBRARY_NAME_LEN] };
    // SAFETY: reads a NUL-terminated kernel string into our buffer.
    unsafe { bpf_probe_read_kernel_str_bytes(name_ptr, &mut pending.name) }.map_err(|e| e as i64)?;
    if !GPU_LIBRARY_PREFIXES.iter().any(|p| starts_with(&pending.name, p)) {
        return Err(0);
    }
    Ok(pending)
}

/// Whether the current process is in a cgroup, or is a process, that
/// userspace selected for hot-call probes.
#[inline(always)]
fn selected_for_hot_calls(pid_tgid: u64) -> bool {
    // SAFETY: helper without arguments.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: read-only map lookups.
    unsafe { HOT_CGROUPS.get(&cgroup).is_some() || HOT_TGIDS.get(&((pid_tgid >> 32) as u32)).is_some() }
}

#[inline(always)]
fn starts_with(name: &[u8; LIBRARY_NAME_LEN], prefix: &[u8]) -> bool {
    if prefix.len() > name.len() {
        return false;
    }
    for i in 0..prefix.len() {
        if name[i] != prefix[i] {
            return false;
        }
    }
    true
}

/// syscalls:sys_exit_mmap (ret at 16): the mapping now exists, so userspace
/// finds it in /proc/PID/maps. With the hold enabled the process is stopped
/// before it returns to user space, and recorded in HELD_PIDS once the stop
/// is queued, so a watchdog that sees the entry can always resume it.
#[tracepoint(category = "syscalls", name = "sys_exit_mmap")]
pub fn mmap_exec_exit(ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: read-only map lookup; the value is copied out before removal.
    let Some(pending) = (unsafe { PENDING_GPU_MAPS.get(&tid) }).copied() else {
        return 0;
    };
    let _ = PENDING_GPU_MAPS.remove(&tid);
    // SAFETY: fixed syscall tracepoint layout.
    let ret: i64 = unsafe { ctx.read_at(16) }.unwrap_or(-1);
    if (-4095..0).contains(&ret) {
        return 0; // the mapping failed: nothing to probe
    }
    let header = current_header(EventKind::GpuMap as u32);
    let mut held = 0;
    let mut held_at_ns = 0;
    // The stop is queued before the record exists: whoever reads the
    // record (the daemon, its watchdog, the next daemon) and then sends
    // SIGCONT is sure to cancel a stop that has not landed yet, since
    // SIGCONT discards a pending SIGSTOP. Recorded first, a resume could
    // come between the two and the stop land after it, with no record
    // left to undo it.
    // SAFETY: signals the current process, which is a user task here.
    if (read_global(&HOLD_ENABLED) != 0 || in_held_cgroup(header.ts_boot_ns))
        && !has_controlling_tty()
        && unsafe { bpf_send_signal(SIGSTOP) } == 0
    {
        if HELD_PIDS.insert(&header.pid, &header.ts_boot_ns, 0).is_ok() {
            held = 1;
            held_at_ns = header.ts_boot_ns;
        } else {
            // Map full: a stop nobody could find must not land.
            // SAFETY: as above; SIGCONT discards the pending SIGSTOP.
            unsafe { bpf_send_signal(SIGCONT) };
        }
    }
    emit_urgent(&GpuMapEvent {
        header,
        key: pending.key,
        fd: pending.fd,
        held,
        held_at_ns,
        name: pending.name,
        known: pending.known,
        _pad: 0,
    });
    0
}

/// Whether the current process's cgroup, or one of its ancestors, is held
/// (see `hold_scope`: a chosen pod's cgroup exists before its containers').
/// Runs only for a GPU runtime mapping being reported, so the walk costs
/// nothing on hot paths.
///
/// match-proto: struct css_set *task_struct::cgroups; struct cgroup
/// *css_set::dfl_cgrp.
#[inline(always)]
fn in_held_cgroup(now: u64) -> bool {
    // SAFETY: helper without arguments.
    if holds(unsafe { bpf_get_current_cgroup_id() }, now) {
        return true;
    }
    let o = offsets();
    if o.have_task_cgroup == 0 || o.have_cgroup_tree == 0 {
        return false; // only the process's own cgroup can be told
    }
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let Ok(css_set) = read::<*const u8>(task, o.task_cgroups) else { return false };
    let Ok(mut cgroup) = read::<*const u8>(css_set, o.css_set_dfl_cgrp) else { return false };
    for _ in 0..HOLD_CGROUP_DEPTH {
        cgroup = match cgroup_parent(cgroup, &o) {
            Ok(parent) if !parent.is_null() => parent,
            _ => return false,
        };
        let Ok(id) = cgroup_id(cgroup, &o) else { return false };
        if holds(id, now) {
            return true;
        }
    }
    false
}

/// Whether the current process has a controlling terminal. Such a process
/// is never held: a shell's job control would see the stop.
///
/// match-proto: struct signal_struct *task_struct::signal; struct
/// tty_struct *signal_struct::tty.
#[inline(always)]
fn has_controlling_tty() -> bool {
    let o = offsets();
    if o.have_tty == 0 {
        return true; // cannot tell: do not hold
    }
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let Ok(signal) = read::<*const u8>(task, o.task_signal) else { return true };
    let tty: *const u8 = read(signal, o.signal_tty).unwrap_or(core::ptr::null());
    !tty.is_null()
}
