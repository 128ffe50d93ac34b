//! Run-queue latency per cgroup: time from a task becoming runnable (wakeup,
//! or preemption while still runnable) to it running, as log2 histograms in
//! a per-CPU hash keyed by cgroup id. Nothing leaves the kernel per event.
//!
//! These programs run on every wakeup and context switch of the node, so
//! only tasks of the cgroups canaryscope reports on (RUNQ_CGROUPS) pay for a
//! timestamp and a histogram update; every other task costs one cgroup-id
//! read and one failed lookup. The set follows cgroups as they are created
//! and removed, here in the kernel, so a new pod's first tasks are counted.
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_ktime_get_boot_ns, bpf_probe_read_kernel_str_bytes},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{HashMap, PerCpuHashMap},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use observer_common::{
    sched::{
        RunqHistogram, RunqWakeup, MAX_REPORTED_CGROUPS, MAX_RUNQ_CGROUPS, MAX_RUNQ_ROOTS, MAX_WAKEUPS,
        ROOT_PATH_LEN,
    },
    task::KernelOffsets,
};

use crate::{
    common::record_latency,
    kernel::{cgroup_id, cgroup_parent, field, offsets, read},
    offset,
};

/// Pending wakeups of reported tasks (tid -> when, and in which cgroup).
#[map(name = "RUNQ_WAKEUPS")]
static RUNQ_WAKEUPS: HashMap<u32, RunqWakeup> = HashMap::with_max_entries(MAX_WAKEUPS, 0);

#[map(name = "RUNQ_LATENCY")] // observer_common::sched::RUNQ_MAP
static RUNQ_LATENCY: PerCpuHashMap<u64, RunqHistogram> = PerCpuHashMap::with_max_entries(MAX_RUNQ_CGROUPS, 0);

#[map(name = "RUNQ_CGROUPS")] // observer_common::sched::RUNQ_CGROUPS_MAP
static RUNQ_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(MAX_REPORTED_CGROUPS, 0);

#[map(name = "RUNQ_ROOTS")] // observer_common::sched::RUNQ_ROOTS_MAP
static RUNQ_ROOTS: HashMap<[u8; ROOT_PATH_LEN], u8> = HashMap::with_max_entries(MAX_RUNQ_ROOTS, 0);

/// `TASK_RUNNING`: a task switched out in this state was preempted and is
/// still waiting for a CPU.
const TASK_RUNNING: u64 = 0;

#[inline(always)]
fn reported(cgroup: u64) -> bool {
    // SAFETY: read-only map lookup.
    unsafe { RUNQ_CGROUPS.get(&cgroup).is_some() }
}

#[inline(always)]
fn mark_runnable(task: *const u8, cgroup: u64) {
    if !reported(cgroup) {
        return;
    }
    let pid: i32 = field(task, offset!(task_pid));
    if pid == 0 {
        return; // the idle task (a reported root of `/`)
    }
    // SAFETY: helper without arguments.
    let since_ns = unsafe { bpf_ktime_get_boot_ns() };
    // A full map loses this wait, never the program.
    let _ = RUNQ_WAKEUPS.insert(&(pid as u32), &RunqWakeup { since_ns, cgroup_id: cgroup }, 0);
}

/// `task->cgroups->dfl_cgrp->kn->id` by direct loads from the typed task
/// pointer a BTF tracepoint gets: four loads, no helper calls, which is
/// most of what a task outside the reported cgroups costs.
#[inline(always)]
fn task_cgroup(task: *const u8) -> u64 {
    let css_set: *const u8 = field(task, offset!(task_cgroups));
    let cgroup: *const u8 = field(css_set, offset!(css_set_dfl_cgrp));
    let kn: *const u8 = field(cgroup, offset!(cgroup_kn));
    field(kn, offset!(kernfs_node_id))
}

#[inline(always)]
fn woken(task: *const u8) {
    if offset!(have_task_cgroup) == 0 {
        return;
    }
    mark_runnable(task, task_cgroup(task));
}

/// match-proto: sched_wakeup(struct task_struct *p).
#[btf_tracepoint(function = "sched_wakeup")]
pub fn sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    woken(ctx.arg::<*const u8>(0));
    0
}

/// match-proto: sched_wakeup_new(struct task_struct *p).
#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    woken(ctx.arg::<*const u8>(0));
    0
}

