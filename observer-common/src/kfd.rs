//! AMD KFD driver ioctls (`/dev/kfd`): kprobes on `kfd_ioctl` where the
//! kernel has kprobes, syscall tracepoints filtered to the KFD device where
//! it has not.

pub const KFD_STATS_MAP: &str = "KFD_STATS";
/// Load-time global: `dev_t` of /dev/kfd as the kernel encodes it
/// (major << 20 | minor); 0 disables the syscall fallback filter.
pub const GLOBAL_KFD_RDEV: &str = "KFD_RDEV";

pub const MAX_KFD_STATS: u32 = 4096;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KfdStatsKey {
    pub cgroup_id: u64,
    /// `_IOC_NR(cmd)`: stable across kernels, unlike the full command.
    pub nr: u32,
    /// 0 or -errno.
    pub result: i32,
}

/// Per key: count, total and log2 histogram of durations.
pub type KfdStats = crate::LatencyHistogram;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KfdInflight {
    pub start_ns: u64,
    pub cmd: u32,
    pub _pad: u32,
}

/// A failed KFD ioctl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KfdIoctlEvent {
    pub header: crate::EventHeader,
    pub cmd: u32,
    pub result: i32,
    pub duration_ns: u64,
    /// 1: seen by the kprobe on kfd_ioctl, 2: by the syscall fallback.
    pub source: u32,
    pub _pad: u32,
}

/// `kernel dev_t` encoding (MINORBITS = 20), as in `inode->i_rdev`.
pub const fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | minor
}

#[cfg(test)]
mod tests {
    #[test]
    fn dev_t_matches_the_kernel_encoding() {
        // /dev/kfd in the test VM is 243:0.
        assert_eq!(super::kernel_dev(243, 0), 243 << 20);
        assert_eq!(super::kernel_dev(1, 3), 0x100003);
    }
}

/// GPU hardware-level events seen through amdgpu/KFD functions.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HwKind {
    MemoryFault = 1,
    Reset = 2,
    QueueEviction = 3,
}

impl HwKind {
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            1 => Some(Self::MemoryFault),
            2 => Some(Self::Reset),
            3 => Some(Self::QueueEviction),
            _ => None,
        }
    }
}

/// Kernel functions hooked for each kind, in order of preference, with the
/// argument that carries a process id or pasid (by position), if any.
/// Prototypes differ by kernel (FACTS: 6.1 vs 6.12): only integer arguments
/// whose position is stable across those versions are read.
pub const HW_HOOKS: &[(&str, HwKind, &str)] = &[
    // kfd_smi_event_update_vmfault(struct kfd_node|kfd_dev *, uint16_t pasid)
    ("kfd_smi_event_update_vmfault", HwKind::MemoryFault, "pasid"),
    ("kfd_signal_vm_fault_event", HwKind::MemoryFault, ""),
    // kfd_signal_reset_event(struct kfd_node|kfd_dev *)
    ("kfd_signal_reset_event", HwKind::Reset, ""),
    ("amdgpu_device_gpu_recover", HwKind::Reset, ""),
    // kfd_smi_event_queue_eviction(struct kfd_node *, pid_t pid, uint32_t trigger)
    ("kfd_smi_event_queue_eviction", HwKind::QueueEviction, "pid"),
    // kfd_process_evict_queues(struct kfd_process *, uint32_t trigger)
    ("kfd_process_evict_queues", HwKind::QueueEviction, ""),
];

/// Eviction triggers (KFD_QUEUE_EVICTION_TRIGGER_*).
pub fn eviction_trigger_name(trigger: u32) -> &'static str {
    match trigger {
        0 => "SVM",
        1 => "USERPTR",
        2 => "TTM",
        3 => "SUSPEND",
        4 => "CRIU_CHECKPOINT",
        5 => "CRIU_RESTORE",
        _ => "UNKNOWN",
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct HwEvent {
    pub header: crate::EventHeader,
    /// [`HwKind`] as a number.
    pub kind: u32,
    /// Index into [`HW_HOOKS`] (from the program's attach point).
    pub hook: u32,
    /// Raw integer arguments 1 and 2 of the hooked function.
    pub arg1: u64,
    pub arg2: u64,
}
