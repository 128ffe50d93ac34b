//! Runs: a program a pod's process started (exec) until it exits, such as
//! a solver run under a worker. The kernel side notes each candidate at its
//! exec and reports its exit whatever the status; userspace decides which
//! candidates are runs (see `observer/src/pipeline/runs.rs`).

use crate::discovery::LIBRARY_NAME_LEN;

/// Candidates for a run, from their exec to their exit: LRU tgid -> boot
/// time of the exec (ns). A candidate is a process of a reported cgroup
/// (the run-queue scope: pods and `--cgroup` prefixes) whose parent is in
/// the same cgroup and ran another executable. An LRU map: a candidate
/// whose exit was missed must not keep its slot from the next.
pub const RUNS_MAP: &str = "RUNS";
pub const MAX_RUNS: u32 = 8192;

/// Longest executable base name a record carries (with its NUL).
pub const EXECUTABLE_NAME_LEN: usize = LIBRARY_NAME_LEN;

/// A candidate run began: its process exec'd a new executable
/// (`sched_process_exec`). Its exit follows as an
/// [`ExitEvent`](crate::exit::ExitEvent) with
/// [`EXIT_FLAG_RUN`](crate::exit::EXIT_FLAG_RUN), normal exits included.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RunExecEvent {
    pub header: crate::EventHeader,
    /// The parent's tgid (`task->real_parent`).
    pub ppid: u32,
    pub _pad: u32,
    /// Base name of the new executable (`mm->exe_file`), NUL-padded.
    pub executable: [u8; EXECUTABLE_NAME_LEN],
    /// Base name of the parent's executable, NUL-padded.
    pub parent_executable: [u8; EXECUTABLE_NAME_LEN],
}

impl Default for RunExecEvent {
    fn default() -> Self {
        Self {
            header: crate::EventHeader::default(),
            ppid: 0,
            _pad: 0,
            executable: [0; EXECUTABLE_NAME_LEN],
            parent_executable: [0; EXECUTABLE_NAME_LEN],
        }
    }
}
