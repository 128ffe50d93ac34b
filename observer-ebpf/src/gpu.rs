//! GPU runtime calls: one uprobe and one uretprobe program shared by every
//! probed function of the HIP runtime (`libamdhip64`), the CUDA driver
//! (`libcuda`/`libnvcuda`) and the CUDA runtime (`libcudart`, or linked
//! statically into an executable); the attach cookie (see
//! `observer_common::gpu::cookie`) says which function fired.
//!
//! match-proto: every probed function returns `hipError_t` / `CUresult` /
//! `cudaError_t`, a 32-bit enum in `eax` (x86-64 SysV), so the return value
//! is read as `i32`.

use aya_ebpf::{
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns,
        bpf_probe_read_user,
    },
    macros::{map, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuHashMap},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use observer_common::{
    gpu::{
        cookie_api, cookie_function, cookie_library, reports_driver_version, DriverVersion, GpuCallEvent,
        GpuStats, GpuStatsKey, InflightFrame, InflightKey, InflightStack, DEFAULT_STALL_NS,
        MAX_DRIVER_VERSION_PROCESSES, MAX_GPU_SLOTS, MAX_INFLIGHT_THREADS, MAX_NESTING, MAX_STATS_ENTRIES,
        UNTIMED_NS,
    },
    EventKind,
};

use crate::common::{bump_generation, current_header, emit, record_latency};

#[map(name = "GPU_INFLIGHT")] // observer_common::gpu::INFLIGHT_MAP
pub static GPU_INFLIGHT: HashMap<InflightKey, InflightStack> =
    HashMap::with_max_entries(MAX_INFLIGHT_THREADS, 0);

#[map(name = "GPU_STATS")] // observer_common::gpu::STATS_MAP
static GPU_STATS: PerCpuHashMap<GpuStatsKey, GpuStats> =
    PerCpuHashMap::with_max_entries(MAX_STATS_ENTRIES, 0);

#[map(name = "GPU_DRIVER_VERSIONS")] // observer_common::gpu::DRIVER_VERSIONS_MAP
static GPU_DRIVER_VERSIONS: LruHashMap<u32, DriverVersion> =
    LruHashMap::with_max_entries(MAX_DRIVER_VERSION_PROCESSES, 0);

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
    // SAFETY: helper reading this program's own attach cookie.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    try_gpu_enter(cookie, ctx.arg::<u64>(0).unwrap_or(0)).unwrap_or(1)
}

/// `arg0`: the call's first argument, kept for the calls that report the
/// driver's version through it.
#[inline(always)]
fn try_gpu_enter(cookie: u64, arg0: u64) -> Result<u32, i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let key = InflightKey { tid: pid_tgid as u32, api: cookie_api(cookie) };
    // SAFETY: plain helper without pointer arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    // The first argument rides in the frame, written anyway: the version
    // calls' `int *` costs no map of its own.
    let frame = InflightFrame {
        start_ns: now,
        function: cookie_function(cookie),
        library: cookie_library(cookie),
        arg0,
    };

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
    // SAFETY: helper reading this program's own attach cookie.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    try_gpu_exit(cookie, ctx.ret()).unwrap_or(1)
}

#[inline(always)]
fn try_gpu_exit(cookie: u64, result: i32) -> Result<u32, i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let api = cookie_api(cookie);
    let function = cookie_function(cookie);
    let key = InflightKey { tid: pid_tgid as u32, api };
    // SAFETY: plain helper without pointer arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };

    // A return without a recorded entry (the probe attached mid-call) still
    // counts, with an unknown duration of zero.
    let mut start = now;
    let mut arg0 = 0;
    if let Some(stack) = GPU_INFLIGHT.get_ptr_mut(&key) {
        // SAFETY: see try_gpu_enter.
        let stack = unsafe { &mut *stack };
        if stack.depth > 0 {
            stack.depth -= 1;
            let (slot, valid) = frame_slot(&stack.depth, 0);
            let (frame_function, frame_start, frame_arg0) = if valid {
                (stack.frames[slot].function, stack.frames[slot].start_ns, stack.frames[slot].arg0)
            } else {
                (u32::MAX, now, 0)
            };
            if frame_function == function {
                start = frame_start;
                arg0 = frame_arg0;
            }
        }
    }
    let duration_ns = now.saturating_sub(start);

    // SAFETY: plain helper without pointer arguments.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let stats_key = GpuStatsKey { cgroup_id, api, function, result, untimed: 0 };
    record_latency(&GPU_STATS, &stats_key, duration_ns);
    if result == 0 && arg0 != 0 && reports_driver_version(api, function) {
        note_driver_version(pid_tgid, cgroup_id, arg0);
    }

    if result != 0 || read_global(&GPU_EMIT_ALL) != 0 || duration_ns >= read_global(&GPU_SLOW_NS) {
        emit_call(cookie, result, duration_ns);
    }
    Ok(0)
}