/// match-proto: sched_switch(bool preempt, struct task_struct *prev,
/// struct task_struct *next, unsigned int prev_state) — prev_state is the
/// 4th argument since 5.18 (6.1 .. 6.18 alike).
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    let prev = ctx.arg::<*const u8>(1);
    let next = ctx.arg::<*const u8>(2);
    let prev_state = ctx.arg::<u64>(3) & 0xffff_ffff;
    if prev_state == TASK_RUNNING {
        // The tracepoint fires before the switch: `prev` is still the
        // current task, whose cgroup a helper reads.
        // SAFETY: helper without arguments.
        mark_runnable(prev, unsafe { bpf_get_current_cgroup_id() });
    }
    let pid: i32 = field(next, offset!(task_pid));
    if pid == 0 {
        return 0;
    }
    let pid = pid as u32;
    // SAFETY: read-only map lookup; the value is copied out before removal.
    let Some(&wakeup) = (unsafe { RUNQ_WAKEUPS.get(&pid) }) else { return 0 };
    let _ = RUNQ_WAKEUPS.remove(&pid);
    // SAFETY: helper without arguments.
    let waited = unsafe { bpf_ktime_get_boot_ns() }.saturating_sub(wakeup.since_ns);
    record_latency(&RUNQ_LATENCY, &wakeup.cgroup_id, waited);
    0
}

/// The cgroup id of a `struct cgroup` on the unified hierarchy; `None` for
/// a v1 hierarchy's cgroup, whose ids are numbered apart and may equal a
/// reported cgroup2 id, and where BTF lacks the offsets to tell.
#[inline(always)]
fn unified_cgroup_id(cgroup: *const u8, o: &KernelOffsets) -> Result<Option<u64>, i64> {
    if o.have_cgroup_tree == 0 {
        return Ok(None);
    }
    let root: *const u8 = read(cgroup, o.cgroup_root)?;
    let hierarchy_id: i32 = read(root, o.cgroup_root_hierarchy_id)?;
    if hierarchy_id != 0 {
        return Ok(None);
    }
    cgroup_id(cgroup, o).map(Some)
}

/// A cgroup created under a reported one is reported too, before any task
/// can enter it.
///
/// match-proto: cgroup_mkdir(struct cgroup *cgrp, const char *path).
#[raw_tracepoint(tracepoint = "cgroup_mkdir")]
pub fn runq_cgroup_mkdir(ctx: RawTracePointContext) -> i32 {
    try_cgroup_mkdir(&ctx).unwrap_or(1)
}

fn try_cgroup_mkdir(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let o = offsets();
    let cgroup = ctx.arg::<u64>(0) as *const u8;
    let Some(id) = unified_cgroup_id(cgroup, &o)? else { return Ok(0) };
    let parent = cgroup_parent(cgroup, &o)?;
    if parent.is_null() {
        return Ok(0);
    }
    let parent_id = cgroup_id(parent, &o)?;
    if reported(parent_id) || is_root_path(ctx.arg::<u64>(1) as *const u8) {
        RUNQ_CGROUPS.insert(&id, &1, 0).map_err(|e| e as i64)?;
    }
    Ok(0)
}

/// Whether the new cgroup's path is one of the reported roots (a root made
/// after the daemon started: kubelet's first start, a solver slice).
#[inline(always)]
fn is_root_path(path: *const u8) -> bool {
    if path.is_null() {
        return false;
    }
    let mut key = [0u8; ROOT_PATH_LEN];
    // SAFETY: the helper reads at most the buffer's length and faults softly.
    if unsafe { bpf_probe_read_kernel_str_bytes(path, &mut key) }.is_err() {
        return false;
    }
    // SAFETY: read-only map lookup.
    unsafe { RUNQ_ROOTS.get(&key).is_some() }
}

/// A removed cgroup leaves the set (its id is never reused: kernfs ids grow).
///
/// match-proto: cgroup_rmdir(struct cgroup *cgrp, const char *path).
#[raw_tracepoint(tracepoint = "cgroup_rmdir")]
pub fn runq_cgroup_rmdir(ctx: RawTracePointContext) -> i32 {
    try_cgroup_rmdir(&ctx).unwrap_or(1)
}

fn try_cgroup_rmdir(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let Some(id) = unified_cgroup_id(ctx.arg::<u64>(0) as *const u8, &offsets())? else { return Ok(0) };
    let _ = RUNQ_CGROUPS.remove(&id);
    Ok(0)
}
