//! Environment faults a node agent meets in production, each survived and
//! visible: a full ring buffer, a GPU library replaced or deleted while
//! probed, processes that exit while they are being probed.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};
use test_support::{
    assert_root, canaryscope, field, fixture, fixtures_dir, metric_value, out_pid, random_hex,
    random_pod_uid, Daemon, PodCgroup, Stepped, Tracer,
};

const WAIT: Duration = Duration::from_secs(20);

/// A private copy of the CUDA fixture app and its ZLUDA-shaped library
/// (`DIR/cuda_app` finds `DIR/zluda/libcuda.so.1` through its RUNPATH).
struct AppCopy {
    dir: PathBuf,
}

impl AppCopy {
    fn new(tag: &str) -> Self {
        let app = fixture("cuda_app");
        let dir = fixtures_dir().join(format!("copy-{tag}-{}", random_hex(8)));
        fs::create_dir_all(dir.join("zluda")).expect("mkdir");
        fs::copy(&app, dir.join("cuda_app")).expect("copy app");
        fs::copy(fixtures_dir().join("zluda/libcuda.so.1"), dir.join("zluda/libcuda.so.1"))
            .expect("copy lib");
        Self { dir }
    }

    fn app(&self) -> PathBuf {
        self.dir.join("cuda_app")
    }

    fn lib(&self) -> PathBuf {
        self.dir.join("zluda/libcuda.so.1")
    }

    /// Replaces the library the way package managers and image layers do:
    /// a new file renamed over the old path (a new inode).
    fn replace_lib(&self) {
        let fresh = self.dir.join("zluda/.libcuda.so.1.new");
        fs::copy(fixtures_dir().join("zluda/libcuda.so.1"), &fresh).expect("copy");
        fs::rename(&fresh, self.lib()).expect("rename over");
    }
}

impl Drop for AppCopy {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn ino(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&fs::metadata(path).expect("stat"))
}

/// The copy's app, stopped before its first GPU call (`--pause-before
/// init`) with its libraries mapped; `args` come after.
fn paused_app(copy: &AppCopy, args: &[&str]) -> (Stepped, u64) {
    let mut command = Command::new(copy.app());
    command.args(["--pause-before", "init"]).args(args);
    let mut process = Stepped::spawn(command);
    let pid = field(&process.wait_line("paused=init"), "pid").parse().expect("pid");
    (process, pid)
}

/// Lets a paused app make its calls and end.
fn finish_app(mut process: Stepped) {
    process.go();
    process.wait_line("cuInit=");
    assert!(process.finish().success());
}

