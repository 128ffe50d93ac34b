//! Kernel struct member offsets from the running kernel's BTF. Rust eBPF
//! cannot carry CO-RE relocations, so this is done once at load time and the
//! result passed to the programs as a global.
use btf_rs::{Btf, Type};
use observer_common::kernel::KernelOffsets;

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading kernel BTF (/sys/kernel/btf/vmlinux): {0}")]
    Read(String),
}

pub fn vmlinux() -> Result<Btf, BtfError> {
    Btf::from_file("/sys/kernel/btf/vmlinux").map_err(|e| BtfError::Read(e.to_string()))
}

/// The BPF helpers this kernel knows, by name without the `bpf_` prefix:
/// the members of `enum bpf_func_id` (`BPF_FUNC_find_vma`, ...). A program
/// that calls a helper missing here is refused by the verifier, with a
/// message that names only its number. `None` when BTF has no such enum.
pub fn kernel_helpers(btf: &Btf) -> Option<std::collections::BTreeSet<String>> {
    let ids = btf.resolve_types_by_name("bpf_func_id").ok()?.into_iter().find_map(|t| match t {
        Type::Enum(e) => Some(e),
        _ => None,
    })?;
    let names = ids
        .members
        .iter()
        .filter_map(|m| Some(btf.resolve_name(m).ok()?.strip_prefix("BPF_FUNC_")?.to_string()))
        .collect();
    Some(names)
}

/// Byte offset of `path` (dot-separated, e.g. `f_path.dentry`) in `struct
/// name`, descending into anonymous structs and unions on the way.
pub fn member_offset(btf: &Btf, name: &str, path: &str) -> Option<u32> {
    let ty = btf
        .resolve_types_by_name(name)
        .ok()?
        .into_iter()
        .find(|t| matches!(t, Type::Struct(_) | Type::Union(_)))?;
    let mut offset = 0;
    let mut current = ty;
    for field in path.split('.') {
        let (bits, next) = find_member(btf, &current, field)?;
        offset += bits;
        current = next;
    }
    (offset % 8 == 0).then_some(offset / 8)
}

/// Finds `field` in a struct/union type; returns its bit offset and type.
fn find_member(btf: &Btf, ty: &Type, field: &str) -> Option<(u32, Type)> {
    let members = match ty {
        Type::Struct(s) | Type::Union(s) => &s.members,
        _ => return None,
    };
    for m in members {
        let member_type = btf.resolve_chained_type(m).ok()?;
        let member_type = strip_modifiers(btf, member_type)?;
        match btf.resolve_name(m) {
            Ok(n) if n == field => return Some((m.bit_offset(), member_type)),
            Ok(n) if !n.is_empty() => continue,
            _ => {
                // Anonymous struct/union: the field may live inside it.
                if let Some((inner, t)) = find_member(btf, &member_type, field) {
                    return Some((m.bit_offset() + inner, t));
                }
            }
        }
    }
    None
}

fn strip_modifiers(btf: &Btf, mut ty: Type) -> Option<Type> {
    for _ in 0..16 {
        ty = match &ty {
            Type::Typedef(t) => btf.resolve_chained_type(t).ok()?,
            Type::Volatile(t) => btf.resolve_chained_type(t).ok()?,
            Type::Const(t) => btf.resolve_chained_type(t).ok()?,
            Type::Restrict(t) => btf.resolve_chained_type(t).ok()?,
            Type::TypeTag(t) => btf.resolve_chained_type(t).ok()?,
            _ => return Some(ty),
        };
    }
    Some(ty)
}

/// Everything the task, crash and scheduler programs need; missing members
/// leave their `have_*` flag at zero instead of failing the load.
pub fn kernel_offsets(btf: &Btf) -> KernelOffsets {
    let mut o = KernelOffsets::ZERO;
    task_and_mapping_offsets(btf, &mut o);
    file_and_limit_offsets(btf, &mut o);
    cgroup_and_sched_offsets(btf, &mut o);
    mapping_tree_offsets(btf, &mut o);
    executable_offsets(btf, &mut o);
    o
}

