//! Native crashes: a fatal synchronous signal raised in the faulting
//! thread, with the mapping and the GPU call its instruction pointer was in.
use core::ffi::c_void;

use aya_ebpf::{
    helpers::{
        bpf_find_vma, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_get_current_task_btf,
        bpf_probe_read_kernel_str_bytes, bpf_task_pt_regs,
    },
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuArray},
    programs::RawTracePointContext,
};
use observer_common::{
    crash::{in_call_api_code, CrashInfo, IpMapping},
    discovery::LIBRARY_NAME_LEN,
    exit::{
        signal::{SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGSEGV},
        SI_KERNEL_FAULT_MIN,
    },
    gpu::{Api, InflightKey},
    kernel::KernelOffsets,
};

use crate::{
    exit::SIGINFO_CODE,
    gpu::{frame_slot, GPU_INFLIGHT},
    kernel::{offsets, read},
};

/// Last fatal synchronous signal per process, until it exits (tgid -> crash).
#[map(name = "CRASHES")]
pub(crate) static CRASHES: HashMap<u32, CrashInfo> = HashMap::with_max_entries(4096, 0);

/// Scratch space: a CrashInfo is too big to build on the 512-byte stack
/// next to everything else.
#[map(name = "CRASH_SCRATCH")]
static CRASH_SCRATCH: PerCpuArray<CrashInfo> = PerCpuArray::with_max_entries(1, 0);

/// x86-64 `struct pt_regs`: ip follows r15..r8, ax, cx, dx, si, di, orig_ax.
const PT_REGS_IP: u32 = 16 * 8;
/// `kernel_siginfo`: the union after si_code, whose first member for
/// faults is `si_addr` (8-byte aligned).
const SIGINFO_ADDR: u32 = 16;

/// match-proto: TP_PROTO(int sig, struct kernel_siginfo *info,
/// struct task_struct *task, int group, int result), 5.10 .. 6.18.
///
/// A fault (SIGSEGV, SIGBUS, SIGILL, SIGFPE) is generated in the faulting
/// thread's own context, and so is abort()'s SIGABRT (tgkill to itself):
/// the address space is still intact here, unlike at exit, so this is where
/// the faulting instruction's mapping is looked up. Needs Linux 5.17
/// (`observer::probes::table::CRASH_HELPERS`); `signal_generate_stack` is
/// the shape for older kernels.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate(ctx: RawTracePointContext) -> i32 {
    try_crash::<true>(&ctx).unwrap_or(1)
}

/// The crash program of kernels before 5.17: the user registers are read
/// where the kernel keeps them, at the top of the thread's kernel stack,
/// and the mapping is found by walking the process's tree of mappings
/// (those kernels still have it), not by waiting for userspace to have
/// read `/proc/PID/maps` before the process died. Only helpers of 5.8 and
/// before.
#[raw_tracepoint(tracepoint = "signal_generate")]
pub fn signal_generate_stack(ctx: RawTracePointContext) -> i32 {
    try_crash::<false>(&ctx).unwrap_or(1)
}

/// x86-64 without KASAN: `THREAD_SIZE` (16 KiB) and `struct pt_regs` (21
/// registers); `task_pt_regs(task)` is the last pt_regs below the stack's
/// top (`TOP_OF_KERNEL_STACK_PADDING` is 0 on x86-64 before FRED, 6.9).
const THREAD_SIZE: u64 = 16 * 1024;
const PT_REGS_SIZE: u64 = 21 * 8;

