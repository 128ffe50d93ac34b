//! Loading the eBPF object and attaching what it offers.
//!
//! What the kernel offers is measured once ([`Environment`]); the object is
//! loaded with the settings the kernel side reads as globals, and its maps
//! are taken as typed handles ([`loaded::Loaded`]); the hooks are declared in
//! [`table`] and attached by one function. Dropping the `Loaded` detaches
//! everything.
pub mod btf;
pub mod gpu;
pub mod gpu_slots;
pub mod http;
pub mod kfd;
pub mod library_load;
pub mod loaded;
pub(crate) mod releaser;
pub mod table;
pub mod tracefs;
pub mod uprobe_multi;

use std::collections::HashSet;

use aya::EbpfLoader;
use log::{info, warn};
use observer_common::{
    gpu as gpu_common,
    kernel::{KernelOffsets, GLOBAL_OFFSETS},
};

pub use loaded::{LoadError, Loaded};
pub use table::{AttachError, HOLDING_PROGRAM};

/// The eBPF object built by `observer/build.rs` from `observer-ebpf/`.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/canaryscope.bpf.o"));

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

/// Raise RLIMIT_MEMLOCK for kernels that still charge BPF maps to it (< 5.11).
fn raise_memlock() {
    let limit = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: valid rlimit struct; failure only matters on old kernels and
    // then shows up as a clear map-creation error.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
}

/// Whether one probe is attached, for `check` and `canaryscope_probe_attached`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProbeStatus {
    /// Family: gpu, exit, crash, oom, sched, discovery, kfd.
    pub probe: &'static str,
    /// What it is attached to (tracepoint, library path, kernel function).
    pub target: String,
    pub attached: bool,
    /// Why not, or how (e.g. the fallback in use).
    pub detail: String,
}

/// Kernel functions the probe table may hook, and whether kprobes exist:
/// read from `/proc/kallsyms` once, not per hook.
#[derive(Debug, Default)]
pub struct KernelFunctions {
    pub kprobes: bool,
    present: HashSet<&'static str>,
}

impl KernelFunctions {
    pub fn read() -> Self {
        let wanted: Vec<&'static str> = table::PROBES
            .iter()
            .copied()
            .chain(table::hardware_probes())
            .filter_map(|p| match p.used {
                table::Use::IfKernelHas(f) | table::Use::UnlessKernelHas(f) => Some(f),
                table::Use::Always | table::Use::IfHelpers(_) | table::Use::UnlessHelpers(_) => None,
            })
            .chain([uprobe_multi::KERNEL_FUNCTION])
            .collect();
        let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        Self { kprobes: kfd::kprobes_supported(), present: kfd::functions_in(&kallsyms, &wanted) }
    }

    /// Acts as if the kernel lacked `function` (tests force a fallback
    /// with it on kernels that have the preferred hook).
    pub fn hide(&mut self, function: &str) {
        self.present.remove(function);
    }

    /// Whether the kernel can make `uprobe_multi` links.
    pub fn has_uprobe_multi(&self) -> bool {
        self.present.contains(uprobe_multi::KERNEL_FUNCTION)
    }

    /// Whether a table entry applies to this kernel.
    pub fn uses(&self, used: table::Use) -> bool {
        match used {
            table::Use::Always => true,
            table::Use::IfKernelHas(f) => self.kprobes && self.present.contains(f),
            table::Use::UnlessKernelHas(f) => !(self.kprobes && self.present.contains(f)),
            // Decided by the environment, which knows the helpers.
            table::Use::IfHelpers(_) | table::Use::UnlessHelpers(_) => true,
        }
    }
}

/// What the kernel offers, measured before loading.
pub struct Environment {
    pub offsets: KernelOffsets,
    /// The BPF helpers the kernel knows (from BTF); `None`: unknown, and
    /// every program is tried.
    pub helpers: Option<std::collections::BTreeSet<String>>,
    pub tracefs: Result<std::path::PathBuf, String>,
    pub btf_error: Option<String>,
    pub kernel: KernelFunctions,
}

