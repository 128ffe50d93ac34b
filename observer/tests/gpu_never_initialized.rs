//! Containers that requested a GPU and never initialised one, end to end:
//! pods scheduled on the stand-in API server while the daemon runs, their
//! specs asking for `nvidia.com/gpu: 1` or for no GPU, their processes in
//! real pod cgroups. A process that never touches a GPU (a framework that
//! fell back to the CPU) is reported once the timeout has passed, in a GPU
//! pod only; a GPU pod whose process initialises the GPU through the HIP
//! stand-in below a ZLUDA-shaped libcuda (every call succeeds) is not, its
//! one init call seen because a GPU pod's process is held at a runtime file
//! the daemon has never seen.
use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use test_support::{
    assert_root, canaryscope, fixture, in_vm,
    k8s::{scheduled_pod, scratch_dir, start_apiserver, write_kubeconfig, NodePod, Proc, NS},
    metric_value, random_pod_uid, Daemon, PodCgroup,
};

const GATE: &str = "canaryscope.io/gpu-runtime";
/// `--gpu-init-timeout`: long enough that the verdict before it is seen.
const TIMEOUT: Duration = Duration::from_secs(3);
const FAMILY: &str = "canaryscope_gpu_never_initialized";

fn wait() -> Duration {
    Duration::from_secs(if in_vm() { 60 } else { 20 })
}

/// A pod of node-a whose `worker` container's limits ask for `gpus`
/// `nvidia.com/gpu` (none: no GPU), declaring the readiness gate if `gated`.
fn test_pod(name: &str, gpus: Option<&str>, gated: bool) -> Value {
    let mut pod = scheduled_pod(name, &random_pod_uid(), "stable", "stablehash");
    let limits = match gpus {
        Some(n) => json!({"cpu": "1", "nvidia.com/gpu": n}),
        None => json!({"cpu": "1"}),
    };
    pod["spec"]["containers"][0]["resources"] = json!({"limits": limits});
    if gated {
        pod["spec"]["readinessGates"] = json!([{"conditionType": GATE}]);
    }
    pod
}

/// The daemon on node-a as the DaemonSet runs it, with a short timeout.
fn daemon(dir: &std::path::Path, api_port: u16, extra: &[&str]) -> Daemon {
    let kubeconfig = write_kubeconfig(dir, api_port);
    let timeout = format!("{}s", TIMEOUT.as_secs());
    let mut args = vec![
        "--kubeconfig",
        kubeconfig.to_str().expect("utf8"),
        "--node-name",
        "node-a",
        "--gpu-init-timeout",
    ];
    args.push(&timeout);
    args.extend_from_slice(extra);
    Daemon::start(&args)
}

/// A pod scheduled while the daemon runs, its container made and its
/// first process started as the kubelet does: named in the status at once.
struct RunningPod {
    pod: NodePod,
    // Dropped in this order: the process ends, then its cgroup goes.
    _process: Proc,
    _cgroup: PodCgroup,
}

impl RunningPod {
    fn start(api_port: u16, spec: Value, program: &str, args: &[&str]) -> Self {
        use std::os::unix::process::CommandExt;
        let pod = NodePod::schedule(api_port, spec, Duration::ZERO);
        let cg = pod.create("worker");
        let mut command = cg.command(std::path::Path::new(program));
        command.args(args).stdout(Stdio::null());
        // SAFETY: setsid is async-signal-safe. A container's process has no
        // controlling terminal (one that has is never held).
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let process = Proc(pod.spawn(&cg, &mut command));
        Self { pod, _process: process, _cgroup: cg }
    }

    /// A process that runs and never touches a GPU.
    fn idle(api_port: u16, spec: Value) -> Self {
        Self::start(api_port, spec, "/bin/sleep", &["60"])
    }

    fn pod_label(&self) -> String {
        format!("pod=\"{}\"", self.pod.name)
    }
}

