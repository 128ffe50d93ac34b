//! Process deaths: abnormal exits, OOM kills, native crashes.
use core::ffi::c_void;

use aya_ebpf::{
    helpers::{
        bpf_find_vma, bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_task, bpf_get_current_task_btf, bpf_probe_read_kernel_str_bytes, bpf_task_pt_regs,
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::{RawTracePointContext, TracePointContext},
};
use observer_common::task::signal::{SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGKILL, SIGSEGV, SIGXCPU};
use observer_common::{
    gpu::{Api, InflightKey},
    task::{
        exit_signal, in_call_api_code, is_abnormal_exit, never_fatal, CrashInfo, ExitEvent, IpMapping,
        OomVictimEvent, OomVictimInfo, SignalOrigin, EXIT_FLAG_CRASH, EXIT_FLAG_OOM_VICTIM, EXIT_FLAG_ORIGIN,
        LIBRARY_NAME_LEN, ORIGIN_FLAG_RLIMIT_CPU, RLIMIT_CPU, RLIMIT_SIZE, RLIM_INFINITY, SI_KERNEL,
        SI_KERNEL_FAULT_MIN, SI_NOINFO,
    },
    EventKind,
};

use crate::{
    common::{count_lost, current_header, emit, EVENTS},
    gpu::{frame_slot, GPU_INFLIGHT},
    kernel::{offsets, read},
};

/// Victims marked by the OOM killer, until they exit (tid -> info).
#[map(name = "OOM_VICTIMS")]
static OOM_VICTIMS: HashMap<u32, OomVictimInfo> = HashMap::with_max_entries(1024, 0);

/// Last fatal synchronous signal per process, until it exits (tgid -> crash).
#[map(name = "CRASHES")]
static CRASHES: HashMap<u32, CrashInfo> = HashMap::with_max_entries(4096, 0);

/// Where the last possibly fatal signal of each process came from, until
/// it exits (tgid -> origin). LRU: a process that caught its signals and
/// lives on must not keep a slot from the next one that dies.
#[map(name = "SIGNAL_ORIGINS")]
static SIGNAL_ORIGINS: LruHashMap<u32, SignalOrigin> = LruHashMap::with_max_entries(8192, 0);

/// Scratch space: a CrashInfo is too big to build on the 512-byte stack
/// next to everything else.
#[map(name = "CRASH_SCRATCH")]
static CRASH_SCRATCH: PerCpuArray<CrashInfo> = PerCpuArray::with_max_entries(1, 0);

/// `enum trace_signal_result` (include/trace/events/signal.h): the signal
/// was queued (with or without its siginfo). Ignored, already pending or
/// dropped signals cannot be the one that ends the process.
const TRACE_SIGNAL_DELIVERED: i32 = 0;
const TRACE_SIGNAL_LOSE_INFO: i32 = 4;
/// x86-64 `struct pt_regs`: ip follows r15..r8, ax, cx, dx, si, di, orig_ax.
const PT_REGS_IP: u32 = 16 * 8;
/// `kernel_siginfo`: si_signo, si_errno, si_code, then the union whose first
/// member for faults is `si_addr` (8-byte aligned).
const SIGINFO_CODE: u32 = 8;
const SIGINFO_ADDR: u32 = 16;

/// match-proto: TP_PROTO(int sig, struct kernel_siginfo *info,
/// struct task_struct *task, int group, int result), 5.10 .. 6.18.
///
/// Who generated a possibly fatal signal, for telling later who ended the
/// process. Apart from the crash program below because it needs nothing
/// newer than the ring buffer: it runs on every kernel of the matrix.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_origin(ctx: RawTracePointContext) -> i32 {
    try_signal_origin(&ctx).unwrap_or(1)
}

fn try_signal_origin(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let sig: i32 = ctx.arg::<u64>(0) as i32;
    if never_fatal(sig) {
        return Ok(0);
    }
    let info = ctx.arg::<u64>(1) as *const u8;
    let result = ctx.arg::<u64>(4) as i32;
    if result != TRACE_SIGNAL_DELIVERED && result != TRACE_SIGNAL_LOSE_INFO {
        return Ok(0);
    }
    // The special siginfo pointers: SEND_SIG_NOINFO (0) and SEND_SIG_PRIV (1).
    let origin_code = match info as u64 {
        0 => SI_NOINFO,
        1 => SI_KERNEL,
        _ => read(info, SIGINFO_CODE).unwrap_or(0),
    };
    record_origin(sig, origin_code, ctx.arg::<u64>(2) as *const u8)?;
    Ok(0)
}

