//! The series budget (docs/daemon.md: the series budget), on a real scrape of the
//! real daemon: what one pod costs Prometheus once its containers have
//! started up. Successful calls and latency histograms are kept per
//! revision on the node, which pods of the revision share; what carries a
//! pod's own labels is its failures and its CPU accounting.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    thread,
    time::{Duration, Instant},
};
use test_support::{
    assert_root, fixture,
    k8s::{control, node_daemon, scheduled_pod, scratch_dir, start_apiserver, write_kubeconfig, NodePod, NS},
    metric_value, random_hex, random_pod_uid, Daemon, PodCgroup,
};

/// Series with a GPU pod's own labels, at most.
const GPU_POD_BUDGET: usize = 40;
/// Series with a CPU-only pod's own labels, at most.
const CPU_POD_BUDGET: usize = 10;
const WAIT: Duration = Duration::from_secs(15);

/// The series of one scrape that carry pod `uid`'s labels.
fn pod_series<'a>(metrics: &'a str, uid: &str) -> Vec<&'a str> {
    let label = format!("pod=\"{uid}\"");
    metrics.lines().filter(|l| !l.starts_with('#') && l.contains(&label)).collect()
}

/// The series kept for the revision `workload` stands for.
fn revision_series<'a>(metrics: &'a str, workload: &str) -> Vec<&'a str> {
    let label = format!("workload=\"{workload}\"");
    metrics.lines().filter(|l| !l.starts_with('#') && l.contains(&label) && !l.contains("pod=")).collect()
}

/// Distinct `function` labels among `series` of `family`.
fn functions(series: &[&str], family: &str) -> BTreeSet<String> {
    series
        .iter()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter_map(|l| l.split("function=\"").nth(1)?.split('"').next().map(str::to_string))
        .collect()
}

/// The pod-level cgroup of a container's (its parent directory).
fn pod_cgroup(container: &PodCgroup) -> String {
    container.rel.rsplit_once('/').map(|(dir, _)| dir.to_string()).expect("a container below its pod")
}

fn nvidia(key: &str) -> PathBuf {
    let env = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nvidia/paths.env");
    let text = std::fs::read_to_string(&env).unwrap_or_else(|e| {
        panic!("{}: {e}; run tests/nvidia/fetch.sh (cargo xtask test does)", env.display())
    });
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{key} missing from target/nvidia/paths.env"))
}

fn run_ok(mut cmd: std::process::Command) -> String {
    let out = cmd.output().expect("run");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[expect(clippy::too_many_lines, reason = "one scenario against the real daemon, read top to bottom")]
#[test]
#[ignore = "needs root and NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn a_gpu_pods_start_up_costs_at_most_40_series_and_a_cpu_pods_10() {
    assert_root();
    let daemon = Daemon::start(&["--no-kubernetes", "--hold"]);
    let uid = random_pod_uid();
    // Three containers, one start-up each, over the three APIs: a model
    // load through the driver API on a runtime whose calls succeed (the
    // stand-ins), the same init on the real HIP runtime (it fails here, as
    // on a node without a GPU), and NVIDIA's CUDA runtime over NVIDIA's
    // driver library (which finds no GPU either).
    let model = PodCgroup::new(&uid, &random_hex(64));
    let mut cmd = model.command(&fixture("cuda_app_standin"));
    cmd.arg("--startup");
    let printed = run_ok(cmd);
    assert!(printed.contains("cuInit=0 ") && printed.contains("startup_failed=1"), "{printed}");
    let init = PodCgroup::new(&uid, &random_hex(64));
    run_ok(init.command(&fixture("cuda_app")));
    let runtime = PodCgroup::new(&uid, &random_hex(64));
    let driver_dir = nvidia("LIBCUDA").parent().expect("dir").to_path_buf();
    let mut cmd = runtime.command(&fixture("cudart_probe"));
    cmd.arg(nvidia("CUDART13")).env("LD_LIBRARY_PATH", &driver_dir);
    run_ok(cmd);

    // Settled: every container's calls are in, successes per revision and
    // failures per pod.
    let workload = pod_cgroup(&model);
    let deadline = Instant::now() + WAIT;
    let metrics = loop {
        let m = daemon.metrics();
        // The pod's calls wherever they are kept, so that a scrape over
        // budget fails on the budget below, not here.
        let all = [pod_series(&m, &uid), revision_series(&m, &workload)].concat();
        let called = functions(&all, "canaryscope_gpu_api_calls_total");
        let failed = functions(&pod_series(&m, &uid), "canaryscope_gpu_api_call_failures_total");
        if called.len() >= 20 && failed.contains("cudaGetDeviceCount") && failed.contains("cuModuleLoadData")
        {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "the start-ups' calls never all showed: {called:?} {failed:?}\n{m}"
        );
        thread::sleep(Duration::from_millis(200));
    };
    let own = pod_series(&metrics, &uid);
    let shared = revision_series(&metrics, &workload);
    let called = functions(&shared, "canaryscope_gpu_api_calls_total");
    let apis: BTreeSet<&str> =
        shared.iter().filter_map(|l| l.split("api=\"").nth(1)?.split('"').next()).collect();
    eprintln!(
        "GPU pod: {} series of its own, {} of its revision ({} functions over {apis:?})",
        own.len(),
        shared.len(),
        called.len()
    );
    assert!(
        own.len() <= GPU_POD_BUDGET,
        "a GPU pod costs {} series, over {GPU_POD_BUDGET}: {own:#?}",
        own.len()
    );
    assert_eq!(apis.len(), 3, "start-ups over HIP, the CUDA driver and the CUDA runtime: {apis:?}");
    let per_pod_latency: Vec<&&str> = own.iter().filter(|l| l.contains("_bucket{")).collect();
    assert!(per_pod_latency.is_empty(), "latency histograms are per revision: {per_pod_latency:#?}");

    // A CPU-only pod, throttled in half a core.
    let cpu_uid = random_pod_uid();
    let mut cpu_pod = PodCgroup::new(&cpu_uid, &random_hex(64));
    cpu_pod.limit_cpu(0.5);
    let mut cmd = cpu_pod.command(&fixture("busy_threads"));
    cmd.args(["4", "1"]);
    run_ok(cmd);
    let cpu_workload = pod_cgroup(&cpu_pod);
    let deadline = Instant::now() + WAIT;
    let metrics = loop {
        let m = daemon.metrics();
        let throttled = pod_series(&m, &cpu_uid)
            .iter()
            .any(|l| l.starts_with("canaryscope_cpu_throttled_periods_total{") && metric_value(l) > 0.0);
        let waited = revision_series(&m, &cpu_workload).iter().any(|l| {
            l.starts_with("canaryscope_cpu_runqueue_latency_seconds_count{") && metric_value(l) > 0.0
        });
        if throttled && waited {
            break m;
        }
        assert!(Instant::now() < deadline, "the CPU pod's throttling never showed:\n{m}");
        thread::sleep(Duration::from_millis(200));
    };
    let own = pod_series(&metrics, &cpu_uid);
    eprintln!(
        "CPU pod: {} series of its own, {} of its revision",
        own.len(),
        revision_series(&metrics, &cpu_workload).len()
    );
    assert!(
        own.len() <= CPU_POD_BUDGET,
        "a CPU pod costs {} series, over {CPU_POD_BUDGET}: {own:#?}",
        own.len()
    );
}

