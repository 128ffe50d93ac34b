//! Why a process died: from what the kernel side recorded when the fatal
//! signal was generated (who sent it, with which `si_code`), the crash and
//! OOM-victim records, and the exit status. An exit 137 alone only says
//! SIGKILL; this tells the OOM killer, a CPU limit, a liveness kill, a
//! wrapper's own timeout and an operator's `kill -9` apart.
use observer_common::exit::{
    exit_signal, exit_status, ExitEvent, SignalOrigin, EXIT_FLAG_CRASH, EXIT_FLAG_OOM_VICTIM,
    EXIT_FLAG_ORIGIN, ORIGIN_FLAG_RLIMIT_CPU, SI_KERNEL, SI_NOINFO,
};

use crate::attribution::{cgroup_path::parse_pod_cgroup, kube::PodCache};

use observer_common::exit::signal::{SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGKILL, SIGSEGV, SIGXCPU};

/// What ended a process. A metric label: the set is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// The OOM killer chose it.
    OomKill,
    /// Its RLIMIT_CPU ran out (SIGXCPU at the soft limit, SIGKILL at the hard one).
    RlimitCpu,
    /// SIGSEGV, SIGBUS, SIGILL or SIGFPE raised by the CPU in its own code.
    Fault,
    /// Its own SIGABRT (`abort()`).
    Abort,
    /// A process sent the fatal signal (`kill`, `tgkill`, `sigqueue`).
    Sent,
    /// Any other signal of the kernel's own (SIGPIPE, SIGALRM, a tty hangup).
    Kernel,
    /// Exit status 137 without a signal: a wrapper passing on its child's
    /// SIGKILL; the child's own exit says why.
    Wrapped,
    /// A signal death whose origin was not recorded (the observer started
    /// after the signal, or the record was lost).
    Unknown,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OomKill => "oom_kill",
            Self::RlimitCpu => "rlimit_cpu",
            Self::Fault => "fault",
            Self::Abort => "abort",
            Self::Sent => "sent",
            Self::Kernel => "kernel",
            Self::Wrapped => "wrapped",
            Self::Unknown => "unknown",
        }
    }
}

/// Where the sender of a fatal signal runs, relative to its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SenderScope {
    /// The process signalled itself.
    SelfProcess,
    /// Another process of the same container (or of the same cgroup of a
    /// pod).
    SameContainer,
    /// Another container of the same pod.
    SamePod,
    /// A process of another pod.
    OtherPod,
    /// Outside every pod: kubelet, the container runtime, systemd, a shell
    /// on the node.
    Host,
    /// The sender's cgroup is gone and was not its target's.
    Unknown,
}

impl SenderScope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SelfProcess => "self",
            Self::SameContainer => "same_container",
            Self::SamePod => "same_pod",
            Self::OtherPod => "other_pod",
            Self::Host => "host",
            Self::Unknown => "unknown",
        }
    }
}

/// Why the host killed a pod's container, from the pod's state in the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KillReason {
    /// The pod has a deletion timestamp: a rollout, an eviction, a scale-down.
    PodDeleted,
    /// The pod lives on, so the kubelet restarts the container (a failed
    /// liveness probe).
    ContainerRestart,
}

impl KillReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PodDeleted => "pod_deleted",
            Self::ContainerRestart => "container_restart",
        }
    }
}

/// The sender of a `sent` signal, as captured when it sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sender {
    pub pid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    /// `None` when the cgroup is already gone.
    pub cgroup: Option<String>,
    pub scope: SenderScope,
}

/// The fatal signal's origin, when the kernel side recorded one that
/// matches the exit signal.
pub fn origin(ev: &ExitEvent) -> Option<&SignalOrigin> {
    (ev.flags & EXIT_FLAG_ORIGIN != 0 && ev.origin.signal as u32 == exit_signal(ev.exit_code))
        .then_some(&ev.origin)
}

