//! The readiness gate `canaryscope.io/gpu-runtime` end to end: the daemon
//! as a DaemonSet would run it, pods with and without the gate on the stand-in
//! API server (which records every PATCH and applies it as kube-apiserver
//! would for its content type), and GPU workers in real pod cgroups running
//! the ZLUDA-shaped library: failing its init (no GPU here), or in its
//! healthy mode, where init, device count and allocation succeed.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use test_support::{
    assert_root, canaryscope, fixture, fixtures_dir,
    k8s::{
        control, scheduled_pod, scratch_dir, start_apiserver, start_apiserver_with, write_kubeconfig,
        NodePod, Proc, NS, REPORTED_BY_THE_TEST,
    },
    metric_value, random_pod_uid, Daemon, PodCgroup, Stepped,
};

const GATE: &str = "canaryscope.io/gpu-runtime";
const WAIT: Duration = Duration::from_secs(30);

/// A test pod of the canary (`track` canary) or stable revision; `gated`
/// pods declare the readiness gate.
fn test_pod(name: &str, gated: bool, canary: bool) -> Value {
    let (track, hash) = if canary { ("canary", "canaryhash") } else { ("stable", "stablehash") };
    let mut p = scheduled_pod(name, &random_pod_uid(), track, hash);
    if gated {
        p["spec"]["readinessGates"] = json!([{"conditionType": GATE}]);
    }
    p
}

/// One pod scheduled to the node while the daemon runs, and its `worker`
/// container's cgroup, made by the kubelet.
struct TestPod {
    name: String,
    pod: NodePod,
    cg: PodCgroup,
}

impl TestPod {
    /// A pod of the canary revision whose container the kubelet names
    /// `report_after` after its start.
    fn new(api_port: u16, name: &str, gated: bool, report_after: Duration) -> Self {
        Self::of_revision(api_port, name, gated, true, report_after)
    }

    fn of_revision(api_port: u16, name: &str, gated: bool, canary: bool, report_after: Duration) -> Self {
        let pod = NodePod::schedule(api_port, test_pod(name, gated, canary), report_after);
        let cg = pod.create("worker");
        Self { name: name.into(), pod, cg }
    }

    /// The ZLUDA-shaped worker; `healthy` makes its start-up succeed.
    fn worker(&self, healthy: bool) -> std::process::Command {
        let mut command = self.cg.command(&fixture("cuda_app"));
        command.arg("--alloc");
        if healthy {
            command.env("ZLUDA_FIXTURE_HEALTHY", "1");
        }
        command
    }

    /// Runs a worker whose cuInit fails, to its end, as a process of the
    /// container (the first one has the kubelet name it); its exit status.
    fn fail_init(&self) -> std::process::ExitStatus {
        let out = self.pod.output(&self.cg, &mut self.worker(false));
        assert!(String::from_utf8_lossy(&out.stdout).contains("cuInit=101 "), "no GPU here: {out:?}");
        out.status
    }
}

/// The daemon on node-a, talking to the stand-in API server, as the
/// DaemonSet runs it: without --hold. The worker here maps a GPU runtime
/// file the daemon has never seen and its `main` calls cuInit at once; its
/// start-up is seen only because a gated pod's processes are held until
/// that file's probes exist.
fn daemon(dir: &std::path::Path, api_port: u16, extra: &[&str]) -> Daemon {
    let kubeconfig = write_kubeconfig(dir, api_port);
    let mut args = vec!["--kubeconfig", kubeconfig.to_str().expect("utf8"), "--node-name", "node-a"];
    args.extend_from_slice(extra);
    Daemon::start(&args)
}

fn get_pod(api_port: u16, name: &str) -> Value {
    let body = control(api_port, "GET", &format!("/api/v1/namespaces/{NS}/pods/{name}"), "");
    serde_json::from_str(&body).expect("a Pod")
}

