//! Loading the eBPF object and attaching probe families.
//!
//! Each family follows the same life cycle: `can_run` (what `check` prints),
//! `load`, `attach`, read its maps; dropping the `Ebpf` detaches everything.
pub mod btf;
pub mod gpu;
pub mod kfd;
pub mod maps;
pub mod tracefs;

use aya::programs::{RawTracePoint, TracePoint};
use aya::{
    maps::{PerCpuArray, RingBuf},
    Ebpf, EbpfLoader,
};
use log::{info, warn};
use observer_common::{
    gpu as gpu_common,
    task::{KernelOffsets, GLOBAL_OFFSETS},
    EVENTS_MAP, LOST_MAP,
};

/// The eBPF object built by `observer/build.rs` from `observer-ebpf/`.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/canaryscope.bpf.o"));

/// The program that stops a process at the mapping of an unknown GPU
/// runtime file when the hold is on.
pub const HOLDING_PROGRAM: &str = "mmap_exec_exit";

/// Settings the kernel side reads as load-time globals.
#[derive(Clone, Debug)]
pub struct KernelSettings {
    /// Every GPU call returns an event (`trace --all`).
    pub gpu_emit_all: bool,
    /// A GPU call at least this slow is an event even when it succeeds.
    pub gpu_slow_ns: u64,
    /// Device whose ioctls the syscall fallback counts as KFD ioctls
    /// (normally /dev/kfd).
    pub kfd_device: Option<std::path::PathBuf>,
    /// Stop a process that maps an unknown GPU runtime file until userspace
    /// resumes it (`--hold`).
    pub hold: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object failed: {0} (is this kernel built with BPF and BTF, and are we root?)")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF map {0} is missing from the object")]
    MissingMap(&'static str),
    #[error("eBPF map {name}: {source}")]
    Map { name: &'static str, source: aya::maps::MapError },
    #[error("loading GPU probe programs: {0}")]
    Program(#[from] aya::programs::ProgramError),
}

/// Raise RLIMIT_MEMLOCK for kernels that still charge BPF maps to it (< 5.11).
fn raise_memlock() {
    let limit = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: valid rlimit struct; failure only matters on old kernels and
    // then shows up as a clear map-creation error.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
}

/// Whether one probe is attached, for `check` and `canaryscope_probe_attached`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ProbeStatus {
    /// Family: gpu, exit, crash, oom, sched, discovery, kfd.
    pub probe: &'static str,
    /// What it is attached to (tracepoint, library path, kernel function).
    pub target: String,
    pub attached: bool,
    /// Why not, or how (e.g. the fallback in use).
    pub detail: String,
}

/// What the kernel offers, measured before loading.
pub struct Environment {
    pub offsets: KernelOffsets,
    pub tracefs: Result<std::path::PathBuf, String>,
    pub btf_error: Option<String>,
}

pub fn environment() -> Environment {
    let tracefs = tracefs::ensure_mounted();
    let (mut offsets, btf_error) = match btf::vmlinux() {
        Ok(b) => (btf::kernel_offsets(&b), None),
        Err(e) => (KernelOffsets::ZERO, Some(e.to_string())),
    };
    if let Ok(dir) = &tracefs {
        if let Some(fields) = tracefs::read_format(dir, "oom", "mark_victim") {
            offsets.mark_victim_pid = tracefs::field_offset(&fields, "pid").unwrap_or(0);
            offsets.mark_victim_anon_rss = tracefs::field_offset(&fields, "anon_rss").unwrap_or(0);
        }
    }
    Environment { offsets, tracefs, btf_error }
}

pub fn load(settings: &KernelSettings, env: &Environment) -> Result<Ebpf, LoadError> {
    raise_memlock();
    let emit_all: u32 = settings.gpu_emit_all.into();
    let kfd_device = settings.kfd_device.clone().unwrap_or_else(|| "/dev/kfd".into());
    let kfd_rdev: u32 = kfd::device_rdev(&kfd_device).unwrap_or(0);
    let hold: u32 = settings.hold.into();
    let mut ebpf = EbpfLoader::new()
        .override_global(gpu_common::GLOBAL_EMIT_ALL, &emit_all, true)
        .override_global(gpu_common::GLOBAL_SLOW_NS, &settings.gpu_slow_ns, true)
        .override_global(GLOBAL_OFFSETS, &env.offsets, true)
        .override_global(observer_common::kfd::GLOBAL_KFD_RDEV, &kfd_rdev, true)
        .override_global(observer_common::discovery::GLOBAL_HOLD, &hold, true)
        .load(EBPF_OBJECT)?;
    // A kernel whose verifier refuses the GPU programs still gets every
    // other family; the failure shows up in `check` and the probe metric.
    if let Err(e) = gpu::GpuProbes::load(&mut ebpf) {
        warn!("GPU runtime probes unavailable: {e}");
    }
    Ok(ebpf)
}

fn attach_raw(ebpf: &mut Ebpf, program: &str, tracepoint: &str) -> Result<(), String> {
    let p: &mut RawTracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("program {program} missing"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    p.load().map_err(|e| format!("load: {e}"))?;
    p.attach(tracepoint).map_err(|e| format!("attach: {e}"))?;
    Ok(())
}

pub(crate) fn attach_tp(ebpf: &mut Ebpf, program: &str, category: &str, name: &str) -> Result<(), String> {
    let p: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("program {program} missing"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    p.load().map_err(|e| format!("load: {e}"))?;
    p.attach(category, name).map_err(|e| format!("attach: {e}"))?;
    Ok(())
}

/// Probe families, each one optional (`--probes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    /// GPU runtime libraries: their uprobes and their discovery.
    pub gpu: bool,
    pub kfd: bool,
    pub sched: bool,
    pub exits: bool,
}

/// The names `--probes` takes, with what each covers.
pub const FAMILY_NAMES: &[(&str, &str)] = &[
    ("gpu", "HIP and CUDA driver API calls (uprobes) and the discovery of their libraries"),
    ("kfd", "AMD KFD driver ioctls and GPU fault, reset and eviction hooks"),
    ("cpu", "run-queue latency per cgroup, CFS throttling and oversubscription"),
    ("exits", "crashes, OOM kills and abnormal exits"),
];

/// Everything, as a node agent runs by default.
impl Default for Families {
    fn default() -> Self {
        Self::ALL
    }
}

impl Families {
    pub const ALL: Self = Self { gpu: true, kfd: true, sched: true, exits: true };

    /// Parses a comma-separated list such as `gpu,exits`, or `all`.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut families = Self { gpu: false, kfd: false, sched: false, exits: false };
        for name in list.split(',').map(str::trim) {
            match name {
                "all" => families = Self::ALL,
                "gpu" => families.gpu = true,
                "kfd" => families.kfd = true,
                "cpu" => families.sched = true,
                "exits" => families.exits = true,
                _ => {
                    let known: Vec<&str> = FAMILY_NAMES.iter().map(|(n, _)| *n).collect();
                    return Err(format!(
                        "unknown probe family `{name}` (known: {}, or all)",
                        known.join(", ")
                    ));
                }
            }
        }
        Ok(families)
    }
}

/// Attaches the tracepoint families; failures are reported, never fatal.
pub fn attach_families(ebpf: &mut Ebpf, env: &Environment, families: Families) -> Vec<ProbeStatus> {
    let mut status = Vec::new();
    let mut record = |probe: &'static str, target: &str, result: Result<(), String>, ok_detail: &str| {
        match &result {
            Ok(()) => info!("attached {probe} probe on {target}"),
            Err(e) => warn!("{probe} probe on {target} not attached: {e}"),
        }
        status.push(ProbeStatus {
            probe,
            target: target.to_string(),
            attached: result.is_ok(),
            detail: result.err().unwrap_or_else(|| ok_detail.to_string()),
        });
    };
    let o = env.offsets;
    if let Some(e) = &env.btf_error {
        record("btf", "/sys/kernel/btf/vmlinux", Err(e.clone()), "");
    }
    if families.exits {
        let exit = if o.task_exit_code == 0 {
            Err("task_struct::exit_code not found in kernel BTF".into())
        } else {
            attach_raw(ebpf, "process_exit", "sched_process_exit")
        };
        record("exit", "sched_process_exit", exit, "abnormal exits from task->exit_code");
        let crash = attach_raw(ebpf, "signal_generate", "signal_generate");
        let crash_detail = if o.have_vma != 0 {
            "faulting library resolved in the kernel (bpf_find_vma)"
        } else {
            "no VMA offsets in BTF: crashes reported without the faulting library"
        };
        record("crash", "signal_generate", crash, crash_detail);
        let oom = match (&env.tracefs, o.mark_victim_pid) {
            (Err(e), _) => Err(e.clone()),
            (Ok(_), 0) => Err("oom:mark_victim has no pid field in tracefs".into()),
            (Ok(_), _) => attach_tp(ebpf, "oom_mark_victim", "oom", "mark_victim"),
        };
        let oom_detail = if o.mark_victim_anon_rss != 0 {
            "oom:mark_victim with anon_rss"
        } else {
            "oom:mark_victim (pid only)"
        };
        record("oom", "oom:mark_victim", oom, oom_detail);
    }
    if families.gpu {
        let r = match &env.tracefs {
            Err(e) => Err(e.clone()),
            Ok(_) => attach_tp(ebpf, "mmap_exec", "syscalls", "sys_enter_mmap"),
        };
        let mapped_detail = if o.have_vma != 0 && o.have_fd_lookup != 0 {
            "GPU runtime files told by name as they are mapped"
        } else {
            "new GPU libraries found by scanning the maps of a process that maps code (no fd offsets in BTF)"
        };
        record("discovery", "syscalls:sys_enter_mmap", r, mapped_detail);
        let r = match &env.tracefs {
            Err(e) => Err(e.clone()),
            Ok(_) => attach_tp(ebpf, HOLDING_PROGRAM, "syscalls", "sys_exit_mmap"),
        };
        record("discovery", "syscalls:sys_exit_mmap", r, "reports (and holds) once the mapping exists");
        let r = attach_raw(ebpf, "process_exec", "sched_process_exec");
        record(
            "discovery",
            "sched_process_exec",
            r,
            "what a new program's loader could find, probed before main",
        );
    }
    if families.kfd {
        for st in kfd::attach(ebpf, env.tracefs.is_ok(), o.have_fd_lookup != 0) {
            let result = if st.attached { Ok(()) } else { Err(st.detail.clone()) };
            record(st.probe, &st.target, result, &st.detail);
        }
    }
    if families.sched {
        if o.have_task_cgroup == 0 || o.task_pid == 0 {
            record("sched", "sched_switch", Err("task_struct cgroup offsets not found in BTF".into()), "");
        } else {
            for (program, tp) in [
                ("sched_wakeup", "sched_wakeup"),
                ("sched_wakeup_new", "sched_wakeup_new"),
                ("sched_switch", "sched_switch"),
            ] {
                let r = attach_raw(ebpf, program, tp);
                record("sched", tp, r, "run-queue latency per cgroup");
            }
        }
    }
    status
}