/// Why the process of `ev` died.
pub fn cause(ev: &ExitEvent) -> Cause {
    let signal = exit_signal(ev.exit_code) as i32;
    if ev.flags & EXIT_FLAG_OOM_VICTIM != 0 {
        return Cause::OomKill;
    }
    if signal == 0 {
        // Only status 137 leaves the kernel without a signal.
        return if exit_status(ev.exit_code) == 137 { Cause::Wrapped } else { Cause::Unknown };
    }
    if ev.flags & EXIT_FLAG_CRASH != 0 && ev.crash.signal == signal {
        // The crash record only holds a process's own faults and aborts.
        return match signal {
            SIGABRT => Cause::Abort,
            SIGSEGV | SIGBUS | SIGILL | SIGFPE => Cause::Fault,
            _ => Cause::Kernel,
        };
    }
    let Some(o) = origin(ev) else { return Cause::Unknown };
    let self_sent = o.sender_tgid == ev.header.pid;
    match o.si_code {
        SI_KERNEL => {
            let cpu_limit = signal == SIGXCPU || (signal == SIGKILL && self_sent);
            if cpu_limit && o.flags & ORIGIN_FLAG_RLIMIT_CPU != 0 {
                Cause::RlimitCpu
            } else {
                Cause::Kernel
            }
        }
        // `send_sig(sig, current, 0)`: the kernel signalling the process
        // for what it did itself (SIGPIPE, SIGXFSZ).
        SI_NOINFO if self_sent => Cause::Kernel,
        // Without a crash record (a kernel older than the crash program,
        // 5.17), the origin alone tells a process's own abort() (tgkill to
        // itself) and its own faults (a fault's positive code, raised in the
        // faulting thread) from the rest.
        code if code <= 0 && self_sent && signal == SIGABRT => Cause::Abort,
        // SI_USER, SI_QUEUE, SI_TKILL, ...: a process asked for it.
        code if code <= 0 => Cause::Sent,
        _ if self_sent && matches!(signal, SIGSEGV | SIGBUS | SIGILL | SIGFPE) => Cause::Fault,
        // Fault codes sent by another process, and the kernel's other
        // positive codes.
        _ => Cause::Kernel,
    }
}

/// Where `sender` runs relative to `target`: by process, then by the pod
/// and container their cgroup paths name.
pub fn sender_scope(
    target_pid: u32,
    target: (u64, Option<&str>),
    sender_pid: u32,
    sender: (u64, Option<&str>),
) -> SenderScope {
    if sender_pid == target_pid {
        return SenderScope::SelfProcess;
    }
    let same_cgroup = (sender.0 != 0 && sender.0 == target.0) || (sender.1.is_some() && sender.1 == target.1);
    if same_cgroup {
        // Two processes of one cgroup outside every pod (the root cgroup, a
        // systemd service) share no container: the sender is the host's.
        return match sender.1.or(target.1) {
            Some(path) if parse_pod_cgroup(path).is_none() => SenderScope::Host,
            _ => SenderScope::SameContainer,
        };
    }
    let Some(sender_path) = sender.1 else { return SenderScope::Unknown };
    let Some(sender_pod) = parse_pod_cgroup(sender_path) else { return SenderScope::Host };
    let Some(target_pod) = target.1.and_then(parse_pod_cgroup) else { return SenderScope::OtherPod };
    if sender_pod.pod_uid != target_pod.pod_uid {
        return SenderScope::OtherPod;
    }
    match (&sender_pod.container, &target_pod.container) {
        (Some(a), Some(b)) if a.id == b.id => SenderScope::SameContainer,
        _ => SenderScope::SamePod,
    }
}

