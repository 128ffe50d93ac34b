//! Run-queue latency per cgroup: time from a task becoming runnable (woken,
//! or preempted while still runnable) to it running, as log2 histograms in
//! a per-CPU hash keyed by cgroup id. Nothing leaves the kernel per event.
//!
//! The scheduler already times every wait (CONFIG_SCHED_INFO, the
//! `run_delay` of /proc/PID/schedstat): it stamps `sched_info.last_queued`
//! with its run queue's clock when a task is queued and clears it when the
//! task runs. The tracepoint fires just before that, so the wait is the run
//! queue's clock now minus the stamp. One program on `sched_switch` is all
//! it takes: no wakeup hooks and no per-task map, which halves the programs
//! every wakeup and context switch of the node runs.
//!
//! Only tasks of the cgroups canaryscope reports on (RUNQ_CGROUPS) get a
//! histogram update; every other task being switched in costs its cgroup id
//! (four direct loads) and one failed lookup. The set follows cgroups as
//! they are created and removed, here in the kernel, so a new pod's first
//! tasks are counted.
use aya_ebpf::{
    helpers::bpf_probe_read_kernel_str_bytes,
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{HashMap, PerCpuHashMap},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use observer_common::sched::{
    RunqHistogram, MAX_REPORTED_CGROUPS, MAX_RUNQ_CGROUPS, MAX_RUNQ_ROOTS, ROOT_PATH_LEN,
};

use crate::{
    common::record_latency,
    kernel::{cgroup_id, cgroup_parent, field, offsets, unified_cgroup_id},
    offset,
};

#[map(name = "RUNQ_LATENCY")] // observer_common::sched::RUNQ_MAP
static RUNQ_LATENCY: PerCpuHashMap<u64, RunqHistogram> = PerCpuHashMap::with_max_entries(MAX_RUNQ_CGROUPS, 0);

#[map(name = "RUNQ_CGROUPS")] // observer_common::sched::RUNQ_CGROUPS_MAP
static RUNQ_CGROUPS: HashMap<u64, u8> = HashMap::with_max_entries(MAX_REPORTED_CGROUPS, 0);

#[map(name = "RUNQ_ROOTS")] // observer_common::sched::RUNQ_ROOTS_MAP
static RUNQ_ROOTS: HashMap<[u8; ROOT_PATH_LEN], u8> = HashMap::with_max_entries(MAX_RUNQ_ROOTS, 0);

/// Whether a cgroup is one canaryscope reports on (also the runs' scope).
#[inline(always)]
pub(crate) fn reported(cgroup: u64) -> bool {
    // SAFETY: read-only map lookup.
    unsafe { RUNQ_CGROUPS.get(&cgroup).is_some() }
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

/// match-proto: sched_switch(bool preempt, struct task_struct *prev,
/// struct task_struct *next, unsigned int prev_state) — `next` is the 3rd
/// argument in every kernel with BTF tracepoints.
///
/// match-proto: unsigned long long sched_info::last_queued (CONFIG_SCHED_INFO);
/// struct cfs_rq *sched_entity::cfs_rq (CONFIG_FAIR_GROUP_SCHED, set for
/// every task whatever its class: `set_task_rq`); struct rq *cfs_rq::rq;
/// u64 rq::clock (updated by `__schedule` before the tracepoint).
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> i32 {
    if offset!(have_run_delay) == 0 || offset!(have_task_cgroup) == 0 {
        return 0;
    }
    let next = ctx.arg::<*const u8>(2);
    let cgroup = task_cgroup(next);
    if !reported(cgroup) {
        return 0;
    }
    // Zero for a task that was not queued (the idle task, a task switched
    // in again after the stamp was consumed).
    let queued: u64 = field(next, offset!(task_last_queued));
    if queued == 0 {
        return 0;
    }
    let cfs_rq: *const u8 = field(next, offset!(task_se_cfs_rq));
    let rq: *const u8 = field(cfs_rq, offset!(cfs_rq_rq));
    let now: u64 = field(rq, offset!(rq_clock));
    record_latency(&RUNQ_LATENCY, &cgroup, now.saturating_sub(queued));
    0
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
