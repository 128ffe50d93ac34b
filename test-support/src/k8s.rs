//! The stand-in Kubernetes API server (tests/fake-apiserver, the only mocked
//! part: it serves real Pod objects to kube-rs) and the pods the daemon tests
//! give it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{free_port, http_get, random_hex};

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

/// A pod on node-a with one container, `worker`, owned by the ReplicaSet
/// `infer-<hash>`, as the scheduler binds it and the kubelet first reports
/// it: its containers waiting to be created, so no `containerID` yet. The
/// kubelet names a container only once it runs ([`NodePod`] plays that part).
pub fn scheduled_pod(name: &str, uid: &str, track: &str, hash: &str) -> Value {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": NS, "uid": uid, "resourceVersion": "1",
            "labels": {"app": "infer", "track": track, "rollouts-pod-template-hash": hash},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("infer-{hash}"),
                                 "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]
        },
        "spec": {"nodeName": "node-a"},
    });
    with_containers(pod, &["worker"])
}

/// `scheduled_pod` with these containers instead of its one, in this
/// order, each waiting to be created.
pub fn with_containers(mut pod: Value, names: &[&str]) -> Value {
    pod["spec"]["containers"] =
        names.iter().map(|name| json!({"name": name, "image": format!("{name}:1")})).collect();
    pod["status"] = json!({
        "phase": "Pending",
        "containerStatuses": names.iter().map(|name| waiting(name, "ContainerCreating")).collect::<Vec<_>>(),
    });
    pod
}

/// A container's status while it has no container: no ID.
fn waiting(name: &str, reason: &str) -> Value {
    json!({"name": name, "image": format!("{name}:1"), "imageID": "", "ready": false, "restartCount": 0,
           "started": false, "state": {"waiting": {"reason": reason}}})
}

/// A [`NodePod`]'s `report_after` for a test that chooses the moment of
/// each report by what it has seen ([`NodePod::report`]).
pub const REPORTED_BY_THE_TEST: Duration = Duration::MAX;

/// One container instance the kubelet made: a cgroup, an ID.
struct Run {
    id: String,
    /// Whether its first process has started (its report is on its way).
    started: bool,
    /// When, in Unix seconds: the status's `state.running.startedAt`.
    started_at: Option<i64>,
    /// Whether the kubelet's status names it (its report came).
    reported: bool,
    /// Its exit code as the kubelet reports it (128 + signal for a signal).
    exit_code: Option<i32>,
}

/// What the kubelet knows of one container of a pod.
struct ContainerRuns {
    name: String,
    runs: Vec<Run>,
}

/// A pod on node-a as the kubelet runs it, in the kubelet's order: the pod
/// reaches the API server with its containers waiting; the kubelet makes a
/// container's cgroup ([`Self::create`]), its process starts (the test's),
/// and only `report_after` later does the pod's status name the container's
/// ID ([`Self::started`]: the kubelet's PLEG relist runs every second, and a
/// busy node is slower). A restart ([`Self::restart`]) reports the exit,
/// makes a new cgroup, and the new ID comes the same way, the old one moving
/// to `lastState.terminated.containerID` and `restartCount` rising. A
/// rollout's deletion is [`Self::terminate`] (the deletion timestamp, as a
/// watch update) and then [`Self::remove`].
///
/// Status updates go through the stand-in's kubelet endpoint, which merges
/// conditions by type as the kubelet's patch does: the gate's condition
/// stays.
pub struct NodePod {
    api_port: u16,
    pub name: String,
    pub uid: String,
    pub json: Value,
    layout: crate::Layout,
    report_after: Duration,
    containers: Arc<Mutex<Vec<ContainerRuns>>>,
    reports: Mutex<Vec<thread::JoinHandle<()>>>,
}

impl NodePod {
    /// `pod` as the kubelet will run it, container IDs reported
    /// `report_after` after each container's start; not yet in the API.
    pub fn new(api_port: u16, pod: Value, report_after: Duration) -> Self {
        let names = pod["spec"]["containers"]
            .as_array()
            .expect("containers")
            .iter()
            .map(|c| ContainerRuns { name: c["name"].as_str().expect("name").to_string(), runs: Vec::new() })
            .collect();
        Self {
            api_port,
            name: pod["metadata"]["name"].as_str().expect("name").to_string(),
            uid: pod["metadata"]["uid"].as_str().expect("uid").to_string(),
            json: pod,
            layout: crate::Layout::SystemdContainerd,
            report_after,
            containers: Arc::new(Mutex::new(names)),
            reports: Mutex::new(Vec::new()),
        }
    }