/// `FIND_VMA`: the kernel has `bpf_task_pt_regs` and `bpf_find_vma`; the
/// other instance calls neither, so it loads where they do not exist.
#[inline(always)]
fn try_crash<const FIND_VMA: bool>(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let sig: i32 = ctx.arg::<u64>(0) as i32;
    let target = ctx.arg::<u64>(2);
    let info = ctx.arg::<u64>(1) as *const u8;
    let si_code: i32 = if (info as u64) > 1 { read(info, SIGINFO_CODE).unwrap_or(0) } else { 0 };
    if !matches!(sig, SIGSEGV | SIGBUS | SIGILL | SIGFPE | SIGABRT) {
        return Ok(0);
    }
    // SAFETY: helper without pointer arguments.
    let current = unsafe { bpf_get_current_task() };
    if target != current {
        return Ok(0); // sent by someone else: not a crash of the target's code
    }
    if sig != SIGABRT && si_code < SI_KERNEL_FAULT_MIN {
        return Ok(0); // a self-sent SIGSEGV is not a fault
    }
    let crash = CRASH_SCRATCH.get_ptr_mut(0).ok_or(-1i64)?;
    // SAFETY: per-CPU scratch slot, only this program on this CPU uses it.
    let crash = unsafe { &mut *crash };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    crash.signal = sig;
    crash.si_code = si_code;
    crash.addr = if sig != SIGABRT && (info as u64) > 1 { read(info, SIGINFO_ADDR).unwrap_or(0) } else { 0 };
    crash.tid = tid;
    crash.ip = read(user_regs::<FIND_VMA>(current)?, PT_REGS_IP).unwrap_or(0);
    note_call_in_flight(crash, tid);
    note_mapping::<FIND_VMA>(crash, current);
    let tgid = (pid_tgid >> 32) as u32;
    CRASHES.insert(&tgid, crash, 0).map_err(|e| e as i64)?;
    Ok(0)
}

/// Where the faulting thread's user registers are: `current`'s pt_regs.
#[inline(always)]
fn user_regs<const FIND_VMA: bool>(current: u64) -> Result<*const u8, i64> {
    if FIND_VMA {
        // The verifier wants a BTF-typed task for this helper; this is the
        // same task as `current`.
        // SAFETY: helper without arguments, then a trusted task pointer.
        Ok(unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8 })
    } else {
        let stack: *const u8 = read(current as *const u8, offsets().task_stack)?;
        Ok(stack.wrapping_add((THREAD_SIZE - PT_REGS_SIZE) as usize))
    }
}

/// The GPU call the thread was in when it faulted. The innermost API wins:
/// a crash inside hipMalloc called by cuMemAlloc is reported as hipMalloc
/// (the CUDA frame is visible in the library).
#[inline(always)]
fn note_call_in_flight(crash: &mut CrashInfo, tid: u32) {
    crash.in_call_api = 0;
    for api in Api::ALL {
        let key = InflightKey { tid, api: api as u32 };
        // SAFETY: read-only access to a map value.
        if let Some(stack) = unsafe { GPU_INFLIGHT.get(&key) } {
            let (slot, valid) = frame_slot(&stack.depth, 1);
            if stack.depth == 0 || !valid {
                continue;
            }
            let frame = stack.frames[slot];
            crash.in_call_api = in_call_api_code(api);
            crash.in_call_function = frame.function;
            break;
        }
    }
}

/// Which mapping (and file) the faulting instruction pointer is in, while
/// the address space is still whole: by `bpf_find_vma`, or by walking the
/// tree of mappings on kernels without it.
#[inline(always)]
fn note_mapping<const FIND_VMA: bool>(crash: &mut CrashInfo, current: u64) {
    crash.ip_mapping = IpMapping::Unknown as u32;
    crash.file_name = [0; LIBRARY_NAME_LEN];
    let o = offsets();
    if o.have_vma == 0 || crash.ip == 0 {
        if !FIND_VMA {
            crash.ip_mapping = IpMapping::NotLookedUp as u32;
        }
        return;
    }
    let mut found = VmaFound {
        mapping: IpMapping::Unknown as u32,
        start: 0,
        pgoff: 0,
        ino: 0,
        name: [0; LIBRARY_NAME_LEN],
    };
    if FIND_VMA {
        // The helper only accepts a stack pointer as the callback's context.
        // SAFETY: `vma_found` is a BPF callback with the signature the
        // helper requires; `found` lives on this stack for the whole call.
        unsafe {
            bpf_find_vma(
                bpf_get_current_task_btf(),
                crash.ip,
                vma_found as *mut c_void,
                (&mut found as *mut VmaFound).cast::<c_void>(),
                0,
            )
        };
    } else if o.have_vma_tree != 0 {
        if let Some(vma) = walk_vma_tree(current as *const u8, crash.ip, &o) {
            describe_vma(vma, &mut found, &o);
        }
    } else {
        found.mapping = IpMapping::NotLookedUp as u32;
    }
    crash.ip_mapping = found.mapping;
    crash.vma_start = found.start;
    crash.vma_pgoff = found.pgoff;
    crash.file_ino = found.ino;
    crash.file_name = found.name;
}