pub fn take_events(ebpf: &mut Ebpf) -> Result<RingBuf<aya::maps::MapData>, LoadError> {
    let map = ebpf.take_map(EVENTS_MAP).ok_or(LoadError::MissingMap(EVENTS_MAP))?;
    RingBuf::try_from(map).map_err(|source| LoadError::Map { name: EVENTS_MAP, source })
}

/// Events the kernel side dropped because the ring buffer was full.
pub fn events_lost(ebpf: &Ebpf) -> u64 {
    let Some(map) = ebpf.map(LOST_MAP) else {
        return 0;
    };
    let Ok(array) = PerCpuArray::<_, u64>::try_from(map) else {
        return 0;
    };
    array.get(&0, 0).map(|values| values.iter().sum()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_lists_parse_and_unknown_names_are_refused() {
        assert_eq!(Families::parse("all"), Ok(Families::ALL));
        let only = Families::parse("gpu, exits").expect("valid");
        assert!(only.gpu && only.exits && !only.kfd && !only.sched);
        assert_eq!(Families::parse("cpu").map(|f| f.sched), Ok(true));
        let err = Families::parse("gpu,kprobes").expect_err("unknown");
        assert!(err.contains("`kprobes`") && err.contains("gpu, kfd, cpu, exits"), "{err}");
        assert!(Families::parse("").is_err(), "an empty list selects nothing: refused");
    }
}
