//! Hot-call selection: which processes get the hot tier of GPU functions
//! (launches, asynchronous copies, error polling) as per-process uprobes.
//!
//! A per-process uprobe makes the kernel write its breakpoint into that
//! process's memory only, so a process nobody selected runs its launches
//! at full speed. The cold tier (init, allocation, synchronisation) stays
//! probed everywhere, and the errors of asynchronous work surface there.
//!
//! This module decides; the library tracker applies the decisions to the
//! GPU processes it knows (those that map a probed runtime file).
use std::{
    collections::{BTreeMap, HashMap},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use serde::Serialize;

/// Why a process carries hot-call probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// `trace`'s `--pid`, `--comm` or `--cgroup` match it.
    Filter,
    /// It runs in a canary pod.
    Canary,
    /// Its cgroup had a GPU failure, stall or crash within the hot window.
    GpuTrouble,
    /// `--hot-calls all` (or `trace` without a filter): every process.
    All,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filter => "filter",
            Self::Canary => "canary",
            Self::GpuTrouble => "gpu_trouble",
            Self::All => "all",
        }
    }
}

/// Tells whether a cgroup path belongs to a canary pod, and by which rule.
pub type CanaryJudge = Box<dyn Fn(&str) -> Option<&'static str> + Send>;

/// Who is selected.
pub enum Policy {
    /// Every process (`--hot-calls all`, or `trace` without a filter).
    Everyone,
    /// Nobody (`--hot-calls none`).
    Nobody,
    /// `trace`'s filters: a process is selected when every filter given
    /// matches it, the same rule that decides what `trace` prints.
    Filter { pids: Vec<u32>, comm: Option<String>, cgroup_prefix: Option<String> },
    /// `run`: canary pods, and cgroups with recent trouble.
    Daemon { window: Duration },
}

impl Policy {
    /// `trace`: the filtered processes, every process without a filter.
    pub fn for_trace(
        mode: crate::config::HotCalls,
        pids: &[u32],
        comm: Option<&str>,
        cgroup_prefix: Option<&str>,
    ) -> Self {
        use crate::config::HotCalls;
        match mode {
            HotCalls::All => Self::Everyone,
            HotCalls::None => Self::Nobody,
            HotCalls::Selected if pids.is_empty() && comm.is_none() && cgroup_prefix.is_none() => {
                Self::Everyone
            }
            HotCalls::Selected => Self::Filter {
                pids: pids.to_vec(),
                comm: comm.map(str::to_string),
                cgroup_prefix: cgroup_prefix.map(str::to_string),
            },
        }
    }

    /// What `run` does without `--hot-calls` and `--hot-window` (its
    /// defaults are valid by config's test): `top` on its own probes and
    /// `check`'s trial load select as the daemon would.
    pub fn daemon_default() -> Self {
        use crate::config::{
            default_duration, parse_hot_calls, HotCalls, DEFAULT_HOT_CALLS, DEFAULT_HOT_WINDOW,
        };
        let mode = parse_hot_calls(DEFAULT_HOT_CALLS).unwrap_or(HotCalls::Selected);
        Self::for_daemon(mode, default_duration(DEFAULT_HOT_WINDOW))
    }

    /// `run`: canary pods and troubled cgroups.
    pub fn for_daemon(mode: crate::config::HotCalls, window: Duration) -> Self {
        use crate::config::HotCalls;
        match mode {
            HotCalls::All => Self::Everyone,
            HotCalls::None => Self::Nobody,
            HotCalls::Selected => Self::Daemon { window },
        }
    }
}

/// What the decision looks at.
pub struct Candidate<'a> {
    pub pid: u32,
    pub comm: &'a str,
    pub cgroup_id: u64,
    pub cgroup_path: Option<&'a str>,
}

/// Where the kernel side should report a process's GPU runtime mappings
/// (so its probes exist before its first launch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelScope {
    Cgroup(u64),
    Process(u32),
}

pub struct Selection {
    policy: Policy,
    canary: Option<CanaryJudge>,
    /// Cgroup id -> until when it stays selected.
    troubled: HashMap<u64, Instant>,
}