    /// The pod scheduled to the node while the daemon runs: in the API,
    /// its containers waiting.
    pub fn schedule(api_port: u16, pod: Value, report_after: Duration) -> Self {
        let node_pod = Self::new(api_port, pod, report_after);
        add_pods(api_port, &[&node_pod.json]);
        node_pod
    }

    /// Several pods scheduled in one request (their watch events in order).
    pub fn schedule_all(api_port: u16, pods: Vec<Value>, report_after: Duration) -> Vec<Self> {
        let pods: Vec<Self> = pods.into_iter().map(|p| Self::new(api_port, p, report_after)).collect();
        add_pods(api_port, &pods.iter().map(|p| &p.json).collect::<Vec<_>>());
        pods
    }

    /// Its containers' cgroups named as `layout` names them.
    pub fn with_layout(mut self, layout: crate::Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The kubelet makes `container`: a new container ID and its cgroup.
    /// The status does not name it until [`Self::started`].
    pub fn create(&self, container: &str) -> crate::PodCgroup {
        let id = crate::random_hex(64);
        let cg = crate::PodCgroup::with_layout(self.layout, &self.uid, &id);
        self.note_run(container, id);
        cg
    }

    fn note_run(&self, container: &str, id: String) {
        let mut containers = self.containers.lock().expect("lock");
        let runs = containers.iter_mut().find(|c| c.name == container).unwrap_or_else(|| {
            panic!("{} has no container {container}", self.name);
        });
        runs.runs.push(Run { id, started: false, started_at: None, reported: false, exit_code: None });
    }

    /// The container of `cg` runs now: its first process has started. The
    /// kubelet's status names it `report_after` from now (in the background;
    /// at once for zero). Later calls for the same container do nothing.
    pub fn started(&self, cg: &crate::PodCgroup) {
        if self.report_after == REPORTED_BY_THE_TEST {
            return;
        }
        let id = cg.container_id().to_string();
        {
            let mut containers = self.containers.lock().expect("lock");
            let run = containers.iter_mut().flat_map(|c| &mut c.runs).find(|r| r.id == id);
            let run = run.unwrap_or_else(|| panic!("{}: a cgroup its kubelet did not make", self.name));
            if std::mem::replace(&mut run.started, true) {
                return;
            }
            run.started_at = Some(unix_now());
        }
        let mut reports = self.reports.lock().expect("lock");
        let (api_port, name, containers, layout, after) =
            (self.api_port, self.name.clone(), self.containers.clone(), self.layout, self.report_after);
        let report = move || {
            if !after.is_zero() {
                // The kubelet's pace, not a wait for anything.
                thread::sleep(after);
            }
            let mut containers = containers.lock().expect("lock");
            let run = containers.iter_mut().flat_map(|c| &mut c.runs).find(|r| r.id == id);
            match run {
                Some(run) if !run.reported => run.reported = true,
                _ => return,
            }
            post_status(api_port, &name, &containers, layout);
        };
        if after.is_zero() {
            report();
        } else {
            reports.push(thread::spawn(report));
        }
    }

    /// Spawns `command` in the container of `cg` and, if it is the
    /// container's first process, has its ID reported.
    pub fn spawn(&self, cg: &crate::PodCgroup, command: &mut Command) -> Child {
        let child = command.spawn().expect("spawn in the pod");
        self.started(cg);
        child
    }

    /// Runs `command` to its end in the container of `cg`, as [`Self::spawn`].
    pub fn output(&self, cg: &crate::PodCgroup, command: &mut Command) -> std::process::Output {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        self.spawn(cg, command).wait_with_output().expect("wait")
    }

    /// Waits until every report so far is in the API server.
    pub fn reported(&self) {
        let reports: Vec<_> = std::mem::take(&mut *self.reports.lock().expect("lock"));
        for r in reports {
            r.join().expect("the kubelet's report");
        }
    }

    /// The container of `cg` exited with `status`, as the kubelet's next
    /// relist sees it: the status names the exited container (its ID, its
    /// exit code). A report of its start still on its way comes first.
    pub fn exited(&self, cg: &crate::PodCgroup, status: ExitStatus) {
        use std::os::unix::process::ExitStatusExt;
        self.reported();
        let exit_code = status.code().or(status.signal().map(|s| 128 + s)).unwrap_or(0);
        let mut containers = self.containers.lock().expect("lock");
        let run = containers.iter_mut().flat_map(|c| &mut c.runs).find(|r| r.id == cg.container_id());
        let run = run.unwrap_or_else(|| panic!("{}: a cgroup its kubelet did not make", self.name));
        run.exit_code = Some(exit_code);
        run.started = true;
        run.started_at.get_or_insert_with(unix_now);
        run.reported = true;
        post_status(self.api_port, &self.name, &containers, self.layout);
    }

    /// The container of `old` exited with `status` ([`Self::exited`]) and
    /// the kubelet restarts it: its cgroup goes (its processes must be
    /// gone), and a new container with a new ID gets a new cgroup in the
    /// same pod, not named until [`Self::started`]; the old ID then moves
    /// to `lastState.terminated.containerID` and `restartCount` rises.
    pub fn restart(&self, old: crate::PodCgroup, status: ExitStatus) -> crate::PodCgroup {
        self.exited(&old, status);
        let container = {
            let containers = self.containers.lock().expect("lock");
            let c = containers.iter().find(|c| c.runs.iter().any(|r| r.id == old.container_id()));
            c.expect("its container").name.clone()
        };
        let id = crate::random_hex(64);
        let new = old.restarted(&id);
        self.note_run(&container, id);
        new
    }

    /// The kubelet names the container of `cg` now, whatever its pace:
    /// for a test that chooses the moment by what it has seen.
    pub fn report(&self, cg: &crate::PodCgroup) {
        let mut containers = self.containers.lock().expect("lock");
        let run = containers.iter_mut().flat_map(|c| &mut c.runs).find(|r| r.id == cg.container_id());
        let run = run.unwrap_or_else(|| panic!("{}: a cgroup its kubelet did not make", self.name));
        run.started = true;
        run.started_at.get_or_insert_with(unix_now);
        run.reported = true;
        post_status(self.api_port, &self.name, &containers, self.layout);
    }

    /// A rollout deletes the pod: the API server sets its deletion
    /// timestamp, which the watch brings as an update.
    pub fn terminate(&self) {
        control(
            self.api_port,
            "POST",
            &format!("/control/pods/{NS}/{}/terminate", self.name),
            r#"{"gracePeriodSeconds": 30}"#,
        );
    }

    /// The kubelet's last word on a deleted pod: it leaves the API.
    pub fn remove(&self) {
        control(self.api_port, "DELETE", &format!("/control/pods/{NS}/{}", self.name), "");
    }

    /// The pod as the API server holds it now.
    pub fn get(&self) -> Value {
        let body = control(self.api_port, "GET", &format!("/api/v1/namespaces/{NS}/pods/{}", self.name), "");
        serde_json::from_str(&body).expect("a Pod")
    }
}

impl Drop for NodePod {
    fn drop(&mut self) {
        let reports: Vec<_> = std::mem::take(&mut *self.reports.lock().unwrap_or_else(|e| e.into_inner()));
        for r in reports {
            let _ = r.join();
        }
    }
}

/// Posts the status the kubelet has for `containers`: each container's
/// latest instance it knows, with the one before it as its last state.
fn post_status(api_port: u16, name: &str, containers: &[ContainerRuns], layout: crate::Layout) {
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            let Some(current) = c.runs.iter().rposition(|r| r.reported) else {
                return waiting(&c.name, "ContainerCreating");
            };
            let run = &c.runs[current];
            let id = layout.container_id_uri(&run.id);
            let (state, running) = match run.exit_code {
                None => (
                    json!({"running": {"startedAt": rfc3339(run.started_at.unwrap_or_else(unix_now))}}),
                    true,
                ),
                Some(_) if current + 1 < c.runs.len() => {
                    (json!({"waiting": {"reason": "CrashLoopBackOff"}}), false)
                }
                Some(code) => (json!({"terminated": {"exitCode": code, "containerID": id}}), false),
            };
            let last = match current.checked_sub(1).map(|i| &c.runs[i]) {
                Some(before) => json!({"terminated": {
                    "exitCode": before.exit_code.unwrap_or(0),
                    "reason": if before.exit_code == Some(0) { "Completed" } else { "Error" },
                    "containerID": layout.container_id_uri(&before.id)}}),
                None => json!({}),
            };
            json!({"name": c.name, "containerID": id, "image": format!("{}:1", c.name), "imageID": "",
                   "ready": running, "started": running, "restartCount": current, "state": state,
                   "lastState": last})
        })
        .collect();
    let any = containers.iter().any(|c| c.runs.iter().any(|r| r.reported));
    let status = json!({"phase": if any { "Running" } else { "Pending" }, "containerStatuses": statuses});
    if let Err(e) =
        try_control(api_port, "POST", &format!("/control/pods/{NS}/{name}/status"), &status.to_string())
    {
        // An API server the test stopped: the update is lost here, where a
        // real kubelet retries; a test resends it with `NodePod::report`.
        eprintln!("the kubelet's status of {name} did not reach the API server: {e}");
    }
}

