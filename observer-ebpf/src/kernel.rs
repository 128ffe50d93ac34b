//! Reading kernel structs at offsets userspace found in BTF.
use aya_ebpf::helpers::{bpf_get_current_task, bpf_probe_read_kernel};
use observer_common::kernel::KernelOffsets;

#[unsafe(no_mangle)] // observer_common::kernel::GLOBAL_OFFSETS
pub static KERNEL_OFFSETS: KernelOffsets = KernelOffsets::ZERO;

/// One offset, read alone from the frozen read-only global: the verifier
/// then knows its value, which BTF-typed programs need to load a field
/// straight from a typed kernel pointer (see `sched.rs`).
#[macro_export]
macro_rules! offset {
    ($field:ident) => {
        // SAFETY: a plain read of a global's field; volatile so the
        // compile-time zero is not folded in.
        unsafe { core::ptr::read_volatile(core::ptr::addr_of!($crate::kernel::KERNEL_OFFSETS.$field)) }
    };
}

/// A field at `offset` of a BTF-typed kernel pointer, by a direct load:
/// no helper call. The verifier checks the access against the type, and
/// the JIT makes a fault read as zero.
#[inline(always)]
pub fn field<T: Copy>(base: *const u8, offset: u32) -> T {
    // SAFETY: see above; only used on pointers the verifier types.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize).cast::<T>()) }
}

#[inline(always)]
pub fn offsets() -> KernelOffsets {
    // SAFETY: volatile so the compile-time zeroes are not folded in; the
    // value is replaced at load time.
    unsafe { core::ptr::read_volatile(&KERNEL_OFFSETS) }
}

/// Reads a `T` at `base + offset` in kernel memory.
#[inline(always)]
pub fn read<T>(base: *const u8, offset: u32) -> Result<T, i64> {
    if base.is_null() {
        return Err(-1);
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address and reports faults.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(offset as usize).cast::<T>()) }.map_err(|e| e as i64)
}

/// `cgroup->kn->id`.
///
/// match-proto: struct kernfs_node *cgroup::kn; u64 kernfs_node::id (5.5+).
#[inline(always)]
pub fn cgroup_id(cgroup: *const u8, o: &KernelOffsets) -> Result<u64, i64> {
    let kn: *const u8 = read(cgroup, o.cgroup_kn)?;
    read(kn, o.kernfs_node_id)
}

/// The parent of a `struct cgroup` (null for a hierarchy's root), through
/// `cgroup->self.parent`, a `struct cgroup_subsys_state *` embedded at
/// `cgroup_self`.
///
/// match-proto: struct cgroup_subsys_state cgroup::self; struct
/// cgroup_subsys_state *cgroup_subsys_state::parent.
#[inline(always)]
pub fn cgroup_parent(cgroup: *const u8, o: &KernelOffsets) -> Result<*const u8, i64> {
    let parent_css: *const u8 = read(cgroup, o.cgroup_self + o.cgroup_parent)?;
    Ok(match parent_css.is_null() {
        true => parent_css,
        false => parent_css.wrapping_sub(o.cgroup_self as usize),
    })
}

/// The cgroup id of a `struct cgroup` on the unified hierarchy; `None` for
/// a v1 hierarchy's cgroup, whose ids are numbered apart and may equal a
/// reported cgroup2 id, and where BTF lacks the offsets to tell.
#[inline(always)]
pub fn unified_cgroup_id(cgroup: *const u8, o: &KernelOffsets) -> Result<Option<u64>, i64> {
    if o.have_cgroup_tree == 0 {
        return Ok(None);
    }
    let root: *const u8 = read(cgroup, o.cgroup_root)?;
    let hierarchy_id: i32 = read(root, o.cgroup_root_hierarchy_id)?;
    if hierarchy_id != 0 {
        return Ok(None);
    }
    cgroup_id(cgroup, o).map(Some)
}

/// The `struct file` behind `fd` of the current task, via
/// task->files->fdt->fd[fd].
///
/// match-proto: struct files_struct *task_struct::files; struct fdtable
/// __rcu *files_struct::fdt; struct file __rcu **fdtable::fd; unsigned int
/// fdtable::max_fds.
#[inline(always)]
pub fn current_fd_file(fd: u64) -> Result<*const u8, i64> {
    let o = offsets();
    if o.have_fd_lookup == 0 {
        return Err(-1);
    }
    // SAFETY: helper without arguments.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    let files: *const u8 = read(task, o.task_files)?;
    let fdt: *const u8 = read(files, o.files_fdt)?;
    let max_fds: u32 = read(fdt, o.fdtable_max_fds)?;
    if fd >= u64::from(max_fds) {
        return Err(-1);
    }
    let fd_array: *const u8 = read(fdt, o.fdtable_fd)?;
    let file: *const u8 = read(fd_array, (fd * 8) as u32)?;
    if file.is_null() {
        return Err(-1);
    }
    Ok(file)
}
