//! Run-queue latency per cgroup: time from a task becoming runnable (wakeup,
//! or preemption while still runnable) to it running, as log2 histograms in
//! a per-CPU hash keyed by cgroup id. Nothing leaves the kernel per event.
use aya_ebpf::{
    helpers::bpf_ktime_get_boot_ns,
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuHashMap},
    programs::RawTracePointContext,
};
use observer_common::sched::{RunqHistogram, MAX_RUNQ_CGROUPS, MAX_WAKEUPS};

use crate::{
    common::record_latency,
    kernel::{offsets, read, task_cgroup_id},
};

/// Wakeup timestamps per thread (tid -> boot ns).
#[map(name = "RUNQ_WAKEUPS")]
static RUNQ_WAKEUPS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_WAKEUPS, 0);

#[map(name = "RUNQ_LATENCY")] // observer_common::sched::RUNQ_MAP
static RUNQ_LATENCY: PerCpuHashMap<u64, RunqHistogram> = PerCpuHashMap::with_max_entries(MAX_RUNQ_CGROUPS, 0);

/// `TASK_RUNNING`: a task switched out in this state was preempted and is
/// still waiting for a CPU.
const TASK_RUNNING: u64 = 0;

#[inline(always)]
fn mark_runnable(task: *const u8) -> Result<(), i64> {
    let pid: i32 = read(task, offsets().task_pid)?;
    if pid == 0 {
        return Ok(()); // the idle task
    }
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    RUNQ_WAKEUPS.insert(&(pid as u32), &now, 0).map_err(|e| e as i64)
}

/// match-proto: sched_wakeup(struct task_struct *p).
#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn sched_wakeup(ctx: RawTracePointContext) -> i32 {
    mark_runnable(ctx.arg::<u64>(0) as *const u8).map(|_| 0).unwrap_or(1)
}

/// match-proto: sched_wakeup_new(struct task_struct *p).
#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: RawTracePointContext) -> i32 {
    mark_runnable(ctx.arg::<u64>(0) as *const u8).map(|_| 0).unwrap_or(1)
}

/// match-proto: sched_switch(bool preempt, struct task_struct *prev,
/// struct task_struct *next, unsigned int prev_state) — prev_state is the
/// 4th argument since 5.18 (6.1 .. 6.18 alike).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> i32 {
    try_sched_switch(&ctx).unwrap_or(1)
}

fn try_sched_switch(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let prev = ctx.arg::<u64>(1) as *const u8;
    let next = ctx.arg::<u64>(2) as *const u8;
    let prev_state = ctx.arg::<u64>(3) & 0xffff_ffff;
    if prev_state == TASK_RUNNING {
        mark_runnable(prev)?;
    }
    let o = offsets();
    let pid: i32 = read(next, o.task_pid)?;
    if pid == 0 {
        return Ok(0);
    }
    let pid = pid as u32;
    // SAFETY: read-only map lookup.
    let Some(&since) = (unsafe { RUNQ_WAKEUPS.get(&pid) }) else { return Ok(0) };
    let _ = RUNQ_WAKEUPS.remove(&pid);
    // SAFETY: helper without arguments.
    let waited = unsafe { bpf_ktime_get_boot_ns() }.saturating_sub(since);
    let cgroup = task_cgroup_id(next, &o)?;
    record_latency(&RUNQ_LATENCY, &cgroup, waited);
    Ok(0)
}
