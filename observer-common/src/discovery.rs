//! Finding GPU runtime libraries before their first call: the records the
//! kernel sends when a process execs or maps a GPU runtime file, and the
//! hold that keeps a process stopped until its probes exist.

use crate::EventHeader;

/// File-name prefixes of the GPU runtime libraries canaryscope probes: HIP,
/// CUDA driver libraries (ZLUDA's or NVIDIA's) and NVIDIA's CUDA runtime,
/// also as wheel repair tools rename it (`libcudart-1a2b3c4d.so.12`). The
/// kernel side compares them against the name of a file being mapped
/// executable.
pub const GPU_LIBRARY_PREFIXES: [&[u8]; 4] =
    [b"libamdhip64.so", b"libcuda.so", b"libnvcuda.so", b"libcudart"];

/// Whether a file name starts like a GPU runtime library.
pub fn is_gpu_library_name(name: &[u8]) -> bool {
    GPU_LIBRARY_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Inode numbers of GPU runtime files userspace has already handled (probed,
/// or inspected and found not to be a runtime): hash ino -> 1. A mapping of
/// any other GPU-named file is reported at once, and held when asked.
pub const GPU_FILES_KNOWN_MAP: &str = "GPU_FILES_KNOWN";
/// Value of a [`GPU_FILES_KNOWN_MAP`] entry for a CUDA driver library:
/// handled, yet each process's mapping of it is still reported (and held,
/// when asked). A runtime linked into a shared object loads the driver
/// library on its first call, so that mapping is when userspace reads the
/// process's other code for it. A process maps its driver library once.
pub const KNOWN_DRIVER: u32 = 2;
/// Capacity of [`GPU_FILES_KNOWN_MAP`]; once it is full, every mapping of a
/// file not in it is reported again (and held, with `--hold`).
pub const MAX_GPU_FILES_KNOWN: u32 = 4096;
/// Processes stopped until their new library is probed: hash tgid -> boot
/// time of the stop (ns). Pinned in bpffs so that a watchdog process, or the
/// next daemon, can resume them if this one dies.
pub const HELD_MAP: &str = "HELD_PIDS";
/// Capacity of [`HELD_MAP`]; once full, a process is reported without
/// being held.
pub const MAX_HELD: u32 = 4096;
/// Cgroups selected for hot-call probes: hash cgroup id -> 1. A process in
/// one of them that maps a GPU runtime file, known or not, is reported (and
/// held, with the hold), so its own hot-call probes exist before its first
/// launch.
pub const HOT_CGROUPS_MAP: &str = "HOT_CGROUPS";
/// Processes selected for hot-call probes (by `trace --pid`/`--comm`): hash
/// tgid -> 1, with the same effect.
pub const HOT_TGIDS_MAP: &str = "HOT_TGIDS";
/// Capacity of each of [`HOT_CGROUPS_MAP`] and [`HOT_TGIDS_MAP`].
pub const MAX_HOT_SCOPES: u32 = 4096;
/// Load-time global: non-zero when the hold is enabled (`--hold`).
pub const GLOBAL_HOLD: &str = "HOLD_ENABLED";
/// Cgroups whose processes are held without `--hold`: hash cgroup id -> 1.
/// The daemon puts the cgroup of each canary pod, and of each pod with the
/// readiness gate, here; a process in it or in any cgroup below it (its
/// containers, made later) is held like `--hold` holds every process, so such
/// a pod's first calls are seen.
pub const HOLD_CGROUPS_MAP: &str = "HOLD_CGROUPS";
/// Capacity of [`HOLD_CGROUPS_MAP`]: canary and gated pods on one node.
pub const MAX_HOLD_CGROUPS: u32 = 1024;
/// Pod cgroups by path, so that a chosen pod is held from the instant the
/// kubelet makes its cgroup, before any task can enter it: NUL-padded
/// [`POD_PATH_LEN`] bytes -> one of the `POD_PATH_*` kinds below. The daemon
/// writes the paths a pod's cgroup can have as soon as its watch sees the
/// pod, and the paths of the kubelet's QoS-level cgroups at its start.
pub const POD_PATHS_MAP: &str = "POD_PATHS";
/// Capacity of [`POD_PATHS_MAP`]: two paths (the systemd and cgroupfs
/// drivers' forms) per pod of a node, many times over.
pub const MAX_POD_PATHS: u32 = 4096;
/// Longest pod cgroup path the kernel matches (with its NUL); the kubelet's
/// longest, a BestEffort pod's under the systemd driver, is 107 bytes.
pub const POD_PATH_LEN: usize = 128;
/// A canary or gated pod: its new cgroup goes into [`HOLD_CGROUPS_MAP`].
pub const POD_PATH_CHOSEN: u32 = 1;
/// A pod the daemon knows and does not hold: its new cgroup is left alone.
pub const POD_PATH_NOT_CHOSEN: u32 = 2;
/// A kubelet QoS-level cgroup (`/kubepods.slice`, `/kubepods/burstable`,
/// ...): a cgroup made under it that has no path of its own in the map is a
/// pod the daemon has not classified yet.
pub const POD_PATH_PARENT: u32 = 3;
/// Ids of the QoS-level cgroups that exist: hash cgroup id -> 1.
pub const POD_PARENTS_MAP: &str = "POD_PARENTS";
pub const MAX_POD_PARENTS: u32 = 64;
/// Pod cgroups made before the daemon's watch brought their pod (the kubelet
/// can be a few milliseconds ahead of it): LRU cgroup id -> boot ns of the
/// cgroup's creation. A process in one is held like a chosen pod's until
/// the daemon has classified the pod, which takes it out, and at most
/// [`UNCLASSIFIED_HOLD_NS`] after the cgroup was made.
pub const UNCLASSIFIED_PODS_MAP: &str = "UNCLASSIFIED_PODS";
pub const MAX_UNCLASSIFIED_PODS: u32 = 1024;
/// How long a pod cgroup counts as unclassified without the daemon's word:
/// long past the watch's latency, short enough that a pod the daemon never
/// hears of (an API server outage) stops being held by default.
pub const UNCLASSIFIED_HOLD_NS: u64 = 30_000_000_000;

/// A pod cgroup's path as the kernel side's map key.
pub fn pod_path_key(path: &str) -> Option<[u8; POD_PATH_LEN]> {
    crate::path_key(path)
}

/// How many ancestors of a process's cgroup the kernel side compares with
/// [`HOLD_CGROUPS_MAP`]: a container sits one level below its pod, a
/// container's own sub-cgroups a few more.
pub const HOLD_CGROUP_DEPTH: usize = 6;

/// The kernel sends at most one generic executable-mapping event per process
/// per window...
pub const MMAP_COALESCE_NS: u64 = 50_000_000;
/// ...and userspace reads that process's maps this long after the event, so
/// every mapping made inside the window is still seen by the scan. A window
/// longer than this delay would hide a later `dlopen` in the same process.
pub const MAP_SCAN_DELAY_MS: u64 = 100;

// A mapping inside the window raises no event of its own, so the scan due
// for the window's first event must come after the window closes: checked
// when this crate compiles, for both sides.
const _: () = assert!(MMAP_COALESCE_NS < MAP_SCAN_DELAY_MS * 1_000_000);

/// A process image was replaced (`sched_process_exec`): userspace resolves
/// what that process's loader would find before `main` runs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecEvent {
    pub header: EventHeader,
}

/// A file named like a GPU runtime and not yet known was mapped executable;
/// sent once the mapping exists (at `mmap` return).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GpuMapEvent {
    pub header: EventHeader,
    /// The mapped file, as the kernel sees it.
    pub key: GpuFileKey,
    /// The descriptor it was mapped from (still open while the process is held).
    pub fd: i32,
    /// Non-zero when the process was stopped and waits for a resume.
    pub held: u32,
    /// Boot time of the stop (ns), 0 when not held.
    pub held_at_ns: u64,
    /// Base name of the file.
    pub name: [u8; LIBRARY_NAME_LEN],
    /// Non-zero when the file was known already and is reported because
    /// the process is selected for hot-call probes.
    pub known: u32,
    pub _pad: u32,
}

