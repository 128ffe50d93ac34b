//! Pods as users run them, each made in the order a node meets it: the
//! daemon runs (as the DaemonSet runs it, without `--hold`), the pod reaches
//! the stand-in API server, and only then does the kubelet make its cgroups
//! and start its processes. Nothing waits for the daemon to have seen the
//! pod. A sidecar beside a GPU container, the CRI-O and cgroupfs cgroup
//! layouts, a `tty: true` container, and a container restarted in a new
//! cgroup through the readiness gate.
//!
//! The workers `dlopen` a runtime file no daemon has seen (a fresh copy)
//! and call `cuInit` at once: in a canary pod such a process is held at
//! the mapping until the copy is probed, which the daemon's announcement
//! says (`held until probed`), so its first call is counted by design, not
//! by luck. Without a GPU here, `cuInit` fails.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use test_support::{
    assert_root, field, fixture, fixtures_dir,
    k8s::{
        control, scheduled_pod, scratch_dir, start_apiserver, with_containers, write_kubeconfig, NodePod,
        Proc, NS,
    },
    metric_value, random_pod_uid, self_killing_marker, Daemon, Layout, PodCgroup, Stepped,
};

const WAIT: Duration = Duration::from_secs(20);
const GATE: &str = "canaryscope.io/gpu-runtime";

/// A node: the stand-in API server with no pods yet, and the daemon on
/// node-a watching it, started in that order.
struct Node {
    dir: PathBuf,
    api_port: u16,
    daemon: Daemon,
    _api: Proc,
}

impl Node {
    fn start() -> Self {
        let dir = scratch_dir();
        let (api, api_port) = start_apiserver(&dir, None);
        let kubeconfig = write_kubeconfig(&dir, api_port);
        let daemon =
            Daemon::start(&["--kubeconfig", kubeconfig.to_str().expect("utf8"), "--node-name", "node-a"]);
        Self { dir, api_port, daemon, _api: api }
    }

    /// A copy of the minimal ZLUDA-shaped library (`cuInit` over the real
    /// HIP runtime) that no daemon has seen: a new inode.
    fn fresh_runtime(&self, tag: &str) -> PathBuf {
        fixture("cuda_first"); // builds the library
        fixture("gpu_dlopen");
        let dir = self.dir.join(tag);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let copy = dir.join("libcuda.so.1");
        std::fs::copy(fixtures_dir().join("zluda-min/libcuda.so.1"), &copy).expect("copy the library");
        copy
    }

    /// The daemon's announcement of `lib`'s probes; they exist once it is out.
    fn announcement(&self, lib: &Path) -> String {
        self.daemon.wait_stderr_line(&format!("probing {}", lib.display()), WAIT)
    }

    /// The /metrics/pods line of `function`'s init failures in `container`
    /// of pod `pod`, once the daemon knows the container by name (the
    /// kubelet names it some time after its start); then every label comes
    /// from the pod the API server gave.
    fn init_failures(&self, pod: &str, container: &str, function: &str) -> String {
        self.daemon.wait_pod_metric(&format!("{function} failing in {pod}/{container}"), WAIT, |l| {
            l.starts_with("canaryscope_gpu_init_failures_total{")
                && l.contains(&format!("pod=\"{pod}\""))
                && l.contains(&format!("container=\"{container}\""))
                && l.contains(&format!("function=\"{function}\""))
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A canary pod of node-a (track canary, revision `canaryhash`) with these
/// containers, waiting to be created.
fn canary_pod(name: &str, containers: &[&str]) -> Value {
    with_containers(scheduled_pod(name, &random_pod_uid(), "canary", "canaryhash"), containers)
}

/// The value of label `name` in an exposition line.
fn label<'a>(line: &'a str, name: &str) -> &'a str {
    let start = format!("{name}=\"");
    line.split_once(&start)
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(value, _)| value)
        .unwrap_or_else(|| panic!("no {name} label in {line}"))
}

/// A command in a new session: no controlling terminal, as a container's
/// first process has unless its spec says `tty: true`.
fn detached(mut command: Command) -> Command {
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    command
}

/// `gpu_dlopen LIB` in `cg` without a terminal, a process of the
/// container in `pod`: it maps the runtime file and calls `cuInit` at once.
/// Returns its exit status.
fn dlopen_at_once(pod: &NodePod, cg: &PodCgroup, lib: &Path) -> std::process::ExitStatus {
    let mut command = cg.command(&fixture("gpu_dlopen"));
    command.arg(lib);
    let out = pod.output(cg, &mut detached(command));
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("init=101"), "cuInit fails without a GPU: {stdout}");
    out.status
}

