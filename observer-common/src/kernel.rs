//! The kernel struct offsets the programs need. Rust cannot emit CO-RE
//! relocations, so userspace reads these offsets from the running kernel's
//! BTF and hands them over as a load-time global.

/// Load-time global holding [`KernelOffsets`].
pub const GLOBAL_OFFSETS: &str = "KERNEL_OFFSETS";

/// Byte offsets of kernel struct members; zero means "not available on the
/// running kernel" and the program skips what depends on it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_exit_code: u32,
    pub task_cgroups: u32,
    pub css_set_dfl_cgrp: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    pub vma_vm_start: u32,
    pub vma_vm_end: u32,
    pub vma_vm_pgoff: u32,
    pub vma_vm_file: u32,
    pub file_f_inode: u32,
    pub file_f_path_dentry: u32,
    pub inode_i_ino: u32,
    pub dentry_d_name_name: u32,
    /// tracefs offset of `anon_rss` in `oom:mark_victim` (0: old layout, pid only).
    pub mark_victim_anon_rss: u32,
    /// tracefs offset of `pid` in `oom:mark_victim`.
    pub mark_victim_pid: u32,
    /// Non-zero when every offset a family needs was found.
    pub have_task_cgroup: u32,
    pub have_vma: u32,
    /// For the KFD syscall fallback: fd -> struct file.
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdtable_fd: u32,
    pub fdtable_max_fds: u32,
    pub inode_i_rdev: u32,
    pub have_fd_lookup: u32,
    /// For the hold: `task->signal->tty` (a process with a controlling
    /// terminal is never stopped, so job control never sees a hold).
    pub task_signal: u32,
    pub signal_tty: u32,
    pub have_tty: u32,
    /// `inode->i_sb->s_dev`: with `i_ino`, a file's identity across mounts.
    pub inode_i_sb: u32,
    pub super_block_s_dev: u32,
    /// `task->signal->rlim[]` (with `task_signal`): the process's resource
    /// limits, for telling a CPU-limit kill from other kernel kills.
    pub signal_rlim: u32,
    pub have_rlimit: u32,
    /// `task->mm->total_vm` and `data_vm` (pages): how much of RLIMIT_AS
    /// and RLIMIT_DATA a process uses, for telling a limit's refusal from
    /// other failures of mmap, mremap and brk.
    pub task_mm: u32,
    pub mm_total_vm: u32,
    pub mm_data_vm: u32,
    pub have_mm: u32,
    /// For keeping the set of reported cgroups current as cgroups come and
    /// go: `cgroup->root->hierarchy_id` (0 on the unified hierarchy; v1
    /// hierarchies number their cgroups on their own) and the parent,
    /// `cgroup->self.parent` (a `cgroup_subsys_state` at offset
    /// `cgroup_self` of its cgroup).
    pub cgroup_root: u32,
    pub cgroup_root_hierarchy_id: u32,
    pub cgroup_self: u32,
    pub cgroup_parent: u32,
    pub have_cgroup_tree: u32,
    /// For run-queue latency from the scheduler's own accounting
    /// (CONFIG_SCHED_INFO, CONFIG_FAIR_GROUP_SCHED): when a task was queued,
    /// `task->sched_info.last_queued`, and the clock of its run queue,
    /// `task->se.cfs_rq->rq->clock`, both in the run queue's clock.
    pub task_last_queued: u32,
    pub task_se_cfs_rq: u32,
    pub cfs_rq_rq: u32,
    pub rq_clock: u32,
    pub have_run_delay: u32,
    /// `task->stack`: the kernel stack, whose top holds the user registers
    /// (the crash program of kernels without `bpf_task_pt_regs`).
    pub task_stack: u32,
    /// The red-black tree of a process's mappings before Linux 6.1 (the
    /// maple tree replaced it): `mm->mm_rb.rb_node`, each mapping's
    /// `vm_rb`, and a node's children. The crash program of kernels
    /// without `bpf_find_vma` (before 5.17) walks it to name the faulting
    /// file while the faulting thread still runs.
    pub mm_mm_rb: u32,
    pub vma_vm_rb: u32,
    pub rb_node_rb_left: u32,
    pub rb_node_rb_right: u32,
    pub have_vma_tree: u32,
    /// For runs: the parent, `task->real_parent`, and a process's
    /// executable, `mm->exe_file` (with `task_mm`, the file's inode and
    /// dentry name offsets of `have_vma`).
    pub task_real_parent: u32,
    pub mm_exe_file: u32,
    pub have_exe: u32,
}

impl KernelOffsets {
    pub const ZERO: Self = Self {
        task_pid: 0,
        task_tgid: 0,
        task_exit_code: 0,
        task_cgroups: 0,
        css_set_dfl_cgrp: 0,
        cgroup_kn: 0,
        kernfs_node_id: 0,
        vma_vm_start: 0,
        vma_vm_end: 0,
        vma_vm_pgoff: 0,
        vma_vm_file: 0,
        file_f_inode: 0,
        file_f_path_dentry: 0,
        inode_i_ino: 0,
        dentry_d_name_name: 0,
        mark_victim_anon_rss: 0,
        mark_victim_pid: 0,
        have_task_cgroup: 0,
        have_vma: 0,
        task_files: 0,
        files_fdt: 0,
        fdtable_fd: 0,
        fdtable_max_fds: 0,
        inode_i_rdev: 0,
        have_fd_lookup: 0,
        task_signal: 0,
        signal_tty: 0,
        have_tty: 0,
        inode_i_sb: 0,
        super_block_s_dev: 0,
        signal_rlim: 0,
        have_rlimit: 0,
        task_mm: 0,
        mm_total_vm: 0,
        mm_data_vm: 0,
        have_mm: 0,
        cgroup_root: 0,
        cgroup_root_hierarchy_id: 0,
        cgroup_self: 0,
        cgroup_parent: 0,
        have_cgroup_tree: 0,
        task_last_queued: 0,
        task_se_cfs_rq: 0,
        cfs_rq_rq: 0,
        rq_clock: 0,
        have_run_delay: 0,
        task_stack: 0,
        mm_mm_rb: 0,
        vma_vm_rb: 0,
        rb_node_rb_left: 0,
        rb_node_rb_right: 0,
        have_vma_tree: 0,
        task_real_parent: 0,
        mm_exe_file: 0,
        have_exe: 0,
    };
}
