//! The real HIP runtime (Debian's libamdhip64) fails to initialise on a
//! machine without a GPU; canaryscope must see exactly those failures, with
//! the caller's pid and cgroup.

use std::{path::Path, process::Command, time::Duration};
use test_support::{assert_root, fixture, out_pid, random_hex, random_pod_uid, PodCgroup, Tracer};

/// Event waits are generous: the VM runs under software emulation.
const WAIT: Duration = Duration::from_secs(20);

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn hip_init_failures_are_traced_with_pid_and_cgroup() {
    assert_root();
    let probe = fixture("hip_probe");
    // With /dev/kfd and no GPU (the VM's CPU-only KFD node) hipInit
    // succeeds: successes are printed too, so that it is seen there.
    let kfd = Path::new("/dev/kfd").exists();
    let tracer = Tracer::start(if kfd { &["--all"][..] } else { &[] });
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));

    // Started after the tracer attached: it must be seen all the same.
    let out = pod.command(&probe).output().expect("run hip_probe");
    assert!(out.status.success(), "hip_probe failed: {out:?}");
    let pid = out_pid(&out.stdout);

    // Without /dev/kfd hipInit itself fails; with it hipInit succeeds and
    // the runtime first fails when it counts devices.
    let init = tracer.wait_for("hipInit", WAIT, |e| e["function"] == "hipInit" && e["pid"] == pid);
    assert_eq!(init["kind"], "gpu_call");
    assert_eq!(init["api"], "hip");
    let (result, name) = if kfd { (0, "hipSuccess") } else { (101, "hipErrorInvalidDevice") };
    assert_eq!(init["result"], result, "{init}");
    assert_eq!(init["result_name"], name, "{init}");
    assert_eq!(init["cgroup"], pod.rel.as_str());
    assert_eq!(init["comm"], "hip_probe");
    assert!(init["library"].as_str().is_some_and(|l| l.contains("libamdhip64")), "{init}");

    let count = tracer
        .wait_for("hipGetDeviceCount", WAIT, |e| e["function"] == "hipGetDeviceCount" && e["pid"] == pid);
    assert_eq!(count["kind"], "gpu_call");
    assert_eq!(count["api"], "hip");
    assert_eq!(count["comm"], "hip_probe");
    assert_eq!(count["result"], 100);
    assert_eq!(count["result_name"], "hipErrorNoDevice");
    assert_eq!(count["cgroup"], pod.rel.as_str());
    assert_eq!(count["tid"], pid);
    assert!(count["library"].as_str().is_some_and(|l| l.contains("libamdhip64")), "{count}");

    let (status, events) = tracer.stop();
    assert!(status.success(), "SIGTERM must end the tracer cleanly: {status:?}");
    // Only failures by default: nothing reported with result 0.
    assert!(kfd || events.iter().all(|e| e["result"] != 0), "{events:#?}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn filters_keep_only_the_asked_for_process() {
    assert_root();
    let probe = fixture("hip_probe");
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let tracer = Tracer::start(&["--cgroup", &pod.rel]);
    let outside = Command::new(&probe).output().expect("run outside");
    let inside = pod.command(&probe).output().expect("run inside");
    let (outside_pid, inside_pid) = (out_pid(&outside.stdout), out_pid(&inside.stdout));
    tracer.wait_for("the process in the cgroup", WAIT, |e| e["pid"] == inside_pid);
    std::thread::sleep(Duration::from_millis(300));
    let (_, events) = tracer.stop();
    assert!(events.iter().all(|e| e["pid"] != outside_pid), "filtered-out pid leaked: {events:#?}");
}