#[repr(C)]
struct VmaFound {
    /// An `IpMapping` as a number, as `CrashInfo::ip_mapping` stores it.
    mapping: u32,
    start: u64,
    pgoff: u64,
    ino: u64,
    name: [u8; LIBRARY_NAME_LEN],
}

/// `bpf_find_vma` callback: records which file backs the faulting address.
#[inline(never)]
extern "C" fn vma_found(_task: *mut c_void, vma: *mut c_void, data: *mut c_void) -> i64 {
    // SAFETY: `data` is the VmaFound passed to bpf_find_vma above.
    let found = unsafe { &mut *(data as *mut VmaFound) };
    describe_vma(vma as *const u8, found, &offsets());
    0
}

/// Fills `found` from the mapping at `vma`: its range start and file.
///
/// match-proto: unsigned long vm_area_struct::vm_start, vm_pgoff; struct file
/// *vm_area_struct::vm_file; struct inode *file::f_inode; struct path
/// file::f_path (dentry first); unsigned long inode::i_ino; struct qstr
/// dentry::d_name (name pointer).
#[inline(always)]
fn describe_vma(vma: *const u8, found: &mut VmaFound, o: &KernelOffsets) {
    found.start = read(vma, o.vma_vm_start).unwrap_or(0);
    found.pgoff = read(vma, o.vma_vm_pgoff).unwrap_or(0);
    let file: *const u8 = read(vma, o.vma_vm_file).unwrap_or(core::ptr::null());
    if file.is_null() {
        found.mapping = IpMapping::Anonymous as u32; // JIT code or a wild jump
        return;
    }
    let inode: *const u8 = read(file, o.file_f_inode).unwrap_or(core::ptr::null());
    found.ino = read(inode, o.inode_i_ino).unwrap_or(0);
    let dentry: *const u8 = read(file, o.file_f_path_dentry).unwrap_or(core::ptr::null());
    let name: *const u8 = read(dentry, o.dentry_d_name_name).unwrap_or(core::ptr::null());
    if !name.is_null() {
        // SAFETY: reads a NUL-terminated kernel string into our buffer.
        let _ = unsafe { bpf_probe_read_kernel_str_bytes(name, &mut found.name) };
    }
    found.mapping = IpMapping::File as u32;
}

/// Deep enough for any red-black tree of mappings: its height is at most
/// twice log2 of the count, and `vm.max_map_count` defaults to 65,530.
const VMA_TREE_DEPTH: u32 = 40;

/// The mapping holding `ip` in the current process, found the way the
/// kernel's own `find_vma` did before 6.1: down the tree of mappings to the
/// lowest one ending above `ip`. The faulting thread is still running, so
/// its address space is intact; nothing is locked, so a tree being changed
/// by another thread at this instant can send the walk astray, and the
/// result is checked before it is believed.
///
/// match-proto: struct mm_struct *task_struct::mm; struct rb_root
/// mm_struct::mm_rb (rb_node first); struct rb_node vm_area_struct::vm_rb;
/// struct rb_node *rb_node::rb_left, *rb_node::rb_right (5.10 .. 6.0).
#[inline(always)]
fn walk_vma_tree(task: *const u8, ip: u64, o: &KernelOffsets) -> Option<*const u8> {
    let mm: *const u8 = read(task, o.task_mm).ok()?;
    let mut node: *const u8 = read(mm, o.mm_mm_rb).ok()?;
    let mut best: *const u8 = core::ptr::null();
    for _ in 0..VMA_TREE_DEPTH {
        if node.is_null() {
            break;
        }
        let vma = node.wrapping_sub(o.vma_vm_rb as usize);
        let end: u64 = read(vma, o.vma_vm_end).ok()?;
        let next = if end > ip {
            best = vma;
            let start: u64 = read(vma, o.vma_vm_start).ok()?;
            if start <= ip {
                break;
            }
            o.rb_node_rb_left
        } else {
            o.rb_node_rb_right
        };
        node = read(node, next).ok()?;
    }
    let start: u64 = read(best, o.vma_vm_start).ok()?;
    let end: u64 = read(best, o.vma_vm_end).ok()?;
    (start <= ip && ip < end).then_some(best)
}
