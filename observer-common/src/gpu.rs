//! GPU runtime calls: HIP (`libamdhip64`), the CUDA driver API (`libcuda`,
//! as shipped by ZLUDA on top of HIP, or NVIDIA's own driver library) and
//! NVIDIA's CUDA runtime (`libcudart`, which frameworks call and which calls
//! the driver API).

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
/// Kernels without attach cookies (before 5.15) get one entry and one return
/// program per probed function of a library file, each reading its cookie
/// from [`SLOT_COOKIES_MAP`] at its slot: this many functions at a time.
pub const MAX_GPU_SLOTS: u32 = 256;
pub const SLOT_COOKIES_MAP: &str = "GPU_SLOT_COOKIES";
/// The slot programs' names: `gpu_enter_s7`, `gpu_exit_s7`.
pub const SLOT_ENTER_PREFIX: &str = "gpu_enter_s";
pub const SLOT_EXIT_PREFIX: &str = "gpu_exit_s";
/// The return-only program that counts hot calls without timing them
/// (`--hot-detail counts`): no entry program, so no clock read, no in-flight
/// frame and no map update at entry.
pub const COUNT_PROGRAM: &str = "gpu_count";
/// [`GpuCallEvent::duration_ns`] of a call counted at its return only.
pub const UNTIMED_NS: u64 = u64::MAX;

wire_enum! {
    /// Which GPU API a probed function belongs to.
    pub enum Api {
        Hip = 0,
        Cuda = 1,
        /// NVIDIA's CUDA runtime (`cuda*` in `libcudart`).
        Cudart = 2,
    }
}

impl Api {
    /// Every API, innermost layer first: the CUDA runtime calls the driver
    /// API, which ZLUDA implements over HIP.
    pub const ALL: [Api; 3] = [Api::Hip, Api::Cuda, Api::Cudart];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hip => "hip",
            Self::Cuda => "cuda",
            Self::Cudart => "cudart",
        }
    }

    pub fn functions(self) -> &'static [GpuFunction] {
        match self {
            Self::Hip => HIP_FUNCTIONS,
            Self::Cuda => CUDA_FUNCTIONS,
            Self::Cudart => CUDART_FUNCTIONS,
        }
    }

    /// Whether calls of this API are made through `other`'s (HIP beneath
    /// ZLUDA's driver API, the driver API beneath the runtime): a failure
    /// here is the cause of, and yields to, a failure there.
    pub fn is_beneath(self, other: Api) -> bool {
        (self as u32) < (other as u32)
    }
}

wire_enum! {
    /// How often a workload calls a function, and so where it is probed.
    pub enum Tier {
        /// Init, device and context set-up, module loading, allocation,
        /// synchronous copies and synchronisations: rare, or already
        /// blocking on the GPU. Probed in every process. Errors of
        /// asynchronous work surface here, at the next synchronisation.
        Cold = 0,
        /// Kernel launches, asynchronous copies and allocations, error
        /// polling: called per operation. Probed only in selected processes
        /// (per-process uprobes), so no other process takes a trap.
        Hot = 1,
    }
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cold => "cold",
            Self::Hot => "hot",
        }
    }
}

/// One probed entry point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuFunction {
    pub name: &'static str,
    pub tier: Tier,
}

const fn cold(name: &'static str) -> GpuFunction {
    GpuFunction { name, tier: Tier::Cold }
}

const fn hot(name: &'static str) -> GpuFunction {
    GpuFunction { name, tier: Tier::Hot }
}

/// HIP entry points probed. The index is the function id carried in the
/// attach cookie; append only, never reorder (ids appear in kernel maps).
pub const HIP_FUNCTIONS: &[GpuFunction] = &[
    cold("hipInit"),
    cold("hipGetDeviceCount"),
    cold("hipSetDevice"),
    cold("hipMalloc"),
    cold("hipMallocManaged"),
    cold("hipFree"),
    cold("hipMemcpy"),
    hot("hipMemcpyAsync"),
    cold("hipModuleLoadData"),
    hot("hipModuleLaunchKernel"),
    hot("hipLaunchKernel"),
    cold("hipDeviceSynchronize"),
    cold("hipStreamSynchronize"),
    hot("hipGetLastError"),
    cold("hipCtxCreate"),
    cold("hipDeviceReset"),
    // Appended with the tiers: entry points current runtimes and
    // frameworks call, per-thread-stream (`_spt`) variants included.
    hot("hipMallocAsync"),
    hot("hipFreeAsync"),
    hot("hipExtLaunchKernel"),
    hot("hipGraphLaunch"),
    hot("hipLaunchKernel_spt"),
    hot("hipMemcpyAsync_spt"),
    hot("hipPeekAtLastError"),
    hot("hipMemsetAsync"),
    hot("hipMemcpyHtoDAsync"),
    hot("hipMemcpyDtoHAsync"),
    hot("hipMemcpyDtoDAsync"),
    hot("hipLaunchCooperativeKernel"),
    cold("hipMemcpy_spt"),
    cold("hipStreamSynchronize_spt"),
    cold("hipEventSynchronize"),
    cold("hipModuleLoad"),
];

