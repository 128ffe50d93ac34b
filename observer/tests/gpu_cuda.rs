//! ZLUDA-shaped CUDA driver library (tests/fixtures/zluda_cuda.c: cu* calls
//! forward to the real HIP runtime and pass HIP's error number through):
//! failures, the HIP call beneath, crashes inside the library, libraries
//! found later or only through a container's root, and in-kernel aggregation.

use std::{path::Path, process::Command, time::Duration};
use test_support::{
    assert_root, canaryscope, field, fixture, fixtures_dir, metric_value, out_pid, random_hex,
    random_pod_uid, shape::KernelShape, uprobe_multi_links, Daemon, PodCgroup, Stepped, Tracer,
};

fn zluda_lib() -> std::path::PathBuf {
    fixture("cuda_app");
    fixtures_dir().join("zluda/libcuda.so.1")
}

/// What cuInit returns through the real HIP runtime: without /dev/kfd
/// hipInit fails (101); with /dev/kfd and no GPU (the VM) hipInit succeeds
/// and the device count fails (100). ZLUDA passes the number through.
fn expected_cu_init() -> (i64, &'static str) {
    if std::path::Path::new("/dev/kfd").exists() {
        (100, "CUDA_ERROR_NO_DEVICE")
    } else {
        (101, "CUDA_ERROR_INVALID_DEVICE")
    }
}

