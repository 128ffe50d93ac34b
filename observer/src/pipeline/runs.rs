//! Runs: what a person would call one run of a program, such as a solver
//! a worker starts for each job, from its exec to its exit.
//!
//! A run is a process that
//! - exec'd an executable its parent does not run, its parent being a
//!   process of the same cgroup (the kernel side notes only these, in the
//!   cgroups canaryscope reports on: `observer-ebpf/src/runs.rs`). So the
//!   container's first process and kubelet's exec probes, whose parent is
//!   the runtime's shim outside the container, are not runs; nor are a
//!   server's own workers, forked or spawned from its own executable;
//! - is not a shell (`sh -c` starts what it is given; that is the run);
//! - was started by a process of the container that is not a shell itself,
//!   directly or through shells: a shell that is the container's
//!   entrypoint starts the container's long-lived process, which is no run;
//! - is not inside another run: a solver's own helpers are part of its run.
//!
//! A process that execs again (`sh -c "exec z3 ..."`) is judged anew, and
//! its run begins at its last exec. The kernel reports the exit of every
//! candidate, normal ones included (`EXIT_FLAG_RUN`); a run's ending is its
//! exit status, the cause of its death, or a memory-limit refusal seen
//! before the end (`exit_cause::run_ending`).
use std::collections::HashMap;

use observer_common::{
    comm_str,
    exit::{exit_status, ExitEvent},
    runs::RunExecEvent,
};

use crate::{
    events::Detail,
    exit_cause::{run_ending, Cause, SenderScope},
};

/// Candidates whose exit was never seen (lost records) are forgotten past
/// this many; the kernel's own map holds as many.
const MAX_CANDIDATES: usize = observer_common::runs::MAX_RUNS as usize;
/// How far up through shells a candidate's starter is looked for.
const MAX_SHELLS: usize = 8;

/// Executables that only start what they are told to (base names).
const SHELLS: &[&str] =
    &["sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox", "fish", "tini", "dumb-init"];

fn is_shell(executable: &str) -> bool {
    SHELLS.contains(&executable)
}

/// One candidate, from its exec record.
#[derive(Clone, Debug)]
struct Candidate {
    ppid: u32,
    exec_ns: u64,
    executable: String,
    parent_executable: String,
    run: bool,
    /// A memory limit refused one of its allocations.
    refused: bool,
}

#[derive(Default)]
pub struct Runs {
    candidates: HashMap<u32, Candidate>,
}

impl Runs {
    /// A candidate exec'd: whether it is a run is decided now, while its
    /// parent's own record (if it was a candidate too) is still here.
    pub fn exec(&mut self, ev: &RunExecEvent) {
        let executable = comm_str(&ev.executable).to_string();
        let parent_executable = comm_str(&ev.parent_executable).to_string();
        let inside_run = self.candidates.get(&ev.ppid).is_some_and(|p| p.run);
        let run = !executable.is_empty()
            && !is_shell(&executable)
            && !inside_run
            && self.started_by_a_program(ev.ppid, &parent_executable);
        if self.candidates.len() >= MAX_CANDIDATES {
            self.candidates.clear();
        }
        let candidate = Candidate {
            ppid: ev.ppid,
            exec_ns: ev.header.ts_boot_ns,
            executable,
            parent_executable,
            run,
            refused: false,
        };
        self.candidates.insert(ev.header.pid, candidate);
    }

    /// Whether `parent` (running `executable`), or the first process above
    /// it that is not a shell, is a process of the container: a shell the
    /// kernel did not note as a candidate was started from outside it.
    fn started_by_a_program(&self, mut parent: u32, executable: &str) -> bool {
        let mut executable = executable.to_string();
        for _ in 0..MAX_SHELLS {
            if !is_shell(&executable) {
                return !executable.is_empty();
            }
            let Some(shell) = self.candidates.get(&parent) else { return false };
            (parent, executable) = (shell.ppid, shell.parent_executable.clone());
        }
        false
    }

    /// A memory limit refused an allocation of `pid`.
    pub fn refused(&mut self, pid: u32) {
        if let Some(c) = self.candidates.get_mut(&pid) {
            c.refused |= c.run;
        }
    }

    /// A candidate exited; its run's end when it was a run. `death`: the
    /// cause and sender of its death by signal, from its `exit` event.
    pub fn ended(&mut self, ev: &ExitEvent, death: Option<(Cause, Option<SenderScope>)>) -> Option<Detail> {
        let candidate = self.candidates.remove(&ev.header.pid)?;
        if !candidate.run {
            return None;
        }
        let start = if ev.run_exec_ns != 0 { ev.run_exec_ns } else { candidate.exec_ns };
        let status = exit_status(ev.exit_code);
        let signalled = death.is_some();
        Some(Detail::RunEnded {
            executable: candidate.executable,
            duration_ns: ev.header.ts_boot_ns.saturating_sub(start),
            ending: run_ending(status, death, candidate.refused),
            exit_code: if signalled { 0 } else { status as i32 },
        })
    }

