//! AMD KFD driver ioctls (`/dev/kfd`): kprobes on `kfd_ioctl` where the
//! kernel has kprobes, syscall tracepoints filtered to the KFD device where
//! it has not.

pub const KFD_STATS_MAP: &str = "KFD_STATS";
/// Load-time global: `dev_t` of /dev/kfd as the kernel encodes it
/// (major << 20 | minor); 0 disables the syscall fallback filter.
pub const GLOBAL_KFD_RDEV: &str = "KFD_RDEV";

pub const MAX_KFD_STATS: u32 = 4096;

/// `_IOC_TYPE` of every KFD ioctl (`AMDKFD_IOCTL_BASE 'K'`, 0x4B).
pub const KFD_IOCTL_TYPE: u32 = b'K' as u32;

/// `_IOC_TYPE(cmd)` (bits 8-15 of an ioctl command).
#[inline(always)]
pub const fn ioc_type(cmd: u32) -> u32 {
    (cmd >> 8) & 0xff
}

/// `_IOC_NR(cmd)` (bits 0-7 of an ioctl command).
#[inline(always)]
pub const fn ioc_nr(cmd: u32) -> u32 {
    cmd & 0xff
}

/// Whether an ioctl command is a KFD one (by its type; direction and size
/// bits vary by kernel).
#[inline(always)]
pub const fn is_kfd_ioctl(cmd: u32) -> bool {
    ioc_type(cmd) == KFD_IOCTL_TYPE
}

wire_enum! {
    /// Which probe saw a KFD ioctl ([`KfdIoctlEvent::source`]).
    pub enum KfdSource {
        /// The kprobe and kretprobe on `kfd_ioctl`.
        Kprobe = 1,
        /// The ioctl syscall tracepoints, filtered to the KFD device (kernels
        /// without kprobes, or without amdgpu loaded).
        Syscall = 2,
    }
}

impl KfdSource {
    /// The `via` of a `kfd_ioctl` event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kprobe => "kprobe",
            Self::Syscall => "syscall",
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    /// A [`KfdSource`] as a number.
    pub source: u32,
    pub _pad: u32,
}

/// `kernel dev_t` encoding (MINORBITS = 20), as in `inode->i_rdev`.
pub const fn kernel_dev(major: u32, minor: u32) -> u32 {
    (major << 20) | minor
}

wire_enum! {
    /// GPU hardware-level events seen through amdgpu/KFD functions.
    pub enum HwKind {
        MemoryFault = 1,
        Reset = 2,
        QueueEviction = 3,
    }
}

impl HwKind {
    /// The kind as `check` describes an attached hook.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::MemoryFault => "MemoryFault",
            Self::Reset => "Reset",
            Self::QueueEviction => "QueueEviction",
        }
    }
}

/// What a hooked function's integer argument 1 carries, if anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HwArg {
    None,
    /// The faulting process's address-space id.
    Pasid,
    /// The evicted process's pid (argument 2 is the trigger).
    Pid,
    /// The eviction trigger.
    Trigger,
}

/// One GPU hardware hook: the kernel function, the program attached to it,
/// what it signals, and what its first integer argument means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HwHook {
    pub function: &'static str,
    pub program: &'static str,
    pub kind: HwKind,
    pub arg: HwArg,
}

