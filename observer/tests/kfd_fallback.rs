//! Without kprobes (or without amdgpu), KFD ioctls are counted from the
//! ioctl syscall tracepoints, filtered in the kernel to fds whose inode is
//! the KFD device. The test points the filter at another character device
//! (`--kfd-device /dev/null`), so it needs no GPU, and issues real
//! KFD-numbered ioctls on it and on a second device that must be ignored.
//! On a kernel with kprobes (the VM) the fallback is forced, so it is
//! tested on both kinds of kernel.

use std::{process::Command, time::Duration};
use test_support::{assert_root, Tracer};

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn syscall_fallback_counts_only_the_kfd_device() {
    assert_root();
    let tracer = Tracer::start(&["--kfd-device", "/dev/null", "--kfd-syscall-fallback"]);
    // GET_VERSION (nr 0x01) on the "KFD" fd, GET_CLOCK_COUNTERS (nr 0x05)
    // on another device; both fail with ENOTTY in the kernel.
    let script = "import fcntl, os\n\
                  a = os.open('/dev/null', os.O_RDWR); b = os.open('/dev/zero', os.O_RDWR)\n\
                  for fd, cmd in ((a, 0x80084B01), (b, 0xC0284B05)):\n\
                  \x20   try: fcntl.ioctl(fd, cmd, bytearray(64))\n\
                  \x20   except OSError as e: pass\n\
                  print('pid=%d' % os.getpid())\n";
    let out = Command::new("python3").arg("-c").arg(script).output().expect("python3");
    assert!(out.status.success(), "{out:?}");
    let pid: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .strip_prefix("pid=")
        .and_then(|p| p.parse().ok())
        .expect("pid");
    let ev =
        tracer.wait_for("kfd_ioctl", Duration::from_secs(5), |e| e["kind"] == "kfd_ioctl" && e["pid"] == pid);
    assert_eq!(ev["ioctl"], "GET_VERSION");
    assert_eq!(ev["errno"], "ENOTTY");
    assert_eq!(ev["result"], -25);
    assert_eq!(ev["via"], "syscall");
    std::thread::sleep(Duration::from_millis(300));
    let (_, events) = tracer.stop();
    let from_pid: Vec<_> = events.iter().filter(|e| e["kind"] == "kfd_ioctl" && e["pid"] == pid).collect();
    assert_eq!(from_pid.len(), 1, "the /dev/zero ioctl must not count: {from_pid:#?}");
}