fn unix_now() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    now.map(|d| d.as_secs() as i64).unwrap_or_default()
}

/// Whole seconds in UTC, as the kubelet writes a container's start
/// (`2026-01-01T00:00:10Z`). The civil date from days since the epoch is
/// Howard Hinnant's `civil_from_days`.
fn rfc3339(unix_seconds: i64) -> String {
    let (days, secs) = (unix_seconds.div_euclid(86_400), unix_seconds.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
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
    try_control(port, method, path, body).unwrap_or_else(|e| panic!("{e}"))
}

/// [`control`], saying what went wrong instead of panicking.
pub fn try_control(port: u16, method: &str, path: &str, body: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    if !(out.starts_with("HTTP/1.1 2") || out.starts_with("HTTP/1.0 2")) {
        return Err(format!("{method} {path}: {out}"));
    }
    Ok(out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
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

/// The value of the first series `query` returns now, if any.
pub fn prom_value(port: u16, query: &str) -> Option<f64> {
    prom_query(port, query).first().and_then(|s| s["value"][1].as_str()?.parse().ok())
}

/// Waits up to a minute for `pred` to hold of `query`'s value (0 while it
/// returns nothing); `what` names it when it never does.
pub fn wait_prom(port: u16, what: &str, query: &str, pred: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = prom_value(port, query).unwrap_or(0.0);
        if pred(v) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {query} is {v}");
        thread::sleep(Duration::from_millis(250));
    }
}

/// The daemon as the DaemonSet runs it on `node-a`, against the stand-in
/// API server of `kubeconfig`, holding first calls, with series of deleted
/// pods kept for `series_grace`.
pub fn node_daemon(kubeconfig: &Path, series_grace: &str) -> crate::Daemon {
    crate::Daemon::on_node(kubeconfig, &["--hold", "--series-grace", series_grace])
}

/// A rollout's two pods on node-a, each with its `worker` container made.
pub struct Rollout {
    pub canary: NodePod,
    pub stable: NodePod,
    pub canary_cg: crate::PodCgroup,
    pub stable_cg: crate::PodCgroup,
}

/// A rollout's two revisions scheduled while the daemon runs, as a rollout
/// does: the API server has the pods first, then the kubelet makes their
/// containers' cgroups; each container's ID reaches the status
/// `report_after` after its first process starts ([`NodePod::started`]).
pub fn schedule_canary_and_stable(api_port: u16, report_after: Duration) -> Rollout {
    let pods = vec![
        scheduled_pod("infer-canaryhash-abcde", &crate::random_pod_uid(), "canary", "canaryhash"),
        scheduled_pod("infer-stablehash-fghij", &crate::random_pod_uid(), "stable", "stablehash"),
    ];
    let mut pods = NodePod::schedule_all(api_port, pods, report_after).into_iter();
    let (canary, stable) = (pods.next().expect("canary"), pods.next().expect("stable"));
    let (canary_cg, stable_cg) = (canary.create("worker"), stable.create("worker"));
    Rollout { canary, stable, canary_cg, stable_cg }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_start_reads_as_the_kubelet_writes_it() {
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_825_599), "2000-02-29T11:59:59Z");
        assert_eq!(super::rfc3339(1_767_225_610), "2026-01-01T00:00:10Z");
    }
}