/// How a run ended (see `pipeline::runs`). A metric label: the set is
/// closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunEnding {
    /// Exit status 0.
    ExitZero,
    /// Another exit status, with no memory-limit refusal seen.
    ExitNonzero,
    /// A mmap, mremap or brk of the run was refused by its RLIMIT_AS or
    /// RLIMIT_DATA before it ended, other than with status 0 and other than
    /// by a kill with a cause of its own (OOM, CPU limit, a signal sent).
    MemoryLimit,
    OomKill,
    RlimitCpu,
    /// A signal sent from its own pod: a wrapper's wall-clock timeout.
    Sent,
    /// A signal sent from outside its pod (the host, another pod): a pod
    /// deleted, a person. Not the run's own ending; the judge leaves it out.
    SentOutside,
    /// Any other cause of a death by signal ([`Cause`]).
    Other(Cause),
}

impl RunEnding {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExitZero => "exit_zero",
            Self::ExitNonzero => "exit_nonzero",
            Self::MemoryLimit => "memory_limit",
            Self::OomKill => "oom_kill",
            Self::RlimitCpu => "rlimit_cpu",
            Self::Sent => "sent",
            Self::SentOutside => "sent_outside",
            Self::Other(cause) => cause.as_str(),
        }
    }
}

/// How a run ended: `death` is the cause and the sender's scope of a
/// death by signal (or status 137), `None` for an exit; `refused`, whether
/// a memory limit refused one of its allocations.
pub fn run_ending(exit_status: u32, death: Option<(Cause, Option<SenderScope>)>, refused: bool) -> RunEnding {
    match death {
        Some((Cause::OomKill, _)) => RunEnding::OomKill,
        Some((Cause::RlimitCpu, _)) => RunEnding::RlimitCpu,
        Some((Cause::Sent, scope)) => match scope {
            Some(SenderScope::SelfProcess | SenderScope::SameContainer | SenderScope::SamePod) => {
                RunEnding::Sent
            }
            _ => RunEnding::SentOutside,
        },
        // A process that cannot allocate dies of it in many ways (exit 101,
        // an abort, a fault on the NULL it got): the limit ended it.
        _ if refused && !(death.is_none() && exit_status == 0) => RunEnding::MemoryLimit,
        Some((cause, _)) => RunEnding::Other(cause),
        None if exit_status == 0 => RunEnding::ExitZero,
        None => RunEnding::ExitNonzero,
    }
}