/// Kernel functions hooked for each kind, in order of preference. This is
/// the one table of these hooks: userspace attaches from it, the kernel
/// programs send their index in it, and events are decoded with it.
/// Prototypes differ between kernels 6.1 and 6.12 (`struct kfd_dev *` became
/// `struct kfd_node *`; see drivers/gpu/drm/amd/amdkfd/kfd_priv.h and
/// kfd_smi_events.h): only integer arguments whose position is stable across
/// those versions are read.
pub const HW_HOOKS: &[HwHook] = &[
    // kfd_smi_event_update_vmfault(struct kfd_node|kfd_dev *, uint16_t pasid)
    HwHook {
        function: "kfd_smi_event_update_vmfault",
        program: "kfd_hw_vmfault",
        kind: HwKind::MemoryFault,
        arg: HwArg::Pasid,
    },
    HwHook {
        function: "kfd_signal_vm_fault_event",
        program: "kfd_hw_vmfault_signal",
        kind: HwKind::MemoryFault,
        arg: HwArg::None,
    },
    // kfd_signal_reset_event(struct kfd_node|kfd_dev *)
    HwHook {
        function: "kfd_signal_reset_event",
        program: "kfd_hw_reset_signal",
        kind: HwKind::Reset,
        arg: HwArg::None,
    },
    HwHook {
        function: "amdgpu_device_gpu_recover",
        program: "kfd_hw_gpu_recover",
        kind: HwKind::Reset,
        arg: HwArg::None,
    },
    // kfd_smi_event_queue_eviction(struct kfd_node *, pid_t pid, uint32_t trigger)
    HwHook {
        function: "kfd_smi_event_queue_eviction",
        program: "kfd_hw_eviction_smi",
        kind: HwKind::QueueEviction,
        arg: HwArg::Pid,
    },
    // kfd_process_evict_queues(struct kfd_process *, uint32_t trigger)
    HwHook {
        function: "kfd_process_evict_queues",
        program: "kfd_hw_evict_queues",
        kind: HwKind::QueueEviction,
        arg: HwArg::Trigger,
    },
];

/// Index in [`HW_HOOKS`] of the hook a program serves: what that program
/// sends as [`HwEvent::hook`]. Meant for constants, where a program missing
/// from the table fails the build.
pub const fn hw_hook(program: &str) -> u32 {
    let mut i = 0;
    while i < HW_HOOKS.len() {
        if str_eq(HW_HOOKS[i].program, program) {
            return i as u32;
        }
        i += 1;
    }
    panic!("program not in HW_HOOKS");
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

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
    /// Index into [`HW_HOOKS`], which also gives the kind.
    pub hook: u32,
    pub _pad: u32,
    /// Raw integer arguments 1 and 2 of the hooked function.
    pub arg1: u64,
    pub arg2: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_t_matches_the_kernel_encoding() {
        // The kfd char device gets a dynamic major (register_chrdev(0, ...)
        // in kfd_chardev.c), e.g. 243:0.
        assert_eq!(kernel_dev(243, 0), 243 << 20);
        assert_eq!(kernel_dev(1, 3), 0x100003);
    }

    #[test]
    fn ioctl_commands_split_into_type_and_number() {
        // AMDKFD_IOC_CREATE_QUEUE with 6.1's and 6.12's argument sizes.
        for cmd in [0xC058_4B02, 0xC060_4B02] {
            assert_eq!((ioc_type(cmd), ioc_nr(cmd)), (KFD_IOCTL_TYPE, 0x02));
            assert!(is_kfd_ioctl(cmd));
        }
        assert!(is_kfd_ioctl(0x0000_4B27)); // AMDKFD_IO: no direction, no size
        assert!(!is_kfd_ioctl(0x8004_6402)); // DRM 'd'
        assert!(!is_kfd_ioctl(0x5401)); // TCGETS
        assert_eq!((ioc_type(u32::MAX), ioc_nr(u32::MAX)), (0xff, 0xff));
    }

    #[test]
    fn sources_round_trip() {
        for s in [KfdSource::Kprobe, KfdSource::Syscall] {
            assert_eq!(KfdSource::from_u32(s as u32), Some(s));
        }
        assert_eq!(KfdSource::from_u32(0), None);
        assert_eq!((KfdSource::Kprobe.as_str(), KfdSource::Syscall.as_str()), ("kprobe", "syscall"));
    }

    #[test]
    fn hooks_are_found_by_program() {
        for (i, hook) in HW_HOOKS.iter().enumerate() {
            assert_eq!(hw_hook(hook.program), i as u32);
        }
    }
}
