//! Solver runs without instrumentation: a real z3 (Debian's) started by a
//! Python worker through the solver runbook's wrapper (RLIMIT_AS,
//! RLIMIT_CPU, a wall-clock timeout: tests/solver/), in real pod cgroups,
//! seen by the real daemon. Its endings as the worker saw them, each run
//! counted once and nothing else counted as a run; then a canary whose z3
//! runs take three times longer, through a real Prometheus and the judge,
//! whose p-value an independent oracle recomputes from Prometheus' own
//! buckets.
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use test_support::{
    assert_root, field, http_get,
    judge::{ask_judge, run_oracle, signal, start_judge},
    k8s::{prom_value, repo, scheduled_pod, scratch_dir, start_prometheus, wait_prom, NodePod, NS},
    metric_value, random_hex, random_pod_uid, Daemon, PodCgroup,
};

fn solver_dir() -> PathBuf {
    repo().join("tests/solver")
}

/// The worker of one pod's container: jobs in on stdin, one `done` line
/// out per job.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: BufReader<ChildStdout>,
}

impl Worker {
    fn start(mut command: Command) -> Self {
        let mut child = command
            .current_dir(solver_dir())
            .arg("worker.py")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 worker.py");
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let mut ready = String::new();
        lines.read_line(&mut ready).expect("the worker starts");
        assert_eq!(ready.trim(), "ready");
        Self { child, stdin, lines }
    }

    fn send(&mut self, job: &Value) {
        writeln!(self.stdin, "{job}").and_then(|_| self.stdin.flush()).expect("a job to the worker");
    }