/// What a replaced or deleted file does to its probes, not how soon a file
/// is found: each process calls only once the probes of the file it maps
/// are announced (a_library_loaded_later_is_found_within_a_second and
/// first_call.rs face that race).
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_library_replaced_or_deleted_while_probed_is_still_traced() {
    assert_root();
    let copy = AppCopy::new("replace");
    let tracer = Tracer::start(&[]);
    let lib_path = copy.lib().display().to_string();
    let cu_init_from = |pid: u64| {
        let lib_path = lib_path.clone();
        move |e: &serde_json::Value| e["function"] == "cuInit" && e["pid"] == pid && e["library"] == lib_path
    };
    let probed_after = |mark: usize, what: &str| {
        tracer.wait_for_after(mark, what, WAIT, |e| e["kind"] == "library_probed" && e["library"] == lib_path)
    };

    // 1. The original file, found when a process that maps it starts.
    let mark = tracer.mark();
    let (process, pid) = paused_app(&copy, &[]);
    probed_after(mark, "the original library probed");
    finish_app(process);
    tracer.wait_for("cuInit from the original library", WAIT, cu_init_from(pid));

    // 2. Replaced by a rename: a new inode at the same path is probed anew.
    let before = ino(&copy.lib());
    copy.replace_lib();
    assert_ne!(before, ino(&copy.lib()), "the replacement must be a new file");
    let mark = tracer.mark();
    let (process, pid) = paused_app(&copy, &[]);
    probed_after(mark, "the replacement probed");
    finish_app(process);
    tracer.wait_for("cuInit from the replacement", WAIT, cu_init_from(pid));

    // 3. Deleted while a process has it mapped: the probes live on the
    // inode, so the running process is still traced.
    let (process, pid) = paused_app(&copy, &[]);
    fs::remove_file(copy.lib()).expect("delete the library");
    finish_app(process);
    tracer.wait_for("cuInit from the deleted library", WAIT, cu_init_from(pid));

    let (status, _) = tracer.stop();
    assert!(status.success(), "the tracer survived all three: {status:?}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn the_exporter_lists_libraries_found_after_start() {
    assert_root();
    let copy = AppCopy::new("exported");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let series = format!("canaryscope_probe_attached{{probe=\"gpu\",target=\"{}\"}}", copy.lib().display());
    assert!(!daemon.metrics().contains(&series), "not mapped by anyone yet");
    // Run as a user's process is, calling at once: its file is listed
    // whether or not that first call came after the attach.
    let out = Command::new(copy.app()).output().expect("run");
    assert!(out.status.success(), "{out:?}");
    let line = daemon.wait_metric("the library found by discovery", WAIT, |l| l.starts_with(&series));
    assert_eq!(metric_value(&line), 1.0, "{line}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_library_deleted_before_discovery_is_probed_through_the_mapping() {
    assert_root();
    let copy = AppCopy::new("deleted");
    // The process maps the library, then the file is unlinked, then the
    // tracer starts: the path in /proc/PID/maps leads nowhere ("(deleted)"),
    // only the mapping itself does. The process calls once the tracer says
    // it traces: what it found at start is probed by then.
    let (process, pid) = paused_app(&copy, &[]);
    fs::remove_file(copy.lib()).expect("delete the library");
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    assert!(maps.contains("libcuda.so.1 (deleted)"), "{maps}");
    let tracer = Tracer::start(&[]);
    finish_app(process);
    let cu = tracer
        .wait_for("cuInit from the deleted library", WAIT, |e| e["function"] == "cuInit" && e["pid"] == pid);
    assert_eq!(cu["library"], copy.lib().display().to_string(), "reported under the path it had: {cu}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn processes_exiting_while_being_probed_do_not_spoil_later_ones() {
    assert_root();
    // One library file reached only through short-lived processes' own
    // mount namespaces (/proc/PID/root/...), like a crash-looping pod: most
    // of them exit while the tracer is still scanning or attaching.
    let copy = AppCopy::new("exiting");
    let tracer = Tracer::start(&[]);
    let script = |args: &str| {
        format!(
            "set -e; mount -t tmpfs none /mnt; mkdir /mnt/app; mount --bind {dir} /mnt/app; \
             exec /mnt/app/cuda_app {args}",
            dir = copy.dir.display()
        )
    };
    for _ in 0..40 {
        // Exits right after loading: an unknown argument. Run at once, one
        // after another, as a crash-looping pod's are.
        let out = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script("--exit-now")])
            .output()
            .expect("unshare");
        assert_eq!(out.status.code(), Some(2), "{out:?}");
    }
    // A process that stays calls cuInit at once too, and its later calls
    // come once the file is probed: by one of those before it, or by it.
    let mut command = Command::new("unshare");
    command.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script("--loop 3 --pause-before loop"),
    ]);
    let mut process = Stepped::spawn(command);
    let pid: u64 = field(&process.wait_line("paused=loop"), "pid").parse().expect("pid");
    tracer.wait_for("the file probed after 40 exits during discovery", WAIT, |e| {
        e["kind"] == "library_probed" && e["library"] == "/mnt/app/zluda/libcuda.so.1"
    });
    process.go();
    process.wait_line("loop=3");
    assert!(process.finish().success());
    let counts = tracer.wait_for_n("device counts after 40 exits during discovery", 3, WAIT, |e| {
        e["function"] == "cuDeviceGetCount" && e["pid"] == pid
    });
    for cu in counts {
        assert_eq!(cu["library"], "/mnt/app/zluda/libcuda.so.1", "{cu}");
    }
    let (status, _) = tracer.stop();
    assert!(status.success(), "{status:?}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_full_ring_buffer_is_counted_as_lost_and_aggregates_stay_exact() {
    assert_root();
    let hip_loop = fixture("hip_loop");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let lost_before = metric_value(
        &daemon.wait_metric("lost counter", WAIT, |l| l.starts_with("canaryscope_events_lost_total")),
    );
    // A stopped reader cannot drain the ring buffer: 40,000 failures (every
    // one is an event) overflow its 1 MiB, while the kernel keeps counting.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGSTOP) };
    let calls = 40_000;
    let out = pod.command(&hip_loop).args(["--fail", &calls.to_string()]).output().expect("hip_loop");
    // SAFETY: as above.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGCONT) };
    assert!(out.status.success(), "{out:?}");
    let short = pod.short_container_id();
    let line = daemon.wait_metric("exact count after the overflow", WAIT, |l| {
        l.starts_with("canaryscope_gpu_api_call_failures_total{")
            && l.contains(&format!("container=\"{short}\""))
            && l.contains("function=\"hipGetDeviceCount\"")
            && metric_value(l) >= calls as f64
    });
    assert_eq!(metric_value(&line), calls as f64, "{line}");
    let lost = metric_value(&daemon.wait_metric("lost events", WAIT, |l| {
        l.starts_with("canaryscope_events_lost_total") && metric_value(l) > lost_before
    }));
    // The reader drains what the ring held when it stopped.
    let received = metric_value(&daemon.wait_metric("records drained after the stop", WAIT, |l| {
        l.starts_with("canaryscope_ring_events_total{kind=\"gpu_call\"}") && metric_value(l) > 0.0
    }));
    eprintln!("received {received}, lost {}", lost - lost_before);
    assert!(received + lost - lost_before >= calls as f64, "nothing vanished uncounted");
    assert!(daemon.get("/metrics").is_some_and(|(c, _)| c == 200));
    assert!(daemon.stop().success());
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn an_event_of_a_cgroup_removed_before_it_is_resolved_is_kept_without_a_path() {
    assert_root();
    let probe = fixture("hip_probe");
    let tracer = Tracer::start(&[]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    // The reader is stopped while the pod runs and its cgroup is removed:
    // by the time the record is read, the id leads nowhere.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGSTOP) };
    let out = pod.command(&probe).output().expect("run hip_probe");
    let cgroup_id = std::os::unix::fs::MetadataExt::ino(&fs::metadata(&pod.dir).expect("cgroup"));
    drop(pod);
    // SAFETY: as above.
    unsafe { libc::kill(tracer.pid() as i32, libc::SIGCONT) };
    let pid = out_pid(&out.stdout);
    let ev = tracer.wait_for("the failure of the vanished pod", WAIT, |e| {
        e["function"] == "hipGetDeviceCount" && e["pid"] == pid
    });
    assert!(ev["cgroup"].is_null(), "no path to report: {ev}");
    assert_eq!(ev["cgroup_id"], cgroup_id, "the id still says which cgroup it was: {ev}");
    let (status, _) = tracer.stop();
    assert!(status.success(), "{status:?}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn without_tracefs_canaryscope_mounts_it_and_attaches() {
    assert_root();
    // In a private mount namespace every tracefs mount is taken away first;
    // the host's mounts stay as they are.
    let script = format!(
        "for m in $(awk '$3 == \"tracefs\" {{print $2}}' /proc/self/mounts | sort -r); do \
             umount -l \"$m\" || exit 3; done; \
         if grep -q ' tracefs ' /proc/self/mounts; then exit 4; fi; \
         exec {} check --json",
        canaryscope().display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare");
    assert!(![3, 4].contains(&out.status.code().unwrap_or(0)), "could not unmount tracefs: {out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    let facility = report["facilities"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["name"] == "tracefs"))
        .unwrap_or_else(|| panic!("{report:#}"));
    assert_eq!(facility["ok"], true, "{facility}");
    let attached = |probe: &str| {
        report["probes"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p["probe"] == probe && p["attached"] == true))
    };
    // Both need tracefs: the OOM tracepoint's format and the mmap syscall tracepoint.
    assert!(attached("oom") && attached("discovery"), "{report:#}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn probes_of_a_deleted_library_go_once_no_process_maps_it() {
    assert_root();
    let copy = AppCopy::new("retired");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let series = format!("canaryscope_probe_attached{{probe=\"gpu\",target=\"{}\"}}", copy.lib().display());
    // A process that keeps the library mapped while its file is deleted,
    // stopped before its calls until the test lets it end.
    let (process, _) = paused_app(&copy, &[]);
    daemon.wait_metric("the library probed", WAIT, |l| l.starts_with(&series));
    fs::remove_file(copy.lib()).expect("delete the library");
    // Deleted but still mapped: the probes stay (longer than the 5 s
    // between checks).
    std::thread::sleep(Duration::from_secs(7));
    assert!(daemon.metrics().contains(&series), "probes removed while the library was still mapped");
    finish_app(process);
    let deadline = std::time::Instant::now() + WAIT;
    while daemon.metrics().contains(&series) {
        assert!(std::time::Instant::now() < deadline, "probes of the deleted, unmapped library remain");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(daemon.get("/metrics").is_some_and(|(c, _)| c == 200));
}
