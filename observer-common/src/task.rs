//! Process-level events: exits, crashes, OOM kills, library loads; plus the
//! kernel struct offsets the programs need.
//!
//! Rust cannot emit CO-RE relocations, so userspace reads these offsets from
//! the running kernel's BTF and hands them over as a load-time global.

use crate::gpu::Api;

/// Load-time global holding [`KernelOffsets`].
pub const GLOBAL_OFFSETS: &str = "KERNEL_OFFSETS";

/// Byte offsets of kernel struct members; zero means "not available on the
/// running kernel" and the program skips what depends on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_exit_code: u32,
    pub task_cgroups: u32,
    pub css_set_dfl_cgrp: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    pub vma_vm_start: u32,
    pub vma_vm_end: u32,
    pub vma_vm_pgoff: u32,
    pub vma_vm_file: u32,
    pub file_f_inode: u32,
    pub file_f_path_dentry: u32,
    pub inode_i_ino: u32,
    pub dentry_d_name_name: u32,
    /// tracefs offset of `anon_rss` in `oom:mark_victim` (0: old layout, pid only).
    pub mark_victim_anon_rss: u32,
    /// tracefs offset of `pid` in `oom:mark_victim`.
    pub mark_victim_pid: u32,
    /// Non-zero when every offset a family needs was found.
    pub have_task_cgroup: u32,
    pub have_vma: u32,
    /// For the KFD syscall fallback: fd -> struct file.
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdtable_fd: u32,
    pub fdtable_max_fds: u32,
    pub inode_i_rdev: u32,
    pub have_fd_lookup: u32,
    /// For the hold: `task->signal->tty` (a process with a controlling
    /// terminal is never stopped, so job control never sees a hold).
    pub task_signal: u32,
    pub signal_tty: u32,
    pub have_tty: u32,
    /// `inode->i_sb->s_dev`: with `i_ino`, a file's identity across mounts.
    pub inode_i_sb: u32,
    pub super_block_s_dev: u32,
    /// `task->signal->rlim[]` (with `task_signal`): the process's resource
    /// limits, for telling a CPU-limit kill from other kernel kills.
    pub signal_rlim: u32,
    pub have_rlimit: u32,
    /// `task->mm->total_vm` and `data_vm` (pages): how much of RLIMIT_AS
    /// and RLIMIT_DATA a process uses, for telling a limit's refusal from
    /// other failures of mmap, mremap and brk.
    pub task_mm: u32,
    pub mm_total_vm: u32,
    pub mm_data_vm: u32,
    pub have_mm: u32,
    /// For keeping the set of reported cgroups current as cgroups come and
    /// go: `cgroup->root->hierarchy_id` (0 on the unified hierarchy; v1
    /// hierarchies number their cgroups on their own) and the parent,
    /// `cgroup->self.parent` (a `cgroup_subsys_state` at offset
    /// `cgroup_self` of its cgroup).
    pub cgroup_root: u32,
    pub cgroup_root_hierarchy_id: u32,
    pub cgroup_self: u32,
    pub cgroup_parent: u32,
    pub have_cgroup_tree: u32,
    /// For run-queue latency from the scheduler's own accounting
    /// (CONFIG_SCHED_INFO, CONFIG_FAIR_GROUP_SCHED): when a task was queued,
    /// `task->sched_info.last_queued`, and the clock of its run queue,
    /// `task->se.cfs_rq->rq->clock`, both in the run queue's clock.
    pub task_last_queued: u32,
    pub task_se_cfs_rq: u32,
    pub cfs_rq_rq: u32,
    pub rq_clock: u32,
    pub have_run_delay: u32,
    /// `task->stack`: the kernel stack, whose top holds the user registers
    /// (the crash program of kernels without `bpf_task_pt_regs`).
    pub task_stack: u32,
}

impl KernelOffsets {
    pub const ZERO: Self = Self {
        task_pid: 0,
        task_tgid: 0,
        task_exit_code: 0,
        task_cgroups: 0,
        css_set_dfl_cgrp: 0,
        cgroup_kn: 0,
        kernfs_node_id: 0,
        vma_vm_start: 0,
        vma_vm_end: 0,
        vma_vm_pgoff: 0,
        vma_vm_file: 0,
        file_f_inode: 0,
        file_f_path_dentry: 0,
        inode_i_ino: 0,
        dentry_d_name_name: 0,
        mark_victim_anon_rss: 0,
        mark_victim_pid: 0,
        have_task_cgroup: 0,
        have_vma: 0,
        task_files: 0,
        files_fdt: 0,
        fdtable_fd: 0,
        fdtable_max_fds: 0,
        inode_i_rdev: 0,
        have_fd_lookup: 0,
        task_signal: 0,
        signal_tty: 0,
        have_tty: 0,
        inode_i_sb: 0,
        super_block_s_dev: 0,
        signal_rlim: 0,
        have_rlimit: 0,
        task_mm: 0,
        mm_total_vm: 0,
        mm_data_vm: 0,
        have_mm: 0,
        cgroup_root: 0,
        cgroup_root_hierarchy_id: 0,
        cgroup_self: 0,
        cgroup_parent: 0,
        have_cgroup_tree: 0,
        task_last_queued: 0,
        task_se_cfs_rq: 0,
        cfs_rq_rq: 0,
        rq_clock: 0,
        have_run_delay: 0,
        task_stack: 0,
    };
}

