//! A node agent must leave nothing behind and keep its numbers exact under
//! load: programs and maps are gone after SIGTERM and after SIGKILL; a flood
//! of failing GPU calls keeps aggregated counters exact and /metrics up.
mod support;

use std::{
    process::Command,
    time::{Duration, Instant},
};

use support::*;

/// Programs and maps of canaryscope's object loaded in the kernel right
/// now (names as the kernel keeps them: at most 15 characters).
fn loaded() -> (usize, usize) {
    const PROGRAMS: &[&str] =
        &["gpu_enter", "gpu_exit", "process_exit", "signal_generat", "oom_mark_victim", "mmap_exec"];
    const MAPS: &[&str] =
        &["GPU_INFLIGHT", "GPU_STATS", "RUNQ_LATENCY", "RUNQ_WAKEUPS", "CRASHES", "OOM_VICTIMS"];
    let count = |kind: &str, names: &[&str]| {
        let out =
            Command::new("bpftool").args(["-j", kind, "show"]).output().expect("bpftool (Debian package)");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter(|p| p["name"].as_str().is_some_and(|n| names.iter().any(|w| n.starts_with(w))))
                    .count()
            })
            .unwrap_or(0)
    };
    (count("prog", PROGRAMS), count("map", MAPS))
}

fn wait_baseline(baseline: (usize, usize)) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while loaded() != baseline {
        assert!(Instant::now() < deadline, "still loaded: {:?} vs baseline {baseline:?}", loaded());
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn nothing_remains_loaded_after_sigterm_or_sigkill() {
    assert_root();
    let baseline = loaded();
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let running = loaded();
    assert!(running.0 > baseline.0 && running.1 > baseline.1, "daemon loaded nothing? {running:?}");
    assert!(daemon.stop().success(), "SIGTERM ends the daemon cleanly");
    wait_baseline(baseline);

    let daemon = Daemon::start(&["--no-kubernetes"]);
    assert!(loaded().0 > baseline.0);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGKILL) };
    drop(daemon);
    wait_baseline(baseline);
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_flood_of_failing_calls_keeps_counts_exact_and_metrics_up() {
    assert_root();
    let hip_loop = fixture("hip_loop");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let calls = 20_000;
    let mut child = pod.command(&hip_loop).args(["--fail", &calls.to_string()]).spawn().expect("hip_loop");
    // /metrics must answer promptly all through the flood.
    let mut slowest = Duration::ZERO;
    while child.try_wait().expect("wait").is_none() {
        let t = Instant::now();
        assert!(daemon.get("/metrics").is_some_and(|(c, _)| c == 200), "/metrics down during the flood");
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("slowest /metrics during the flood: {slowest:?}");
    let short = pod.rel.rsplit("cri-containerd-").next().map(|s| s[..12].to_string()).unwrap_or_default();
    // hip_loop's own hipGetDeviceCount calls, plus none other in that cgroup.
    let line = daemon.wait_metric("exact failing-call count", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_gpu_api_calls_total{")
            && l.contains(&format!("container=\"{short}\""))
            && l.contains("function=\"hipGetDeviceCount\"")
            && metric_value(l) >= calls as f64
    });
    assert_eq!(metric_value(&line), calls as f64, "{line}");
    let lost = daemon.wait_metric("lost counter", Duration::from_secs(1), |l| {
        l.starts_with("canaryscope_events_lost_total")
    });
    let received = daemon.wait_metric("records", Duration::from_secs(1), |l| {
        l.starts_with("canaryscope_ring_events_total{kind=\"gpu_call\"}")
    });
    // Every failure is an event: what did not arrive must have been counted as lost.
    assert!(metric_value(&received) + metric_value(&lost) >= calls as f64, "{received} / {lost}");
}