/// A file's identity as the kernel sees it: the superblock's device
/// (kernel encoding, major << 20 | minor) and the inode number. Inode
/// numbers alone repeat across filesystems (every new tmpfs starts low).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GpuFileKey {
    pub dev: u32,
    pub _pad: u32,
    pub ino: u64,
}

impl GpuFileKey {
    /// From a userspace `st_dev` (glibc encoding) and `st_ino`.
    pub fn from_stat(st_dev: u64, st_ino: u64) -> Self {
        let major = ((st_dev >> 32) & 0xffff_f000) | ((st_dev >> 8) & 0xfff);
        let minor = ((st_dev >> 12) & 0xffff_ff00) | (st_dev & 0xff);
        Self { dev: ((major << 20) | (minor & 0xf_ffff)) as u32, _pad: 0, ino: st_ino }
    }
}

/// Per-thread note between `mmap` entry and return.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PendingGpuMap {
    pub key: GpuFileKey,
    pub fd: i32,
    /// See [`GpuMapEvent::known`].
    pub known: u32,
    pub name: [u8; LIBRARY_NAME_LEN],
}

/// Longest file base name a record carries (a mapped library's, a
/// crash's file).
pub const LIBRARY_NAME_LEN: usize = 64;

/// A process mapped a file executable: it may have loaded a GPU library.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct LibraryMapEvent {
    pub header: crate::EventHeader,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_devices_convert_to_the_kernel_encoding() {
        // 8:1 (sda1) and 0:46 (a tmpfs), as glibc's makedev encodes them.
        assert_eq!(GpuFileKey::from_stat(0x801, 7).dev, (8 << 20) | 1);
        assert_eq!(GpuFileKey::from_stat(46, 7).dev, 46);
        // 259:65536 needs the high minor bits.
        let st_dev = (259u64 << 8) | ((65536u64 & !0xff) << 12);
        assert_eq!(GpuFileKey::from_stat(st_dev, 1).dev, (259 << 20) | 65536);
    }

    #[test]
    fn runtime_names_are_recognised() {
        assert!(is_gpu_library_name(b"libcuda.so.1"));
        assert!(is_gpu_library_name(b"libnvcuda.so"));
        assert!(is_gpu_library_name(b"libamdhip64.so.5.2.50203"));
        assert!(is_gpu_library_name(b"libcudart.so.12"));
        assert!(is_gpu_library_name(b"libcudart-d0da41ae.so.11.0"));
        assert!(!is_gpu_library_name(b"libcublas.so.12"));
        assert!(!is_gpu_library_name(b"libc.so.6"));
    }
}