/// At a successful version call's return: the version it wrote through
/// `out`, kept per process before any event of the call is emitted, so
/// userspace finds it there.
#[inline(always)]
fn note_driver_version(pid_tgid: u64, cgroup_id: u64, out: u64) {
    // SAFETY: a checked read of the caller's memory; a bad pointer fails.
    let Ok(version) = (unsafe { bpf_probe_read_user(out as *const i32) }) else { return };
    let noted = DriverVersion { version, _pad: 0, cgroup_id };
    let _ = GPU_DRIVER_VERSIONS.insert(&((pid_tgid >> 32) as u32), &noted, 0);
}

/// The event of one returned call of the function `cookie` names.
#[inline(always)]
fn emit_call(cookie: u64, result: i32, duration_ns: u64) {
    emit(&GpuCallEvent {
        header: current_header(EventKind::GpuCall as u32),
        api: cookie_api(cookie),
        function: cookie_function(cookie),
        result,
        library: cookie_library(cookie),
        duration_ns,
    });
}

/// Hot calls in `--hot-detail counts`: attached as a uretprobe alone. The
/// kernel still plants the entry breakpoint (that is how it finds the return
/// address to hijack) but runs no program there, and this one only counts:
/// no clock, no in-flight frame, one map lookup. Under return-thunk
/// mitigations every helper and map call costs tens of nanoseconds, and the
/// entry program's clock read, hash lookup and helpers were most of what a
/// timed pair adds to a launch.
#[uretprobe]
pub fn gpu_count(ctx: RetProbeContext) -> u32 {
    // SAFETY: helper reading this program's own attach cookie.
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let result: i32 = ctx.ret();
    let (api, function) = (cookie_api(cookie), cookie_function(cookie));
    // SAFETY: plain helper without pointer arguments.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let key = GpuStatsKey { cgroup_id, api, function, result, untimed: 1 };
    match GPU_STATS.get_ptr_mut(&key) {
        // SAFETY: per-CPU value; no other writer on this CPU.
        Some(stats) => unsafe { (*stats).count += 1 },
        None => {
            let stats = GpuStats { count: 1, ..GpuStats::default() };
            // A full map loses the count, never the program.
            let _ = GPU_STATS.insert(&key, &stats, 0);
        }
    }
    bump_generation();
    if result != 0 || read_global(&GPU_EMIT_ALL) != 0 {
        emit_call(cookie, result, UNTIMED_NS);
    }
    0
}

// Kernels without attach cookies (before 5.15). Userspace gives each probed
// function of a library file a slot, writes the cookie it would have
// attached into GPU_SLOT_COOKIES there, and attaches that slot's pair of
// programs; everything after the cookie is the same code, reached through
// one BPF-to-BPF call so the 256 pairs stay small.

#[map(name = "GPU_SLOT_COOKIES")] // observer_common::gpu::SLOT_COOKIES_MAP
static GPU_SLOT_COOKIES: Array<u64> = Array::with_max_entries(MAX_GPU_SLOTS, 0);

#[inline(never)]
fn slot_enter(slot: u32, arg0: u64) -> u32 {
    let Some(&cookie) = GPU_SLOT_COOKIES.get(slot) else { return 1 };
    try_gpu_enter(cookie, arg0).unwrap_or(1)
}

#[inline(never)]
fn slot_exit(slot: u32, result: i32) -> u32 {
    let Some(&cookie) = GPU_SLOT_COOKIES.get(slot) else { return 1 };
    try_gpu_exit(cookie, result).unwrap_or(1)
}

macro_rules! gpu_slots {
    ($($slot:literal)*) => {
        paste::paste! {
            $(
                #[uprobe]
                pub fn [<gpu_enter_s $slot>](ctx: ProbeContext) -> u32 {
                    slot_enter($slot, ctx.arg::<u64>(0).unwrap_or(0))
                }

                #[uretprobe]
                pub fn [<gpu_exit_s $slot>](ctx: RetProbeContext) -> u32 {
                    slot_exit($slot, ctx.ret())
                }
            )*
        }
    };
}

// MAX_GPU_SLOTS of them (observer_common::gpu); a unit test on the userspace
// side checks that the object has exactly that many pairs.
gpu_slots!(
    0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31
    32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63
    64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95
    96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127
    128 129 130 131 132 133 134 135 136 137 138 139 140 141 142 143 144 145 146 147 148 149 150 151 152 153 154 155 156 157 158 159
    160 161 162 163 164 165 166 167 168 169 170 171 172 173 174 175 176 177 178 179 180 181 182 183 184 185 186 187 188 189 190 191
    192 193 194 195 196 197 198 199 200 201 202 203 204 205 206 207 208 209 210 211 212 213 214 215 216 217 218 219 220 221 222 223
    224 225 226 227 228 229 230 231 232 233 234 235 236 237 238 239 240 241 242 243 244 245 246 247 248 249 250 251 252 253 254 255
);