impl Selection {
    pub fn new(policy: Policy) -> Self {
        Self { policy, canary: None, troubled: HashMap::new() }
    }

    pub fn set_canary_judge(&mut self, judge: CanaryJudge) {
        self.canary = Some(judge);
    }

    /// Whether selection is per process at all (rather than everyone or nobody).
    pub fn per_process(&self) -> bool {
        matches!(self.policy, Policy::Filter { .. } | Policy::Daemon { .. })
    }

    /// Processes selected by pid from the start.
    pub fn initial_pids(&self) -> &[u32] {
        match &self.policy {
            Policy::Filter { pids, comm: None, cgroup_prefix: None } => pids,
            _ => &[],
        }
    }

    /// A GPU failure, stall or crash in a cgroup: it is selected for the
    /// window from now. Returns whether it was not selected for trouble before.
    pub fn note_trouble(&mut self, cgroup_id: u64, now: Instant) -> bool {
        let Policy::Daemon { window } = self.policy else { return false };
        if cgroup_id == 0 {
            return false;
        }
        self.troubled.insert(cgroup_id, now + window).is_none_or(|until| until <= now)
    }

    /// Forgets trouble older than the window; returns the cgroups let go.
    pub fn expire(&mut self, now: Instant) -> Vec<u64> {
        let gone: Vec<u64> =
            self.troubled.iter().filter(|(_, until)| **until <= now).map(|(c, _)| *c).collect();
        for c in &gone {
            self.troubled.remove(c);
        }
        gone
    }

    pub fn troubled_cgroups(&self) -> impl Iterator<Item = u64> + '_ {
        self.troubled.keys().copied()
    }

    /// Why this process is selected, if it is.
    pub fn reason(&self, c: &Candidate<'_>, now: Instant) -> Option<Reason> {
        match &self.policy {
            Policy::Everyone => Some(Reason::All),
            Policy::Nobody => None,
            Policy::Filter { pids, comm, cgroup_prefix } => {
                let pid_ok = pids.is_empty() || pids.contains(&c.pid);
                let comm_ok = comm.as_deref().is_none_or(|want| want == c.comm);
                let cgroup_ok = cgroup_prefix
                    .as_deref()
                    .is_none_or(|prefix| c.cgroup_path.is_some_and(|p| p.starts_with(prefix)));
                (pid_ok && comm_ok && cgroup_ok).then_some(Reason::Filter)
            }
            Policy::Daemon { .. } => {
                if let (Some(judge), Some(path)) = (&self.canary, c.cgroup_path) {
                    if judge(path).is_some() {
                        return Some(Reason::Canary);
                    }
                }
                self.troubled
                    .get(&c.cgroup_id)
                    .is_some_and(|until| *until > now)
                    .then_some(Reason::GpuTrouble)
            }
        }
    }

    /// How the kernel side should know a selected process: its cgroup for
    /// the daemon (the whole pod is selected), the process itself for
    /// `trace`'s filters.
    pub fn kernel_scope(&self, c: &Candidate<'_>) -> Option<KernelScope> {
        match self.policy {
            Policy::Filter { .. } => Some(KernelScope::Process(c.pid)),
            Policy::Daemon { .. } if c.cgroup_id != 0 => Some(KernelScope::Cgroup(c.cgroup_id)),
            _ => None,
        }
    }
}

/// How many GPU processes carry hot-call probes, by reason.
pub type HotCounts = BTreeMap<Reason, usize>;

/// Tells when a process has exited, robust to pid reuse: a pidfd refers to
/// the process it was opened for, not to whoever gets its number next.
pub struct ExitWatch(Option<OwnedFd>);