/// match-proto: TP_PROTO(int sig, struct kernel_siginfo *info,
/// struct task_struct *task, int group, int result), 5.10 .. 6.18.
///
/// A fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE) is generated in the faulting
/// thread's own context, and so is abort()'s SIGABRT (tgkill to itself):
/// the address space is still intact here, unlike at exit, so this is where
/// the faulting instruction's mapping is looked up. Needs Linux 5.17
/// (`observer::probes::table::CRASH_HELPERS`); `signal_generate_stack` is
/// the shape for older kernels.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate(ctx: RawTracePointContext) -> i32 {
    try_crash::<true>(&ctx).unwrap_or(1)
}

/// The crash program of kernels before 5.17: the user registers are read
/// where the kernel keeps them, at the top of the thread's kernel stack,
/// and no mapping is looked up (userspace resolves the address against the
/// process's code ranges, as for any crash the kernel could not place). Only
/// helpers of 5.8 and before.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate_stack(ctx: RawTracePointContext) -> i32 {
    try_crash::<false>(&ctx).unwrap_or(1)
}

/// x86-64 without KASAN: `THREAD_SIZE` (16 KiB) and `struct pt_regs` (21
/// registers); `task_pt_regs(task)` is the last pt_regs below the stack's
/// top (`TOP_OF_KERNEL_STACK_PADDING` is 0 on x86-64 before FRED, 6.9).
const THREAD_SIZE: u64 = 16 * 1024;
const PT_REGS_SIZE: u64 = 21 * 8;

/// `FIND_VMA`: the kernel has `bpf_task_pt_regs` and `bpf_find_vma`; the
/// other instance calls neither, so it loads where they do not exist.
#[inline(always)]
fn try_crash<const FIND_VMA: bool>(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let sig: i32 = ctx.arg::<u64>(0) as i32;
    let target = ctx.arg::<u64>(2);
    let info = ctx.arg::<u64>(1) as *const u8;
    let si_code: i32 = if (info as u64) > 1 { read(info, SIGINFO_CODE).unwrap_or(0) } else { 0 };
    if !matches!(sig, SIGSEGV | SIGBUS | SIGILL | SIGFPE | SIGABRT) {
        return Ok(0);
    }
    // SAFETY: helper without pointer arguments.
    let current = unsafe { bpf_get_current_task() };
    if target != current {
        return Ok(0); // sent by someone else: not a crash of the target's code
    }
    if sig != SIGABRT && si_code < SI_KERNEL_FAULT_MIN {
        return Ok(0); // a self-sent SIGSEGV is not a fault
    }
    let crash = CRASH_SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    // SAFETY: per-CPU scratch slot, only this program on this CPU uses it.
    let crash = unsafe { &mut *crash };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    crash.signal = sig;
    crash.si_code = si_code;
    crash.addr = if sig != SIGABRT && (info as u64) > 1 { read(info, SIGINFO_ADDR).unwrap_or(0) } else { 0 };
    crash.tid = tid;
    let regs = if FIND_VMA {
        // The verifier wants a BTF-typed task for this helper; this is the
        // same task as `current`.
        // SAFETY: helper without arguments, then a trusted task pointer.
        unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8 }
    } else {
        let stack: *const u8 = read(current as *const u8, offsets().task_stack)?;
        stack.wrapping_add((THREAD_SIZE - PT_REGS_SIZE) as usize)
    };
    crash.ip = read(regs, PT_REGS_IP).unwrap_or(0);

    crash.in_call_api = 0;
    // The innermost API wins: a crash inside hipMalloc called by cuMemAlloc
    // is reported as hipMalloc (the CUDA frame is visible in the library).
    for api in Api::ALL {
        let key = InflightKey { tid, api: api as u32 };
        // SAFETY: read-only access to a map value.
        if let Some(stack) = unsafe { GPU_INFLIGHT.get(&key) } {
            let (slot, valid) = frame_slot(&stack.depth, 1);
            if stack.depth == 0 || !valid {
                continue;
            }
            let frame = stack.frames[slot];
            crash.in_call_api = in_call_api_code(api);
            crash.in_call_function = frame.function;
            break;
        }
    }

    crash.ip_mapping = if FIND_VMA { IpMapping::Unknown } else { IpMapping::NotLookedUp } as u32;
    crash.file_name = [0; LIBRARY_NAME_LEN];
    if FIND_VMA && offsets().have_vma != 0 && crash.ip != 0 {
        // The helper only accepts a stack pointer as the callback's context.
        let mut found = VmaFound {
            mapping: IpMapping::Unknown as u32,
            start: 0,
            pgoff: 0,
            ino: 0,
            name: [0; LIBRARY_NAME_LEN],
        };
        // SAFETY: `vma_found` is a BPF callback with the signature the
        // helper requires; `found` lives on this stack for the whole call.
        unsafe {
            bpf_find_vma(
                bpf_get_current_task_btf(),
                crash.ip,
                vma_found as *mut c_void,
                (&mut found as *mut VmaFound).cast::<c_void>(),
                0,
            )
        };
        crash.ip_mapping = found.mapping;
        crash.vma_start = found.start;
        crash.vma_pgoff = found.pgoff;
        crash.file_ino = found.ino;
        crash.file_name = found.name;
    }
    let tgid = (pid_tgid >> 32) as u32;
    CRASHES.insert(&tgid, crash, 0).map_err(|e| e as i64)?;
    Ok(0)
}