/// Event waits are generous: the VM runs under software emulation.
const WAIT: Duration = Duration::from_secs(20);

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn cu_init_failure_is_reported_with_the_hip_call_beneath() {
    assert_root();
    let app = fixture("cuda_app");
    let lib = zluda_lib();
    // Named with --lib: this test is about what a failing cuInit reports
    // (its error, the HIP call beneath, their nesting), and cuda_app calls
    // cuInit first thing, which would race the attach of a file found at
    // its exec. Finding the file is a_library_loaded_later_is_found_within_a_second's.
    let tracer = Tracer::start(&["--lib", lib.to_str().expect("utf8")]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let out = pod.command(&app).output().expect("run cuda_app");
    assert!(out.status.success(), "{out:?}");
    let pid = out_pid(&out.stdout);
    let cu = tracer.wait_for("cuInit", WAIT, |e| e["function"] == "cuInit" && e["pid"] == pid);
    assert_eq!(cu["api"], "cuda");
    let (code, name) = expected_cu_init();
    assert_eq!(cu["result"], code);
    assert_eq!(cu["result_name"], name);
    assert!(cu["library"].as_str().is_some_and(|l| l.ends_with("zluda/libcuda.so.1")), "{cu}");
    assert_eq!(cu["cgroup"], pod.rel.as_str());
    // The failing HIP call beneath: hipInit without /dev/kfd, else the device count.
    let hip_function = if code == 101 { "hipInit" } else { "hipGetDeviceCount" };
    let hip =
        tracer.wait_for("the HIP call beneath", WAIT, |e| e["function"] == hip_function && e["pid"] == pid);
    assert_eq!(hip["result"], code);
    assert_eq!(hip["cgroup"], pod.rel.as_str());
    assert_eq!(hip["tid"], cu["tid"]);
    // The HIP call happened inside cuInit: shorter, and not after it returned.
    assert!(hip["duration_ns"].as_u64() <= cu["duration_ns"].as_u64(), "{hip} vs {cu}");
    assert!(hip["ts_ns"].as_u64() <= cu["ts_ns"].as_u64());
}

/// Where the kernel has `uprobe_multi` links, a newly probed file costs one
/// link per program, whatever its function count: what its release costs
/// at a stop. Elsewhere, and when told, functions get a perf-event link
/// each. Calls are seen either way.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_probed_file_takes_one_uprobe_multi_link_per_program_where_the_kernel_has_them() {
    assert_root();
    let lib = zluda_lib();
    let multi = KernelShape::declared().uprobe_multi;
    for per_function in [false, true] {
        let tracer = Tracer::start(if per_function { &["--per-function-uprobes"] } else { &[] });
        let before = uprobe_multi_links(tracer.pid());
        // A file this tracer has never seen, mapped by a process in a pod.
        let dir = std::env::temp_dir().join(format!("canaryscope-links-{}", random_hex(12)));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let copy = dir.join("libcuda.so.1");
        std::fs::copy(&lib, &copy).expect("copy the ZLUDA library");
        let copy_path = copy.to_str().expect("utf8").to_string();
        let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
        let mark = tracer.mark();
        let out = pod.command(&fixture("gpu_dlopen")).arg(&copy).output().expect("gpu_dlopen");
        assert!(out.status.success(), "{out:?}");
        tracer.wait_for_after(mark, "the copy probed", WAIT, |e| {
            e["kind"] == "library_probed" && e["library"] == copy_path.as_str()
        });
        // trace probes the hot tier everywhere, timed: an entry and a
        // return program.
        let expected = if multi && !per_function { 2 } else { 0 };
        assert_eq!(
            uprobe_multi_links(tracer.pid()) - before,
            expected,
            "uprobe_multi in the kernel: {multi}; --per-function-uprobes: {per_function}"
        );
        // Its calls are seen through whichever links it got.
        let out = pod.command(&fixture("cuda_app")).env("LD_LIBRARY_PATH", &dir).output().expect("cuda_app");
        assert!(out.status.success(), "{out:?}");
        let pid = out_pid(&out.stdout);
        let cu = tracer.wait_for("cuInit", WAIT, |e| e["function"] == "cuInit" && e["pid"] == pid);
        assert_eq!(cu["library"], copy_path.as_str(), "{cu}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn check_tells_zluda_from_other_libraries() {
    assert_root();
    let lib = zluda_lib();
    let out =
        Command::new(canaryscope()).args(["check", "--json", "--lib"]).arg(&lib).output().expect("run check");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let entry = report["gpu_libraries"]
        .as_array()
        .and_then(|a| a.iter().find(|l| l["path"].as_str() == lib.to_str()))
        .unwrap_or_else(|| panic!("library missing: {report:#}"));
    assert_eq!(entry["flavor"], "zluda", "{entry}");
    // cuLaunchKernel_ptsz is cuLaunchKernel's address under a second name:
    // probed once, under the name listed first.
    assert_eq!(entry["aliases"], serde_json::json!(["cuLaunchKernel_ptsz=cuLaunchKernel"]), "{entry}");
    let hip = report["gpu_libraries"].as_array().and_then(|a| a.iter().find(|l| l["flavor"] == "hip"));
    assert!(hip.is_some(), "Debian's libamdhip64 is listed as hip: {report:#}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_crash_inside_the_library_names_library_and_call() {
    assert_root();
    let app = fixture("cuda_app");
    let lib = zluda_lib();
    // Named with --lib: the crash and the call in flight are the subject,
    // and the library must be probed before cuda_app's first call, which
    // comes at once, so that the call is in the in-flight map.
    let tracer = Tracer::start(&["--lib", lib.to_str().expect("utf8")]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let child = pod
        .command(&app)
        .arg("--launch")
        .env("ZLUDA_FIXTURE_CRASH", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id() as u64;
    let out = child.wait_with_output().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(11), "{out:?}");
    let crash = tracer.wait_for("crash", WAIT, |e| e["kind"] == "crash" && e["pid"] == pid);
    assert_eq!(crash["signal"], "SIGSEGV");
    assert!(crash["library"].as_str().is_some_and(|l| l.contains("libcuda.so.1")), "{crash}");
    assert_eq!(crash["in_call"], "cuLaunchKernel");
    assert_eq!(crash["cgroup"], pod.rel.as_str());
    let exit = tracer.wait_for("exit", WAIT, |e| e["kind"] == "exit" && e["pid"] == pid);
    assert_eq!(exit["signal"], "SIGSEGV");
}

/// Whether `event` names the same file as `lib` (the tracer reports a file
/// under the name it was found by, `libcuda.so` or `libcuda.so.1`).
fn is_file(event: &serde_json::Value, lib: &Path) -> bool {
    let same = |a: &Path| a.canonicalize().ok();
    event["library"].as_str().is_some_and(|l| same(Path::new(l)).is_some() && same(Path::new(l)) == same(lib))
}

/// No `--lib`, and the library is in no standard directory: the tracer
/// learns of it only from a process whose loader will find it, here
/// through the executable's run path. That process calls cuInit first
/// thing, as a user's does, and waits only before its later calls. Its
/// runtime file is probed because of its exec, within a second of it, and
/// its calls from then on are all seen. Whether its very first call is
/// seen is a race with the attach that only the hold settles
/// (docs/how-it-sees.md, "A new library, before its first call";
/// first_call.rs tests the hold):
/// reported here, not required.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_library_loaded_later_is_found_within_a_second() {
    assert_root();
    let app = fixture("cuda_app");
    let lib = zluda_lib();
    let tracer = Tracer::start(&[]);
    let mut command = Command::new(&app);
    command.args(["--loop", "3", "--pause-before", "loop"]);
    let mut process = Stepped::spawn(command);
    let pid: u64 = field(&process.wait_line("paused=loop"), "pid").parse().expect("pid");
    let probed = tracer.wait_for("the library found through the run path", WAIT, |e| {
        e["kind"] == "library_probed" && is_file(e, &lib)
    });
    assert_eq!(probed["pid"], pid, "found because of this process: {probed}");
    assert!(probed["reason"].as_str().is_some_and(|r| r.starts_with("run path of ")), "{probed}");
    let init_probes_after = probed["init_probes_after_ns"].as_u64().unwrap_or(u64::MAX);
    assert!(init_probes_after < 1_000_000_000, "cuInit probed more than a second after the exec: {probed}");
    process.go();
    process.wait_line("loop=3");
    assert!(process.finish().success());
    let counts = tracer.wait_for_n("the device counts after the probes", 3, WAIT, |e| {
        e["function"] == "cuDeviceGetCount" && e["pid"] == pid
    });
    assert!(counts.iter().all(|e| is_file(e, &lib)), "{counts:#?}");
    let first = tracer.events().into_iter().find(|e| e["function"] == "cuInit" && e["pid"] == pid);
    eprintln!(
        "cuInit probed {:.1} ms after the exec; the process's first call, at once, {}",
        init_probes_after as f64 / 1e6,
        if first.is_some() { "seen" } else { "missed" }
    );
    if let Some(cu) = first {
        assert_eq!(cu["result_name"], expected_cu_init().1, "{cu}");
    }
}

/// A library only inside a container's own root: found at the exec through
/// /proc/PID/root, reported under the path the container sees. As above,
/// the process calls cuInit at once and waits only before its later calls.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_library_only_inside_a_container_root_is_probed() {
    assert_root();
    let app = fixture("cuda_app");
    let lib = zluda_lib();
    let tracer = Tracer::start(&[]);
    // A private mount namespace with a tmpfs holding the app and its
    // library: from the host the file exists only via /proc/PID/root.
    let script = format!(
        "set -e; mount -t tmpfs none /mnt; mkdir -p /mnt/app/zluda; cp {app} /mnt/app/; cp {lib} /mnt/app/zluda/; \
         exec /mnt/app/cuda_app --loop 3 --pause-before loop",
        app = app.display(),
        lib = lib.display()
    );
    let mut command = Command::new("unshare");
    command.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    let mut process = Stepped::spawn(command);
    let pid: u64 = field(&process.wait_line("paused=loop"), "pid").parse().expect("pid");
    let probed = tracer.wait_for("the container's library probed", WAIT, |e| {
        e["kind"] == "library_probed" && e["library"] == "/mnt/app/zluda/libcuda.so.1"
    });
    assert_eq!(probed["pid"], pid, "found because of this process: {probed}");
    assert!(probed["reason"].as_str().is_some_and(|r| r.starts_with("run path of ")), "{probed}");
    process.go();
    process.wait_line("loop=3");
    assert!(process.finish().success());
    let counts = tracer.wait_for_n("the device counts in the container", 3, WAIT, |e| {
        e["function"] == "cuDeviceGetCount" && e["pid"] == pid
    });
    for cu in counts {
        assert_eq!(cu["library"], "/mnt/app/zluda/libcuda.so.1", "the path as the container sees it: {cu}");
    }
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn successful_calls_are_aggregated_in_the_kernel_exactly() {
    assert_root();
    let app = fixture("cuda_app");
    let lib = zluda_lib();
    // Named with --lib: the count must be exact, so the library is probed
    // before the process exists; finding it is another test's subject.
    let daemon = Daemon::start(&["--no-kubernetes", "--lib", lib.to_str().expect("utf8")]);
    let before = ring_records(&daemon);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let out = pod.command(&app).args(["--version-loop", "100000"]).output().expect("run");
    assert!(out.status.success(), "{out:?}");
    let short = pod.short_container_id();
    // Per container: the per-pod view (Prometheus counts successes per revision).
    let line = daemon.wait_pod_metric("100000 successful calls", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_gpu_api_calls_total{")
            && l.contains(&format!("container=\"{short}\""))
            && l.contains("function=\"cuDriverGetVersion\"")
            && l.contains("result=\"CUDA_SUCCESS\"")
            && metric_value(l) >= 100000.0
    });
    assert_eq!(metric_value(&line), 100000.0, "exact count: {line}");
    let after = ring_records(&daemon);
    // The failures of cuInit/hipInit beneath are all that may cross;
    // 100,000 successes must not.
    assert!(after - before < 20.0, "{} GPU call records for 100,000 calls", after - before);
    let lost = daemon.wait_metric("events lost", Duration::from_secs(1), |l| {
        l.starts_with("canaryscope_events_lost_total")
    });
    assert_eq!(metric_value(&lost), 0.0);
}

/// GPU call records that crossed the ring buffer. Only that kind: every
/// exec on the node crosses too, and other work on the machine must not
/// decide this test.
fn ring_records(daemon: &Daemon) -> f64 {
    std::thread::sleep(Duration::from_millis(700));
    daemon
        .metrics()
        .lines()
        .filter(|l| l.starts_with("canaryscope_ring_events_total{") && l.contains("kind=\"gpu_call\""))
        .map(metric_value)
        .sum()
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_call_hanging_past_the_threshold_is_reported_once_then_on_return() {
    assert_root();
    let app = fixture("cuda_app");
    let lib = zluda_lib();
    // Named with --lib: the stall is the subject, and its call must be
    // probed whatever the attach of a file found at exec takes.
    let tracer = Tracer::start(&["--lib", lib.to_str().expect("utf8"), "--stall-threshold", "500ms"]);
    // The fixture's cuStreamSynchronize sleeps this long inside the library
    // before returning: a hang in synchronisation that eventually ends.
    let out = Command::new(&app)
        .arg("--sync")
        .env("ZLUDA_FIXTURE_SYNC_SLEEP_MS", "2500")
        .output()
        .expect("run cuda_app --sync");
    let pid = out_pid(&out.stdout);
    let stall = tracer.wait_for("gpu_stall", WAIT, |e| e["kind"] == "gpu_stall" && e["pid"] == pid);
    assert_eq!(stall["function"], "cuStreamSynchronize");
    assert!(stall["elapsed_ns"].as_u64() >= Some(500_000_000), "{stall}");
    // Where HIP has /dev/kfd but no GPU (the VM), the synchronisation
    // beneath may crash instead of returning: then the crash is the end.
    // Without /dev/kfd the runtime never reaches the device: the call must
    // return, and the process exit cleanly.
    let kfd = std::path::Path::new("/dev/kfd").exists();
    assert!(kfd || out.status.success(), "without /dev/kfd the fixture exits 0: {out:?}");
    if kfd && std::os::unix::process::ExitStatusExt::signal(&out.status).is_some() {
        let crash =
            tracer.wait_for("the crash ending the stall", WAIT, |e| e["kind"] == "crash" && e["pid"] == pid);
        // The innermost call in flight: the synchronisation, at the HIP
        // layer beneath or the CUDA one.
        let in_call = crash["in_call"].as_str().unwrap_or_default();
        assert!(matches!(in_call, "hipStreamSynchronize" | "cuStreamSynchronize"), "{crash}");
    } else {
        let ret = tracer.wait_for("the return", WAIT, |e| {
            e["kind"] == "gpu_call" && e["function"] == "cuStreamSynchronize" && e["pid"] == pid
        });
        assert!(ret["duration_ns"].as_u64() >= Some(2_400_000_000), "{ret}");
    }
    std::thread::sleep(Duration::from_millis(600));
    let (_, events) = tracer.stop();
    let stalls = events.iter().filter(|e| e["kind"] == "gpu_stall" && e["pid"] == pid).count();
    assert_eq!(stalls, 1, "a stall is reported once: {events:#?}");
}