pub fn environment() -> Environment {
    let tracefs = tracefs::ensure_mounted();
    let (mut offsets, helpers, btf_error) = match btf::vmlinux() {
        Ok(b) => (btf::kernel_offsets(&b), btf::kernel_helpers(&b), None),
        Err(e) => (KernelOffsets::ZERO, None, Some(e.to_string())),
    };
    if let Ok(dir) = &tracefs {
        if let Some(fields) = tracefs::read_format(dir, "oom", "mark_victim") {
            offsets.mark_victim_pid = tracefs::field_offset(&fields, "pid").unwrap_or(0);
            offsets.mark_victim_anon_rss = tracefs::field_offset(&fields, "anon_rss").unwrap_or(0);
        }
    }
    Environment { offsets, helpers, tracefs, btf_error, kernel: KernelFunctions::read() }
}

impl Environment {
    /// Whether a table entry applies to this kernel.
    pub fn uses(&self, used: table::Use) -> bool {
        let lacks =
            |wanted: &'static [table::KernelHelper]| table::Need::Helpers(wanted).check(self).is_err();
        match used {
            table::Use::IfHelpers(wanted) => !lacks(wanted),
            table::Use::UnlessHelpers(wanted) => lacks(wanted),
            other => self.kernel.uses(other),
        }
    }
}

/// Loads the object with its globals set, takes its maps, and loads the
/// GPU uprobe programs (attached later, per library file).
pub fn load(settings: &KernelSettings, env: &Environment) -> Result<Loaded, LoadError> {
    raise_memlock();
    let emit_all: u32 = settings.gpu_emit_all.into();
    let kfd_device = settings.kfd_device.clone().unwrap_or_else(|| "/dev/kfd".into());
    let kfd_rdev: u32 = kfd::device_rdev(&kfd_device).unwrap_or(0);
    let hold: u32 = settings.hold.into();
    let ebpf = EbpfLoader::new()
        .override_global(gpu_common::GLOBAL_EMIT_ALL, &emit_all, true)
        .override_global(gpu_common::GLOBAL_SLOW_NS, &settings.gpu_slow_ns, true)
        .override_global(GLOBAL_OFFSETS, &env.offsets, true)
        .override_global(observer_common::kfd::GLOBAL_KFD_RDEV, &kfd_rdev, true)
        .override_global(observer_common::discovery::GLOBAL_HOLD, &hold, true)
        .load(EBPF_OBJECT)?;
    // Attach cookies name a call's function; without them the GPU programs
    // are slot pairs, and uprobe_multi links carry no use.
    let cookies = table::Need::Helpers(table::GPU_CALL_HELPERS).check(env);
    // Loaded now, while every map is still in the object to relocate against.
    let multi = match cookies.is_ok() && env.kernel.has_uprobe_multi() {
        true => match uprobe_multi::load(
            EBPF_OBJECT,
            &ebpf,
            &[gpu::ENTER_PROGRAM, gpu::EXIT_PROGRAM, gpu_common::COUNT_PROGRAM],
        ) {
            Ok(programs) => Some(programs),
            Err(why) => {
                warn!("GPU runtime probes: a perf-event link per function ({why})");
                None
            }
        },
        false => None,
    };
    let mut loaded = Loaded::new(ebpf)?;
    if let Some(programs) = multi {
        loaded.set_multi_programs(programs);
    }
    // A kernel whose verifier refuses the GPU programs still gets every
    // other family; the failure shows up in `check` and the probe metric,
    // with the kernel feature it lacks where that is known.
    let refused = match cookies {
        // No attach cookies: a pair of programs per probed function
        // (gpu_slots.rs), loaded as functions are probed.
        Err(missing) => {
            info!("GPU runtime probes: one program pair per function ({missing})");
            loaded.use_gpu_slots();
            None
        }
        Ok(()) => {
            loaded.load_gpu_programs().err().map(|e| format!("the kernel refused the GPU programs: {e}"))
        }
    };
    if let Some(why) = refused {
        warn!("GPU runtime probes unavailable: {why}");
        loaded.set_gpu_unavailable(why);
    }
    Ok(loaded)
}

#[cfg(test)]
mod object_names;