/// The pod's gauge in an exposition, if it has one.
fn verdict(text: &str, pod: &RunningPod) -> Option<f64> {
    let label = pod.pod_label();
    text.lines().find(|l| l.starts_with(&format!("{FAMILY}{{")) && l.contains(&label)).map(metric_value)
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_gpu_pod_that_never_initialises_is_seen_after_the_timeout_and_a_cpu_or_initialised_pod_is_not() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    // As the DaemonSet runs it, without --hold: a pod that asked for a GPU
    // has its processes held at a runtime file the daemon has never seen,
    // so the working pod's one cuInit, at once, is seen.
    let daemon = daemon(&dir, api_port, &[]);
    // A fresh copy of the stand-in runtime, loaded by path: no daemon has
    // seen it, and it calls cuInit the moment dlopen returns.
    let runtime = dir.join("runtime");
    for (from, to) in
        [("zluda-standin/libcuda.so.1", "zluda-standin"), ("hip-standin/libamdhip64.so.5", "hip-standin")]
    {
        let file = fixture(from);
        std::fs::create_dir_all(runtime.join(to)).expect("mkdir");
        std::fs::copy(&file, runtime.join(to).join(file.file_name().expect("a file"))).expect("copy");
    }
    let libcuda = runtime.join("zluda-standin/libcuda.so.1");
    let working = RunningPod::start(
        api_port,
        test_pod("infer-gpu-working", Some("1"), false),
        fixture("gpu_dlopen").to_str().expect("utf8"),
        &["--linger", "60000", libcuda.to_str().expect("utf8")],
    );
    daemon.wait_pod_metric("the working pod's successful cuInit", wait(), |l| {
        l.starts_with("canaryscope_gpu_api_calls_total{")
            && l.contains(&working.pod_label())
            && l.contains("function=\"cuInit\"")
            && l.contains("result=\"CUDA_SUCCESS\"")
    });
    // The same idle process in a pod that asked for a GPU and one that did not.
    let started = Instant::now();
    let idle = RunningPod::idle(api_port, test_pod("infer-gpu-idle", Some("1"), false));
    let cpu = RunningPod::idle(api_port, test_pod("infer-cpu", None, false));

    let first = daemon.wait_metric("the idle GPU pod's verdict", wait(), |l| {
        l.starts_with(&format!("{FAMILY}{{")) && l.contains(&idle.pod_label())
    });
    assert_eq!(
        metric_value(&first),
        0.0,
        "within the timeout ({:?} after its start): {first}",
        started.elapsed()
    );
    let flagged = daemon.wait_metric("the idle GPU pod never initialised", wait(), |l| {
        l.starts_with(&format!("{FAMILY}{{")) && l.contains(&idle.pod_label()) && metric_value(l) == 1.0
    });
    // startedAt has whole seconds: the verdict comes at most a second early.
    let after = started.elapsed();
    assert!(after >= TIMEOUT - Duration::from_secs(1), "flagged {after:?} after its start: {flagged}");
    assert!(
        flagged.contains("container=\"worker\"") && flagged.contains("namespace=\"inference\""),
        "{flagged}"
    );
    let text = daemon.metrics();
    assert_eq!(
        verdict(&text, &working),
        Some(0.0),
        "it initialised, and started before the idle one: {text}"
    );
    assert_eq!(verdict(&text, &cpu), None, "a pod that asked for no GPU is never judged: {text}");

    // top reads the same verdicts from the daemon's per-pod view.
    let url = format!("http://127.0.0.1:{}/metrics", daemon.port);
    let out = Command::new(canaryscope())
        .args(["top", "--from", &url, "--once", "--json", "--filter", "inference"])
        .output()
        .expect("top runs");
    assert!(out.status.success(), "{out:?}");
    let snapshot: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let row = |name: &str| {
        let rows = snapshot["rows"].as_array().expect("rows");
        rows.iter().find(|r| r["name"] == format!("{NS}/{name}")).cloned().unwrap_or(Value::Null)
    };
    assert_eq!(row(&idle.pod.name)["gpu_never_initialized"], 1, "{snapshot}");
    assert_eq!(row(&working.pod.name)["gpu_never_initialized"], 0, "{snapshot}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_gated_gpu_pod_that_never_initialises_gets_gpu_never_initialized_without_a_gate_timeout() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    let daemon = daemon(&dir, api_port, &[]);
    let gpu = RunningPod::idle(api_port, test_pod("infer-gpu-gated", Some("1"), true));
    let cpu = RunningPod::idle(api_port, test_pod("infer-cpu-gated", None, true));
    let want = format!(
        "container worker: requested nvidia.com/gpu: 1 and made no successful GPU initialisation (cuInit, \
         hipInit, cudaGetDeviceCount or another init call) within {}s of its start",
        TIMEOUT.as_secs()
    );
    let deadline = Instant::now() + wait();
    loop {
        let condition = gate_condition(&gpu.pod.get());
        if condition.as_ref().is_some_and(|c| c["status"] == "False" && c["reason"] == "GpuNeverInitialized")
        {
            let c = condition.expect("condition");
            assert_eq!(c["message"], want.as_str(), "{c}");
            break;
        }
        assert!(Instant::now() < deadline, "no False/GpuNeverInitialized within {:?}: {condition:?}", wait());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Both pods are judged in the same pass: once no patch is pending,
    // the CPU pod's has been left alone.
    daemon.wait_metric("no patch pending", wait(), |l| l == "canaryscope_readiness_gate_pending_patches 0");
    assert_eq!(gate_condition(&cpu.pod.get()), None, "a pod that asked for no GPU gets no verdict");
    let _ = std::fs::remove_dir_all(&dir);
}

fn gate_condition(pod: &Value) -> Option<Value> {
    pod["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == GATE).cloned()
}