    #[cfg(test)]
    fn is_run(&self, pid: u32) -> Option<bool> {
        self.candidates.get(&pid).map(|c| c.run)
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{exit::EXIT_FLAG_RUN, runs::EXECUTABLE_NAME_LEN, EventHeader};

    use super::*;
    use crate::exit_cause::RunEnding;

    fn name(s: &str) -> [u8; EXECUTABLE_NAME_LEN] {
        observer_common::path_key(s).expect("short")
    }

    fn exec(runs: &mut Runs, pid: u32, ppid: u32, exe: &str, parent: &str, at: u64) {
        let header = EventHeader { pid, tid: pid, ts_boot_ns: at, ..Default::default() };
        let ev =
            RunExecEvent { header, ppid, executable: name(exe), parent_executable: name(parent), _pad: 0 };
        runs.exec(&ev);
    }

    fn exit(pid: u32, exit_code: u32, at: u64, exec_at: u64) -> ExitEvent {
        let mut ev =
            ExitEvent { exit_code, flags: EXIT_FLAG_RUN, run_exec_ns: exec_at, ..Default::default() };
        ev.header.pid = pid;
        ev.header.ts_boot_ns = at;
        ev
    }

    #[test]
    fn a_worker_s_solver_is_a_run_through_shells_too() {
        let mut runs = Runs::default();
        // python worker (pid 10, not a candidate: the container's first process).
        exec(&mut runs, 20, 10, "z3", "python3.11", 100);
        assert_eq!(runs.is_run(20), Some(true));
        // worker -> sh -c "z3 ..." -> z3.
        exec(&mut runs, 30, 10, "dash", "python3.11", 200);
        exec(&mut runs, 31, 30, "z3", "dash", 210);
        assert_eq!((runs.is_run(30), runs.is_run(31)), (Some(false), Some(true)));
        // The run's own helper is part of it.
        exec(&mut runs, 40, 20, "cat", "z3", 300);
        assert_eq!(runs.is_run(40), Some(false));
        let ended = runs.ended(&exit(20, 0, 1_100, 100), None);
        let Some(Detail::RunEnded { executable, duration_ns, ending, .. }) = ended else {
            panic!("{ended:?}")
        };
        assert_eq!((executable.as_str(), duration_ns, ending), ("z3", 1_000, RunEnding::ExitZero));
        assert!(runs.ended(&exit(40, 0, 400, 300), None).is_none(), "no run");
    }

    #[test]
    fn an_entrypoint_shell_and_a_probes_shell_start_no_run() {
        let mut runs = Runs::default();
        // bash (pid 1, the entrypoint: no candidate) -> python worker.
        exec(&mut runs, 2, 1, "python3.11", "bash", 10);
        assert_eq!(runs.is_run(2), Some(false));
        // kubelet's exec probe: sh (outside: no candidate) -> cat.
        exec(&mut runs, 50, 49, "cat", "sh", 20);
        assert_eq!(runs.is_run(50), Some(false));
        // The worker started from the shell is the container's long-lived
        // process; what it starts is a run.
        exec(&mut runs, 3, 2, "z3", "python3.11", 30);
        assert_eq!(runs.is_run(3), Some(true));
    }

    #[test]
    fn endings_come_from_the_status_the_death_and_refusals() {
        let mut runs = Runs::default();
        exec(&mut runs, 20, 10, "z3", "python3", 0);
        runs.refused(20);
        let ended = runs.ended(&exit(20, 101 << 8, 50, 0), None);
        assert!(matches!(
            ended,
            Some(Detail::RunEnded { ending: RunEnding::MemoryLimit, exit_code: 101, .. })
        ));
        exec(&mut runs, 21, 10, "z3", "python3", 0);
        let death = Some((Cause::Sent, Some(SenderScope::SameContainer)));
        let ended = runs.ended(&exit(21, 9, 50, 0), death);
        assert!(matches!(ended, Some(Detail::RunEnded { ending: RunEnding::Sent, exit_code: 0, .. })));
        exec(&mut runs, 22, 10, "z3", "python3", 0);
        let ended = runs.ended(&exit(22, 2 << 8, 50, 0), None);
        assert!(matches!(ended, Some(Detail::RunEnded { ending: RunEnding::ExitNonzero, exit_code: 2, .. })));
        // A re-exec begins the run again (sh -c "exec z3 ...").
        exec(&mut runs, 23, 10, "dash", "python3", 0);
        exec(&mut runs, 23, 10, "z3", "python3", 70);
        let ended = runs.ended(&exit(23, 0, 100, 70), None);
        assert!(matches!(ended, Some(Detail::RunEnded { duration_ns: 30, .. })), "{ended:?}");
    }
}
