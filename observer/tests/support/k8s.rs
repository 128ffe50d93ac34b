//! The stand-in Kubernetes API server (tests/fake-apiserver, the only mocked
//! part: it serves real Pod objects to kube-rs) and the pods the daemon tests
//! give it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use super::{free_port, http_get, random_hex};

/// The namespace of the test pods.
pub const NS: &str = "inference";

/// A child process killed and reaped when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A running pod on node-a with one container, `worker`, owned by the
/// ReplicaSet `infer-<hash>`.
pub fn pod(name: &str, uid: &str, container_id: &str, track: &str, hash: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NS, "uid": uid, "resourceVersion": "1",
            "labels": {"app": "infer", "track": track, "rollouts-pod-template-hash": hash},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("infer-{hash}"),
                                 "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]
        },
        "spec": {"nodeName": "node-a", "containers": [{"name": "worker", "image": "worker:1"}]},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "worker", "containerID": format!("containerd://{container_id}"), "image": "worker:1",
            "imageID": "", "ready": true, "restartCount": 0, "started": true, "state": {"running": {}}}]}
    })
}

/// `pod` with these containers instead of its one: `(name, containerID)`,
/// the ID as the kubelet reports it (`containerd://<id>`, `cri-o://<id>`),
/// in this order, all running.
pub fn with_containers(mut pod: Value, containers: &[(&str, String)]) -> Value {
    pod["spec"]["containers"] =
        containers.iter().map(|(name, _)| json!({"name": name, "image": format!("{name}:1")})).collect();
    pod["status"]["containerStatuses"] = containers
        .iter()
        .map(|(name, id)| {
            json!({"name": name, "containerID": id, "image": format!("{name}:1"), "imageID": "",
                   "ready": true, "restartCount": 0, "started": true, "state": {"running": {}}})
        })
        .collect();
    pod
}

/// Hands `pods` to the stand-in API server, as the scheduler's binding
/// does: the watch of a daemon already running brings them to it.
pub fn add_pods(api_port: u16, pods: &[&Value]) {
    control(
        api_port,
        "POST",
        "/control/pods",
        &Value::Array(pods.iter().map(|p| (*p).clone()).collect()).to_string(),
    );
}

/// Starts the stand-in API server on `port` (a free one for `None`), with
/// `pods` stored from the start when given.
#[expect(clippy::zombie_processes, reason = "the child is owned by Proc, whose Drop kills and waits")]
pub fn start_apiserver_with(dir: &Path, port: Option<u16>, pods: Option<&Value>) -> (Proc, u16) {
    let port_file = dir.join("port");
    let _ = fs::remove_file(&port_file);
    let mut command = Command::new("python3");
    command
        .arg(repo().join("tests/fake-apiserver/fake_apiserver.py"))
        .args(["--port", &port.unwrap_or(0).to_string(), "--port-file"])
        .arg(&port_file)
        .arg("--quiet")
        .stdout(Stdio::null());
    if let Some(pods) = pods {
        let file = dir.join("pods.json");
        fs::write(&file, pods.to_string()).expect("pods file");
        command.arg("--pods").arg(file);
    }
    let child = command.spawn().expect("python3 runs the stand-in API server");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(p) = fs::read_to_string(&port_file).ok().and_then(|s| s.trim().parse().ok()) {
            return (Proc(child), p);
        }
        assert!(Instant::now() < deadline, "fake API server did not start");
        thread::sleep(Duration::from_millis(50));
    }
}

pub fn start_apiserver(dir: &Path, port: Option<u16>) -> (Proc, u16) {
    start_apiserver_with(dir, port, None)
}

/// A fresh directory for one test's files.
pub fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("canaryscope-k8s-{}", random_hex(8)));
    fs::create_dir_all(&dir).expect("tmp");
    dir
}

/// A kubeconfig pointing at the stand-in API server.
pub fn write_kubeconfig(dir: &Path, api_port: u16) -> PathBuf {
    let kubeconfig = dir.join("kubeconfig");
    fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{api_port}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\nusers:\n- name: fake\n  user: {{}}\n"
        ),
    )
    .expect("kubeconfig");
    kubeconfig
}

/// One request to the server (control API or Kubernetes API); asserts a
/// 2xx answer and returns its body.
pub fn control(port: u16, method: &str, path: &str, body: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 2") || out.starts_with("HTTP/1.0 2"), "{method} {path}: {out}");
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

/// A real Prometheus (Debian's package) scraping the daemon at `daemon_port`
/// every second, evaluating `rules` when given; its data lives in `dir`.
/// Returns the process (stopped when dropped) and its HTTP port.
pub fn start_prometheus(dir: &Path, daemon_port: u16, rules: Option<&Path>) -> (Proc, u16) {
    start_prometheus_of(dir, &[daemon_port], rules)
}

/// A Prometheus scraping several daemons each second, as one scrapes a
/// DaemonSet's pods.
pub fn start_prometheus_of(dir: &Path, daemon_ports: &[u16], rules: Option<&Path>) -> (Proc, u16) {
    let port = free_port();
    let targets: Vec<String> = daemon_ports.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
    let targets = targets.join(", ");
    let config = dir.join("prometheus.yml");
    let rule_files = match rules {
        Some(r) => format!("  evaluation_interval: 1s\nrule_files:\n  - {}\n", r.display()),
        None => String::new(),
    };
    fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n{rule_files}scrape_configs:\n  - job_name: canaryscope\n    honor_labels: true\n    static_configs:\n      - targets: [{targets}]\n"
        ),
    )
    .expect("prometheus.yml");
    let prometheus = Proc(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package) runs"),
    );
    (prometheus, port)
}

/// Prometheus' whole answer to an instant query (`Null` while it is not up).
pub fn prom(port: u16, query: &str) -> Value {
    let encoded: String = query
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let body = http_get(port, &format!("/api/v1/query?query={encoded}")).map(|(_, b)| b).unwrap_or_default();
    serde_json::from_str(&body).unwrap_or(Value::Null)
}

/// The series an instant query returns now.
pub fn prom_query(port: u16, query: &str) -> Vec<Value> {
    prom(port, query)["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The daemon as the DaemonSet runs it on `node-a`, against the stand-in
/// API server of `kubeconfig`, holding first calls, with series of deleted
/// pods kept for `series_grace`.
pub fn node_daemon(kubeconfig: &Path, series_grace: &str) -> super::Daemon {
    super::Daemon::start(&[
        "--hold",
        "--kubeconfig",
        kubeconfig.to_str().expect("utf8"),
        "--node-name",
        "node-a",
        "--series-grace",
        series_grace,
    ])
}

/// A rollout's two revisions scheduled while the daemon runs, as a rollout
/// does: the API server has the pods first, then the kubelet makes their
/// cgroups. Returns the pods as posted (to post again to an API server
/// that restarts), the canary's cgroup and the stable's.
pub fn schedule_canary_and_stable(api_port: u16) -> (Value, super::PodCgroup, super::PodCgroup) {
    let (canary_uid, stable_uid) = (super::random_pod_uid(), super::random_pod_uid());
    let (canary_cid, stable_cid) = (random_hex(64), random_hex(64));
    let pods = json!([
        pod("infer-canaryhash-abcde", &canary_uid, &canary_cid, "canary", "canaryhash"),
        pod("infer-stablehash-fghij", &stable_uid, &stable_cid, "stable", "stablehash"),
    ]);
    control(api_port, "POST", "/control/pods", &pods.to_string());
    (pods, super::PodCgroup::new(&canary_uid, &canary_cid), super::PodCgroup::new(&stable_uid, &stable_cid))
}
