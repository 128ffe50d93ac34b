//! AMD KFD driver: `kfd_ioctl` kprobes when the kernel has kprobes and
//! amdgpu is loaded, else the ioctl syscall tracepoints filtered to the KFD
//! device; and the fault, reset and eviction functions where they exist.
use std::{fs, os::unix::fs::MetadataExt, path::Path};

use aya::{programs::KProbe, Ebpf};
use observer_common::kfd::{kernel_dev, HW_HOOKS};

use super::ProbeStatus;

/// Program names for `HW_HOOKS`, index for index.
const HW_PROGRAMS: [&str; 6] = [
    "kfd_hw_vmfault",
    "kfd_hw_vmfault_signal",
    "kfd_hw_reset_signal",
    "kfd_hw_gpu_recover",
    "kfd_hw_eviction_smi",
    "kfd_hw_evict_queues",
];

pub fn kprobes_supported() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe").exists()
}

/// Whether `symbol` is a function in the running kernel or its modules.
pub fn kernel_has_function(symbol: &str) -> bool {
    let Ok(text) = fs::read_to_string("/proc/kallsyms") else { return false };
    text.lines().any(|l| {
        let mut f = l.split_whitespace();
        let (_, kind, name) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        name == symbol && matches!(kind, "t" | "T")
    })
}

/// The kernel's encoding of a character device's number, as `i_rdev` holds it.
pub fn device_rdev(path: &Path) -> Option<u32> {
    let rdev = fs::metadata(path).ok()?.rdev();
    // SAFETY: major/minor are pure arithmetic on the number.
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    Some(kernel_dev(major, minor))
}

fn kprobe(ebpf: &mut Ebpf, program: &str, function: &str) -> Result<(), String> {
    let p: &mut KProbe = ebpf
        .program_mut(program)
        .ok_or_else(|| format!("program {program} missing"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    p.load().map_err(|e| format!("load: {e}"))?;
    p.attach(function, 0).map_err(|e| format!("attach: {e}"))?;
    Ok(())
}

/// Which way KFD ioctls are seen, for `check` and the probe metric.
pub fn attach(ebpf: &mut Ebpf, tracefs_ok: bool, have_fd_lookup: bool) -> Vec<ProbeStatus> {
    let mut out = Vec::new();
    let kprobes = kprobes_supported();
    if kprobes && kernel_has_function("kfd_ioctl") {
        // The same KProbe type serves the kretprobe: aya reads the kind
        // from the program's section.
        let r = kprobe(ebpf, "kfd_ioctl_enter", "kfd_ioctl")
            .and_then(|_| kprobe(ebpf, "kfd_ioctl_exit", "kfd_ioctl"));
        out.push(status("kfd", "kprobe:kfd_ioctl", r, "kprobe + kretprobe on kfd_ioctl"));
    } else {
        let why = if !kprobes {
            "this kernel has no kprobes (CONFIG_KPROBES unset)"
        } else {
            "kfd_ioctl not in kallsyms (amdgpu not loaded)"
        };
        let r = match (tracefs_ok, have_fd_lookup) {
            (false, _) => Err("tracefs unavailable".to_string()),
            (_, false) => Err("task->files offsets not in BTF".to_string()),
            _ => super::attach_tp(ebpf, "kfd_sys_enter_ioctl", "syscalls", "sys_enter_ioctl")
                .and_then(|_| super::attach_tp(ebpf, "kfd_sys_exit_ioctl", "syscalls", "sys_exit_ioctl")),
        };
        let detail = format!("syscall fallback ({why}): ioctls on fds of the KFD device");
        out.push(status("kfd", "syscalls:sys_enter_ioctl", r, &detail));
    }
    if kprobes {
        for (index, (function, kind, _)) in HW_HOOKS.iter().enumerate() {
            if !kernel_has_function(function) {
                continue; // not in this kernel: say nothing rather than fail
            }
            let r = kprobe(ebpf, HW_PROGRAMS[index], function);
            out.push(status("gpu_hw", &format!("kprobe:{function}"), r, &format!("{kind:?}")));
        }
    }
    out
}

fn status(probe: &'static str, target: &str, r: Result<(), String>, ok: &str) -> ProbeStatus {
    ProbeStatus {
        probe,
        target: target.to_string(),
        attached: r.is_ok(),
        detail: r.err().unwrap_or_else(|| ok.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_programs_cover_every_hook() {
        assert_eq!(HW_PROGRAMS.len(), HW_HOOKS.len());
    }

    #[test]
    fn rdev_of_dev_null_is_1_3() {
        assert_eq!(device_rdev(Path::new("/dev/null")), Some(kernel_dev(1, 3)));
        assert_eq!(device_rdev(Path::new("/nonexistent")), None);
    }
}