impl ExitWatch {
    pub fn open(pid: u32) -> Self {
        // SAFETY: pidfd_open(2) with a pid and no flags; returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) } as i32;
        // SAFETY: a descriptor just returned to us and owned by nobody else.
        Self((fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Whether the process is gone. Kernels without pidfds (before 5.3)
    /// fall back to the pid's /proc entry.
    pub fn exited(&self, pid: u32) -> bool {
        match &self.0 {
            Some(fd) => {
                let mut pfd = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd, zero timeout.
                let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
                ready > 0
            }
            None => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        }
    }
}

/// A process's cgroup (id and path below the cgroup2 root), from
/// /proc/PID/cgroup and the directory's inode.
pub fn process_cgroup(pid: u32, root: Option<&std::path::Path>) -> Option<(u64, String)> {
    use std::os::unix::fs::MetadataExt;
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
    let dir = root?.join(path.trim_start_matches('/'));
    let id = std::fs::metadata(dir).ok()?.ino();
    Some((id, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate<'a>(pid: u32, comm: &'a str, cgroup_id: u64, path: &'a str) -> Candidate<'a> {
        Candidate { pid, comm, cgroup_id, cgroup_path: Some(path) }
    }

    #[test]
    fn trace_filters_select_like_they_print() {
        let now = Instant::now();
        let s = Selection::new(Policy::Filter {
            pids: vec![],
            comm: Some("worker".into()),
            cgroup_prefix: Some("/pods/a".into()),
        });
        assert_eq!(s.reason(&candidate(1, "worker", 7, "/pods/a/c1"), now), Some(Reason::Filter));
        assert_eq!(s.reason(&candidate(1, "worker", 7, "/pods/b/c1"), now), None);
        assert_eq!(s.reason(&candidate(1, "other", 7, "/pods/a/c1"), now), None);
        let by_pid = Selection::new(Policy::Filter { pids: vec![42], comm: None, cgroup_prefix: None });
        assert_eq!(by_pid.initial_pids(), &[42]);
        assert_eq!(by_pid.reason(&candidate(42, "x", 7, "/"), now), Some(Reason::Filter));
        assert_eq!(by_pid.reason(&candidate(43, "x", 7, "/"), now), None);
    }

    #[test]
    fn trouble_selects_a_cgroup_for_the_window_then_lets_go() {
        let t0 = Instant::now();
        let mut s = Selection::new(Policy::Daemon { window: Duration::from_secs(10) });
        let c = candidate(5, "solver", 99, "/pods/x");
        assert_eq!(s.reason(&c, t0), None);
        assert!(s.note_trouble(99, t0));
        assert!(!s.note_trouble(99, t0 + Duration::from_secs(1)), "already selected");
        assert_eq!(s.reason(&c, t0 + Duration::from_secs(10)), Some(Reason::GpuTrouble), "renewed at +1s");
        assert!(s.expire(t0 + Duration::from_secs(10)).is_empty());
        assert_eq!(s.expire(t0 + Duration::from_secs(11)), vec![99]);
        assert_eq!(s.reason(&c, t0 + Duration::from_secs(11)), None);
        assert!(!s.note_trouble(0, t0), "events without a cgroup select nothing");
    }

    #[test]
    fn canary_pods_are_selected_before_trouble() {
        let now = Instant::now();
        let mut s = Selection::new(Policy::Daemon { window: Duration::from_secs(60) });
        s.set_canary_judge(Box::new(|path| path.contains("canary").then_some("track label")));
        assert_eq!(s.reason(&candidate(1, "w", 3, "/pods/canary-1"), now), Some(Reason::Canary));
        s.note_trouble(4, now);
        assert_eq!(s.reason(&candidate(2, "w", 4, "/pods/stable-1"), now), Some(Reason::GpuTrouble));
        assert_eq!(s.reason(&candidate(3, "w", 5, "/pods/stable-2"), now), None);
        assert_eq!(s.kernel_scope(&candidate(3, "w", 5, "/")), Some(KernelScope::Cgroup(5)));
    }

    #[test]
    fn an_exit_watch_sees_its_own_process_alive() {
        let me = std::process::id();
        assert!(!ExitWatch::open(me).exited(me));
        assert!(process_cgroup(me, crate::attribution::cgroups::cgroup2_root().as_deref()).is_some());
    }
}
