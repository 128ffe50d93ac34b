//! Abnormal exits and who caused them: the exit record, the sender of the
//! last possibly fatal signal, and the wait-status helpers both sides use.

use crate::crash::CrashInfo;

/// `si_code` values at or below zero come from a sender (kill, tgkill,
/// sigqueue); positive ones from the kernel reporting a fault.
pub const SI_KERNEL_FAULT_MIN: i32 = 1;

/// `si_code` the kernel reports for its own signals (`SEND_SIG_PRIV`,
/// include/uapi/asm-generic/siginfo.h).
pub const SI_KERNEL: i32 = 0x80;
/// Stand-in `si_code` for a signal generated without any siginfo
/// (`SEND_SIG_NOINFO`): the kernel's `send_sig(sig, task, 0)`, as for
/// SIGPIPE and SIGXFSZ. The tracepoint itself reports these as SI_USER;
/// this value is outside every real code so the two stay apart.
pub const SI_NOINFO: i32 = i32::MIN;
/// `RLIMIT_CPU`, the index into `signal_struct::rlim`.
pub const RLIMIT_CPU: u32 = 0;
/// `struct rlimit { rlim_cur, rlim_max }`, two `unsigned long`s.
pub const RLIMIT_SIZE: u32 = 16;
/// `RLIM_INFINITY` on 64-bit kernels.
pub const RLIM_INFINITY: u64 = u64::MAX;

/// The signal was generated while the process had a finite RLIMIT_CPU
/// ([`SignalOrigin::flags`]).
pub const ORIGIN_FLAG_RLIMIT_CPU: u32 = 1;

/// Who generated the last possibly fatal signal for a process, taken in the
/// sender's context at `signal_generate`: the sender may be gone by the
/// time its target exits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SignalOrigin {
    pub signal: i32,
    /// `si_code` ([`SI_KERNEL`], `SI_USER` = 0, `SI_TKILL` = -6, ...), or
    /// [`SI_NOINFO`].
    pub si_code: i32,
    /// The current task when the signal was generated: for `kill`, `tgkill`
    /// and `sigqueue` the sender; for kernel signals whatever ran then.
    pub sender_tgid: u32,
    /// `ORIGIN_FLAG_*`.
    pub flags: u32,
    pub sender_cgroup_id: u64,
    pub sender_comm: [u8; 16],
}

/// A process (thread-group leader) ended abnormally: killed by a signal or
/// exiting with status 137, or a candidate run ended however it did
/// ([`EXIT_FLAG_RUN`]). Other normal exits never leave the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExitEvent {
    pub header: crate::EventHeader,
    /// `task->exit_code`: signal in bits 0..7, core-dump flag 0x80, status in bits 8..16.
    pub exit_code: u32,
    pub flags: u32,
    /// From `oom:mark_victim` when the kernel gives it (kB).
    pub oom_anon_rss_kb: u64,
    pub crash: CrashInfo,
    /// Valid when `flags` has [`EXIT_FLAG_ORIGIN`]: the fatal signal's
    /// origin (its number equals the exit signal).
    pub origin: SignalOrigin,
    /// With [`EXIT_FLAG_RUN`]: boot time of the candidate run's exec (ns).
    pub run_exec_ns: u64,
}

pub const EXIT_FLAG_OOM_VICTIM: u32 = 1;
pub const EXIT_FLAG_CRASH: u32 = 2;
pub const EXIT_FLAG_ORIGIN: u32 = 4;
/// The process was a candidate run (`runs::RUNS_MAP`): its exit is sent
/// whatever its status, with [`ExitEvent::run_exec_ns`].
pub const EXIT_FLAG_RUN: u32 = 8;

/// Signals whose default action is to ignore or to stop: they never end a
/// process, so `signal_generate` does not record where they came from
/// (SIGCHLD alone fires at every child's exit).
#[inline(always)]
pub const fn never_fatal(sig: i32) -> bool {
    // SIGCHLD 17, SIGCONT 18, SIGSTOP 19, SIGTSTP 20, SIGTTIN 21, SIGTTOU 22,
    // SIGURG 23, SIGWINCH 28 (x86-64, arch/x86/include/uapi/asm/signal.h).
    matches!(sig, 17..=23 | 28)
}

/// Exit status helpers shared by both sides.
#[inline(always)]
pub const fn exit_signal(exit_code: u32) -> u32 {
    exit_code & 0x7f
}

#[inline(always)]
pub const fn exit_status(exit_code: u32) -> u32 {
    (exit_code >> 8) & 0xff
}

#[inline(always)]
pub const fn core_dumped(exit_code: u32) -> bool {
    exit_code & 0x80 != 0
}

/// Whether an exit is worth an event: death by signal, or status 137
/// (what a shell or container runtime reports for a SIGKILLed child).
#[inline(always)]
pub const fn is_abnormal_exit(exit_code: u32) -> bool {
    exit_signal(exit_code) != 0 || exit_status(exit_code) == 137
}

/// The x86-64 numbers of the signals both sides reason about (a fault, an
/// abort, a CPU-limit kill), written once.
pub mod signal {
    pub const SIGILL: i32 = 4;
    pub const SIGABRT: i32 = 6;
    pub const SIGBUS: i32 = 7;
    pub const SIGFPE: i32 = 8;
    pub const SIGKILL: i32 = 9;
    pub const SIGSEGV: i32 = 11;
    pub const SIGXCPU: i32 = 24;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_decode_like_wait_status() {
        assert!(is_abnormal_exit(9)); // SIGKILL
        assert!(is_abnormal_exit(11 | 0x80)); // SIGSEGV, core dumped
        assert!(core_dumped(11 | 0x80));
        assert_eq!(exit_signal(24 | 0x80), 24); // SIGXCPU
        assert!(is_abnormal_exit(137 << 8));
        assert!(!is_abnormal_exit(0));
        assert!(!is_abnormal_exit(3 << 8)); // a clean exit(3) is not a kill
        assert_eq!(exit_status(3 << 8), 3);
    }

    #[test]
    fn only_signals_that_can_end_a_process_are_traced() {
        for sig in [1, 2, 6, 9, 11, 13, 15, 24, 31, 34, 64] {
            assert!(!never_fatal(sig), "{sig}");
        }
        for sig in [17, 18, 19, 20, 21, 22, 23, 28] {
            assert!(never_fatal(sig), "{sig}");
        }
    }

    #[test]
    fn signal_origin_has_no_implicit_padding() {
        let explicit = 4 + 4 + 4 + 4 + 8 + 16;
        assert_eq!(core::mem::size_of::<SignalOrigin>(), explicit);
    }
}
