//! AMD KFD driver ioctls: `kfd_ioctl` entry/return where kprobes exist,
//! the ioctl syscall tracepoints filtered to the KFD device where not.
//! Aggregated per cgroup x `_IOC_NR` x result; failures become events.
use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_boot_ns},
    macros::{kprobe, kretprobe, map, tracepoint},
    maps::{HashMap, PerCpuHashMap},
    programs::{ProbeContext, RetProbeContext, TracePointContext},
};
use observer_common::{
    kfd::{
        hw_hook, ioc_nr, is_kfd_ioctl, HwEvent, KfdInflight, KfdIoctlEvent, KfdSource, KfdStats, KfdStatsKey,
        MAX_KFD_STATS,
    },
    EventKind,
};

use crate::{
    common::{current_header, emit, record_latency},
    gpu::{read_global, GPU_EMIT_ALL},
    kernel::{current_fd_file, offsets, read},
};

#[map(name = "KFD_INFLIGHT")]
static KFD_INFLIGHT: HashMap<u32, KfdInflight> = HashMap::with_max_entries(8192, 0);

#[map(name = "KFD_STATS")] // observer_common::kfd::KFD_STATS_MAP
static KFD_STATS: PerCpuHashMap<KfdStatsKey, KfdStats> = PerCpuHashMap::with_max_entries(MAX_KFD_STATS, 0);

#[unsafe(no_mangle)] // observer_common::kfd::GLOBAL_KFD_RDEV
static KFD_RDEV: u32 = 0;

#[inline(always)]
fn enter(cmd: u32) -> Result<(), i64> {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_boot_ns() };
    KFD_INFLIGHT.insert(&tid, &KfdInflight { start_ns: now, cmd, _pad: 0 }, 0).map_err(|e| e as i64)
}

#[inline(always)]
fn exit(result: i64, source: KfdSource) -> Result<(), i64> {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: read-only lookup.
    let Some(inflight) = (unsafe { KFD_INFLIGHT.get(&tid) }).copied() else { return Ok(()) };
    let _ = KFD_INFLIGHT.remove(&tid);
    // SAFETY: helpers without arguments.
    let duration_ns = unsafe { bpf_ktime_get_boot_ns() }.saturating_sub(inflight.start_ns);
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let result = result as i32;
    let key = KfdStatsKey { cgroup_id, nr: ioc_nr(inflight.cmd), result };
    record_latency(&KFD_STATS, &key, duration_ns);
    // `trace --all` shows successes too (GET_VERSION succeeding is how a
    // person tells a working driver from a missing one).
    if result < 0 || read_global(&GPU_EMIT_ALL) != 0 {
        emit(&KfdIoctlEvent {
            header: current_header(EventKind::KfdIoctl as u32),
            cmd: inflight.cmd,
            result,
            duration_ns,
            source: source as u32,
            _pad: 0,
        });
    }
    Ok(())
}

/// match-proto: static long kfd_ioctl(struct file *filep, unsigned int cmd,
/// unsigned long arg) in drivers/gpu/drm/amd/amdkfd/kfd_chardev.c.
#[kprobe]
pub fn kfd_ioctl_enter(ctx: ProbeContext) -> u32 {
    let cmd: u32 = ctx.arg::<u64>(1).unwrap_or(0) as u32;
    if !is_kfd_ioctl(cmd) {
        return 0;
    }
    enter(cmd).map(|_| 0).unwrap_or(1)
}

#[kretprobe]
pub fn kfd_ioctl_exit(ctx: RetProbeContext) -> u32 {
    let ret: i64 = ctx.ret::<i64>();
    exit(ret, KfdSource::Kprobe).map(|_| 0).unwrap_or(1)
}

/// The device number behind `fd` of the current task.
///
/// match-proto: dev_t inode::i_rdev.
#[inline(always)]
fn fd_rdev(fd: u64) -> Result<u32, i64> {
    let file = current_fd_file(fd)?;
    let inode: *const u8 = read(file, offsets().file_f_inode)?;
    read(inode, offsets().inode_i_rdev)
}

/// Fallback without kprobes: syscalls:sys_enter_ioctl (fd at 16, cmd at 24;
/// the syscall tracepoint layout is fixed by the ABI).
#[tracepoint(category = "syscalls", name = "sys_enter_ioctl")]
pub fn kfd_sys_enter_ioctl(ctx: TracePointContext) -> u32 {
    // SAFETY: fixed syscall tracepoint layout.
    let cmd: u64 = unsafe { ctx.read_at(24) }.unwrap_or(0);
    let cmd = cmd as u32;
    if !is_kfd_ioctl(cmd) {
        return 0; // most ioctls stop here, before any pointer chasing
    }
    // SAFETY: volatile read of a load-time global.
    let want = unsafe { core::ptr::read_volatile(&KFD_RDEV) };
    let fd: u64 = unsafe { ctx.read_at(16) }.unwrap_or(u64::MAX);
    match fd_rdev(fd) {
        Ok(rdev) if rdev == want && want != 0 => enter(cmd).map(|_| 0).unwrap_or(1),
        _ => 0,
    }
}

/// syscalls:sys_exit_ioctl: `ret` at 16.
#[tracepoint(category = "syscalls", name = "sys_exit_ioctl")]
pub fn kfd_sys_exit_ioctl(ctx: TracePointContext) -> u32 {
    // SAFETY: fixed syscall tracepoint layout.
    let ret: i64 = unsafe { ctx.read_at(16) }.unwrap_or(0);
    exit(ret, KfdSource::Syscall).map(|_| 0).unwrap_or(1)
}

/// One small program per hooked function (aya's `KProbe::attach` takes no
/// cookie), each sending its index in `HW_HOOKS`; arguments 1 and 2 are
/// read raw and decoded in userspace, which knows each prototype.
#[inline(always)]
fn hw_event(ctx: &ProbeContext, hook: u32) -> u32 {
    let arg1: u64 = ctx.arg::<u64>(1).unwrap_or(0);
    let arg2: u64 = ctx.arg::<u64>(2).unwrap_or(0);
    emit(&HwEvent { header: current_header(EventKind::GpuHardware as u32), hook, _pad: 0, arg1, arg2 });
    0
}

#[kprobe]
pub fn kfd_hw_vmfault(ctx: ProbeContext) -> u32 {
    const HOOK: u32 = hw_hook("kfd_hw_vmfault");
    hw_event(&ctx, HOOK)
}

#[kprobe]
pub fn kfd_hw_vmfault_signal(ctx: ProbeContext) -> u32 {
    const HOOK: u32 = hw_hook("kfd_hw_vmfault_signal");
    hw_event(&ctx, HOOK)
}

#[kprobe]
pub fn kfd_hw_reset_signal(ctx: ProbeContext) -> u32 {
    const HOOK: u32 = hw_hook("kfd_hw_reset_signal");
    hw_event(&ctx, HOOK)
}

#[kprobe]
pub fn kfd_hw_gpu_recover(ctx: ProbeContext) -> u32 {
    const HOOK: u32 = hw_hook("kfd_hw_gpu_recover");
    hw_event(&ctx, HOOK)
}

#[kprobe]
pub fn kfd_hw_eviction_smi(ctx: ProbeContext) -> u32 {
    const HOOK: u32 = hw_hook("kfd_hw_eviction_smi");
    hw_event(&ctx, HOOK)
}

#[kprobe]
pub fn kfd_hw_evict_queues(ctx: ProbeContext) -> u32 {
    const HOOK: u32 = hw_hook("kfd_hw_evict_queues");
    hw_event(&ctx, HOOK)
}
