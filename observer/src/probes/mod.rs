//! Loading the eBPF object and attaching probe families.
//!
//! Each family follows the same life cycle: `can_run` (what `check` prints),
//! `load`, `attach`, read its maps; dropping the `Ebpf` detaches everything.
pub mod gpu;
pub mod maps;

use aya::{
    maps::{PerCpuArray, RingBuf},
    Ebpf, EbpfLoader,
};
use observer_common::{gpu as gpu_common, EVENTS_MAP, LOST_MAP};

/// The eBPF object built by `observer/build.rs` from `observer-ebpf/`.
static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/canaryscope.bpf.o"));

/// Settings the kernel side reads as load-time globals.
#[derive(Clone, Copy, Debug)]
pub struct KernelSettings {
    /// Every GPU call returns an event (`trace --all`).
    pub gpu_emit_all: bool,
    /// A GPU call at least this slow is an event even when it succeeds.
    pub gpu_slow_ns: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object failed: {0} (is this kernel built with BPF and BTF, and are we root?)")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF map {0} is missing from the object")]
    MissingMap(&'static str),
    #[error("eBPF map {name}: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("loading GPU probe programs: {0}")]
    Program(#[from] aya::programs::ProgramError),
}

/// Raise RLIMIT_MEMLOCK for kernels that still charge BPF maps to it (< 5.11).
fn raise_memlock() {
    let limit = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid rlimit struct; failure only matters on old kernels and
    // then shows up as a clear map-creation error.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) };
}

pub fn load(settings: KernelSettings) -> Result<Ebpf, LoadError> {
    raise_memlock();
    let emit_all: u32 = settings.gpu_emit_all.into();
    let mut ebpf = EbpfLoader::new()
        .override_global(gpu_common::GLOBAL_EMIT_ALL, &emit_all, true)
        .override_global(gpu_common::GLOBAL_SLOW_NS, &settings.gpu_slow_ns, true)
        .load(EBPF_OBJECT)?;
    gpu::GpuProbes::load(&mut ebpf)?;
    Ok(ebpf)
}

pub fn take_events(ebpf: &mut Ebpf) -> Result<RingBuf<aya::maps::MapData>, LoadError> {
    let map = ebpf
        .take_map(EVENTS_MAP)
        .ok_or(LoadError::MissingMap(EVENTS_MAP))?;
    RingBuf::try_from(map).map_err(|source| LoadError::Map {
        name: EVENTS_MAP,
        source,
    })
}

/// Events the kernel side dropped because the ring buffer was full.
pub fn events_lost(ebpf: &Ebpf) -> u64 {
    let Some(map) = ebpf.map(LOST_MAP) else {
        return 0;
    };
    let Ok(array) = PerCpuArray::<_, u64>::try_from(map) else {
        return 0;
    };
    array
        .get(&0, 0)
        .map(|values| values.iter().sum())
        .unwrap_or(0)
}