    /// The outcome and wall seconds the worker saw for its next job.
    fn done(&mut self) -> (String, f64) {
        let mut line = String::new();
        self.lines.read_line(&mut line).expect("the worker's line");
        assert!(line.starts_with("done "), "{line:?}");
        (field(&line, "outcome"), field(&line, "seconds").parse().expect("seconds"))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python(cg: &PodCgroup) -> Command {
    cg.command(Path::new("/usr/bin/python3"))
}

/// The daemon's counter lines for the container's runs, summed by label.
fn run_lines(metrics: &str, owner: &str, family: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for l in metrics.lines().filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(owner)) {
        *out.entry(field_label(l, label)).or_default() += metric_value(l);
    }
    out
}

/// A label's value out of an exposition line.
fn field_label(line: &str, label: &str) -> String {
    let start = line.find(&format!("{label}=\"")).map(|i| i + label.len() + 2).unwrap_or(0);
    line[start..].split('"').next().unwrap_or_default().to_string()
}

#[test]
#[ignore = "needs root and z3 (scripts/setup.sh); run by `cargo xtask test`"]
fn a_real_z3_under_the_runbooks_wrapper_ends_each_way_and_only_its_runs_count() {
    assert_root();
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let cg = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    // The worker is the container's first process (started from outside).
    let mut worker = Worker::start(python(&cg));
    // php(9) takes z3 seconds of CPU; php(5) a few milliseconds.
    let jobs = [
        (json!({"pigeons": 5}), "exit0", "exit_zero"),
        (json!({"bad": true}), "exit1", "exit_nonzero"),
        // 30 MiB of address space: z3's allocations are refused, it says
        // "out of memory" and exits 101.
        (json!({"pigeons": 9, "memory_mb": 30}), "exit101", "memory_limit"),
        // One second of CPU: SIGXCPU from the kernel.
        (json!({"pigeons": 9, "cpu": 1, "timeout": 120}), "signal24", "rlimit_cpu"),
        // Half a second of wall clock: the wrapper's SIGKILL.
        (json!({"pigeons": 9, "cpu": 120, "timeout": 0.5}), "timeout", "sent"),
        // Through `sh -c "z3 ... && true"`: the shell is no run, z3 is.
        (json!({"pigeons": 5, "shell": true}), "exit0", "exit_zero"),
    ];
    let mut worker_seconds = 0.0;
    for (job, outcome, _) in &jobs {
        worker.send(job);
        let (seen, seconds) = worker.done();
        assert_eq!(&seen, outcome, "{job}");
        worker_seconds += seconds;
    }
    // kubelet's exec probe: a shell from outside the container, and the
    // program it starts, are no runs.
    let probe =
        cg.command(Path::new("/bin/sh")).args(["-c", "cat /proc/self/stat >/dev/null; true"]).status();
    assert!(probe.expect("the probe").success());

    let owner = format!("workload=\"{}\"", cg.rel.rsplit_once('/').map(|(pod, _)| pod).unwrap_or_default());
    let want: BTreeMap<String, f64> = jobs.iter().fold(BTreeMap::new(), |mut m, (_, _, ending)| {
        *m.entry(ending.to_string()).or_default() += 1.0;
        m
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let text = daemon.metrics();
        // The refused allocations too: their counter is exported on its
        // own path, which may come a refresh after the runs' endings.
        let refused = text
            .lines()
            .any(|l| l.starts_with("canaryscope_memory_limit_refusals_total{") && l.contains("limit=\"as\""));
        if refused && run_lines(&text, &owner, "canaryscope_run_endings_total", "ending") == want {
            break text;
        }
        assert!(Instant::now() < deadline, "endings {want:?} and refusals of `as`, the daemon has:\n{text}");
        thread::sleep(Duration::from_millis(100));
    };
    // Each run counted once, all of them z3's: neither the worker, its
    // shell, the probe's shell nor cat.
    let executables = run_lines(&metrics, &owner, "canaryscope_run_endings_total", "executable");
    assert_eq!(executables, BTreeMap::from([("z3".to_string(), jobs.len() as f64)]), "{metrics}");
    // The durations are the runs': exec to exit, within the worker's own
    // fork-to-wait times.
    let sum = run_lines(&metrics, &owner, "canaryscope_run_duration_seconds_sum", "executable")["z3"];
    assert!(sum <= worker_seconds && sum >= 0.8 * worker_seconds - 0.05, "{sum} s of {worker_seconds} s");
}

/// Runs scheduled as a rollout does: the pod in the API first, then its
/// container's cgroup, its worker, and its ID reported a moment later.
fn worker_pod(api_port: u16, name: &str, hash: &str, track: &str) -> (NodePod, PodCgroup, Worker) {
    let mut pod = scheduled_pod(name, &random_pod_uid(), track, hash);
    pod["metadata"]["ownerReferences"][0]["name"] = Value::from(format!("solver-{hash}"));
    let node_pod = NodePod::schedule(api_port, pod, Duration::from_millis(300));
    let cg = node_pod.create("worker");
    let worker = Worker::start(python(&cg));
    node_pod.started(&cg);
    (node_pod, cg, worker)
}

/// The judge's run p99 recomputed by tests/judge/runs_oracle.py from the
/// cumulative buckets Prometheus holds at `at` (every run series was born
/// after the canary's first data, so its value is its increase).
fn oracle_p99(prom_port: u16, canary: &str, baseline: &str, at: f64) -> Value {
    let side = |revision: &str| {
        let query =
            format!("canaryscope_run_duration_seconds_bucket{{revision=\"{revision}\",executable=\"z3\"}}");
        let encoded: String = query
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        let (_, body) =
            http_get(prom_port, &format!("/api/v1/query?query={encoded}&time={at}")).expect("Prometheus");
        let answer: Value = serde_json::from_str(&body).expect("JSON");
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        let mut total = 0.0;
        for s in answer["data"]["result"].as_array().expect("a vector") {
            let v: f64 = s["value"][1].as_str().and_then(|v| v.parse().ok()).expect("a value");
            match s["metric"]["le"].as_str().expect("le") {
                "+Inf" => total = v,
                le => buckets.push((le.parse().expect("a bound"), v)),
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (le, cumulative): (Vec<f64>, Vec<f64>) = buckets.into_iter().unzip();
        json!({"le": le, "cumulative": cumulative, "total": total})
    };
    let case = json!([{"kind": "p99", "strata": [{"executable": "z3", "canary": side(canary), "baseline": side(baseline)}]}]);
    let answers = run_oracle("tests/judge/runs_oracle.py", &case, &[]);
    answers.as_array().and_then(|a| a.first()).cloned().expect("one answer")
}

/// Runs per revision in the test below.
const RUNS: usize = 20;

/// [`RUNS`] rounds of one job per worker, one worker after another so that
/// all see the same load; a worker's job is that many copies of the same
/// problem. The seconds each worker saw, by name.
fn rounds<'a>(workers: &mut [(&'a str, &mut Worker, u32)]) -> BTreeMap<&'a str, Vec<f64>> {
    let mut seconds: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _ in 0..RUNS {
        for (name, worker, copies) in workers.iter_mut() {
            worker.send(&json!({"pigeons": 7, "copies": copies}));
            let (outcome, s) = worker.done();
            assert_eq!(outcome, "exit0");
            seconds.entry(*name).or_default().push(s);
        }
    }
    seconds
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
#[ignore = "needs root, z3 and prometheus (scripts/setup.sh); run by `cargo xtask test`"]
fn a_canary_whose_z3_runs_take_three_times_longer_fails_on_the_run_p99() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port, daemon) = Daemon::with_apiserver(&dir, &[]);
    let (_prom, prom_port) = start_prometheus(&dir, daemon.port, None);
    // Stable, a canary three times as slow, and a canary like stable.
    let (_s, _scg, mut stable) = worker_pod(api_port, "solver-stablehash-0", "stablehash", "stable");
    let (_c, _ccg, mut slow) = worker_pod(api_port, "solver-slowhash-0", "slowhash", "canary");
    let (_h, _hcg, mut same) = worker_pod(api_port, "solver-samehash-0", "samehash", "canary");
    // Every run after each revision's first data (its pods' seconds), so
    // the judge counts them all and the oracle can read plain values.
    for hash in ["stablehash", "slowhash", "samehash"] {
        let q = format!("sum(canaryscope_pod_seconds_total{{revision=\"{hash}\"}})");
        wait_prom(prom_port, "pod-seconds", &q, |v| v > 0.0);
    }
    let seconds = rounds(&mut [("stable", &mut stable, 1), ("slow", &mut slow, 3), ("same", &mut same, 1)]);
    for hash in ["stablehash", "slowhash", "samehash"] {
        let q = format!("sum(canaryscope_run_duration_seconds_count{{revision=\"{hash}\"}})");
        wait_prom(prom_port, "every run scraped", &q, |v| v == RUNS as f64);
    }
    let worker_ratio = median(&seconds["slow"]) / median(&seconds["stable"]);
    let p50 = |hash: &str| {
        let q = format!(
            "histogram_quantile(0.5, sum by (le) (canaryscope_run_duration_seconds_bucket{{revision=\"{hash}\"}}))"
        );
        prom_value(prom_port, &q).expect("a p50")
    };
    let daemon_ratio = p50("slowhash") / p50("stablehash");
    eprintln!(
        "slow/stable median: {worker_ratio:.2} by the workers, {daemon_ratio:.2} by the daemon's buckets"
    );
    // Three times the solving, beside z3's start-up of a few tens of ms.
    assert!(worker_ratio > 2.2 && daemon_ratio > 2.2, "{worker_ratio} {daemon_ratio}");

    let end =
        (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock")).as_secs_f64();
    let (_judge, judge_port) = start_judge(prom_port, &[]);
    let ask = |canary: &str| -> Value {
        let path = format!(
            "/v1/judge?namespace={NS}&workload=solver&canary={canary}&baseline=stablehash&window=10m&interval=10m&end={end:.3}"
        );
        ask_judge(judge_port, &path)
    };
    let answer = ask("slowhash");
    assert_eq!(answer["verdict"], "fail", "{answer:#}");
    let p99 = signal(&answer, "run_duration_p99");
    assert_eq!(
        (&p99["verdict"], &p99["rule"]),
        (&json!("fail"), &json!("fisher_exact_stratified")),
        "{p99:#}"
    );
    // One stratum: the node (here its daemon's address) and the executable.
    assert_eq!(p99["nodes_used"], json!([format!("127.0.0.1:{}/z3", daemon.port)]), "{p99:#}");
    // The same p-value from Prometheus' buckets, by the oracle's own rule.
    let oracle = oracle_p99(prom_port, "slowhash", "stablehash", end);
    let (ours, theirs) = (p99["p_value"].as_f64().expect("p"), oracle["p_value"].as_f64().expect("p"));
    assert!((ours - theirs).abs() <= 1e-9 * ours.max(theirs), "judge {ours}, oracle {theirs}: {oracle}");
    assert_eq!(p99["canary_events"].as_f64(), oracle["tables"][0][0].as_f64(), "{oracle}");
    assert_eq!(signal(&answer, "run_limit_endings")["canary_exposure"], RUNS as f64);

    let answer = ask("samehash");
    assert_ne!(answer["verdict"], "fail", "{answer:#}");
    assert_ne!(signal(&answer, "run_duration_p99")["verdict"], "fail", "{answer:#}");
    // The workers go before their cgroups.
    drop((stable, slow, same));
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
