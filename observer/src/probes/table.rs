//! Every kernel-side hook canaryscope attaches, declared once: program,
//! kind of hook, family, what the kernel must offer, and what a person is
//! told. [`attach_all`] walks this table; `check`, the
//! `canaryscope_probe_attached` metric and `/readyz` all read the statuses it
//! returns. GPU runtime uprobes are per library file and live in `gpu`.
use aya::{
    programs::{BtfTracePoint, KProbe, ProgramError, RawTracePoint, TracePoint},
    Ebpf,
};
use log::{info, warn};
use observer_common::{kernel::KernelOffsets, kfd::HW_HOOKS};

use super::{Environment, ProbeStatus};
use crate::config::Families;

/// Where a program attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// A raw tracepoint, by event name.
    Raw(&'static str),
    /// A BTF-typed raw tracepoint (`tp_btf`), by event name: its programs
    /// load fields straight from typed kernel pointers.
    Btf(&'static str),
    /// A tracefs tracepoint: category and event.
    Tracepoint(&'static str, &'static str),
    /// A kernel function (kprobe or kretprobe; aya reads which from the
    /// program's section).
    Kprobe(&'static str),
}

/// What a status names as the probe's target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// A tracepoint, as people name it (`sched_switch`, `oom:mark_victim`).
    Named(&'static str),
    /// A kernel function, shown as `kprobe:NAME`.
    KernelFunction(&'static str),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Named(name) => f.write_str(name),
            Self::KernelFunction(function) => write!(f, "kprobe:{function}"),
        }
    }
}

/// Which `--probes` family a hook belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Gpu,
    Kfd,
    Sched,
    Exits,
}

impl Family {
    fn selected(self, families: Families) -> bool {
        match self {
            Self::Gpu => families.gpu,
            Self::Kfd => families.kfd,
            Self::Sched => families.sched,
            Self::Exits => families.exits,
        }
    }
}

/// Something the kernel must offer before a hook is tried; each failed
/// requirement is the reason a person reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// A mounted tracefs (tracepoint formats and ids).
    Tracefs,
    /// `task_struct::exit_code` in BTF.
    ExitCode,
    /// The `pid` field of `oom:mark_victim`.
    MarkVictimPid,
    /// The task -> cgroup id offsets in BTF.
    TaskCgroup,
    /// The fd -> file offsets in BTF.
    FdLookup,
    /// `task->signal->rlim` and `task->mm` sizes in BTF.
    MemLimits,
    /// `cgroup->root`, `cgroup_root::hierarchy_id` and `cgroup->self.parent`
    /// in BTF.
    CgroupTree,
    /// The scheduler's own wait stamp and run-queue clock, in BTF.
    RunDelay,
    /// BPF helpers the programs call, each newer than the oldest kernels.
    Helpers(&'static [KernelHelper]),
    /// `task_struct::stack` in BTF.
    TaskStack,
    /// `task_struct::real_parent` and `mm_struct::exe_file` in BTF.
    Executable,
}

/// A BPF helper a program calls, and the Linux release that brought it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelHelper {
    /// As in `enum bpf_func_id`, without `BPF_FUNC_`.
    pub name: &'static str,
    pub since: &'static str,
}

/// What the GPU call programs need: the attach cookie tells them which
/// probed function fired.
pub const GPU_CALL_HELPERS: &[KernelHelper] = &[KernelHelper { name: "get_attach_cookie", since: "5.15" }];

/// What the crash program needs to read the faulting thread's registers and
/// find the mapping of the faulting instruction.
pub const CRASH_HELPERS: &[KernelHelper] = &[
    KernelHelper { name: "get_current_task_btf", since: "5.11" },
    KernelHelper { name: "task_pt_regs", since: "5.15" },
    KernelHelper { name: "find_vma", since: "5.17" },
];