/// Runs `command` to its end as its parent, told of every stop and
/// continue as a shell's job control is (`waitpid` with `WUNTRACED |
/// WCONTINUED`): its wait status and how many times it was stopped.
/// `started` runs once it is spawned.
#[expect(clippy::zombie_processes, reason = "reaped by the waitpid here, which std cannot see")]
fn run_counting_stops(mut command: Command, started: impl FnOnce()) -> (i32, usize) {
    let child = command.stdout(Stdio::null()).spawn().expect("spawn");
    started();
    let pid = child.id() as libc::pid_t;
    let mut stops = 0;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on our own child, which nothing else waits for.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WUNTRACED | libc::WCONTINUED) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "waitpid {pid}: {e}");
            continue;
        }
        if libc::WIFSTOPPED(status) {
            stops += 1;
        } else if !libc::WIFCONTINUED(status) {
            return (status, stops);
        }
    }
}

/// A canary pod with two containers: `worker`, whose process calls the GPU
/// runtime and fails its init, and `sidecar` (a log shipper, a proxy),
/// which never touches the GPU. The worker's failure is its container's;
/// the sidecar gets no GPU series, and its process, though it maps
/// libraries in a pod whose processes the daemon holds, is never stopped:
/// only the mapping of a GPU runtime file holds a process.
#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_sidecar_beside_a_gpu_container_gets_no_gpu_series_and_is_never_held() {
    assert_root();
    let node = Node::start();
    let name = "infer-canaryhash-sidecar";
    // The sidecar comes first in the spec, as injected sidecars often do.
    // The kubelet names each container 0.4 s after its start.
    let pod = NodePod::schedule(
        node.api_port,
        canary_pod(name, &["sidecar", "worker"]),
        Duration::from_millis(400),
    );
    let runtime = node.fresh_runtime("sidecar-pod");
    // Dropped in reverse: the worker's cgroup made the pod's.
    let worker = pod.create("worker");
    let sidecar = pod.create("sidecar");

    // The sidecar starts as the worker does: a dynamically linked program
    // loading its libraries, then running to its end.
    let mut shipper = sidecar.command(Path::new("/usr/bin/python3"));
    shipper.args(["-c", "import json, ssl, zlib, sqlite3; print(json.dumps({'shipped': 1}))"]);
    let (status, stops) = run_counting_stops(detached(shipper), || pod.started(&sidecar));
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the sidecar's wait status {status:#x}"
    );
    assert_eq!(stops, 0, "the sidecar was stopped {stops} times");

    dlopen_at_once(&pod, &worker, &runtime);
    let announced = node.announcement(&runtime);
    assert!(announced.contains("held until probed"), "the canary's worker was not held: {announced}");

    // Every record of the sidecar's cgroup is read before its marker's exit.
    let marker = self_killing_marker(&sidecar);
    node.daemon.wait_pod_metric("the sidecar's marker exit", WAIT, |l| {
        l.starts_with("canaryscope_abnormal_exits_total{")
            && l.contains(&format!("pod=\"{name}\""))
            && l.contains("container=\"sidecar\"")
    });
    let line = node.init_failures(name, "worker", "cuInit");
    assert_eq!(label(&line, "container"), "worker", "{line}");
    assert_eq!(metric_value(&line), 1.0, "{line}");
    let text = node.daemon.pod_metrics();
    let of_sidecar: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("canaryscope_gpu_") && l.contains("container=\"sidecar\""))
        .collect();
    assert!(of_sidecar.is_empty(), "GPU series of the sidecar (marker pid {marker}): {of_sidecar:#?}");
    let of_worker =
        text.lines().filter(|l| l.starts_with("canaryscope_gpu_") && l.contains("container=\"worker\""));
    assert!(of_worker.count() > 1, "the worker's calls are its own: {text}");
    drop(sidecar);
    drop(worker);
}