/// `si_code` values at or below zero come from a sender (kill, tgkill,
/// sigqueue); positive ones from the kernel reporting a fault.
pub const SI_KERNEL_FAULT_MIN: i32 = 1;

pub const LIBRARY_NAME_LEN: usize = 64;

/// Unit of [`CrashInfo::vma_pgoff`]: `vm_pgoff` counts pages, `PAGE_SIZE`
/// bytes each (4 KiB on x86-64, `arch/x86/include/asm/page_types.h`).
pub const PAGE_SIZE: u64 = 4096;

wire_enum! {
    /// What the kernel found at a crash's instruction pointer
    /// ([`CrashInfo::ip_mapping`]).
    pub enum IpMapping {
        /// Not looked up (no VMA offsets in BTF, or no instruction pointer), or
        /// no mapping holds the address.
        Unknown = 0,
        /// Anonymous memory (JIT code or a wild jump): `vma_start` and
        /// `vma_pgoff` are set, the file fields are not.
        Anonymous = 1,
        /// A file mapping: `vma_start`, `vma_pgoff`, `file_ino` and `file_name`
        /// are set.
        File = 2,
        /// The kernel has no lookup of mappings (before 5.17): userspace
        /// resolves `ip` against the process's code ranges it recorded.
        NotLookedUp = 3,
    }
}

/// [`CrashInfo::in_call_api`] for a call of `api` in flight; 0 means none.
#[inline(always)]
pub const fn in_call_api_code(api: Api) -> u32 {
    api as u32 + 1
}

/// The API of a [`CrashInfo::in_call_api`]: `None` when no call was in
/// flight (0) or for a number no [`Api`] has.
pub fn in_call_api(code: u32) -> Option<Api> {
    code.checked_sub(1).and_then(Api::from_u32)
}

/// What was known when a fatal synchronous signal was raised in a process.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CrashInfo {
    pub signal: i32,
    pub si_code: i32,
    /// `si_addr`: the faulting data address for SIGSEGV/SIGBUS, the
    /// instruction for SIGILL/SIGFPE.
    pub addr: u64,
    /// User instruction pointer of the faulting thread.
    pub ip: u64,
    pub tid: u32,
    /// GPU call in flight on that thread: [`in_call_api_code`] of its API
    /// (0 = none), and its function.
    pub in_call_api: u32,
    pub in_call_function: u32,
    /// An [`IpMapping`] as a number: what maps `ip`.
    pub ip_mapping: u32,
    pub vma_start: u64,
    /// In pages of [`PAGE_SIZE`] bytes.
    pub vma_pgoff: u64,
    pub file_ino: u64,
    /// Base name of the file backing the mapping holding `ip`.
    pub file_name: [u8; LIBRARY_NAME_LEN],
}

impl Default for CrashInfo {
    fn default() -> Self {
        Self {
            signal: 0,
            si_code: 0,
            addr: 0,
            ip: 0,
            tid: 0,
            in_call_api: 0,
            in_call_function: 0,
            ip_mapping: IpMapping::Unknown as u32,
            vma_start: 0,
            vma_pgoff: 0,
            file_ino: 0,
            file_name: [0; LIBRARY_NAME_LEN],
        }
    }
}

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
/// exiting with status 137. Normal exits never leave the kernel.
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
}

pub const EXIT_FLAG_OOM_VICTIM: u32 = 1;
pub const EXIT_FLAG_CRASH: u32 = 2;
pub const EXIT_FLAG_ORIGIN: u32 = 4;

/// Signals whose default action is to ignore or to stop: they never end a
/// process, so `signal_generate` does not record where they came from
/// (SIGCHLD alone fires at every child's exit).
#[inline(always)]
pub const fn never_fatal(sig: i32) -> bool {
    // SIGCHLD 17, SIGCONT 18, SIGSTOP 19, SIGTSTP 20, SIGTTIN 21, SIGTTOU 22,
    // SIGURG 23, SIGWINCH 28 (x86-64, arch/x86/include/uapi/asm/signal.h).
    matches!(sig, 17..=23 | 28)
}

/// The OOM killer chose a victim (sent in the killer's context).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OomVictimEvent {
    pub header: crate::EventHeader,
    pub victim_pid: u32,
    pub _pad: u32,
    pub anon_rss_kb: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OomVictimInfo {
    pub anon_rss_kb: u64,
}

/// A process mapped a file executable: it may have loaded a GPU library.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LibraryMapEvent {
    pub header: crate::EventHeader,
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
    fn crash_encodings_round_trip() {
        for api in Api::ALL {
            assert_eq!(in_call_api(in_call_api_code(api)), Some(api));
        }
        assert_eq!(in_call_api(0), None);
        for m in [IpMapping::Unknown, IpMapping::Anonymous, IpMapping::File, IpMapping::NotLookedUp] {
            assert_eq!(IpMapping::from_u32(m as u32), Some(m));
        }
        assert_eq!(IpMapping::from_u32(4), None);
        assert_eq!(CrashInfo::default().ip_mapping, IpMapping::Unknown as u32);
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

    #[test]
    fn crash_info_has_no_implicit_padding() {
        let c = CrashInfo::default();
        let explicit = 4 + 4 + 8 + 8 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + c.file_name.len();
        assert_eq!(core::mem::size_of::<CrashInfo>(), explicit);
    }
}