impl Need {
    pub fn check(self, env: &Environment) -> Result<(), String> {
        let o = &env.offsets;
        let (ok, why) = match self {
            Self::Tracefs => return env.tracefs.as_ref().map(|_| ()).map_err(Clone::clone),
            Self::ExitCode => (o.task_exit_code != 0, "task_struct::exit_code not found in kernel BTF"),
            Self::MarkVictimPid => (o.mark_victim_pid != 0, "oom:mark_victim has no pid field in tracefs"),
            Self::TaskCgroup => {
                (o.have_task_cgroup != 0 && o.task_pid != 0, "task_struct cgroup offsets not found in BTF")
            }
            Self::FdLookup => (o.have_fd_lookup != 0, "task->files offsets not in BTF"),
            Self::CgroupTree => (
                o.have_cgroup_tree != 0 && o.have_task_cgroup != 0,
                "cgroup root or parent offsets not found in BTF",
            ),
            Self::Helpers(wanted) => {
                let Some(known) = &env.helpers else { return Ok(()) };
                let missing: Vec<String> = wanted
                    .iter()
                    .filter(|h| !known.contains(h.name))
                    .map(|h| format!("bpf_{} (Linux {})", h.name, h.since))
                    .collect();
                if missing.is_empty() {
                    return Ok(());
                }
                return Err(format!("this kernel lacks the BPF helper(s) {}", missing.join(", ")));
            }
            Self::TaskStack => (o.task_stack != 0, "task_struct::stack not found in BTF"),
            Self::Executable => {
                (o.have_exe != 0, "task_struct::real_parent or mm_struct::exe_file not found in BTF")
            }
            Self::RunDelay => (
                o.have_run_delay != 0,
                "task_struct::sched_info.last_queued or se.cfs_rq (CONFIG_SCHED_INFO, CONFIG_FAIR_GROUP_SCHED) \
                 not found in BTF",
            ),
            Self::MemLimits => (
                o.have_rlimit != 0 && o.have_mm != 0,
                "signal_struct::rlim or mm_struct::total_vm/data_vm not found in BTF",
            ),
        };
        if ok {
            Ok(())
        } else {
            Err(why.to_string())
        }
    }
}

