//! A crash-looping canary, the most common way a bad canary fails: one
//! container of one pod dies at start, the kubelet restarts it in a new
//! cgroup, and it dies again, five times. The daemon runs as the DaemonSet
//! runs it, against the stand-in API server, with a short series grace; the
//! kubelet's part is played in its own order ([`NodePod`]): each container's
//! ID reaches the pod's status only after its process started, and after a
//! restart the old ID moves to `lastState`. A real Prometheus scrapes the
//! daemon every second, and this test fetches `/metrics` itself all along.
//!
//! What must hold, for segfaults, GPU init failures and OOM kills alike:
//! - no scrape's text ever holds two samples with one label set (Prometheus
//!   2.42 does not count such duplicates within one scrape, so this is
//!   asserted on the text);
//! - every series Prometheus ever stored for the pod's family is under
//!   `container="worker"`, never a short container ID;
//! - its last value is the number of deaths, with `resets()` 0, also after
//!   the series grace has purged the first restarts' cgroups. Not
//!   `increase()`: a series born at 1 makes it miss the first death and
//!   extrapolate.

use std::{
    collections::{BTreeSet, HashSet},
    path::PathBuf,
    process::{Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use test_support::{
    assert_root, fixture, http_get,
    k8s::{
        node_daemon, prom, prom_query, scheduled_pod, scratch_dir, start_apiserver, start_prometheus,
        write_kubeconfig, NodePod, Proc,
    },
    random_pod_uid, Daemon, PodCgroup,
};

/// Deaths in one crash loop: the first container and four restarts.
const DEATHS: usize = 5;
/// The daemon's `--series-grace`: short, so that the first restarts'
/// cgroups are purged while the test runs.
const SERIES_GRACE: Duration = Duration::from_secs(2);
/// How often the daemon looks for removed cgroups (`metrics`' liveness
/// check) and refreshes its series: a removed cgroup's series are purged
/// within grace + check + refresh of its removal.
const PURGE_CHECK: Duration = Duration::from_secs(3);
/// The kubelet's back-off before a restart (10 s doubling to 5 min on a
/// real node), shortened to keep the test short.
const BACK_OFF: Duration = Duration::from_millis(400);
const WAIT: Duration = Duration::from_secs(30);

/// The node: the stand-in API server, the daemon, a Prometheus scraping it
/// every second, and this test's own scrapes.
struct Node {
    dir: PathBuf,
    api_port: u16,
    _daemon: Daemon,
    prom_port: u16,
    scrapes: Scrapes,
    _prom: Proc,
    _api: Proc,
}

impl Node {
    fn start() -> Self {
        let dir = scratch_dir();
        let (api, api_port) = start_apiserver(&dir, None);
        let kubeconfig = write_kubeconfig(&dir, api_port);
        let grace = format!("{}s", SERIES_GRACE.as_secs());
        let daemon = node_daemon(&kubeconfig, &grace);
        let (prom, prom_port) = start_prometheus(&dir, daemon.port, None);
        let deadline = Instant::now() + WAIT;
        while prom_query(prom_port, "up{job=\"canaryscope\"} == 1").is_empty() {
            assert!(Instant::now() < deadline, "Prometheus never scraped the daemon");
            thread::sleep(Duration::from_millis(200));
        }
        let scrapes = Scrapes::start(daemon.port);
        Self { dir, api_port, _daemon: daemon, prom_port, scrapes, _prom: prom, _api: api }
    }

    /// Every series Prometheus stored for `family` and pod `pod` since the
    /// test began, each with its last value and its resets.
    fn stored(&self, family: &str, pod: &str) -> Vec<(Value, f64, f64)> {
        let selector = selector(family, pod);
        let last = prom_query(self.prom_port, &format!("last_over_time({selector}[10m])"));
        let resets = prom_query(self.prom_port, &format!("resets({selector}[10m])"));
        last.iter()
            .map(|s| {
                let metric = s["metric"].clone();
                let value = sample(s);
                // Functions of a series drop its name.
                let mut labels = metric.clone();
                labels.as_object_mut().map(|m| m.remove("__name__"));
                let reset = resets.iter().find(|r| r["metric"] == labels).map(sample).unwrap_or(f64::NAN);
                (metric, value, reset)
            })
            .collect()
    }

    /// What the pod's `family` looks like to a rule: each of its series
    /// (one per signal, cause or function) under `container="worker"`,
    /// its last value `deaths` (one per death), never reset.
    /// Waits for Prometheus to have it, and returns the findings otherwise.
    fn check_family(&self, family: &str, pod: &str, deaths: f64, findings: &mut Vec<String>) {
        let deadline = Instant::now() + WAIT;
        let mut seen;
        loop {
            seen = self.stored(family, pod);
            let now = prom_query(self.prom_port, &selector(family, pod));
            let settled = !now.is_empty()
                && now.iter().all(|s| s["metric"]["container"] == "worker" && sample(s) == deaths)
                && seen.iter().all(|(m, v, r)| m["container"] == "worker" && *v == deaths && *r == 0.0);
            if settled || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(500));
        }
        let rows: Vec<String> = seen.iter().map(|(m, v, r)| format!("{m} last {v} resets {r}")).collect();
        for (metric, value, resets) in &seen {
            if metric["container"] != "worker" {
                findings.push(format!("{family}: a series not under container=\"worker\": {metric}"));
            } else if *value != deaths {
                findings.push(format!("{family}: last value {value} under {metric}, not {deaths}"));
            }
            if *resets != 0.0 {
                findings.push(format!("{family}: resets() {resets} under {metric}"));
            }
        }
        let per_label_set: f64 =
            seen.iter().filter(|(m, _, _)| m["container"] == "worker").map(|(_, v, _)| v).sum();
        if seen.is_empty() {
            let answer = prom(self.prom_port, &format!("last_over_time({}[10m])", selector(family, pod)));
            findings.push(format!("{family}: Prometheus stored no series of pod {pod}: {answer}"));
        }
        eprintln!("{family} of {pod} (sum under worker {per_label_set}): {rows:#?}");
    }

    /// Waits past the purge of every cgroup removed before `removed_by`,
    /// then until Prometheus has scraped after it.
    fn wait_purged(&self, removed_by: Instant) {
        let purged_by = removed_by + SERIES_GRACE + PURGE_CHECK;
        // The grace and the daemon's liveness check are times, not events:
        // nothing in the exposition says a cgroup's series were purged once
        // their counts live on in their label set's.
        let left = purged_by.saturating_duration_since(Instant::now());
        thread::sleep(left);
        let after = unix_now_s();
        let deadline = Instant::now() + WAIT;
        loop {
            let last = prom_query(self.prom_port, "timestamp(up{job=\"canaryscope\"})");
            if last.first().map(sample).is_some_and(|t| t > after) {
                return;
            }
            assert!(Instant::now() < deadline, "Prometheus stopped scraping");
            thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `family` (a name, or a name with matchers in braces) of pod `pod`.
fn selector(family: &str, pod: &str) -> String {
    match family.strip_suffix('}') {
        Some(open) => format!("{open},pod=\"{pod}\"}}"),
        None => format!("{family}{{pod=\"{pod}\"}}"),
    }
}

fn sample(series: &Value) -> f64 {
    series["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

fn unix_now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// What this test's scrapes found: how many texts, how many held a label
/// set twice, and which label sets, by path.
#[derive(Default)]
struct Found {
    scrapes: usize,
    with_duplicates: usize,
    twice: BTreeSet<String>,
}

/// This test's own scrapes of `/metrics` and `/metrics/pods`, every 100 ms
/// from its start to its end, each text checked for two samples of one
/// label set.
struct Scrapes {
    stop: Arc<AtomicBool>,
    found: Arc<Mutex<Found>>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
}

impl Scrapes {
    fn start(port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let found = Arc::new(Mutex::new(Found::default()));
        let (stop2, found2) = (stop.clone(), found.clone());
        let thread = thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                for path in ["/metrics", "/metrics/pods"] {
                    let Some((200, text)) = http_get(port, path) else { continue };
                    let twice = duplicates(&text);
                    let mut found = found2.lock().expect("lock");
                    found.scrapes += 1;
                    found.with_duplicates += usize::from(!twice.is_empty());
                    found.twice.extend(twice.into_iter().map(|t| format!("{path}: {t}")));
                }
                thread::sleep(Duration::from_millis(100));
            }
        });
        Self { stop, found, thread: Mutex::new(Some(thread)) }
    }

    /// Stops scraping; what the scrapes found.
    fn finish(&self) -> Found {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.lock().expect("lock").take() {
            t.join().expect("the scraping thread");
        }
        std::mem::take(&mut *self.found.lock().expect("lock"))
    }
}

impl Drop for Scrapes {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The label sets that occur more than once in an exposition's text,
/// labels compared as sets (their order in the text does not matter).
fn duplicates(text: &str) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut twice = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let Some((series, _value)) = line.rsplit_once(' ') else { continue };
        let key = label_set(series);
        if !seen.insert(key.clone()) {
            twice.push(series.to_string());
        }
    }
    twice
}

/// `name{a="1",b="2"}` as its name and its sorted label pairs.
fn label_set(series: &str) -> (String, Vec<(String, String)>) {
    let Some((name, rest)) = series.split_once('{') else { return (series.to_string(), Vec::new()) };
    let mut labels = Vec::new();
    let mut chars = rest.trim_end_matches('}').chars().peekable();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "a quoted value in {series}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.extend(chars.next()),
                '"' => break,
                c => value.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').to_string(), value));
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels.sort();
    (name.to_string(), labels)
}

/// One crash loop: `DEATHS` runs of `worker` in container `worker` of a
/// canary pod, each container's ID reported `report_after` after its start,
/// each death restarted by the kubelet after its back-off in a new cgroup
/// (made by `make`, where limits go). Returns the pod and when its last
/// restart removed a cgroup.
fn crash_loop(
    node: &Node,
    name: &str,
    report_after: Duration,
    limit: impl Fn(&mut PodCgroup),
    worker: impl Fn(&PodCgroup) -> Command,
    died: impl Fn(ExitStatus),
) -> (NodePod, PodCgroup, Instant) {
    let pod = NodePod::schedule(
        node.api_port,
        scheduled_pod(name, &random_pod_uid(), "canary", "canaryhash"),
        report_after,
    );
    let mut cg = pod.create("worker");
    limit(&mut cg);
    let mut last_removal = Instant::now();
    for death in 1..=DEATHS {
        let mut command = worker(&cg);
        command.stdout(Stdio::null()).stderr(Stdio::null());
        let status = pod.spawn(&cg, &mut command).wait().expect("the worker");
        died(status);
        if death == DEATHS {
            // The kubelet backs off; the last container's cgroup stays.
            pod.exited(&cg, status);
            break;
        }
        thread::sleep(BACK_OFF);
        cg = pod.restart(cg, status);
        last_removal = Instant::now();
        limit(&mut cg);
    }
    (pod, cg, last_removal)
}

/// The deaths counted, the scrapes clean: asserted with every finding at once.
fn assert_counted(node: &Node, pod: &str, families: &[&str], removed_by: Instant) {
    let mut findings = Vec::new();
    for family in families {
        node.check_family(family, pod, DEATHS as f64, &mut findings);
    }
    node.wait_purged(removed_by);
    for family in families {
        node.check_family(family, pod, DEATHS as f64, &mut findings);
    }
    let found = node.scrapes.finish();
    assert!(found.scrapes > 20, "only {} scrapes", found.scrapes);
    if found.with_duplicates > 0 {
        findings.push(format!(
            "{} of {} scrapes held two samples with one label set, of: {:#?}",
            found.with_duplicates, found.scrapes, found.twice
        ));
    }
    findings.dedup();
    assert!(findings.is_empty(), "{} findings:\n{}", findings.len(), findings.join("\n"));
}

/// A canary whose worker segfaults in its own code 0.5 s after its start;
/// the kubelet names each container 0.3 s after its start, as in the
/// report that found the bug.
#[test]
#[ignore = "needs root, python3 and prometheus; run by `cargo xtask test`"]
fn a_segfault_loop_counts_five_crashes_under_the_containers_name() {
    assert_root();
    let node = Node::start();
    let name = "infer-canaryhash-crashy";
    let (_pod, _cg, removed_by) = crash_loop(
        &node,
        name,
        Duration::from_millis(300),
        |_| {},
        |cg| {
            let mut c = cg.command(&fixture("segv_app"));
            c.args(["--sleep-before", "500"]);
            c
        },
        |status| {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc::SIGSEGV), "{status}");
        },
    );
    assert_counted(
        &node,
        name,
        &["canaryscope_native_crashes_total", "canaryscope_abnormal_exits_total"],
        removed_by,
    );
}