/// One pod of the layouts test: its name and layout, and the pod once
/// scheduled.
struct LayoutPod {
    name: String,
    layout: Layout,
    pod: Option<NodePod>,
}

impl LayoutPod {
    fn new(track: &str, tag: &str, layout: Layout) -> Self {
        let name = format!("infer-{track}hash-{tag}");
        Self { name, layout, pod: None }
    }

    /// Its Pod: a `sidecar` container listed first, then `worker`.
    fn spec(&self, track: &str) -> Value {
        with_containers(
            scheduled_pod(&self.name, &random_pod_uid(), track, &format!("{track}hash")),
            &["sidecar", "worker"],
        )
    }

    fn pod(&self) -> &NodePod {
        self.pod.as_ref().expect("scheduled")
    }

    /// Its worker's cgroup, as the layout names it.
    fn cgroup(&self) -> PodCgroup {
        self.pod().create("worker")
    }

    /// Asserts that its worker's one failing cuInit is counted as its own.
    fn assert_failure_counted(&self, node: &Node, track: &str, cg: &PodCgroup) {
        let line = node.init_failures(&self.name, "worker", "cuInit");
        assert_eq!(label(&line, "container"), "worker", "{:?} ({}): {line}", self.layout, cg.rel);
        assert_eq!(label(&line, "track"), track, "{line}");
        assert_eq!(metric_value(&line), 1.0, "{:?}: {line}", self.layout);
    }
}

/// A worker failing its GPU init in a container cgroup of each layout the
/// kubelet and runtime make besides systemd + containerd: CRI-O's
/// `crio-<id>.scope`, the cgroupfs driver's bare id, and CRI-O under
/// cgroupfs; in a canary pod and in a stable one of each. The failure is
/// its own pod's and container's, though the pod has a second container.
/// The pods' cgroups are found under each driver's names: a canary's
/// process is held at a runtime file the daemon has not seen, and a
/// stable pod's, made once the daemon knows the pod, is not.
#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn crio_and_cgroupfs_layouts_attribute_a_failing_init_to_its_pod_and_container() {
    assert_root();
    let node = Node::start();
    let layouts = [
        ("crio", Layout::SystemdCrio),
        ("cgroupfs", Layout::CgroupfsContainerd),
        ("cgroupfs-crio", Layout::CgroupfsCrio),
    ];
    let mut canaries: Vec<LayoutPod> =
        layouts.iter().map(|(tag, l)| LayoutPod::new("canary", tag, *l)).collect();
    let mut stables: Vec<LayoutPod> =
        layouts.iter().map(|(tag, l)| LayoutPod::new("stable", tag, *l)).collect();
    // One request, the stable pods first: their watch events come first. A
    // busy kubelet names each container 1.5 s after its start.
    let specs: Vec<Value> =
        stables.iter().map(|p| p.spec("stable")).chain(canaries.iter().map(|p| p.spec("canary"))).collect();
    let scheduled = NodePod::schedule_all(node.api_port, specs, Duration::from_millis(1500));
    for (layout_pod, pod) in stables.iter_mut().chain(canaries.iter_mut()).zip(scheduled) {
        layout_pod.pod = Some(pod.with_layout(layout_pod.layout));
    }

    let mut cgroups = LastFirst(Vec::new());
    for canary in &canaries {
        let cg = canary.cgroup();
        let runtime = node.fresh_runtime(&canary.name);
        dlopen_at_once(canary.pod(), &cg, &runtime);
        let announced = node.announcement(&runtime);
        assert!(
            announced.contains("held until probed"),
            "{:?} ({}): not held: {announced}",
            canary.layout,
            cg.rel
        );
        cgroups.0.push(cg);
    }
    for (canary, cg) in canaries.iter().zip(&cgroups.0) {
        canary.assert_failure_counted(&node, "canary", cg);
    }
    // The daemon has named the canaries, so it knows the stable pods that
    // came before them. Their processes are not held: each calls only once
    // its runtime copy is probed, since its first call would race the attach.
    for stable in &stables {
        let cg = stable.cgroup();
        let runtime = node.fresh_runtime(&stable.name);
        let mut command = cg.command(&fixture("gpu_dlopen"));
        command.arg("--pause").arg(&runtime);
        let mut worker = Stepped::spawn(detached(command));
        stable.pod().started(&cg);
        worker.wait_line("loaded");
        let announced = node.announcement(&runtime);
        assert!(
            !announced.contains("held until probed"),
            "{:?} ({}): held: {announced}",
            stable.layout,
            cg.rel
        );
        worker.go();
        assert!(worker.wait_line("pid=").contains("init=101"), "cuInit fails without a GPU");
        assert!(worker.finish().success());
        cgroups.0.push(cg);
    }
    for (stable, cg) in stables.iter().zip(&cgroups.0[canaries.len()..]) {
        stable.assert_failure_counted(&node, "stable", cg);
    }
}