/// When an entry is used at all. Entries that are alternatives of each
/// other (a kprobe and its syscall fallback) say so here, so exactly one of
/// them reports a status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    Always,
    /// Only where kprobes exist and this function is in the kernel; silent
    /// otherwise (a hook absent from this kernel version is not a failure).
    IfKernelHas(&'static str),
    /// Only where [`Use::IfKernelHas`] of this function does not hold.
    UnlessKernelHas(&'static str),
    /// Only where the kernel has these BPF helpers (or they are unknown).
    IfHelpers(&'static [KernelHelper]),
    /// Only where the kernel is known to lack one of these helpers: the
    /// shape for older kernels.
    UnlessHelpers(&'static [KernelHelper]),
}

/// One status line: the programs that make it up and what they need.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    pub family: Family,
    /// The `probe` label of the status: exit, crash, oom, discovery, kfd,
    /// gpu_hw, sched.
    pub label: &'static str,
    /// The `target` of the status.
    pub target: Target,
    /// One program, or two (an entry and a return probe).
    pub programs: [Option<(&'static str, Hook)>; 2],
    pub needs: &'static [Need],
    pub used: Use,
    /// What an attached probe's status says.
    pub detail: StatusDetail,
}

/// The status text of an attached probe, fixed or told by the kernel.
#[derive(Clone, Copy, Debug)]
pub enum StatusDetail {
    Text(&'static str),
    /// One text where the kernel offers something, another where not.
    Depends {
        offers: fn(&KernelOffsets) -> bool,
        yes: &'static str,
        no: &'static str,
    },
    Kernel(fn(&Environment) -> String),
}

impl StatusDetail {
    fn text(self, env: &Environment) -> String {
        match self {
            Self::Text(text) => text.to_string(),
            Self::Depends { offers, yes, no } => if offers(&env.offsets) { yes } else { no }.to_string(),
            Self::Kernel(describe) => describe(env),
        }
    }
}

const fn one(program: &'static str, hook: Hook) -> [Option<(&'static str, Hook)>; 2] {
    [Some((program, hook)), None]
}

const fn two(a: (&'static str, Hook), b: (&'static str, Hook)) -> [Option<(&'static str, Hook)>; 2] {
    [Some(a), Some(b)]
}

impl Probe {
    fn programs(&self) -> impl Iterator<Item = (&'static str, Hook)> + '_ {
        self.programs.iter().flatten().copied()
    }
}

/// The program that stops a process at the mapping of an unknown GPU
/// runtime file when the hold is on.
pub const HOLDING_PROGRAM: &str = "mmap_exec_exit";

/// The kernel function whose presence picks the KFD ioctl path.
pub const KFD_IOCTL: &str = "kfd_ioctl";

/// Every table-driven hook, in the order statuses are listed.
pub const PROBES: &[Probe] = &[
    Probe {
        family: Family::Exits,
        label: "exit",
        target: Target::Named("sched_process_exit"),
        programs: one("process_exit", Hook::Raw("sched_process_exit")),
        needs: &[Need::ExitCode],
        used: Use::Always,
        detail: StatusDetail::Text("abnormal exits from task->exit_code"),
    },
    Probe {
        family: Family::Exits,
        label: "exit_cause",
        target: Target::Named("signal_generate:sender"),
        programs: one("signal_origin", Hook::Raw("signal_generate")),
        needs: &[],
        used: Use::Always,
        detail: StatusDetail::Text("who sent a possibly fatal signal, for an exit's cause"),
    },
    Probe {
        family: Family::Exits,
        label: "crash",
        target: Target::Named("signal_generate"),
        programs: one("signal_generate", Hook::Raw("signal_generate")),
        needs: &[Need::Helpers(CRASH_HELPERS)],
        used: Use::IfHelpers(CRASH_HELPERS),
        detail: StatusDetail::Depends {
            offers: |o| o.have_vma != 0,
            yes: "faulting library resolved in the kernel (bpf_find_vma)",
            no: "no VMA offsets in BTF: crashes reported without the faulting library",
        },
    },
    Probe {
        family: Family::Exits,
        label: "crash",
        target: Target::Named("signal_generate:stack"),
        programs: one("signal_generate_stack", Hook::Raw("signal_generate")),
        needs: &[Need::TaskStack],
        used: Use::UnlessHelpers(CRASH_HELPERS),
        detail: StatusDetail::Depends {
            offers: |o| o.have_vma_tree != 0,
            yes: "fallback before Linux 5.17 (no bpf_find_vma): registers from the thread's kernel stack, the \
                  library from the process's tree of mappings",
            no: "fallback before Linux 5.17 (no bpf_find_vma): registers from the thread's kernel stack, the \
                 library from the process's code ranges seen by userspace",
        },
    },
    Probe {
        family: Family::Exits,
        label: "oom",
        target: Target::Named("oom:mark_victim"),
        programs: one("oom_mark_victim", Hook::Tracepoint("oom", "mark_victim")),
        needs: &[Need::Tracefs, Need::MarkVictimPid],
        used: Use::Always,
        detail: StatusDetail::Depends {
            offers: |o| o.mark_victim_anon_rss != 0,
            yes: "oom:mark_victim with anon_rss",
            no: "oom:mark_victim (pid only)",
        },
    },
    Probe {
        family: Family::Exits,
        label: "runs",
        target: Target::Named("sched_process_exec:runs"),
        programs: one("run_exec", Hook::Raw("sched_process_exec")),
        needs: &[Need::TaskCgroup, Need::Executable],
        used: Use::Always,
        detail: StatusDetail::Text(
            "programs a pod's process starts, exec to exit, in the cgroups the cpu family reports on",
        ),
    },
    memory_limit("syscalls:mmap", ("memlimit_mmap_enter", "sys_enter_mmap"), ("memlimit_mmap_exit", "sys_exit_mmap")),
    memory_limit(
        "syscalls:mremap",
        ("memlimit_mremap_enter", "sys_enter_mremap"),
        ("memlimit_mremap_exit", "sys_exit_mremap"),
    ),
    memory_limit("syscalls:brk", ("memlimit_brk_enter", "sys_enter_brk"), ("memlimit_brk_exit", "sys_exit_brk")),
    Probe {
        family: Family::Gpu,
        label: "discovery",
        target: Target::Named("syscalls:sys_enter_mmap"),
        programs: one("mmap_exec", Hook::Tracepoint("syscalls", "sys_enter_mmap")),
        needs: &[Need::Tracefs],
        used: Use::Always,
        detail: StatusDetail::Depends {
            offers: |o| o.have_vma != 0 && o.have_fd_lookup != 0,
            yes: "GPU runtime files told by name as they are mapped",
            no: "new GPU libraries found by scanning the maps of a process that maps code (no fd offsets in BTF)",
        },
    },
    Probe {
        family: Family::Gpu,
        label: "discovery",
        target: Target::Named("syscalls:sys_exit_mmap"),
        programs: one(HOLDING_PROGRAM, Hook::Tracepoint("syscalls", "sys_exit_mmap")),
        needs: &[Need::Tracefs],
        used: Use::Always,
        detail: StatusDetail::Text("reports (and holds) once the mapping exists"),
    },
    Probe {
        family: Family::Gpu,
        label: "discovery",
        target: Target::Named("sched_process_exec"),
        programs: one("process_exec", Hook::Raw("sched_process_exec")),
        needs: &[],
        used: Use::Always,
        detail: StatusDetail::Text("what a new program's loader could find, probed before main"),
    },
    // Attached before the hold can matter: a pod cgroup made while they
    // load is found by the daemon's look at its paths instead.
    hold_scope("cgroup_mkdir", "cgroup_mkdir:hold", "hold_cgroup_mkdir", "canary and gated pods held from their cgroup's creation"),
    hold_scope("cgroup_rmdir", "cgroup_rmdir:hold", "hold_cgroup_rmdir", "removed pod cgroups leave the held set"),
    Probe {
        family: Family::Kfd,
        label: "kfd",
        target: Target::KernelFunction(KFD_IOCTL),
        programs: two(
            ("kfd_ioctl_enter", Hook::Kprobe(KFD_IOCTL)),
            ("kfd_ioctl_exit", Hook::Kprobe(KFD_IOCTL)),
        ),
        needs: &[],
        used: Use::IfKernelHas(KFD_IOCTL),
        detail: StatusDetail::Text("kprobe + kretprobe on kfd_ioctl"),
    },
    Probe {
        family: Family::Kfd,
        label: "kfd",
        target: Target::Named("syscalls:sys_enter_ioctl"),
        programs: two(
            ("kfd_sys_enter_ioctl", Hook::Tracepoint("syscalls", "sys_enter_ioctl")),
            ("kfd_sys_exit_ioctl", Hook::Tracepoint("syscalls", "sys_exit_ioctl")),
        ),
        needs: &[Need::Tracefs, Need::FdLookup],
        used: Use::UnlessKernelHas(KFD_IOCTL),
        detail: StatusDetail::Kernel(|env| {
            let why = if !env.kernel.kprobes {
                "this kernel has no kprobes (CONFIG_KPROBES unset)"
            } else {
                "kfd_ioctl not in kallsyms (amdgpu not loaded)"
            };
            format!("syscall fallback ({why}): ioctls on fds of the KFD device")
        }),
    },
    // The set of reported cgroups follows cgroups as they come and go; it
    // is attached before the run-queue programs that read it.
    run_queue_scope("cgroup_mkdir", "runq_cgroup_mkdir", "cgroups created under reported ones are reported"),
    run_queue_scope("cgroup_rmdir", "runq_cgroup_rmdir", "removed cgroups leave the reported set"),
    run_queue("sched_switch"),
];

/// An entry and exit syscall tracepoint pair that sees memory-limit
/// refusals of one address-space-growing call.
const fn memory_limit(
    target: &'static str,
    enter: (&'static str, &'static str),
    exit: (&'static str, &'static str),
) -> Probe {
    Probe {
        family: Family::Exits,
        label: "memlimit",
        target: Target::Named(target),
        programs: two(
            (enter.0, Hook::Tracepoint("syscalls", enter.1)),
            (exit.0, Hook::Tracepoint("syscalls", exit.1)),
        ),
        needs: &[Need::Tracefs, Need::MemLimits],
        used: Use::Always,
        detail: StatusDetail::Text("calls refused by RLIMIT_AS or RLIMIT_DATA"),
    }
}

/// A scheduler raw tracepoint of the run-queue latency histogram; each
/// program is named after its event.
const fn run_queue(event: &'static str) -> Probe {
    Probe {
        family: Family::Sched,
        label: "sched",
        target: Target::Named(event),
        programs: one(event, Hook::Btf(event)),
        needs: &[Need::TaskCgroup, Need::RunDelay],
        used: Use::Always,
        detail: StatusDetail::Text("run-queue latency per cgroup"),
    }
}

/// A cgroup tracepoint of the hold scope (see `discovery::hold_scope`).
const fn hold_scope(
    event: &'static str,
    target: &'static str,
    program: &'static str,
    what: &'static str,
) -> Probe {
    Probe {
        family: Family::Gpu,
        label: "discovery",
        target: Target::Named(target),
        programs: one(program, Hook::Raw(event)),
        needs: &[Need::CgroupTree],
        used: Use::Always,
        detail: StatusDetail::Text(what),
    }
}

const fn run_queue_scope(event: &'static str, program: &'static str, what: &'static str) -> Probe {
    Probe {
        family: Family::Sched,
        label: "sched",
        target: Target::Named(event),
        programs: one(program, Hook::Raw(event)),
        needs: &[Need::CgroupTree],
        used: Use::Always,
        detail: StatusDetail::Text(what),
    }
}

/// The GPU hardware hooks (faults, resets, evictions), one entry each,
/// taken from the table the kernel side indexes its events by.
pub fn hardware_probes() -> impl Iterator<Item = Probe> {
    HW_HOOKS.iter().map(|hook| Probe {
        family: Family::Kfd,
        label: "gpu_hw",
        target: Target::KernelFunction(hook.function),
        programs: one(hook.program, Hook::Kprobe(hook.function)),
        needs: &[],
        used: Use::IfKernelHas(hook.function),
        detail: StatusDetail::Text(hook.kind.as_str()),
    })
}

/// Every program name the table attaches (for the object-name test).
pub fn program_names() -> impl Iterator<Item = &'static str> {
    PROBES
        .iter()
        .copied()
        .chain(hardware_probes())
        .flat_map(|p| p.programs.into_iter().flatten().map(|(name, _)| name))
}

/// Why one program did not attach.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("program {0} missing from the eBPF object")]
    MissingProgram(&'static str),
    #[error("program {program} is not a {expected} program: {source}")]
    WrongType { program: &'static str, expected: &'static str, source: ProgramError },
    #[error("load: {0}")]
    Load(ProgramError),
    #[error("attach: {0}")]
    Attach(ProgramError),
    #[error("no free program slot: without attach cookies (Linux < 5.15) at most {0} functions are probed at once")]
    NoSlot(u32),
    #[error("the slot cookie map: {0}")]
    SlotMap(String),
}

/// Loads and attaches one program at its hook.
pub fn attach_program(ebpf: &mut Ebpf, program: &'static str, hook: Hook) -> Result<(), AttachError> {
    let found = ebpf.program_mut(program).ok_or(AttachError::MissingProgram(program))?;
    let wrong = |expected| move |source| AttachError::WrongType { program, expected, source };
    match hook {
        Hook::Raw(event) => {
            let p: &mut RawTracePoint = found.try_into().map_err(wrong("raw tracepoint"))?;
            p.load().map_err(AttachError::Load)?;
            p.attach(event).map_err(AttachError::Attach)?;
        }
        Hook::Btf(event) => {
            let p: &mut BtfTracePoint = found.try_into().map_err(wrong("BTF tracepoint"))?;
            let btf = aya::Btf::from_sys_fs().map_err(|e| AttachError::Load(ProgramError::Btf(e)))?;
            p.load(event, &btf).map_err(AttachError::Load)?;
            p.attach().map_err(AttachError::Attach)?;
        }
        Hook::Tracepoint(category, event) => {
            let p: &mut TracePoint = found.try_into().map_err(wrong("tracepoint"))?;
            p.load().map_err(AttachError::Load)?;
            p.attach(category, event).map_err(AttachError::Attach)?;
        }
        Hook::Kprobe(function) => {
            let p: &mut KProbe = found.try_into().map_err(wrong("kprobe"))?;
            p.load().map_err(AttachError::Load)?;
            p.attach(function, 0).map_err(AttachError::Attach)?;
        }
    }
    Ok(())
}

/// Attaches every table entry of the selected families. A failure is a
/// status, never fatal: what cannot be seen is said, the rest still runs.
pub fn attach_all(ebpf: &mut Ebpf, env: &Environment, families: Families) -> Vec<ProbeStatus> {
    let mut statuses = Vec::new();
    if let Some(e) = &env.btf_error {
        statuses.push(ProbeStatus {
            probe: "btf",
            target: "/sys/kernel/btf/vmlinux".into(),
            attached: false,
            detail: e.clone(),
        });
    }
    for probe in PROBES.iter().copied().chain(hardware_probes()) {
        if !probe.family.selected(families) || !env.uses(probe.used) {
            continue;
        }
        let result = probe.needs.iter().try_for_each(|need| need.check(env)).and_then(|()| {
            probe
                .programs()
                .try_for_each(|(program, hook)| attach_program(ebpf, program, hook))
                .map_err(|e| e.to_string())
        });
        match &result {
            Ok(()) => info!("attached {} probe on {}", probe.label, probe.target),
            Err(e) => warn!("{} probe on {} not attached: {e}", probe.label, probe.target),
        }
        statuses.push(ProbeStatus {
            probe: probe.label,
            target: probe.target.to_string(),
            attached: result.is_ok(),
            detail: result.err().unwrap_or_else(|| probe.detail.text(env)),
        });
    }
    statuses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_target_is_unique() {
        let mut targets: Vec<String> =
            PROBES.iter().copied().chain(hardware_probes()).map(|p| p.target.to_string()).collect();
        let all = targets.len();
        targets.sort_unstable();
        targets.dedup();
        assert_eq!(targets.len(), all, "two entries would report under one target");
    }

    /// A kernel without a helper gets a reason that names it and its
    /// release; one with every helper, or whose helpers are unknown, tries.
    #[test]
    fn a_missing_helper_is_named_with_its_release() {
        let mut env = crate::probes::environment();
        let all: std::collections::BTreeSet<String> =
            CRASH_HELPERS.iter().chain(GPU_CALL_HELPERS).map(|h| h.name.to_string()).collect();
        env.helpers = Some(all.clone());
        assert_eq!(Need::Helpers(CRASH_HELPERS).check(&env), Ok(()));
        env.helpers = None;
        assert_eq!(Need::Helpers(CRASH_HELPERS).check(&env), Ok(()));
        // As on Linux 5.11 to 5.14: the task as a BTF pointer, not yet its
        // registers or the lookup of its mappings.
        env.helpers = Some(all.into_iter().filter(|h| h != "find_vma" && h != "task_pt_regs").collect());
        assert_eq!(
            Need::Helpers(CRASH_HELPERS).check(&env),
            Err("this kernel lacks the BPF helper(s) bpf_task_pt_regs (Linux 5.15), bpf_find_vma (Linux 5.17)".into())
        );
        let crash = PROBES.iter().find(|p| p.label == "crash").expect("crash probe");
        assert!(crash.needs.contains(&Need::Helpers(CRASH_HELPERS)), "{:?}", crash.needs);
    }

    #[test]
    fn alternatives_exclude_each_other() {
        let kfd: Vec<Use> = PROBES.iter().filter(|p| p.label == "kfd").map(|p| p.used).collect();
        assert_eq!(kfd, vec![Use::IfKernelHas(KFD_IOCTL), Use::UnlessKernelHas(KFD_IOCTL)]);
        let crash: Vec<Use> = PROBES.iter().filter(|p| p.label == "crash").map(|p| p.used).collect();
        assert_eq!(crash, vec![Use::IfHelpers(CRASH_HELPERS), Use::UnlessHelpers(CRASH_HELPERS)]);
    }
}