/// Notes who generated `sig` for `target`'s process: the current task,
/// taken now because the sender may exit before its target does.
#[inline(always)]
fn record_origin(sig: i32, si_code: i32, target: *const u8) -> Result<(), i64> {
    let o = offsets();
    if o.task_tgid == 0 {
        return Err(-1);
    }
    let target_tgid: u32 = read(target, o.task_tgid)?;
    let pid_tgid = bpf_get_current_pid_tgid();
    let mut flags = 0;
    // RLIMIT_CPU's signals are the kernel's own (SEND_SIG_PRIV): SIGXCPU at
    // the soft limit, SIGKILL at the hard one (kernel/time/posix-cpu-timers.c,
    // check_process_timers). A SIGKILL of the kernel is a CPU-limit kill only
    // if the process had a finite limit, which is read here.
    if si_code == SI_KERNEL && (sig == SIGKILL || sig == SIGXCPU) && o.have_rlimit != 0 {
        let signal: *const u8 = read(target, o.task_signal)?;
        let cur: u64 = read(signal, o.signal_rlim + RLIMIT_CPU * RLIMIT_SIZE)?;
        if cur != RLIM_INFINITY {
            flags |= ORIGIN_FLAG_RLIMIT_CPU;
        }
    }
    let origin = SignalOrigin {
        signal: sig,
        si_code,
        sender_tgid: (pid_tgid >> 32) as u32,
        flags,
        // SAFETY: helper without pointer arguments.
        sender_cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        sender_comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    SIGNAL_ORIGINS.insert(&target_tgid, &origin, 0).map_err(|e| e as i64)
}

#[repr(C)]
struct VmaFound {
    /// An `IpMapping` as a number, as `CrashInfo::ip_mapping` stores it.
    mapping: u32,
    start: u64,
    pgoff: u64,
    ino: u64,
    name: [u8; LIBRARY_NAME_LEN],
}

/// `bpf_find_vma` callback: records which file backs the faulting address.
///
/// match-proto: unsigned long vm_area_struct::vm_start, vm_pgoff; struct file
/// *vm_area_struct::vm_file; struct inode *file::f_inode; struct path
/// file::f_path (dentry first); unsigned long inode::i_ino; struct qstr
/// dentry::d_name (name pointer).
#[inline(never)]
extern "C" fn vma_found(_task: *mut c_void, vma: *mut c_void, data: *mut c_void) -> i64 {
    let o = offsets();
    let vma = vma as *const u8;
    // SAFETY: `data` is the VmaFound passed to bpf_find_vma above.
    let found = unsafe { &mut *(data as *mut VmaFound) };
    found.start = read(vma, o.vma_vm_start).unwrap_or(0);
    found.pgoff = read(vma, o.vma_vm_pgoff).unwrap_or(0);
    let file: *const u8 = read(vma, o.vma_vm_file).unwrap_or(core::ptr::null());
    if file.is_null() {
        found.mapping = IpMapping::Anonymous as u32; // JIT code or a wild jump
        return 0;
    }
    let inode: *const u8 = read(file, o.file_f_inode).unwrap_or(core::ptr::null());
    found.ino = read(inode, o.inode_i_ino).unwrap_or(0);
    let dentry: *const u8 = read(file, o.file_f_path_dentry).unwrap_or(core::ptr::null());
    let name: *const u8 = read(dentry, o.dentry_d_name_name).unwrap_or(core::ptr::null());
    if !name.is_null() {
        // SAFETY: reads a NUL-terminated kernel string into our buffer.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(name, &mut found.name) };
    }
    found.mapping = IpMapping::File as u32;
    0
}

/// match-proto: oom:mark_victim; `pid` at a tracefs-given offset, and on
/// 6.9+ (and recent 6.1.y) `anon_rss` (kB) too. Runs in the killer's context.
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(ctx: TracePointContext) -> u32 {
    try_oom_mark_victim(&ctx).unwrap_or(1)
}

fn try_oom_mark_victim(ctx: &TracePointContext) -> Result<u32, i64> {
    let o = offsets();
    // SAFETY: offsets come from the running kernel's tracefs format file.
    let victim: i32 = unsafe { ctx.read_at(o.mark_victim_pid as usize) }.map_err(|e| e as i64)?;
    let anon_rss_kb: u64 = if o.mark_victim_anon_rss != 0 {
        unsafe { ctx.read_at(o.mark_victim_anon_rss as usize) }.unwrap_or(0)
    } else {
        0
    };
    let header = current_header(EventKind::OomVictim as u32);
    let info = OomVictimInfo { anon_rss_kb };
    let victim = victim as u32;
    OOM_VICTIMS.insert(&victim, &info, 0).map_err(|e| e as i64)?;
    emit(&OomVictimEvent { header, victim_pid: victim, _pad: 0, anon_rss_kb });
    Ok(0)
}

/// match-proto: sched_process_exit(struct task_struct *p[, bool group_dead]);
/// always the current task. `task->exit_code` is set before this fires
/// (do_exit), and the mm is already gone, so crash details were saved at
/// signal time.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(ctx: RawTracePointContext) -> i32 {
    try_process_exit(&ctx).unwrap_or(1)
}

