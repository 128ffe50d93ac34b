//! CPU inference and solver failure modes with real processes in real
//! cgroups with real limits: CFS throttling and oversubscription, OOM kills,
//! CPU-rlimit kills, and clean exits that must not be reported.

use std::time::Duration;
use test_support::{
    assert_root, child_pid, fixture, metric_value, random_hex, random_pod_uid, Daemon, PodCgroup, Tracer,
};

/// Mean run-queue latency of one container's histogram, from the per-pod
/// view (Prometheus gets one histogram per revision).
fn mean_runq(metrics: &str, container: &str) -> Option<(f64, f64)> {
    let pick = |suffix: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with(&format!("canaryscope_cpu_runqueue_latency_seconds_{suffix}{{"))
                    && l.contains(&format!("container=\"{container}\""))
            })
            .map(metric_value)
    };
    let (sum, count) = (pick("sum")?, pick("count")?);
    (count > 0.0).then_some((sum / count, count))
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn threads_beyond_a_small_quota_are_throttled_oversubscribed_and_wait() {
    assert_root();
    let busy = fixture("busy_threads");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let mut limited = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    // The incident: a runtime starts one thread per host core (32) inside a
    // 2-core limit. Scaled to whatever runs the test: one thread per CPU,
    // inside a limit of 2/32 of the machine. Without the limit the same threads
    // have a CPU each and barely wait; with it they wait out most periods.
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let quota = cpus as f64 * 2.0 / 32.0;
    let threads = cpus.to_string();
    limited.limit_cpu(quota);
    let tracer = Tracer::start(&["--cgroup", &limited.rel]);
    let out = limited.command(&busy).args([threads.as_str(), "5"]).output().expect("busy");
    assert!(out.status.success());
    let throttle = tracer.wait_for("cpu_throttle", Duration::from_secs(3), |e| e["kind"] == "cpu_throttle");
    assert_eq!(throttle["cgroup"], limited.rel.as_str());
    assert!(throttle["periods"].as_u64() >= Some(2), "{throttle}");
    let over =
        tracer.wait_for("cpu_oversubscribed", Duration::from_secs(3), |e| e["kind"] == "cpu_oversubscribed");
    assert_eq!(over["cgroup"], limited.rel.as_str());
    assert!(over["runnable_threads"].as_u64() > Some(1), "{over}");
    assert_eq!(over["quota_cores"], quota);
    drop(tracer);

    // The same load without a limit, for comparison.
    let free = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let out = free.command(&busy).args([threads.as_str(), "5"]).output().expect("busy");
    assert!(out.status.success());
    // The histograms come with the daemon's next read of the kernel maps.
    daemon.wait_pod_metric("the free cgroup's run-queue histogram", Duration::from_secs(5), |l| {
        l.starts_with("canaryscope_cpu_runqueue_latency_seconds_count{")
            && l.contains(&free.short_container_id())
    });
    let metrics = daemon.pod_metrics();
    let (limited_mean, limited_n) =
        mean_runq(&metrics, &limited.short_container_id()).expect("limited histogram");
    let (free_mean, free_n) = mean_runq(&metrics, &free.short_container_id()).expect("free histogram");
    eprintln!("run-queue mean: limited {limited_mean:.6}s over {limited_n} waits, free {free_mean:.6}s over {free_n}");
    assert!(limited_mean > 10.0 * free_mean, "limited {limited_mean} vs free {free_mean}");
    let throttled = daemon.wait_metric("throttled periods", Duration::from_secs(2), |l| {
        l.starts_with("canaryscope_cpu_throttled_periods_total{") && l.contains(&limited.short_container_id())
    });
    assert!(metric_value(&throttled) >= 2.0, "{throttled}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_process_past_its_memory_limit_is_one_oom_kill_and_one_sigkill_exit() {
    assert_root();
    let hog = fixture("oom_hog");
    let mut pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    pod.limit_memory(50 << 20);
    let tracer = Tracer::start(&["--cgroup", &pod.rel]);
    let child = pod.command(&hog).arg("200").stdout(std::process::Stdio::null()).spawn().expect("spawn");
    let pid = child.id() as u64;
    let out = child.wait_with_output().expect("wait");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(9), "{out:?}");
    let oom = tracer.wait_for("oom_kill", Duration::from_secs(5), |e| e["kind"] == "oom_kill");
    assert_eq!(oom["pid"], pid);
    assert_eq!(oom["cgroup"], pod.rel.as_str());
    assert_eq!(oom["scope"], "memcg");
    let exit = tracer.wait_for("exit", Duration::from_secs(5), |e| e["kind"] == "exit" && e["pid"] == pid);
    assert_eq!(exit["signal"], "SIGKILL");
    // The OOM killer's SIGKILL is the kernel's own, sent from whichever task
    // was allocating: the victim mark decides the cause.
    assert_eq!(exit["cause"], "oom_kill", "{exit}");
    assert_eq!(exit["sender_scope"], serde_json::Value::Null, "{exit}");
    let _marker = tracer.barrier(&pod);
    let (_, events) = tracer.stop();
    assert_eq!(events.iter().filter(|e| e["kind"] == "oom_kill").count(), 1, "{events:#?}");
    assert_eq!(events.iter().filter(|e| e["kind"] == "exit" && e["pid"] == pid).count(), 1, "{events:#?}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_solver_child_killed_by_its_cpu_rlimit_is_reported_a_clean_failure_is_not() {
    assert_root();
    let solver = fixture("solver_child");
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let tracer = Tracer::start(&["--cgroup", &pod.rel]);
    let out = pod.command(&solver).arg("cpu").output().expect("solver cpu");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let child: u64 = child_pid(&text);
    let exit = tracer.wait_for("exit of the rlimited child", Duration::from_secs(5), |e| {
        e["kind"] == "exit" && e["pid"] == child
    });
    assert!(exit["signal"] == "SIGXCPU" || exit["signal"] == "SIGKILL", "{exit}");
    assert_eq!(exit["cause"], "rlimit_cpu", "{exit}");
    assert_eq!(exit["cgroup"], pod.rel.as_str(), "the child lives in its parent's cgroup");

    let out = pod.command(&solver).arg("as").output().expect("solver as");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("exit 3"), "{text}");
    let clean_child: u64 = child_pid(&text);
    let _marker = tracer.barrier(&pod);
    let (_, events) = tracer.stop();
    // Its refused allocation is an event of its own; its exit is no kill.
    assert!(
        !events.iter().any(|e| e["pid"] == clean_child && e["kind"] != "memory_limit_refusal"),
        "a child that refused an allocation and exited 3 is no kill: {events:#?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e["pid"] == clean_child && e["kind"] == "memory_limit_refusal" && e["limit"] == "as"),
        "the refused allocation is seen: {events:#?}"
    );
}