/// Cgroups removed last made first, also when a test fails: the first
/// cgroupfs pod made the QoS levels the others share.
struct LastFirst(Vec<PodCgroup>);

impl Drop for LastFirst {
    fn drop(&mut self) {
        while let Some(cg) = self.0.pop() {
            drop(cg);
        }
    }
}

/// Runs its arguments as a child with a pseudo-terminal as its controlling
/// terminal, as a runtime starts a `tty: true` container, and relays the
/// terminal to its own stdin and stdout; exits as the child did.
const WITH_A_TTY: &str = "import os, pty, sys; sys.exit(os.waitstatus_to_exitcode(pty.spawn(sys.argv[1:])))";

/// Field `index` (from 0 at the state) of /proc/PID/stat after the name.
fn stat_field(pid: u64, index: usize) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(") ").expect("stat layout");
    rest.split_whitespace().nth(index).expect("stat field").to_string()
}

/// A `tty: true` container of a canary pod: its process has a controlling
/// terminal, so it is never held (job control would see the stop), while a
/// process of the same pod without one is. It is still traced: once its
/// runtime file is probed, its failing `cuInit` counts, in its container.
/// Its first call races the attach as in the default mode (see "A new
/// library, before its first call"), so its process calls only after the
/// announcement.
#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_tty_container_is_never_held_yet_its_init_failure_is_counted() {
    assert_root();
    let node = Node::start();
    let name = "infer-canaryhash-tty";
    let mut spec = canary_pod(name, &["worker", "shell"]);
    spec["spec"]["containers"][1]["tty"] = json!(true);
    spec["spec"]["containers"][1]["stdin"] = json!(true);
    // A quiet kubelet: each container named as soon as it starts.
    let pod = NodePod::schedule(node.api_port, spec, Duration::ZERO);
    let worker = pod.create("worker");
    let shell = pod.create("shell");

    // Without a terminal, the pod's process is held: the pod is in scope.
    let runtime = node.fresh_runtime("tty-worker");
    dlopen_at_once(&pod, &worker, &runtime);
    let announced = node.announcement(&runtime);
    assert!(announced.contains("held until probed"), "the worker was not held: {announced}");

    let runtime = node.fresh_runtime("tty-shell");
    let mut command = shell.command(Path::new("/usr/bin/python3"));
    command.args(["-c", WITH_A_TTY]).arg(fixture("gpu_dlopen")).arg("--pause").arg(&runtime);
    let mut process = Stepped::spawn(detached(command));
    pod.started(&shell);
    let pid: u64 = field(&process.wait_line("loaded"), "pid").parse().expect("pid");
    assert_ne!(stat_field(pid, 4), "0", "pid {pid} has no controlling terminal");
    let announced = node.announcement(&runtime);
    assert!(!announced.contains("held until probed"), "a process with a terminal was held: {announced}");
    assert!(announced.contains(&format!("[{pid}]")), "found through its own mapping: {announced}");
    process.go();
    process.wait_line("pid=");
    assert!(process.finish().success());

    let line = node.init_failures(name, "worker", "cuInit");
    let text = node.daemon.pod_metrics();
    for (container, what) in [("worker", "the held worker"), ("shell", "the terminal's process")] {
        let counted = text.lines().find(|l| {
            l.starts_with("canaryscope_gpu_init_failures_total{")
                && l.contains(&format!("pod=\"{name}\""))
                && l.contains(&format!("container=\"{container}\""))
                && l.contains("function=\"cuInit\"")
        });
        let counted =
            counted.unwrap_or_else(|| panic!("no cuInit failure of {what} (first seen: {line}):\n{text}"));
        assert_eq!(metric_value(counted), 1.0, "{counted}");
    }
    drop(shell);
    drop(worker);
}