fn try_process_exit(_ctx: &RawTracePointContext) -> Result<i32, i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    let tgid = (pid_tgid >> 32) as u32;
    // A thread that dies mid-call never returns: drop its in-flight frames
    // here so the map cannot fill with dead threads.
    for api in Api::ALL {
        let _ = GPU_INFLIGHT.remove(&InflightKey { tid, api: api as u32 });
    }
    // Plain values rather than an Option of a struct: LLVM otherwise spills
    // the undefined payload of `None`, which the verifier rejects.
    // SAFETY: read-only map lookup.
    let (oom_victim, oom_rss_kb) = match unsafe { OOM_VICTIMS.get(&tid) } {
        Some(info) => (true, info.anon_rss_kb),
        None => (false, 0),
    };
    if oom_victim {
        let _ = OOM_VICTIMS.remove(&tid);
    }
    if tid != tgid {
        return Ok(0); // the process's status is reported once, by its leader
    }
    let o = offsets();
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let exit_code: i32 = read(task, o.task_exit_code)?;
    let exit_code = exit_code as u32;
    // SAFETY: read-only map lookup.
    let crash = unsafe { CRASHES.get(&tgid) };
    // Copied out before the slot is freed: an LRU map hands freed slots to
    // the next insert at once. Plain values, as for the OOM victim above.
    // SAFETY: read-only map lookup.
    let (have_origin, origin) = match unsafe { SIGNAL_ORIGINS.get(&tgid) } {
        Some(o) => (true, *o),
        None => (false, SignalOrigin::default()),
    };
    if have_origin {
        let _ = SIGNAL_ORIGINS.remove(&tgid);
    }
    if !is_abnormal_exit(exit_code) && !oom_victim {
        if crash.is_some() {
            let _ = CRASHES.remove(&tgid);
        }
        return Ok(0);
    }
    let Some(mut slot) = EVENTS.reserve::<ExitEvent>(0) else {
        count_lost();
        return Ok(0);
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at reserved ring-buffer memory of the right size;
    // fields are written in place to keep the stack small.
    unsafe {
        (*ev).header = current_header(EventKind::Exit as u32);
        (*ev).exit_code = exit_code;
        (*ev).flags = 0;
        (*ev).oom_anon_rss_kb = 0;
        (*ev).crash = CrashInfo::default();
        if oom_victim {
            (*ev).flags |= EXIT_FLAG_OOM_VICTIM;
            (*ev).oom_anon_rss_kb = oom_rss_kb;
        }
        if let Some(crash) = crash {
            if crash.signal as u32 == exit_signal(exit_code) {
                (*ev).flags |= EXIT_FLAG_CRASH;
                (*ev).crash = *crash;
            }
        }
        (*ev).origin = SignalOrigin::default();
        if have_origin && origin.signal as u32 == exit_signal(exit_code) {
            (*ev).flags |= EXIT_FLAG_ORIGIN;
            (*ev).origin = origin;
        }
    }
    slot.submit(0);
    if crash.is_some() {
        let _ = CRASHES.remove(&tgid);
    }
    Ok(0)
}
