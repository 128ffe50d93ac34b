//! What the KFD hooks need to know about the running kernel: whether it has
//! kprobes, which of the hooked functions it has, and the device number the
//! syscall fallback filters ioctls by. The hooks themselves are declared in
//! the probe table.
use std::{collections::HashSet, fs, os::unix::fs::MetadataExt, path::Path};

use observer_common::kfd::kernel_dev;

pub fn kprobes_supported() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe").exists()
}

/// Which of `wanted` are functions in a `/proc/kallsyms` text (the running
/// kernel and its loaded modules).
pub fn functions_in(kallsyms: &str, wanted: &[&'static str]) -> HashSet<&'static str> {
    kallsyms
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next(), f.next()?, f.next()?);
            matches!(kind, "t" | "T").then_some(name)
        })
        .filter_map(|name| wanted.iter().find(|w| **w == name).copied())
        .collect()
}

/// The kernel's encoding of a character device's number, as `i_rdev` holds it.
pub fn device_rdev(path: &Path) -> Option<u32> {
    let rdev = fs::metadata(path).ok()?.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    Some(kernel_dev(major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdev_of_dev_null_is_1_3() {
        assert_eq!(device_rdev(Path::new("/dev/null")), Some(kernel_dev(1, 3)));
        assert_eq!(device_rdev(Path::new("/nonexistent")), None);
    }

    #[test]
    fn only_text_symbols_count_as_functions() {
        let kallsyms =
            "ffffffffc0a00000 t kfd_ioctl\t[amdgpu]\nffffffffc0b00000 d kfd_smi_event_update_vmfault\n";
        let found = functions_in(kallsyms, &["kfd_ioctl", "kfd_smi_event_update_vmfault", "absent"]);
        assert_eq!(found, HashSet::from(["kfd_ioctl"]));
    }
}