/// Why the host killed the process of a pod's container at `target_cgroup`,
/// from the pod's state in the API: `None` outside pods, and while the pod
/// cache cannot tell (not synced, or the API unreachable).
pub fn kill_reason(target_cgroup: Option<&str>, pods: &PodCache) -> Option<KillReason> {
    let pod = parse_pod_cgroup(target_cgroup?)?;
    match pods.get(&pod.pod_uid) {
        Some(meta) if meta.deleting => Some(KillReason::PodDeleted),
        Some(_) => Some(KillReason::ContainerRestart),
        // A pod leaves the API only once deleted and its containers are
        // stopped: one already gone from a synced cache was deleted.
        None if pods.is_synced() && pods.api_healthy() => Some(KillReason::PodDeleted),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use observer_common::{crash::CrashInfo, exit::SI_KERNEL_FAULT_MIN};

    use super::*;

    const POD_A: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1c0a2b3e_4f5d_6789_abcd_ef0123456789.slice";
    const POD_B: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c0a2b3e_4f5d_6789_abcd_ef0123456789.slice";

    fn container(pod: &str, digit: char) -> String {
        format!("{pod}/cri-containerd-{}.scope", digit.to_string().repeat(64))
    }

    fn exit(exit_code: u32, flags: u32, origin: SignalOrigin) -> ExitEvent {
        let mut ev = ExitEvent { exit_code, flags, origin, ..Default::default() };
        ev.header.pid = 100;
        ev
    }

    fn sent_by(sender_tgid: u32, signal: i32, si_code: i32, flags: u32) -> SignalOrigin {
        SignalOrigin { signal, si_code, sender_tgid, flags, ..Default::default() }
    }

    #[test]
    fn causes_follow_the_signal_origin() {
        let kernel_kill = sent_by(100, SIGKILL, SI_KERNEL, 0);
        // The OOM killer's SIGKILL is SI_KERNEL too; the victim mark decides.
        assert_eq!(cause(&exit(9, EXIT_FLAG_OOM_VICTIM | EXIT_FLAG_ORIGIN, kernel_kill)), Cause::OomKill);
        assert_eq!(cause(&exit(9, EXIT_FLAG_ORIGIN, kernel_kill)), Cause::Kernel);
        let cpu = sent_by(100, SIGKILL, SI_KERNEL, ORIGIN_FLAG_RLIMIT_CPU);
        assert_eq!(cause(&exit(9, EXIT_FLAG_ORIGIN, cpu)), Cause::RlimitCpu);
        let xcpu = sent_by(100, SIGXCPU, SI_KERNEL, ORIGIN_FLAG_RLIMIT_CPU);
        assert_eq!(cause(&exit(24 | 0x80, EXIT_FLAG_ORIGIN, xcpu)), Cause::RlimitCpu);
        // `kill -XCPU` from a shell is a sent signal, limit or not.
        let kill_xcpu = sent_by(7, SIGXCPU, 0, ORIGIN_FLAG_RLIMIT_CPU);
        assert_eq!(cause(&exit(24, EXIT_FLAG_ORIGIN, kill_xcpu)), Cause::Sent);
        // SI_USER from kill(2), SI_TKILL (-6) from tgkill(2).
        assert_eq!(cause(&exit(9, EXIT_FLAG_ORIGIN, sent_by(7, SIGKILL, 0, 0))), Cause::Sent);
        assert_eq!(cause(&exit(15, EXIT_FLAG_ORIGIN, sent_by(7, 15, -6, 0))), Cause::Sent);
        // SIGPIPE from writing to a closed pipe: the kernel, for the process itself.
        assert_eq!(cause(&exit(13, EXIT_FLAG_ORIGIN, sent_by(100, 13, SI_NOINFO, 0))), Cause::Kernel);
        // A record of another signal than the fatal one says nothing.
        assert_eq!(cause(&exit(9, EXIT_FLAG_ORIGIN, sent_by(7, 15, 0, 0))), Cause::Unknown);
        assert_eq!(cause(&exit(9, 0, SignalOrigin::default())), Cause::Unknown);
        assert_eq!(cause(&exit(137 << 8, 0, SignalOrigin::default())), Cause::Wrapped);
    }

    #[test]
    fn crashes_are_faults_or_aborts() {
        let mut ev = exit(11 | 0x80, EXIT_FLAG_CRASH | EXIT_FLAG_ORIGIN, sent_by(100, SIGSEGV, 1, 0));
        ev.crash = CrashInfo { signal: SIGSEGV, si_code: SI_KERNEL_FAULT_MIN, ..Default::default() };
        assert_eq!(cause(&ev), Cause::Fault);
        let mut ev = exit(6 | 0x80, EXIT_FLAG_CRASH | EXIT_FLAG_ORIGIN, sent_by(100, SIGABRT, -6, 0));
        ev.crash = CrashInfo { signal: SIGABRT, si_code: -6, ..Default::default() };
        assert_eq!(cause(&ev), Cause::Abort);
        // `kill -SEGV` from elsewhere is no crash record: sent.
        let ev = exit(11, EXIT_FLAG_ORIGIN, sent_by(7, SIGSEGV, 0, 0));
        assert_eq!(cause(&ev), Cause::Sent);
    }

    /// On a kernel without the crash program (before 5.17) the origin alone
    /// tells a process's own fault and abort from a signal sent to it.
    #[test]
    fn without_a_crash_record_the_origin_tells_faults_and_aborts() {
        assert_eq!(cause(&exit(11, EXIT_FLAG_ORIGIN, sent_by(100, SIGSEGV, 1, 0))), Cause::Fault);
        assert_eq!(cause(&exit(7, EXIT_FLAG_ORIGIN, sent_by(100, SIGBUS, 2, 0))), Cause::Fault);
        assert_eq!(cause(&exit(6 | 0x80, EXIT_FLAG_ORIGIN, sent_by(100, SIGABRT, -6, 0))), Cause::Abort);
        // The same codes from another process are no fault of the target's.
        assert_eq!(cause(&exit(11, EXIT_FLAG_ORIGIN, sent_by(7, SIGSEGV, 1, 0))), Cause::Kernel);
        assert_eq!(cause(&exit(6, EXIT_FLAG_ORIGIN, sent_by(7, SIGABRT, -6, 0))), Cause::Sent);
    }

    #[test]
    fn runs_end_by_status_by_limit_or_by_a_wrapper() {
        use SenderScope::*;
        assert_eq!(run_ending(0, None, false), RunEnding::ExitZero);
        assert_eq!(run_ending(1, None, false), RunEnding::ExitNonzero);
        // z3's "out of memory" (exit 101) after its RLIMIT_AS refused a call.
        assert_eq!(run_ending(101, None, true), RunEnding::MemoryLimit);
        // A run that coped with a refusal and succeeded ended well.
        assert_eq!(run_ending(0, None, true), RunEnding::ExitZero);
        assert_eq!(run_ending(0, Some((Cause::Abort, None)), true), RunEnding::MemoryLimit);
        assert_eq!(run_ending(0, Some((Cause::Abort, None)), false), RunEnding::Other(Cause::Abort));
        assert_eq!(run_ending(0, Some((Cause::RlimitCpu, None)), true), RunEnding::RlimitCpu);
        assert_eq!(run_ending(0, Some((Cause::OomKill, None)), false), RunEnding::OomKill);
        // The wrapper's timeout kills from the same container; a pod's
        // deletion from the host is not the run's ending.
        assert_eq!(run_ending(0, Some((Cause::Sent, Some(SameContainer))), false), RunEnding::Sent);
        assert_eq!(run_ending(0, Some((Cause::Sent, Some(SamePod))), false), RunEnding::Sent);
        assert_eq!(run_ending(0, Some((Cause::Sent, Some(Host))), false), RunEnding::SentOutside);
        assert_eq!(run_ending(0, Some((Cause::Sent, None)), false), RunEnding::SentOutside);
        assert_eq!(RunEnding::Other(Cause::Wrapped).as_str(), "wrapped");
    }

    #[test]
    fn sender_scope_follows_pods_and_containers() {
        let a1 = container(POD_A, 'a');
        let a2 = container(POD_A, 'b');
        let b1 = container(POD_B, 'c');
        let scope = |sender: (u64, Option<&str>)| sender_scope(100, (5, Some(&a1)), 7, sender);
        assert_eq!(sender_scope(100, (5, Some(&a1)), 100, (5, Some(&a1))), SenderScope::SelfProcess);
        // Two processes of the root cgroup, or of one service, are in no
        // container.
        assert_eq!(sender_scope(100, (1, Some("/")), 7, (1, Some("/"))), SenderScope::Host);
        assert_eq!(
            sender_scope(100, (9, Some("/system.slice/solver.service")), 7, (9, None)),
            SenderScope::Host
        );
        assert_eq!(scope((5, Some(&a1))), SenderScope::SameContainer);
        // Gone sender cgroup, but the same id as the target's.
        assert_eq!(scope((5, None)), SenderScope::SameContainer);
        assert_eq!(scope((6, None)), SenderScope::Unknown);
        assert_eq!(scope((6, Some(&a2))), SenderScope::SamePod);
        assert_eq!(scope((6, Some(POD_A))), SenderScope::SamePod);
        assert_eq!(scope((8, Some(&b1))), SenderScope::OtherPod);
        assert_eq!(scope((1, Some("/"))), SenderScope::Host);
        assert_eq!(scope((9, Some("/system.slice/kubelet.service"))), SenderScope::Host);
        assert_eq!(scope((9, Some("/system.slice/containerd.service"))), SenderScope::Host);
        // A pod's process killing a host process.
        assert_eq!(sender_scope(100, (1, Some("/")), 7, (8, Some(&b1))), SenderScope::OtherPod);
    }
}
