//! GPU runtime calls: one uprobe and one uretprobe program shared by every
//! probed function of `libamdhip64` and `libcuda`/`libnvcuda`; the attach
//! cookie (see `observer_common::gpu::cookie`) says which function fired.
//!
//! match-proto: every probed function returns `hipError_t` / `CUresult`, a
//! 32-bit enum in `eax` (x86-64 SysV), so the return value is read as `i32`.

use aya_ebpf::{
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns,
    },
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, PerCpuHashMap},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use observer_common::{
    gpu::{
        cookie_api, cookie_function, cookie_library, GpuCallEvent, GpuStats, GpuStatsKey, InflightFrame,
        InflightKey, InflightStack, DEFAULT_STALL_NS, MAX_INFLIGHT_THREADS, MAX_NESTING, MAX_STATS_ENTRIES,
    },
    EventKind,
};

use crate::common::{current_header, emit, record_latency};

#[map(name = "GPU_INFLIGHT")] // observer_common::gpu::INFLIGHT_MAP
pub static GPU_INFLIGHT: HashMap<InflightKey, InflightStack> =
    HashMap::with_max_entries(MAX_INFLIGHT_THREADS, 0);

#[map(name = "GPU_STATS")] // observer_common::gpu::STATS_MAP
static GPU_STATS: PerCpuHashMap<GpuStatsKey, GpuStats> =
    PerCpuHashMap::with_max_entries(MAX_STATS_ENTRIES, 0);

/// Non-zero: every return is an event (`canaryscope trace --all`).
#[unsafe(no_mangle)] // observer_common::gpu::GLOBAL_EMIT_ALL
pub static GPU_EMIT_ALL: u32 = 0;
/// Calls at least this slow are events even when they succeed (stall returns).
#[unsafe(no_mangle)] // observer_common::gpu::GLOBAL_SLOW_NS
static GPU_SLOW_NS: u64 = DEFAULT_STALL_NS;

#[inline(always)]
pub fn read_global<T: Copy>(v: &T) -> T {
    // SAFETY: globals are overridden at load time; the volatile read keeps
    // the compiler from folding the compile-time default into the code.
    unsafe { core::ptr::read_volatile(v) }
}

/// Index into `InflightStack::frames` for nesting depth `*depth - back`,
/// and whether that depth is kept at all.
///
/// Two volatile reads on purpose: LLVM otherwise proves the index bounded
/// from the validity check and drops the mask, then checks one register and
/// indexes with another, which the 6.1 verifier rejects as unbounded. The
/// mask is what the verifier needs; the separate check is what we need.
#[inline(always)]
pub fn frame_slot(depth: &u32, back: u32) -> (usize, bool) {
    // SAFETY: plain reads of a valid map value field.
    let for_index = unsafe { core::ptr::read_volatile(depth) }.wrapping_sub(back);
    let for_check = unsafe { core::ptr::read_volatile(depth) }.wrapping_sub(back);
    ((for_index as usize) & (MAX_NESTING - 1), (for_check as usize) < MAX_NESTING)
}

#[uprobe]
pub fn gpu_enter(ctx: ProbeContext) -> u32 {
    try_gpu_enter(&ctx).unwrap_or(1)
}

fn try_gpu_enter(ctx: &ProbeContext) -> Result<u32, i64> {
    // SAFETY: helper reading this program's own attach cookie.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = InflightKey { tid: pid_tgid as u32, api: cookie_api(cookie) };
    // SAFETY: plain helper without pointer arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let frame =
        InflightFrame { start_ns: now, function: cookie_function(cookie), library: cookie_library(cookie) };

    // A thread's entry outlives its calls (depth 0 when idle): a hash
    // insert and delete per call cost about a third of the program's time.
    // Userspace removes the entries of threads that exited.
    if let Some(stack) = GPU_INFLIGHT.get_ptr_mut(&key) {
        // SAFETY: the map value stays valid while this program runs, and only
        // this thread touches its own key.
        let stack = unsafe { &mut *stack };
        if stack.depth == 0 {
            // An outermost call: the thread id may belong to a new thread
            // by now, and a thread can move between cgroups.
            stack.pid = (pid_tgid >> 32) as u32;
            // SAFETY: plain helper without pointer arguments.
            stack.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
        }
        let (slot, valid) = frame_slot(&stack.depth, 0);
        if valid {
            stack.frames[slot] = frame;
        }
        stack.depth = stack.depth.saturating_add(1);
        return Ok(0);
    }
    let mut stack = InflightStack {
        pid: (pid_tgid >> 32) as u32,
        depth: 1,
        // SAFETY: plain helper without pointer arguments.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        frames: [InflightFrame::default(); MAX_NESTING],
    };
    stack.frames[0] = frame;
    GPU_INFLIGHT.insert(&key, &stack, 0).map_err(|e| e as i64)?;
    Ok(0)
}

#[uretprobe]
pub fn gpu_exit(ctx: RetProbeContext) -> u32 {
    try_gpu_exit(&ctx).unwrap_or(1)
}

fn try_gpu_exit(ctx: &RetProbeContext) -> Result<u32, i64> {
    // SAFETY: helper reading this program's own attach cookie.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let pid_tgid = bpf_get_current_pid_tgid();
    let api = cookie_api(cookie);
    let function = cookie_function(cookie);
    let key = InflightKey { tid: pid_tgid as u32, api };
    // SAFETY: plain helper without pointer arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    let result: i32 = ctx.ret();

    // A return without a recorded entry (the probe attached mid-call) still
    // counts, with an unknown duration of zero.
    let mut start = now;
    if let Some(stack) = GPU_INFLIGHT.get_ptr_mut(&key) {
        // SAFETY: see try_gpu_enter.
        let stack = unsafe { &mut *stack };
        if stack.depth > 0 {
            stack.depth -= 1;
            let (slot, valid) = frame_slot(&stack.depth, 0);
            let (frame_function, frame_start) = if valid {
                (stack.frames[slot].function, stack.frames[slot].start_ns)
            } else {
                (u32::MAX, now)
            };
            if frame_function == function {
                start = frame_start;
            }
        }
    }
    let duration_ns = now.saturating_sub(start);

    // SAFETY: plain helper without pointer arguments.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let stats_key = GpuStatsKey { cgroup_id, api, function, result, _pad: 0 };
    record_latency(&GPU_STATS, &stats_key, duration_ns);

    if result != 0 || read_global(&GPU_EMIT_ALL) != 0 || duration_ns >= read_global(&GPU_SLOW_NS) {
        let event = GpuCallEvent {
            header: current_header(EventKind::GpuCall as u32),
            api,
            function,
            result,
            library: cookie_library(cookie),
            duration_ns,
        };
        emit(&event);
    }
    Ok(0)
}
