//! Runs: a pod's process that exec'd an executable its parent does not run
//! (a worker starting a solver), noted at the exec so that its exit is
//! reported whatever its status (`exit.rs`). Userspace decides which of
//! these candidates are runs (shells and the programs they start for the
//! container's entrypoint are not).
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_task, bpf_probe_read_kernel_str_bytes},
    macros::{map, raw_tracepoint},
    maps::LruHashMap,
    programs::RawTracePointContext,
};
use observer_common::{
    runs::{RunExecEvent, EXECUTABLE_NAME_LEN, MAX_RUNS},
    EventKind,
};

use crate::{
    common::{count_lost, current_header, EVENTS},
    kernel::{cgroup_id, offsets, read},
    sched::reported,
};

/// Candidates from exec to exit: tgid -> boot ns of the exec.
#[map(name = "RUNS")] // observer_common::runs::RUNS_MAP
pub(crate) static RUNS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_RUNS, 0);

/// match-proto: sched_process_exec(struct task_struct *p, pid_t old_pid,
/// struct linux_binprm *bprm); the current task, in its new image.
///
/// match-proto: struct task_struct *task_struct::real_parent; struct
/// mm_struct *task_struct::mm; struct file *mm_struct::exe_file (__rcu).
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn run_exec(_ctx: RawTracePointContext) -> i32 {
    try_run_exec().unwrap_or(1)
}

fn try_run_exec() -> Result<i32, i64> {
    let o = offsets();
    if o.have_exe == 0 || o.have_task_cgroup == 0 {
        return Ok(0);
    }
    // SAFETY: helper without arguments.
    let cgroup = unsafe { bpf_get_current_cgroup_id() };
    if !reported(cgroup) {
        return Ok(0);
    }
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let parent: *const u8 = read(task, o.task_real_parent)?;
    // The container's first process and kubelet's exec probes are started
    // from outside the container (the runtime's shim): not runs.
    let css_set: *const u8 = read(parent, o.task_cgroups)?;
    let parent_cgroup = cgroup_id(read(css_set, o.css_set_dfl_cgrp)?, &o)?;
    if parent_cgroup != cgroup {
        return Ok(0);
    }
    let exe = exe_file(task)?;
    let parent_exe = exe_file(parent).unwrap_or(core::ptr::null());
    // A server's own workers run its executable (a fork, or Python's
    // multiprocessing spawning Python): not runs.
    if !parent_exe.is_null() && same_file(exe, parent_exe) {
        return Ok(0);
    }
    let header = current_header(EventKind::RunExec as u32);
    RUNS.insert(&header.pid, &header.ts_boot_ns, 0).map_err(|e| e as i64)?;
    let Some(mut slot) = EVENTS.reserve::<RunExecEvent>(0) else {
        count_lost();
        return Ok(0);
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at reserved ring-buffer memory of the right size;
    // fields are written in place to keep the stack small.
    unsafe {
        (*ev).header = header;
        (*ev).ppid = read(parent, o.task_tgid).unwrap_or(0);
        (*ev)._pad = 0;
        (*ev).executable = [0; EXECUTABLE_NAME_LEN];
        (*ev).parent_executable = [0; EXECUTABLE_NAME_LEN];
        let _ = file_name(exe, &mut (*ev).executable);
        if !parent_exe.is_null() {
            let _ = file_name(parent_exe, &mut (*ev).parent_executable);
        }
    }
    slot.submit(0);
    Ok(0)
}

/// `task->mm->exe_file`; an error for a task without an mm.
#[inline(always)]
fn exe_file(task: *const u8) -> Result<*const u8, i64> {
    let o = offsets();
    let mm: *const u8 = read(task, o.task_mm)?;
    let file: *const u8 = read(mm, o.mm_exe_file)?;
    if file.is_null() {
        return Err(-1);
    }
    Ok(file)
}

/// Whether two open files are the same file (one inode).
#[inline(always)]
fn same_file(a: *const u8, b: *const u8) -> bool {
    let o = offsets();
    match (read::<*const u8>(a, o.file_f_inode), read::<*const u8>(b, o.file_f_inode)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// The base name of an open file, NUL-terminated into `out`.
///
/// match-proto: struct dentry *file::f_path.dentry; const unsigned char
/// *dentry::d_name.name.
#[inline(always)]
fn file_name(file: *const u8, out: &mut [u8; EXECUTABLE_NAME_LEN]) -> Result<(), i64> {
    let o = offsets();
    let dentry: *const u8 = read(file, o.file_f_path_dentry)?;
    let name: *const u8 = read(dentry, o.dentry_d_name_name)?;
    // SAFETY: reads a NUL-terminated kernel string into our buffer.
    unsafe { bpf_probe_read_kernel_str_bytes(name, out) }.map(|_| ()).map_err(|e| e as i64)
}
