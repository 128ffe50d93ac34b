//! One metric contract, taken from the code and checked on a real scrape: a
//! daemon sees every event kind this machine can cause (GPU init failures
//! and successful calls, a stall, a crash inside the GPU library, an abort,
//! an OOM kill, an mmap refused by RLIMIT_AS, a CPU-limited cgroup), each
//! family is asserted on its /metrics, and deploy/tools/queries.py
//! checks every rule, alert and analysis query of deploy/ against that
//! scrape (and against the declared families for what cannot be caused
//! here: GPU hardware faults, KFD).

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};
use test_support::{assert_root, fixture, random_hex, random_pod_uid, Daemon, PodCgroup};

const WAIT: Duration = Duration::from_secs(10);

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Python that deploy/check.sh would use: the first with PyYAML.
fn python_with_yaml() -> &'static str {
    ["python3", "/usr/bin/python3"]
        .into_iter()
        .find(|p| Command::new(p).args(["-c", "import yaml"]).status().is_ok_and(|s| s.success()))
        .expect("python3 with PyYAML (scripts/setup.sh installs it)")
}

/// Whether the exposition has a sample of `family` with all of `labels`.
fn has(metrics: &str, family: &str, labels: &[&str]) -> bool {
    metrics.lines().any(|l| {
        l.strip_prefix(family).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            && labels.iter().all(|want| l.contains(want))
    })
}