/// A canary whose GPU runtime fails `cuInit` at once (no GPU here), the
/// process exiting before the kubelet names the container, 1 s after its
/// start: every init failure under `container="worker"`.
#[test]
#[ignore = "needs root, python3 and prometheus; run by `cargo xtask test`"]
fn a_gpu_init_failure_loop_counts_five_failures_under_the_containers_name() {
    assert_root();
    let node = Node::start();
    let name = "infer-canaryhash-noinit";
    let (_pod, _cg, removed_by) = crash_loop(
        &node,
        name,
        Duration::from_millis(1000),
        |_| {},
        |cg| {
            let mut c = cg.command(&fixture("cuda_app"));
            c.arg("--alloc");
            c
        },
        |status| assert!(status.success(), "cuda_app ends after its failed init: {status}"),
    );
    // The application's call; the HIP calls below it count per call.
    assert_counted(&node, name, &["canaryscope_gpu_init_failures_total{function=\"cuInit\"}"], removed_by);
}

/// A canary that outgrows its 50 MiB memory limit at start, the kubelet
/// naming each container at once: five OOM kills, five abnormal exits.
#[test]
#[ignore = "needs root, python3 and prometheus; run by `cargo xtask test`"]
fn an_oom_kill_loop_counts_five_kills_under_the_containers_name() {
    assert_root();
    let node = Node::start();
    let name = "infer-canaryhash-hungry";
    let (_pod, _cg, removed_by) = crash_loop(
        &node,
        name,
        Duration::ZERO,
        // The kubelet sets each new container's limit from the pod's spec.
        |cg| cg.limit_memory(50 << 20),
        |cg| {
            let mut c = cg.command(&fixture("oom_hog"));
            c.arg("200");
            c
        },
        |status| {
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(status.signal(), Some(libc::SIGKILL), "the OOM killer's: {status}");
        },
    );
    assert_counted(
        &node,
        name,
        &["canaryscope_oom_kills_total", "canaryscope_abnormal_exits_total"],
        removed_by,
    );
}