/// CUDA driver API entry points probed (the ones ZLUDA implements, and the
/// versioned and per-thread-stream variants the CUDA 12 runtime gets
/// through `cuGetProcAddress`). Same rule: append only.
pub const CUDA_FUNCTIONS: &[GpuFunction] = &[
    cold("cuInit"),
    cold("cuDeviceGet"),
    cold("cuDeviceGetCount"),
    cold("cuCtxCreate_v2"),
    cold("cuDevicePrimaryCtxRetain"),
    cold("cuMemAlloc_v2"),
    cold("cuMemFree_v2"),
    cold("cuMemcpyHtoD_v2"),
    cold("cuMemcpyDtoH_v2"),
    cold("cuModuleLoadData"),
    cold("cuModuleLoadDataEx"),
    cold("cuModuleGetFunction"),
    hot("cuLaunchKernel"),
    cold("cuStreamSynchronize"),
    cold("cuCtxSynchronize"),
    // Cheap, and called by frameworks at start-up (torch's CUDA init).
    cold("cuDriverGetVersion"),
    // Appended with the tiers.
    hot("cuLaunchKernelEx"),
    hot("cuLaunchKernel_ptsz"),
    hot("cuLaunchKernelEx_ptsz"),
    hot("cuLaunchCooperativeKernel"),
    hot("cuGraphLaunch"),
    hot("cuMemcpyAsync"),
    hot("cuMemcpyHtoDAsync_v2"),
    hot("cuMemcpyDtoHAsync_v2"),
    hot("cuMemcpyAsync_ptsz"),
    hot("cuMemcpyHtoDAsync_v2_ptsz"),
    hot("cuMemcpyDtoHAsync_v2_ptsz"),
    hot("cuMemAllocAsync"),
    hot("cuMemFreeAsync"),
    cold("cuCtxCreate_v4"),
    cold("cuLibraryLoadData"),
    cold("cuLibraryGetKernel"),
    cold("cuMemcpyHtoD_v2_ptds"),
    cold("cuMemcpyDtoH_v2_ptds"),
    cold("cuStreamSynchronize_ptsz"),
    cold("cuGetProcAddress_v2"),
];

/// CUDA runtime entry points probed (`libcudart.so.*`, every export versioned,
/// e.g. `cudaGetDeviceCount@@libcudart.so.13`). Functions a runtime lacks
/// (`cudaInitDevice` before 12.0) are skipped. Same rule: append only.
pub const CUDART_FUNCTIONS: &[GpuFunction] = &[
    // The runtime initialises on its first call; these are what frameworks
    // call first (torch.cuda.is_available() is cudaGetDeviceCount).
    cold("cudaGetDeviceCount"),
    cold("cudaSetDevice"),
    cold("cudaInitDevice"),
    cold("cudaDriverGetVersion"),
    cold("cudaGetDeviceProperties"),
    cold("cudaGetDeviceProperties_v2"),
    cold("cudaMalloc"),
    cold("cudaMallocManaged"),
    cold("cudaMallocHost"),
    cold("cudaMallocPitch"),
    cold("cudaFree"),
    cold("cudaMemcpy"),
    cold("cudaMemcpy_ptds"),
    cold("cudaDeviceSynchronize"),
    cold("cudaStreamSynchronize"),
    cold("cudaStreamSynchronize_ptsz"),
    cold("cudaEventSynchronize"),
    cold("cudaStreamCreate"),
    cold("cudaStreamCreateWithFlags"),
    cold("cudaStreamCreateWithPriority"),
    hot("cudaLaunchKernel"),
    hot("cudaLaunchKernel_ptsz"),
    hot("cudaLaunchKernelExC"),
    hot("cudaLaunchKernelExC_ptsz"),
    hot("cudaMemcpyAsync"),
    hot("cudaMemcpyAsync_ptsz"),
    hot("cudaMemsetAsync"),
    hot("cudaMemsetAsync_ptsz"),
    hot("cudaMallocAsync"),
    hot("cudaMallocAsync_ptsz"),
    hot("cudaFreeAsync"),
    hot("cudaFreeAsync_ptsz"),
    hot("cudaGetLastError"),
    hot("cudaPeekAtLastError"),
    hot("cudaGraphLaunch"),
    hot("cudaGraphLaunch_ptsz"),
];

/// The position of `name` in `table`, as a cookie's function id; `u32::MAX`
/// when absent. `const`, so the kernel side compares ids, never names.
pub const fn function_id(table: &[GpuFunction], name: &str) -> u32 {
    let mut i = 0;
    while i < table.len() {
        let (a, b) = (table[i].name.as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return i as u32;
            }
        }
        i += 1;
    }
    u32::MAX
}

/// The driver API's `CUresult cuDriverGetVersion(int *)` and the runtime's
/// `cudaError_t cudaDriverGetVersion(int *)`: the CUDA version the driver
/// reports (12020 for CUDA 12.2), which tells "runtime newer than the
/// driver" (35 `cudaErrorInsufficientDriver`) from a missing device.
pub const CUDA_DRIVER_GET_VERSION: u32 = function_id(CUDA_FUNCTIONS, "cuDriverGetVersion");
pub const CUDART_DRIVER_GET_VERSION: u32 = function_id(CUDART_FUNCTIONS, "cudaDriverGetVersion");