/// The revision's successful cuDriverGetVersion calls on this scrape.
fn revision_calls(metrics: &str, hash: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("canaryscope_gpu_api_calls_total{")
                && l.contains(&format!("revision=\"{hash}\""))
                && l.contains("function=\"cuDriverGetVersion\"")
                && l.contains("result=\"CUDA_SUCCESS\"")
        })
        .map(metric_value)
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_revisions_counters_keep_the_calls_of_its_pods_that_are_gone() {
    assert_root();
    let dir = scratch_dir();
    let (api, api_port) = start_apiserver(&dir, None);
    let kubeconfig = write_kubeconfig(&dir, api_port);
    let daemon = node_daemon(&kubeconfig, "1s");
    // Two pods of one revision, scheduled while the daemon runs; the
    // kubelet names each container 0.8 s after its start.
    let specs = vec![
        scheduled_pod("infer-samehash-aaaaa", &random_pod_uid(), "stable", "samehash"),
        scheduled_pod("infer-samehash-bbbbb", &random_pod_uid(), "stable", "samehash"),
    ];
    let pods = NodePod::schedule_all(api_port, specs, Duration::from_millis(800));
    let second = pods[1].create("worker");
    {
        let first = pods[0].create("worker");
        for (pod, cg) in [(&pods[0], &first), (&pods[1], &second)] {
            let mut cmd = cg.command(&fixture("cuda_app"));
            cmd.args(["--version-loop", "100"]).env("ZLUDA_FIXTURE_HEALTHY", "1");
            let out = pod.output(cg, &mut cmd);
            assert!(out.status.success(), "{out:?}");
        }
        let line = daemon.wait_metric("both pods' calls in their revision's series", WAIT, |l| {
            revision_calls(l, "samehash").is_some_and(|v| v >= 200.0)
        });
        assert_eq!(metric_value(&line), 200.0, "{line}");
        // The first pod is deleted, and its cgroup goes with it.
        control(api_port, "DELETE", &format!("/control/pods/{NS}/infer-samehash-aaaaa"), "");
    }
    let gone = "pod=\"infer-samehash-aaaaa\"";
    let deadline = Instant::now() + Duration::from_secs(30);
    while daemon.pod_metrics().contains(gone) {
        assert!(Instant::now() < deadline, "the deleted pod's series are still exported");
        thread::sleep(Duration::from_millis(200));
    }
    // Its calls stay in the revision's counter: a drop would read as a
    // counter reset to rate() and increase().
    assert_eq!(revision_calls(&daemon.metrics(), "samehash"), Some(200.0), "{}", daemon.metrics());
    drop(second);
    drop(api);
    let _ = std::fs::remove_dir_all(&dir);
}
