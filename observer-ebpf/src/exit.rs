//! Abnormal exits, and who sent the signal that ended a process.
use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task,
    },
    macros::{map, raw_tracepoint},
    maps::LruHashMap,
    programs::RawTracePointContext,
};
use observer_common::{
    crash::CrashInfo,
    exit::{
        exit_signal, is_abnormal_exit, never_fatal,
        signal::{SIGKILL, SIGXCPU},
        ExitEvent, SignalOrigin, EXIT_FLAG_CRASH, EXIT_FLAG_OOM_VICTIM, EXIT_FLAG_ORIGIN, EXIT_FLAG_RUN,
        ORIGIN_FLAG_RLIMIT_CPU, RLIMIT_CPU, RLIMIT_SIZE, RLIM_INFINITY, SI_KERNEL, SI_NOINFO,
    },
    gpu::{Api, InflightKey},
    EventKind,
};

use crate::{
    common::{count_lost, current_header, EVENTS},
    crash::CRASHES,
    gpu::GPU_INFLIGHT,
    kernel::{offsets, read},
    oom::OOM_VICTIMS,
    runs::RUNS,
};

/// Where the last possibly fatal signal of each process came from, until
/// it exits (tgid -> origin). LRU: a process that caught its signals and
/// lives on must not keep a slot from the next one that dies.
#[map(name = "SIGNAL_ORIGINS")]
static SIGNAL_ORIGINS: LruHashMap<u32, SignalOrigin> = LruHashMap::with_max_entries(8192, 0);

/// `enum trace_signal_result` (include/trace/events/signal.h): the signal
/// was queued (with or without its siginfo). Ignored, already pending or
/// dropped signals cannot be the one that ends the process.
const TRACE_SIGNAL_DELIVERED: i32 = 0;
const TRACE_SIGNAL_LOSE_INFO: i32 = 4;
/// `kernel_siginfo`: si_signo, si_errno, si_code, then the union whose first
/// member for faults is `si_addr` (8-byte aligned).
pub(crate) const SIGINFO_CODE: u32 = 8;

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
    // A candidate run's exit is reported whatever its status.
    // SAFETY: read-only map lookup.
    let run_exec_ns = unsafe { RUNS.get(&tgid) }.copied().unwrap_or(0);
    if run_exec_ns != 0 {
        let _ = RUNS.remove(&tgid);
    }
    if !is_abnormal_exit(exit_code) && !oom_victim && run_exec_ns == 0 {
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
        (*ev).run_exec_ns = run_exec_ns;
        if run_exec_ns != 0 {
            (*ev).flags |= EXIT_FLAG_RUN;
        }
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