fn gate_condition(pod: &Value) -> Option<Value> {
    pod["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == GATE).cloned()
}

/// Every PATCH the server received for pod `name`.
fn patches_of(api_port: u16, name: &str) -> Vec<Value> {
    let body = control(api_port, "GET", "/control/patches", "");
    let all: Value = serde_json::from_str(&body).expect("patches");
    all["items"].as_array().into_iter().flatten().filter(|p| p["name"] == name).cloned().collect()
}

/// The start of the gate's message about the pod's `worker` container.
const NAMED: &str = "container worker: ";

/// Waits until pod `name`'s gate condition has this status and reason,
/// its message starting with `message`.
fn wait_condition(api_port: u16, name: &str, status: &str, reason: &str, message: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let pod = get_pod(api_port, name);
        if let Some(c) = gate_condition(&pod) {
            if c["status"] == status
                && c["reason"] == reason
                && c["message"].as_str().is_some_and(|m| m.starts_with(message))
            {
                return pod;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name}: no {GATE} condition {status}/{reason} {message:?} within {WAIT:?}; conditions: {}; patches: {:#?}",
            pod["status"]["conditions"],
            patches_of(api_port, name)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The kubelet's conditions are all still there.
fn assert_kubelet_conditions(pod: &Value) {
    let types: Vec<&str> = pod["status"]["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .filter_map(|c| c["type"].as_str())
        .collect();
    for kubelet in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert!(types.contains(&kubelet), "the kubelet's {kubelet} condition was lost: {types:?}");
    }
}

/// Waits until the daemon's judgement has reached the API server: one
/// scrape in which `pred` holds and no gate patch is pending. The gate judges
/// events in the same pass that counts them, so a scrape that shows the
/// events and nothing pending shows every patch they caused as sent.
fn wait_settled(daemon: &Daemon, what: &str, pred: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        let text = daemon.metrics();
        let pending = text
            .lines()
            .find(|l| l.starts_with("canaryscope_readiness_gate_pending_patches "))
            .map(metric_value);
        if pending == Some(0.0) && pred(&text) {
            return;
        }
        assert!(Instant::now() < deadline, "not settled ({what}) within {WAIT:?}; /metrics:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The count of cuInit failures of pod `name` in an exposition.
fn cuinit_failures(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| {
            l.starts_with("canaryscope_gpu_init_failures_total{")
                && l.contains(&format!("pod=\"{name}\""))
                && l.contains("function=\"cuInit\"")
        })
        .map(metric_value)
        .unwrap_or(0.0)
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_gated_canary_whose_cuinit_fails_gets_false_init_failed_and_keeps_the_kubelet_conditions() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    let daemon = daemon(&dir, api_port, &[]);
    let canary = TestPod::new(api_port, "infer-canaryhash-gate1", true, Duration::from_millis(300));
    let _plain = TestPod::new(api_port, "infer-canaryhash-plain1", false, Duration::from_millis(300));

    canary.fail_init();
    let pod = wait_condition(api_port, &canary.name, "False", "InitFailed", NAMED);
    let condition = gate_condition(&pod).expect("condition");
    assert_eq!(
        condition["message"], "container worker: cuInit returned 101 CUDA_ERROR_INVALID_DEVICE",
        "{condition}"
    );
    assert!(condition["lastTransitionTime"].is_string(), "{condition}");
    assert_kubelet_conditions(&pod);
    for patch in patches_of(api_port, &canary.name) {
        assert_eq!(patch["contentType"], "application/strategic-merge-patch+json", "{patch}");
        assert_eq!(patch["subresource"], "status", "{patch}");
    }

    // `check` asks the daemon: the gate is on, one pod of the node uses it.
    wait_settled(&daemon, "the gated pod counted as false", |text| {
        text.lines().any(|l| l == "canaryscope_readiness_gate_pods{condition=\"false\"} 1")
    });
    let out = std::process::Command::new(canaryscope())
        .args(["check", "--json", "--daemon", &format!("127.0.0.1:{}", daemon.port)])
        .output()
        .expect("canaryscope check");
    let report: Value = serde_json::from_slice(&out.stdout).expect("check --json");
    let gate = &report["readiness_gate"];
    assert_eq!(gate["condition_type"], GATE, "{gate}");
    assert_eq!(gate["enabled"], true, "{gate}");
    assert_eq!(gate["pods"], json!({"true": 0, "false": 1, "none": 0}), "{gate}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_gated_pod_whose_runtime_starts_up_gets_true_from_its_first_calls_despite_conflicts() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    // The first two patches meet a conflict; the daemon must retry.
    control(api_port, "POST", "/control/patch-failures", r#"{"code": 409, "count": 2}"#);
    // The worker's first GPU calls are its start-up: seen thanks to --hold.
    let _daemon = daemon(&dir, api_port, &[]);
    // A quiet kubelet names the container as soon as it starts: the
    // condition is written once, named.
    let worker = TestPod::new(api_port, "infer-canaryhash-gate2", true, Duration::ZERO);

    let out = worker.pod.output(&worker.cg, &mut worker.worker(true));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cuInit=0 ") && stdout.contains("cuMemAlloc=0"), "a healthy start-up: {out:?}");
    let pod = wait_condition(api_port, &worker.name, "True", "RuntimeReady", NAMED);
    let condition = gate_condition(&pod).expect("condition");
    assert!(
        condition["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("container worker: cuInit, cuDeviceGetCount")),
        "{condition}"
    );
    assert_kubelet_conditions(&pod);
    let codes: Vec<Value> = patches_of(api_port, &worker.name).iter().map(|p| p["code"].clone()).collect();
    assert_eq!(codes, [json!(409), json!(409), json!(200)], "conflicts are retried until the patch lands");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A gated canary whose worker fails `cuInit` before the kubelet has named
/// its container: the gate can only name it by its short ID, and writes so.
/// Once the pod's status names the container, the gate reads the pod cache
/// again and rewrites the condition with the name, its status and reason
/// (and so its transition time) unchanged. The kubelet's report is made to
/// come after that first patch, which is the order this test is about.
#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_condition_written_before_the_kubelet_named_the_container_is_rewritten_with_its_name() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    let daemon = daemon(&dir, api_port, &[]);
    // The kubelet's report waits for the test, below.
    let canary = TestPod::new(api_port, "infer-canaryhash-unnamed", true, REPORTED_BY_THE_TEST);
    let mut exited = canary.fail_init();

    let short = canary.cg.short_container_id();
    let unnamed = format!("container {short}: cuInit returned 101 CUDA_ERROR_INVALID_DEVICE");
    let pod = wait_condition(api_port, &canary.name, "False", "InitFailed", &unnamed);
    let first = gate_condition(&pod).expect("condition");
    assert_eq!(first["message"], unnamed.as_str(), "{first}");

    // The kubelet's relist names the container.
    canary.pod.report(&canary.cg);
    let pod = wait_condition(api_port, &canary.name, "False", "InitFailed", NAMED);
    let named = gate_condition(&pod).expect("condition");
    assert_eq!(
        named["message"], "container worker: cuInit returned 101 CUDA_ERROR_INVALID_DEVICE",
        "{named}"
    );
    assert_eq!(named["lastTransitionTime"], first["lastTransitionTime"], "the status did not change");
    assert_kubelet_conditions(&pod);

    // Two restarts, each failing before the kubelet names it: the first
    // container's ID leaves the status (which names only the current one
    // and the last), and the condition, which is about that first
    // failure, still names the container.
    let TestPod { name, pod, mut cg } = canary;
    for _ in 0..2 {
        cg = pod.restart(cg, exited);
        let out = pod.output(&cg, cg.command(&fixture("cuda_app")).arg("--alloc"));
        assert!(String::from_utf8_lossy(&out.stdout).contains("cuInit=101 "), "no GPU here: {out:?}");
        exited = out.status;
        pod.report(&cg);
    }
    // Every failure is the named container's once the daemon has the last
    // status; the gate judged in that same pass.
    let named_failures = |text: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with("canaryscope_gpu_init_failures_total{")
                    && l.contains(&format!("pod=\"{name}\""))
                    && l.contains("container=\"worker\"")
                    && l.contains("function=\"cuInit\"")
            })
            .map(metric_value)
            .sum::<f64>()
    };
    wait_settled(&daemon, "every failure named", |text| named_failures(text) == 3.0);
    let condition = gate_condition(&get_pod(api_port, &name)).expect("condition");
    assert_eq!(
        condition["message"], "container worker: cuInit returned 101 CUDA_ERROR_INVALID_DEVICE",
        "{condition}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `gpu_dlopen` in `pod` on a fresh copy of the ZLUDA-shaped library
/// (a file the daemon has never seen, found by no loader ahead of time) and
/// returns the daemon's announcement of that copy's probes.
fn dlopen_fresh_copy(daemon: &Daemon, dir: &std::path::Path, pod: &TestPod) -> String {
    use std::os::unix::process::CommandExt;
    fixture("cuda_first"); // builds the library below
    let copy = dir.join(&pod.name).join("libcuda.so.1");
    std::fs::create_dir_all(dir.join(&pod.name)).expect("mkdir");
    std::fs::copy(fixtures_dir().join("zluda-min/libcuda.so.1"), &copy).expect("copy");
    let mut command = pod.cg.command(&fixture("gpu_dlopen"));
    command.arg(&copy);
    // SAFETY: setsid is async-signal-safe. A process with a controlling
    // terminal is never held (job control would see the stop).
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let out = pod.pod.output(&pod.cg, &mut command);
    assert!(out.status.success(), "{out:?}");
    daemon.wait_stderr_line(&format!("probing {}", copy.display()), Duration::from_secs(30))
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn without_hold_a_canary_or_gated_pods_process_is_held_at_a_new_runtime_file_and_a_stable_ones_is_not() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    let daemon = daemon(&dir, api_port, &[]);
    let after = Duration::from_millis(1000);
    let stable_gated = TestPod::of_revision(api_port, "infer-stablehash-gated", true, false, after);
    let canary = TestPod::new(api_port, "infer-canaryhash-plain", false, after);
    let stable = TestPod::of_revision(api_port, "infer-stablehash-plain", false, false, after);
    let free = dlopen_fresh_copy(&daemon, &dir, &stable);
    assert!(!free.contains("held"), "a stable, ungated pod's process was held: {free}");
    for pod in [&stable_gated, &canary] {
        let held = dlopen_fresh_copy(&daemon, &dir, pod);
        assert!(held.contains("held until probed"), "{}'s process was not held: {held}", pod.name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn an_ungated_pod_on_the_node_is_never_patched() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    let daemon = daemon(&dir, api_port, &[]);
    let gated = TestPod::new(api_port, "infer-canaryhash-gate3", true, Duration::from_millis(100));
    let plain = TestPod::new(api_port, "infer-canaryhash-plain", false, Duration::from_millis(100));

    // Both fail, and the ungated one also starts up successfully. The gated
    // pod goes first: its process is held at the runtime file the daemon
    // has not seen, so the ungated pod's calls find that file probed.
    gated.fail_init();
    wait_condition(api_port, &gated.name, "False", "InitFailed", NAMED);
    plain.fail_init();
    let out = plain.worker(true).output().expect("worker");
    assert!(String::from_utf8_lossy(&out.stdout).contains("cuMemAlloc=0"), "{out:?}");
    // The gated pod's failure was judged after the plain pod's calls: once
    // nothing is pending, nothing about the plain pod is on its way either.
    wait_settled(&daemon, "both pods' failures counted", |text| {
        cuinit_failures(text, &plain.name) == 1.0 && cuinit_failures(text, &gated.name) == 1.0
    });
    assert_eq!(patches_of(api_port, &plain.name), Vec::<Value>::new(), "a pod without the gate was patched");
    assert!(gate_condition(&get_pod(api_port, &plain.name)).is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn repeated_failures_cause_no_repeated_patches() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    let daemon = daemon(&dir, api_port, &[]);
    let canary = TestPod::new(api_port, "infer-canaryhash-gate4", true, Duration::from_millis(1200));

    canary.fail_init();
    // Named: a condition written before the kubelet named the container
    // has been rewritten by now, and the name stays.
    wait_condition(api_port, &canary.name, "False", "InitFailed", NAMED);
    wait_settled(&daemon, "the first failure", |text| cuinit_failures(text, &canary.name) == 1.0);
    let first = patches_of(api_port, &canary.name).len();
    assert!(first >= 1);
    for _ in 0..3 {
        canary.fail_init();
    }
    wait_settled(&daemon, "four failures", |text| cuinit_failures(text, &canary.name) == 4.0);
    assert_eq!(
        patches_of(api_port, &canary.name).len(),
        first,
        "the same failure again is no change of the condition"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_change_while_the_api_server_is_down_is_patched_once_it_is_back() {
    assert_root();
    let dir = scratch_dir();
    let (api, api_port) = start_apiserver(&dir, None);
    let daemon = daemon(&dir, api_port, &[]);
    let canary = TestPod::new(api_port, "infer-canaryhash-gate5", true, Duration::ZERO);
    // What the API server holds when it goes away: the pod, its container
    // not started yet.
    let pods: Value =
        serde_json::from_str(&control(api_port, "GET", "/control/pods", "")).expect("a PodList");

    drop(api);
    // The container starts and fails; the kubelet's report of it is lost.
    canary.fail_init();
    daemon.wait_metric("a patch that failed while the API server is down", WAIT, |l| {
        l.starts_with("canaryscope_readiness_gate_patches_total{result=\"error\"}") && metric_value(l) >= 1.0
    });
    let (_api, _) = start_apiserver_with(&dir, Some(api_port), Some(&pods));
    // The kubelet's status update, retried once the API server answers.
    canary.pod.report(&canary.cg);
    let pod = wait_condition(api_port, &canary.name, "False", "InitFailed", "");
    assert_kubelet_conditions(&pod);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_stalled_call_flips_the_condition_to_false() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    let _daemon = daemon(&dir, api_port, &["--stall-threshold", "1s"]);
    let worker = TestPod::new(api_port, "infer-canaryhash-gate6", true, Duration::from_millis(200));

    // Starts up, then hangs in cuStreamSynchronize.
    let mut command = worker.worker(true);
    command.args(["--sync", "--pause-before", "sync"]).env("ZLUDA_FIXTURE_SYNC_SLEEP_MS", "60000");
    let mut process = Stepped::spawn(command);
    worker.pod.started(&worker.cg);
    process.wait_line("paused=sync");
    wait_condition(api_port, &worker.name, "True", "RuntimeReady", NAMED);
    process.go();
    let pod = wait_condition(api_port, &worker.name, "False", "CallStalled", NAMED);
    let condition = gate_condition(&pod).expect("condition");
    assert_eq!(
        condition["message"],
        "container worker: cuStreamSynchronize has not returned within the stall threshold (1s)",
        "{condition}"
    );
    drop(process);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn gate_timeout_marks_a_silent_pod_and_a_restart_leaves_a_true_condition_alone() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    // Ready from before this daemon started, its container running and
    // named: nothing the daemon sees says otherwise.
    let mut earlier_json = test_pod("infer-canaryhash-earlier", true, true);
    earlier_json["status"]["conditions"] = json!([
        {"type": "PodScheduled", "status": "True"},
        {"type": "Ready", "status": "True"},
        {"type": GATE, "status": "True", "reason": "RuntimeReady", "message": "from the daemon before",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ]);
    let earlier = NodePod::schedule(api_port, earlier_json, Duration::ZERO);
    let earlier_cg = earlier.create("worker");
    let _earlier_process =
        Proc(earlier.spawn(&earlier_cg, earlier_cg.command(std::path::Path::new("/bin/sleep")).arg("60")));
    let daemon = daemon(&dir, api_port, &["--gate-timeout", "2s"]);
    // Scheduled once the daemon runs; its container never starts.
    let silent = TestPod::new(api_port, "infer-canaryhash-silent", true, Duration::ZERO);

    let pod = wait_condition(api_port, &silent.name, "False", "NoRuntimeActivity", "");
    let condition = gate_condition(&pod).expect("condition");
    assert_eq!(condition["message"], "no GPU runtime call seen within 2s", "{condition}");
    assert_kubelet_conditions(&pod);
    // Both pods are judged in the same pass: once nothing is pending, the
    // earlier pod's condition has been left as it was.
    wait_settled(&daemon, "the silent pod marked", |text| {
        text.lines().any(|l| l == "canaryscope_readiness_gate_pods{condition=\"true\"} 1")
    });
    assert_eq!(patches_of(api_port, &earlier.name), Vec::<Value>::new(), "a True condition was touched");
    let _ = std::fs::remove_dir_all(&dir);
}

/// From the API server sending a canary pod to its container's first
/// process: the kubelet's own pace on a quiet node and on a busy one.
const ROLLOUT_DELAYS_MS: [u64; 6] = [0, 50, 100, 300, 600, 1000];
/// Canary pods scheduled at once, per delay and way of loading.
const CANARIES_AT_ONCE: usize = 10;

/// How a canary's worker comes to its runtime.
#[derive(Clone, Copy, Debug)]
enum Loading {
    /// `DT_NEEDED`, found through `LD_LIBRARY_PATH`; `main` calls `cuInit` first.
    Linked,
    /// `dlopen` by path, `cuInit` at once.
    Dlopened,
}

/// One canary of a rollout: its pod as the scheduler hands it to the node
/// (Pending, its container waiting), a runtime copy no daemon has seen,
/// and, once `delay` has passed, its container's cgroup and first process.
struct Canary {
    name: String,
    lib: std::path::PathBuf,
}

impl Canary {
    fn new(dir: &std::path::Path, tag: &str) -> Self {
        let name = format!("infer-canaryhash-{tag}");
        let lib = dir.join(&name).join("libcuda.so.1");
        std::fs::create_dir_all(dir.join(&name)).expect("mkdir");
        std::fs::copy(fixtures_dir().join("zluda-min/libcuda.so.1"), &lib).expect("copy");
        Self { name, lib }
    }

    fn scheduled(&self) -> Value {
        scheduled_pod(&self.name, &random_pod_uid(), "canary", "canaryhash")
    }

    /// The kubelet's part: the pod's cgroup, the container's, and its first
    /// process, started without a controlling terminal as a container's is;
    /// the kubelet names the container in its own time.
    fn start(&self, pod: &NodePod, loading: Loading) -> (PodCgroup, std::process::Child) {
        use std::os::unix::process::CommandExt;
        let cg = pod.create("worker");
        let mut command = match loading {
            Loading::Linked => {
                let mut c = cg.command(&fixture("cuda_first"));
                c.env("LD_LIBRARY_PATH", self.lib.parent().expect("dir"));
                c
            }
            Loading::Dlopened => {
                let mut c = cg.command(&fixture("gpu_dlopen"));
                c.arg(&self.lib);
                c
            }
        };
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        let child = pod.spawn(&cg, command.stdout(std::process::Stdio::null()));
        (cg, child)
    }
}

/// Whether the exposition counts a `cuInit` of pod `name`.
fn cuinit_seen(text: &str, name: &str) -> bool {
    text.lines().any(|l| {
        l.starts_with("canaryscope_gpu_api_calls_total{")
            && l.contains(&format!("pod=\"{name}\""))
            && l.contains("function=\"cuInit\"")
            && metric_value(l) >= 1.0
    })
}

/// A rollout as it unfolds on a node: the daemon runs (as the DaemonSet
/// runs it, no `--hold`), canary pods are scheduled to the node, and each
/// delay later the kubelet makes their cgroups and starts their workers,
/// which call `cuInit` of a runtime file no daemon has seen. Every first
/// call is counted, at every delay, linked or `dlopen`ed, and every
/// `dlopen`ing worker was held at its mapping until its copy was probed.
#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn canaries_scheduled_while_the_daemon_runs_are_seen_from_their_first_call_at_every_delay() {
    assert_root();
    let dir = scratch_dir();
    fixture("cuda_first"); // builds the ZLUDA-shaped library too
    fixture("gpu_dlopen");
    let (_api, api_port) = start_apiserver(&dir, None);
    // First calls are the cold tier's. Hot-call probes are per process (and
    // every pod here fails its init, which selects it): those of 120 workers
    // would only make the daemon's exit minutes long.
    let daemon = daemon(&dir, api_port, &["--hot-calls", "none"]);
    let mut missed = Vec::new();
    let mut runs = 0;
    for loading in [Loading::Linked, Loading::Dlopened] {
        for delay in ROLLOUT_DELAYS_MS {
            let canaries: Vec<Canary> = (0..CANARIES_AT_ONCE)
                .map(|i| Canary::new(&dir, &format!("{loading:?}-{delay}-{i}").to_lowercase()))
                .collect();
            let scheduled: Vec<Value> = canaries.iter().map(Canary::scheduled).collect();
            // Each container is named 0.3 s after its start.
            let pods = NodePod::schedule_all(api_port, scheduled, Duration::from_millis(300));
            // The kubelet's pace, not a wait for the daemon.
            std::thread::sleep(Duration::from_millis(delay));
            let mut started: Vec<_> =
                canaries.iter().zip(&pods).map(|(c, pod)| c.start(pod, loading)).collect();
            for (_, child) in &mut started {
                let status = child.wait().expect("worker");
                assert!(status.success(), "worker: {status}");
            }
            // Counted series appear at the daemon's next refresh; a call
            // never seen never appears, so allow a generous bound.
            let deadline = Instant::now() + WAIT;
            let mut unseen: Vec<&Canary> = canaries.iter().collect();
            while !unseen.is_empty() && Instant::now() < deadline {
                let text = daemon.pod_metrics();
                unseen.retain(|c| !cuinit_seen(&text, &c.name));
                if !unseen.is_empty() {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            runs += canaries.len();
            missed.extend(unseen.iter().map(|c| format!("{loading:?} at {delay} ms: {}", c.name)));
            // Seen is not enough: this one-function library attaches faster
            // than the real HIP runtime under it loads, so a first call can
            // win the race by luck. Each copy's probes must have existed
            // before its first call by design: found by the loader's look
            // at exec, or the process held at the mapping until probed.
            for c in &canaries {
                let announced = daemon.wait_stderr_line(&format!("probing {}", c.lib.display()), WAIT);
                let by_design = match loading {
                    Loading::Linked => {
                        announced.contains("LD_LIBRARY_PATH of") || announced.contains("held until probed")
                    }
                    Loading::Dlopened => announced.contains("held until probed"),
                };
                if !by_design {
                    missed.push(format!("{loading:?} at {delay} ms: {} was not held: {announced}", c.name));
                }
            }
            eprintln!(
                "{loading:?}, {delay} ms: {} of {} first calls seen",
                canaries.len() - unseen.len(),
                canaries.len()
            );
            drop(started); // the cgroups go with the pods
            for pod in &pods {
                pod.remove();
            }
        }
    }
    assert!(missed.is_empty(), "{} findings in {runs} runs: {missed:#?}", missed.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process's scheduler state (`T` when stopped), `None` once it is gone.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().next()?.chars().next()
}

/// The value of the first series of `metric` for pod `name` and `function`.
fn pod_function_value(text: &str, metric: &str, name: &str, function: &str) -> Option<f64> {
    text.lines()
        .find(|l| {
            l.starts_with(&format!("{metric}{{"))
                && l.contains(&format!("pod=\"{name}\""))
                && l.contains(&format!("function=\"{function}\""))
        })
        .map(metric_value)
}

/// A rolling update of the DaemonSet during a canary: the daemon is stopped
/// with SIGTERM and a new one started while a gated canary and a gated
/// stable pod run, both started up under the old one. Nothing the pods'
/// owners see changes because of it: no condition moves, the gate's
/// timeout marks neither, a process the old daemon held at its stop runs
/// on, and the new daemon's counters start from zero, one series per label
/// set, which is a counter reset to Prometheus' `rate()`.
#[expect(clippy::too_many_lines, reason = "one scenario against the real daemon, read top to bottom")]
#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_daemon_restart_under_running_gated_pods_moves_no_condition_and_leaves_nothing_held() {
    use std::os::unix::process::CommandExt;
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    let gate_timeout = Duration::from_secs(3);
    let timeout_flag = ["--gate-timeout", "3s"];
    let old = daemon(&dir, api_port, &timeout_flag);
    let after = Duration::from_millis(700);
    let canary = TestPod::new(api_port, "infer-canaryhash-restart", true, after);
    let stable = TestPod::of_revision(api_port, "infer-stablehash-restart", true, false, after);
    // Both start up under the old daemon and keep running across the restart.
    let mut running = Vec::new();
    for pod in [&canary, &stable] {
        let mut worker = pod.worker(true);
        worker.args(["--linger", "120000"]).stdout(std::process::Stdio::null());
        running.push(Proc(pod.pod.spawn(&pod.cg, &mut worker)));
    }
    let mut before = Vec::new();
    for pod in [&canary, &stable] {
        let judged = wait_condition(api_port, &pod.name, "True", "RuntimeReady", NAMED);
        before.push((gate_condition(&judged).expect("condition"), patches_of(api_port, &pod.name).len()));
    }
    wait_settled(&old, "both pods true", |text| {
        text.lines().any(|l| l == "canaryscope_readiness_gate_pods{condition=\"true\"} 2")
    });
    let old_cuinit =
        pod_function_value(&old.pod_metrics(), "canaryscope_gpu_api_calls_total", &canary.name, "cuInit")
            .expect("the canary's start-up counted by the old daemon");

    // A process of the canary held by the old daemon as it stops: with the
    // daemon frozen, its mapping of a fresh runtime copy stays held.
    fixture("cuda_first");
    let copy = dir.join("restart-copy/libcuda.so.1");
    std::fs::create_dir_all(dir.join("restart-copy")).expect("mkdir");
    std::fs::copy(fixtures_dir().join("zluda-min/libcuda.so.1"), &copy).expect("copy");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(old.pid() as i32, libc::SIGSTOP) };
    let mut late = canary.cg.command(&fixture("gpu_dlopen"));
    late.arg(&copy).stdout(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe (no controlling terminal: holdable).
    unsafe {
        late.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut late = late.spawn().expect("gpu_dlopen");
    let deadline = Instant::now() + Duration::from_secs(2);
    while process_state(late.id()) != Some('T') {
        assert!(Instant::now() < deadline, "the late process was never held");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: as above; the stop is taken once the daemon runs again.
    unsafe { libc::kill(old.pid() as i32, libc::SIGTERM) };
    unsafe { libc::kill(old.pid() as i32, libc::SIGCONT) };
    assert!(old.stop().success(), "the old daemon stops cleanly");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = late.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "a process the old daemon held is still {:?}",
            process_state(late.id())
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "the held process ran on: {status}");

    let new = daemon(&dir, api_port, &timeout_flag);
    // Past the gate's timeout as counted from the new daemon's start: a pod
    // that started up before it is not a silent one.
    std::thread::sleep(gate_timeout + Duration::from_secs(2));
    wait_settled(&new, "both pods still true", |text| {
        text.lines().any(|l| l == "canaryscope_readiness_gate_pods{condition=\"true\"} 2")
    });
    for (pod, (condition, patches)) in [&canary, &stable].into_iter().zip(&before) {
        let now = get_pod(api_port, &pod.name);
        assert_eq!(gate_condition(&now).as_ref(), Some(condition), "{}'s condition moved", pod.name);
        assert_eq!(patches_of(api_port, &pod.name).len(), *patches, "{} was patched again", pod.name);
    }
    let text = new.pod_metrics();
    let new_cuinit = pod_function_value(&text, "canaryscope_gpu_api_calls_total", &canary.name, "cuInit");
    assert!(
        new_cuinit.unwrap_or(0.0) < old_cuinit,
        "the new daemon's count starts from zero: {new_cuinit:?} after {old_cuinit}"
    );
    let scrape = new.metrics();
    let series: Vec<&str> = scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s))
        .collect();
    let mut unique = series.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), series.len(), "a series twice in one scrape");
    drop(running);
    let _ = std::fs::remove_dir_all(&dir);
}