/// A task's parent and executable file (runs); needs the cgroup, mm and
/// file offsets found before.
fn executable_offsets(btf: &Btf, o: &mut KernelOffsets) {
    let get = |s: &str, f: &str| member_offset(btf, s, f);
    if let (Some(parent), Some(exe), true, true, true) = (
        get("task_struct", "real_parent"),
        get("mm_struct", "exe_file"),
        o.have_task_cgroup != 0,
        o.have_mm != 0,
        o.have_vma != 0,
    ) {
        (o.task_real_parent, o.mm_exe_file, o.have_exe) = (parent, exe, 1);
    }
}

/// The task's ids, exit code and cgroup; a mapping's range and file.
fn task_and_mapping_offsets(btf: &Btf, o: &mut KernelOffsets) {
    let get = |s: &str, f: &str| member_offset(btf, s, f);
    let task = (get("task_struct", "pid"), get("task_struct", "tgid"), get("task_struct", "exit_code"));
    if let (Some(pid), Some(tgid), Some(exit_code)) = task {
        o.task_pid = pid;
        o.task_tgid = tgid;
        o.task_exit_code = exit_code;
    }
    if let (Some(a), Some(b), Some(c), Some(d)) = (
        get("task_struct", "cgroups"),
        get("css_set", "dfl_cgrp"),
        get("cgroup", "kn"),
        get("kernfs_node", "id"),
    ) {
        (o.task_cgroups, o.css_set_dfl_cgrp, o.cgroup_kn, o.kernfs_node_id) = (a, b, c, d);
        o.have_task_cgroup = 1;
    }
    if let (
        Some(start),
        Some(end),
        Some(pgoff),
        Some(file),
        Some(inode),
        Some(dentry),
        Some(ino),
        Some(name),
    ) = (
        get("vm_area_struct", "vm_start"),
        get("vm_area_struct", "vm_end"),
        get("vm_area_struct", "vm_pgoff"),
        get("vm_area_struct", "vm_file"),
        get("file", "f_inode"),
        get("file", "f_path.dentry"),
        get("inode", "i_ino"),
        get("dentry", "d_name.name"),
    ) {
        (o.vma_vm_start, o.vma_vm_end, o.vma_vm_pgoff, o.vma_vm_file) = (start, end, pgoff, file);
        (o.file_f_inode, o.file_f_path_dentry, o.inode_i_ino, o.dentry_d_name_name) =
            (inode, dentry, ino, name);
        o.have_vma = 1;
    }
}

/// A task's open files (the `/dev/kfd` lookup), tty, rlimits and memory sizes.
fn file_and_limit_offsets(btf: &Btf, o: &mut KernelOffsets) {
    let get = |s: &str, f: &str| member_offset(btf, s, f);
    if let (Some(files), Some(fdt), Some(fd), Some(max), Some(rdev), Some(inode)) = (
        get("task_struct", "files"),
        get("files_struct", "fdt"),
        get("fdtable", "fd"),
        get("fdtable", "max_fds"),
        get("inode", "i_rdev"),
        get("file", "f_inode"),
    ) {
        (o.task_files, o.files_fdt, o.fdtable_fd, o.fdtable_max_fds, o.inode_i_rdev) =
            (files, fdt, fd, max, rdev);
        o.file_f_inode = inode;
        o.have_fd_lookup = 1;
    }
    if let (Some(sb), Some(dev)) = (get("inode", "i_sb"), get("super_block", "s_dev")) {
        (o.inode_i_sb, o.super_block_s_dev) = (sb, dev);
    }
    if let (Some(signal), Some(tty)) = (get("task_struct", "signal"), get("signal_struct", "tty")) {
        (o.task_signal, o.signal_tty, o.have_tty) = (signal, tty, 1);
    }
    if let (Some(signal), Some(rlim)) = (get("task_struct", "signal"), get("signal_struct", "rlim")) {
        (o.task_signal, o.signal_rlim, o.have_rlimit) = (signal, rlim, 1);
    }
    if let (Some(mm), Some(total), Some(data)) =
        (get("task_struct", "mm"), get("mm_struct", "total_vm"), get("mm_struct", "data_vm"))
    {
        (o.task_mm, o.mm_total_vm, o.mm_data_vm, o.have_mm) = (mm, total, data, 1);
    }
}

