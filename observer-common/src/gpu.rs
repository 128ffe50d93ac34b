//! GPU runtime calls: HIP (`libamdhip64`) and the CUDA driver API (`libcuda`,
//! as shipped by ZLUDA on top of HIP, or NVIDIA's own driver library).

/// In-flight calls per thread and API (hash, userspace scans it for stalls).
pub const INFLIGHT_MAP: &str = "GPU_INFLIGHT";
/// Per-CPU aggregate per cgroup x function x result.
pub const STATS_MAP: &str = "GPU_STATS";

/// Load-time global: non-zero makes every return an event (`trace --all`).
pub const GLOBAL_EMIT_ALL: &str = "GPU_EMIT_ALL";
/// Load-time global: a call slower than this (ns) is an event even on success.
pub const GLOBAL_SLOW_NS: &str = "GPU_SLOW_NS";
/// Default stall threshold (10 s): a call in flight this long is a stall,
/// and returning after this long makes it an event. Userspace sets
/// [`GLOBAL_SLOW_NS`] from its `--stall-threshold`; this is the kernel
/// side's value until it does.
pub const DEFAULT_STALL_NS: u64 = 10_000_000_000;

pub const MAX_INFLIGHT_THREADS: u32 = 16384;
pub const MAX_STATS_ENTRIES: u32 = 16384;
/// Nesting depth kept per thread and API (hipMalloc inside cuMemAlloc is a
/// different API, but a runtime may call its own public entry points).
pub const MAX_NESTING: usize = 4;

wire_enum! {
    /// Which GPU API a probed function belongs to.
    pub enum Api {
        Hip = 0,
        Cuda = 1,
    }
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hip => "hip",
            Self::Cuda => "cuda",
        }
    }

    pub fn functions(self) -> &'static [&'static str] {
        match self {
            Self::Hip => HIP_FUNCTIONS,
            Self::Cuda => CUDA_FUNCTIONS,
        }
    }
}

/// HIP entry points probed. The index is the function id carried in the
/// attach cookie; append only, never reorder (ids appear in kernel maps).
pub const HIP_FUNCTIONS: &[&str] = &[
    "hipInit",
    "hipGetDeviceCount",
    "hipSetDevice",
    "hipMalloc",
    "hipMallocManaged",
    "hipFree",
    "hipMemcpy",
    "hipMemcpyAsync",
    "hipModuleLoadData",
    "hipModuleLaunchKernel",
    "hipLaunchKernel",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipGetLastError",
    "hipCtxCreate",
    "hipDeviceReset",
];

/// CUDA driver API entry points probed (the ones ZLUDA implements).
pub const CUDA_FUNCTIONS: &[&str] = &[
    "cuInit",
    "cuDeviceGet",
    "cuDeviceGetCount",
    "cuCtxCreate_v2",
    "cuDevicePrimaryCtxRetain",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuModuleLoadData",
    "cuModuleLoadDataEx",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    // Cheap, and called by frameworks at start-up (torch's CUDA init).
    "cuDriverGetVersion",
];

/// Functions whose failure means the runtime could not start at all.
pub fn is_init_function(name: &str) -> bool {
    matches!(
        name,
        "hipInit"
            | "hipGetDeviceCount"
            | "hipSetDevice"
            | "cuInit"
            | "cuDeviceGet"
            | "cuDeviceGetCount"
            | "cuCtxCreate_v2"
            | "cuDevicePrimaryCtxRetain"
    )
}

/// Attach cookie: library index (userspace's table) in bits 32..64, API in
/// bits 16..32, function index in bits 0..16.
#[inline(always)]
pub const fn cookie(library: u32, api: Api, function: u32) -> u64 {
    ((library as u64) << 32) | ((api as u64) << 16) | (function as u64 & 0xffff)
}

#[inline(always)]
pub const fn cookie_library(cookie: u64) -> u32 {
    (cookie >> 32) as u32
}

#[inline(always)]
pub const fn cookie_api(cookie: u64) -> u32 {
    ((cookie >> 16) & 0xffff) as u32
}

#[inline(always)]
pub const fn cookie_function(cookie: u64) -> u32 {
    (cookie & 0xffff) as u32
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InflightKey {
    pub tid: u32,
    pub api: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InflightFrame {
    /// `bpf_ktime_get_boot_ns()` at entry.
    pub start_ns: u64,
    pub function: u32,
    /// Library index from the attach cookie.
    pub library: u32,
}

/// Calls in flight on one thread for one API, outermost first.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct InflightStack {
    pub pid: u32,
    /// Current nesting depth; frames beyond `MAX_NESTING` are counted, not kept.
    pub depth: u32,
    pub cgroup_id: u64,
    pub frames: [InflightFrame; MAX_NESTING],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuStatsKey {
    pub cgroup_id: u64,
    pub api: u32,
    pub function: u32,
    pub result: i32,
    pub _pad: u32,
}

/// Per key: count, total and log2 histogram of durations.
pub type GpuStats = crate::LatencyHistogram;

/// A GPU call that returned with an error, slowly, or (with emit-all) at all.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuCallEvent {
    pub header: crate::EventHeader,
    pub api: u32,
    pub function: u32,
    pub result: i32,
    /// Index of the library in userspace's table (from the attach cookie).
    pub library: u32,
    pub duration_ns: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_round_trips() {
        let c = cookie(7, Api::Cuda, 12);
        assert_eq!(cookie_library(c), 7);
        assert_eq!(cookie_api(c), Api::Cuda as u32);
        assert_eq!(cookie_function(c), 12);
    }

    #[test]
    fn function_tables_fit_the_cookie_and_have_no_duplicates() {
        for api in [Api::Hip, Api::Cuda] {
            let f = api.functions();
            assert!(f.len() < 0xffff);
            for (i, a) in f.iter().enumerate() {
                assert!(!f[i + 1..].contains(a), "{a} twice");
            }
        }
    }
}