/// Waits until pod `name`'s gate condition has this status, reason and
/// message start.
fn wait_condition(api_port: u16, name: &str, status: &str, reason: &str, message: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let body = control(api_port, "GET", &format!("/api/v1/namespaces/{NS}/pods/{name}"), "");
        let pod: Value = serde_json::from_str(&body).expect("a Pod");
        let condition = pod["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == GATE))
            .cloned();
        if let Some(c) = &condition {
            if c["status"] == status
                && c["reason"] == reason
                && c["message"].as_str().is_some_and(|m| m.starts_with(message))
            {
                return c.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name}: no {GATE} condition {status}/{reason} {message:?} within {WAIT:?}; conditions: {}",
            pod["status"]["conditions"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A gated canary whose worker fails its init, then restarts as the
/// kubelet restarts a container: the old container's cgroup goes, the pod
/// (same uid) reports the new container ID with the old one as its last
/// state, and a new cgroup holds the new container, whose start-up
/// succeeds. The condition goes `False`/`InitFailed` and then
/// `True`/`RuntimeReady` for the restarted container, named as before.
#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_restarted_container_in_a_new_cgroup_turns_the_gate_true() {
    assert_root();
    let node = Node::start();
    let name = "infer-canaryhash-restart";
    let mut spec = canary_pod(name, &["worker"]);
    spec["spec"]["readinessGates"] = json!([{"conditionType": GATE}]);
    // The kubelet names each container 0.6 s after its start.
    let pod = NodePod::schedule(node.api_port, spec, Duration::from_millis(600));

    let first = pod.create("worker");
    let runtime = node.fresh_runtime("restart");
    let exited = dlopen_at_once(&pod, &first, &runtime);
    let failed = wait_condition(node.api_port, name, "False", "InitFailed", "container worker: ");
    assert_eq!(
        failed["message"], "container worker: cuInit returned 101 CUDA_ERROR_INVALID_DEVICE",
        "{failed}"
    );

    // The kubelet's restart: the container exits, its cgroup goes, a new
    // cgroup is made, and the pod's status moves on to the new container
    // once it runs, the old one in its last state.
    let second = pod.restart(first, exited);
    let mut worker = second.command(&fixture("cuda_app"));
    worker.arg("--alloc").env("ZLUDA_FIXTURE_HEALTHY", "1");
    let out = pod.output(&second, &mut detached(worker));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("cuInit=0 ") && stdout.contains("cuMemAlloc=0"), "a healthy start-up: {out:?}");
    wait_condition(node.api_port, name, "True", "RuntimeReady", "container worker: cuInit, cuDeviceGetCount");
    let calls = node.daemon.wait_pod_metric("the restarted container's cuInit", WAIT, |l| {
        l.starts_with("canaryscope_gpu_api_calls_total{")
            && l.contains(&format!("pod=\"{name}\""))
            && l.contains("function=\"cuInit\"")
            && l.contains("result=\"CUDA_SUCCESS\"")
    });
    assert_eq!(label(&calls, "container"), "worker", "{calls}");
    drop(second);
}