/// The cgroup tree (run-queue scope, pod hold) and the scheduler's own
/// stamps of a task's wait.
fn cgroup_and_sched_offsets(btf: &Btf, o: &mut KernelOffsets) {
    let get = |s: &str, f: &str| member_offset(btf, s, f);
    if let (Some(root), Some(hierarchy_id), Some(self_), Some(parent)) = (
        get("cgroup", "root"),
        get("cgroup_root", "hierarchy_id"),
        get("cgroup", "self"),
        get("cgroup_subsys_state", "parent"),
    ) {
        (o.cgroup_root, o.cgroup_root_hierarchy_id, o.cgroup_self, o.cgroup_parent) =
            (root, hierarchy_id, self_, parent);
        o.have_cgroup_tree = 1;
    }
    if let (Some(queued), Some(cfs_rq), Some(rq), Some(clock)) = (
        get("task_struct", "sched_info.last_queued"),
        get("task_struct", "se.cfs_rq"),
        get("cfs_rq", "rq"),
        get("rq", "clock"),
    ) {
        (o.task_last_queued, o.task_se_cfs_rq, o.cfs_rq_rq, o.rq_clock) = (queued, cfs_rq, rq, clock);
        o.have_run_delay = 1;
    }
    o.task_stack = get("task_struct", "stack").unwrap_or(0);
}

/// The tree of a process's mappings, before 6.1 only (the maple tree's
/// kernels have `bpf_find_vma` instead). Needs the mm and mapping offsets.
fn mapping_tree_offsets(btf: &Btf, o: &mut KernelOffsets) {
    let get = |s: &str, f: &str| member_offset(btf, s, f);
    if let (Some(mm_rb), Some(vm_rb), Some(left), Some(right), true, true) = (
        get("mm_struct", "mm_rb"),
        get("vm_area_struct", "vm_rb"),
        get("rb_node", "rb_left"),
        get("rb_node", "rb_right"),
        o.have_mm != 0,
        o.have_vma != 0,
    ) {
        (o.mm_mm_rb, o.vma_vm_rb, o.rb_node_rb_left, o.rb_node_rb_right) = (mm_rb, vm_rb, left, right);
        o.have_vma_tree = 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads this machine's real BTF: the offsets must exist and be sane.
    #[test]
    fn finds_task_and_vma_members_in_this_kernel() {
        let Ok(btf) = vmlinux() else {
            panic!("no /sys/kernel/btf/vmlinux: canaryscope needs a kernel with BTF");
        };
        let o = kernel_offsets(&btf);
        assert_eq!(o.have_task_cgroup, 1, "{o:?}");
        assert_eq!(o.have_vma, 1, "{o:?}");
        assert_eq!(o.have_rlimit, 1, "{o:?}");
        assert_eq!(o.have_mm, 1, "{o:?}");
        assert_eq!(o.have_run_delay, 1, "{o:?}");
        assert_eq!(o.have_exe, 1, "{o:?}");
        let helpers = kernel_helpers(&btf).expect("enum bpf_func_id in BTF");
        // The oldest helper and the newest one canaryscope calls (5.17).
        assert!(helpers.contains("map_lookup_elem") && helpers.contains("find_vma"), "{helpers:?}");
        assert!(!helpers.iter().any(|h| h.starts_with("BPF_FUNC_") || h.is_empty()), "{helpers:?}");
        assert!(o.task_tgid == o.task_pid + 4, "pid and tgid are adjacent pid_t: {o:?}");
        assert_eq!(o.vma_vm_end, o.vma_vm_start + 8, "vm_start/vm_end are adjacent: {o:?}");
        // d_name is a qstr { hash_len (u64), name } on 64-bit kernels.
        let d_name = member_offset(&btf, "dentry", "d_name").expect("d_name");
        assert_eq!(o.dentry_d_name_name, d_name + 8);
        assert_eq!(member_offset(&btf, "task_struct", "no_such_field"), None);
        assert_eq!(o.have_cgroup_tree, 1, "{o:?}");
        // A cgroup starts with its own subsystem state, which is what a
        // child's `self.parent` points at.
        assert_eq!(o.cgroup_self, 0, "{o:?}");
    }
}