#[expect(clippy::too_many_lines, reason = "one scenario against the real daemon, read top to bottom")]
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn every_family_on_a_real_scrape_and_deploy_selects_only_what_it_carries() {
    assert_root();
    // The ZLUDA-shaped library is found when its first process starts, as
    // on a node; --hold makes that process's first calls count too.
    let daemon = Daemon::start(&["--no-kubernetes", "--stall-threshold", "500ms", "--hold"]);
    let app = fixture("cuda_app");
    let mut pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    pod.limit_cpu(0.5);
    pod.limit_memory(50 << 20);

    // Init failures through the real HIP runtime, and successful calls.
    assert!(pod.command(&fixture("hip_probe")).output().expect("hip_probe").status.success());
    let ok = pod.command(&app).args(["--version-loop", "100"]).env("ZLUDA_FIXTURE_HEALTHY", "1").output();
    assert!(ok.expect("cuda_app").status.success());
    // A crash inside the GPU library, and an abort.
    let crash = pod.command(&app).arg("--launch").env("ZLUDA_FIXTURE_CRASH", "1").output().expect("crash");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&crash.status), Some(11), "{crash:?}");
    let abort = pod.command(Path::new("/bin/sh")).args(["-c", "kill -ABRT $$"]).output().expect("abort");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&abort.status), Some(6), "{abort:?}");
    // An OOM kill in the 50 MiB limit.
    let hog = pod.command(&fixture("oom_hog")).arg("200").stdout(Stdio::null()).output().expect("oom_hog");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&hog.status), Some(9), "{hog:?}");
    // An mmap refused by RLIMIT_AS (no signal: only the refusal counts).
    let refused = pod.command(&fixture("mmap_refused")).args(["0.01", "64"]).output().expect("mmap_refused");
    assert!(refused.status.success(), "{refused:?}");
    // CPU limits are found by a walk of the hierarchy every few seconds
    // and sampled each second: the pod's are there before the stall below,
    // whose scrape must show them too.
    let short = pod.short_container_id();
    let container = format!("container=\"{short}\"");
    daemon.wait_metric("the pod's CFS periods", WAIT, |l| {
        l.starts_with("canaryscope_cpu_periods_total{") && l.contains(&container)
    });
    // A synchronisation that hangs past the threshold, scraped while it hangs.
    let mut stalled = pod
        .command(&app)
        .arg("--sync")
        .env("ZLUDA_FIXTURE_HEALTHY", "1")
        .env("ZLUDA_FIXTURE_SYNC_SLEEP_MS", "4000")
        .stdout(Stdio::null())
        .spawn()
        .expect("cuda_app --sync");
    let deadline = Instant::now() + WAIT;
    let metrics = loop {
        let m = daemon.metrics();
        let stall = m.lines().any(|l| {
            l.starts_with("canaryscope_gpu_api_stalled_calls{")
                && l.contains("function=\"cuStreamSynchronize\"")
        });
        if stall
            && has(&m, "canaryscope_oom_kills_total", &[])
            && has(&m, "canaryscope_native_crashes_total", &[])
            && has(&m, "canaryscope_memory_limit_refusals_total", &[])
        {
            break m;
        }
        assert!(Instant::now() < deadline, "events missing from /metrics:\n{m}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = stalled.wait();

    // Without Kubernetes a pod's revision is unknown, and its own cgroup
    // stands for it in the series kept per revision.
    let pod_cgroup = pod.rel.rsplit_once('/').map(|(dir, _)| dir).expect("a container below its pod");
    let revision = format!("workload=\"{pod_cgroup}\"");
    for (family, labels) in [
        (
            "canaryscope_gpu_api_calls_total",
            vec!["result=\"CUDA_SUCCESS\"", "function=\"cuDriverGetVersion\""],
        ),
        ("canaryscope_gpu_api_call_duration_seconds_bucket", vec!["api=\"cuda\"", "tier=\"cold\""]),
        ("canaryscope_cpu_runqueue_latency_seconds_bucket", vec![]),
    ] {
        let mut want = labels.clone();
        want.push(&revision);
        assert!(has(&metrics, family, &want), "no {family} with {want:?} for the pod's revision:\n{metrics}");
        let per_pod = metrics.lines().find(|l| l.starts_with(family) && l.contains("pod="));
        assert!(per_pod.is_none(), "{family} is kept per revision, not per pod: {per_pod:?}");
    }
    for (family, labels) in [
        ("canaryscope_gpu_api_call_failures_total", vec!["function=\"hipInit\""]),
        ("canaryscope_gpu_init_failures_total", vec!["function=\"hipInit\""]),
        ("canaryscope_gpu_api_stalled_calls", vec!["function=\"cuStreamSynchronize\""]),
        ("canaryscope_native_crashes_total", vec!["signal=\"SIGSEGV\"", "library=\"libcuda.so"]),
        ("canaryscope_abnormal_exits_total", vec!["signal=\"SIGABRT\"", "cause=\"abort\""]),
        (
            "canaryscope_abnormal_exits_total",
            vec!["signal=\"SIGKILL\"", "cause=\"oom_kill\"", "sender_scope=\"none\""],
        ),
        ("canaryscope_oom_kills_total", vec!["scope=\"memcg\""]),
        ("canaryscope_memory_limit_refusals_total", vec!["limit=\"as\""]),
        ("canaryscope_cpu_periods_total", vec![]),
        ("canaryscope_cpu_quota_cores", vec![]),
    ] {
        let mut want = labels.clone();
        want.push(&container);
        assert!(has(&metrics, family, &want), "no {family} with {want:?} for the pod:\n{metrics}");
    }
    for family in [
        "canaryscope_probe_attached",
        "canaryscope_events_lost_total",
        "canaryscope_decode_errors_total",
        "canaryscope_ring_events_total",
        "canaryscope_series_overflow_total",
        "canaryscope_tracked_cgroups",
        // 0 here (no Kubernetes); readiness_gate.rs scrapes the gate's families.
        "canaryscope_readiness_gate_enabled",
        "canaryscope_node_gpu_memory_faults_total",
        "canaryscope_node_gpu_resets_total",
        "canaryscope_node_gpu_queue_evictions_total",
        // 0 here: no KFD, so no VRAM per pod and no GPU to strand it on.
        "canaryscope_node_gpu_vram_stranded_unattributed_bytes_total",
    ] {
        assert!(has(&metrics, family, &[]), "no {family}:\n{metrics}");
    }

    // deploy/ against this scrape.
    let scrape = std::env::temp_dir().join(format!("canaryscope-scrape-{}.prom", random_hex(8)));
    std::fs::write(&scrape, &metrics).expect("write the scrape");
    let out = Command::new(python_with_yaml())
        .arg(repo().join("deploy/tools/queries.py"))
        .args(["contract", "--scrape"])
        .arg(&scrape)
        .output()
        .expect("python3 queries.py");
    let _ = std::fs::remove_file(&scrape);
    assert!(
        out.status.success(),
        "deploy/ selects what the exporter does not produce:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