/// Whether a call fills an `int *` first argument with the driver's version.
#[inline(always)]
pub const fn reports_driver_version(api: u32, function: u32) -> bool {
    (api == Api::Cuda as u32 && function == CUDA_DRIVER_GET_VERSION)
        || (api == Api::Cudart as u32 && function == CUDART_DRIVER_GET_VERSION)
}

/// Per process (tgid): the driver version its latest successful
/// version call returned. Successful calls are not events, so the kernel
/// keeps the answer here and userspace reads it where it needs it (a
/// failure's event, the per-pod gauge). LRU: dead processes age out.
pub const DRIVER_VERSIONS_MAP: &str = "GPU_DRIVER_VERSIONS";
pub const MAX_DRIVER_VERSION_PROCESSES: u32 = 4096;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverVersion {
    /// `1000 * major + 10 * minor`, as CUDA encodes it.
    pub version: i32,
    pub _pad: u32,
    /// The process's cgroup at the call.
    pub cgroup_id: u64,
}

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
            | "cuCtxCreate_v4"
            | "cuDevicePrimaryCtxRetain"
            | "cudaGetDeviceCount"
            | "cudaSetDevice"
            | "cudaInitDevice"
    )
}

/// The tier of a probed function by name; `None` for a name not probed.
pub fn tier_of(name: &str) -> Option<Tier> {
    Api::ALL.iter().flat_map(|api| api.functions()).find(|f| f.name == name).map(|f| f.tier)
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
    /// The call's first argument: the `int *` a version call fills (see
    /// [`reports_driver_version`]), read at its return.
    pub arg0: u64,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuStatsKey {
    pub cgroup_id: u64,
    pub api: u32,
    pub function: u32,
    pub result: i32,
    /// Non-zero: counted at return only ([`COUNT_PROGRAM`]); the value's
    /// count is the number of calls, and its buckets and total stay empty.
    pub untimed: u32,
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
    /// [`UNTIMED_NS`] when the call was counted at its return only.
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
    fn per_operation_calls_are_hot_and_failures_still_surface_cold() {
        for name in [
            "hipLaunchKernel",
            "hipModuleLaunchKernel",
            "hipMemcpyAsync",
            "hipGetLastError",
            "cuLaunchKernel",
            "cudaLaunchKernel",
            "cudaMemcpyAsync",
            "cudaGetLastError",
        ] {
            assert_eq!(tier_of(name), Some(Tier::Hot), "{name}");
        }
        // Sticky errors of asynchronous work are returned by the next
        // synchronisation, which every process keeps probed.
        for name in [
            "hipInit",
            "cuInit",
            "cudaGetDeviceCount",
            "hipStreamSynchronize",
            "cuStreamSynchronize",
            "cuCtxSynchronize",
            "cudaDeviceSynchronize",
            "cudaStreamSynchronize",
        ] {
            assert_eq!(tier_of(name), Some(Tier::Cold), "{name}");
        }
        // Every init function is cold: a failed start is seen in every process.
        for f in Api::ALL.iter().flat_map(|api| api.functions()) {
            if is_init_function(f.name) {
                assert_eq!(f.tier, Tier::Cold, "{}", f.name);
            }
        }
    }

    #[test]
    fn function_tables_fit_the_cookie_and_have_no_duplicates() {
        for api in Api::ALL {
            let f = api.functions();
            assert!(f.len() < 0xffff);
            for (i, a) in f.iter().enumerate() {
                assert!(!f[i + 1..].iter().any(|b| b.name == a.name), "{} twice", a.name);
            }
        }
    }

    #[test]
    fn version_calls_are_known_by_id() {
        assert_eq!(CUDA_FUNCTIONS[CUDA_DRIVER_GET_VERSION as usize].name, "cuDriverGetVersion");
        assert_eq!(CUDART_FUNCTIONS[CUDART_DRIVER_GET_VERSION as usize].name, "cudaDriverGetVersion");
        assert!(reports_driver_version(Api::Cuda as u32, CUDA_DRIVER_GET_VERSION));
        assert!(!reports_driver_version(Api::Hip as u32, CUDA_DRIVER_GET_VERSION));
        assert_eq!(function_id(CUDA_FUNCTIONS, "cuNoSuchThing"), u32::MAX);
    }

    #[test]
    fn layers_run_from_hip_beneath_to_the_cuda_runtime_on_top() {
        assert!(Api::Hip.is_beneath(Api::Cuda));
        assert!(Api::Cuda.is_beneath(Api::Cudart));
        assert!(Api::Hip.is_beneath(Api::Cudart));
        assert!(!Api::Cudart.is_beneath(Api::Cuda));
        assert!(!Api::Cuda.is_beneath(Api::Cuda));
        for (i, api) in Api::ALL.iter().enumerate() {
            assert_eq!(Api::from_u32(*api as u32), Some(*api));
            assert!(Api::ALL[i + 1..].iter().all(|outer| api.is_beneath(*outer)));
        }
    }
}
