//! `canaryscope judge` over recorded series shaped like real rollouts:
//! counters that reset, pods replaced, revisions retried and rolled back,
//! GPU canaries whose baseline started days earlier, nodes only the canary
//! runs on. The series go through `promtool tsdb create-blocks-from
//! openmetrics` into a real Prometheus, and the real service is asked as
//! Argo and Flagger ask it. Each case has a namespace of its own in one
//! Prometheus, so the whole file starts one Prometheus and one judge.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use test_support::{
    canaryscope, http_request,
    judge::{ask_judge, signal, start_judge},
    k8s::Proc,
    recorded::{Blocks, Rec},
};

/// Where every recording ends (Unix seconds); the judge is asked at it.
const END: i64 = 1_700_000_000 + 3 * 86_400;
/// Samples every 15 s, as a ServiceMonitor scrapes.
const STEP: i64 = 15;

/// A revision's owner labels on a node, as the daemon exports them.
fn owner(ns: &str, workload: &str, revision: &str, node: &str) -> String {
    format!("namespace=\"{ns}\",workload=\"{workload}\",revision=\"{revision}\",track=\"x\",node=\"{node}\"")
}

/// A counter sampled every STEP from `from` to `to` seconds before END,
/// valued by `f` of the seconds before END.
fn rec(metric: &'static str, labels: String, from: i64, to: i64, f: impl Fn(i64) -> f64) -> Rec {
    let samples = (0..=(from - to) / STEP).map(|i| from - i * STEP).map(|b| (END - b, f(b))).collect();
    let family = metric.strip_suffix("_total").unwrap_or(metric);
    Rec { family, kind: "counter", name: metric.to_string(), labels, samples }
}

const POD_SECONDS: &str = "canaryscope_pod_seconds_total";
const CRASHES: &str = "canaryscope_native_crashes_total";
const STARTUPS: &str = "canaryscope_gpu_startups_total";

/// Pod-seconds of `pods` pods running from `from` to `to` seconds before END.
fn pods(ns: &str, workload: &str, revision: &str, node: &str, pods: f64, from: i64, to: i64) -> Rec {
    rec(POD_SECONDS, owner(ns, workload, revision, node), from, to, |b| pods * (from - b) as f64)
}

/// One pod's crash counter from `from` to `to` seconds before END, stepping
/// at each of `at` (seconds before END).
fn crashes(ns: &str, workload: &str, revision: &str, node: &str, span: (i64, i64), at: &[i64]) -> Rec {
    let labels = format!(
        "{},pod=\"{revision}-{node}\",container=\"c\",signal=\"SIGSEGV\",library=\"l\"",
        owner(ns, workload, revision, node)
    );
    rec(CRASHES, labels, span.0, span.1, |b| at.iter().filter(|a| **a >= b).count() as f64)
}

/// A Prometheus over blocks of one case's series and a judge asking it,
/// both stopped when the test ends.
struct Recorded {
    judge_port: u16,
    prom_port: u16,
    // Dropped in this order: the judge, then Prometheus and its files.
    _judge: Proc,
    _blocks: Blocks,
}

fn recorded(case: Case) -> Recorded {
    let blocks = Blocks::new("judge-recorded", &case());
    let (judge, judge_port) = start_judge(blocks.port, &[]);
    Recorded { judge_port, prom_port: blocks.port, _judge: judge, _blocks: blocks }
}

/// Argo's question about `canary` against `baseline` of `ns`/`infer`.
fn ask_on(port: u16, ns: &str, canary: &str, baseline: &str, extra: &str) -> Value {
    let path = format!(
        "/v1/judge?namespace={ns}&workload=infer&canary={canary}&baseline={baseline}&window=1h&interval=5m&end={END}{extra}"
    );
    ask_judge(port, &path)
}

fn ask(r: &Recorded, ns: &str, extra: &str) -> Value {
    ask_on(r.judge_port, ns, "canary", "stable", extra)
}

type Case = fn() -> Vec<Rec>;

/// A daemon restart 30 minutes before the end zeroes every series on the
/// node. The baseline (three pods for hours) had 30 crashes before the
/// window, 33 before the canary's first data, 40 at the restart and 32
/// after it: 39 over the canary's span. The canary (one pod from 50
/// minutes before the end) had 4 before the restart and 10 after.
fn restart() -> Vec<Rec> {
    let ns = "restart";
    let stable_ps =
        |b: i64| if b >= 1800 { 20_000.0 + 3.0 * (5400 - b) as f64 } else { 3.0 * (1800 - b) as f64 };
    let stable_crashes = |b: i64| match b {
        3600.. => 30.0,
        1800.. => 30.0 + ((3600 - b) / 180) as f64,
        _ => ((1800 - b) as f64 * 32.0 / 1800.0).floor(),
    };
    let canary_ps = |b: i64| if b >= 1800 { (3000 - b) as f64 } else { (1800 - b) as f64 };
    let canary_crashes =
        |b: i64| if b >= 1800 { ((3000 - b) / 300) as f64 } else { ((1800 - b) as f64 / 180.0).floor() };
    let crash_labels = |revision| {
        format!(
            "{},pod=\"p\",container=\"c\",signal=\"SIGSEGV\",library=\"l\"",
            owner(ns, "infer", revision, "node-a")
        )
    };
    vec![
        rec(POD_SECONDS, owner(ns, "infer", "stable", "node-a"), 5400, 0, stable_ps),
        rec(CRASHES, crash_labels("stable"), 5400, 0, stable_crashes),
        rec(POD_SECONDS, owner(ns, "infer", "canary", "node-a"), 3000, 0, canary_ps),
        rec(CRASHES, crash_labels("canary"), 3000, 0, canary_crashes),
    ]
}

/// The canary's only pod ran 2,475 s and crashed twice; it was replaced
/// six minutes later, after its series were purged, and its revision's
/// pod-seconds began again from 0. Stable's three pods crashed 6 times.
fn replaced() -> Vec<Rec> {
    let ns = "replaced";
    vec![
        pods(ns, "infer", "stable", "node-a", 3.0, 5400, 0),
        crashes(ns, "infer", "stable", "node-a", (5400, 0), &[3000, 2400, 1900, 1200, 700, 100]),
        pods(ns, "infer", "canary", "node-a", 1.0, 3000, 525),
        crashes(ns, "infer", "canary", "node-a", (3000, 230), &[2000, 1000]),
        pods(ns, "infer", "canary", "node-a", 1.0, 165, 0),
    ]
}

/// A canary aborted after 4 crashes in 10 minutes and retried with the
/// same pod-template hash 43 minutes later; 2 minutes into the new try.
fn retried() -> Vec<Rec> {
    let ns = "retried";
    vec![
        pods(ns, "infer", "stable", "node-a", 3.0, 5400, 0),
        pods(ns, "infer", "canary", "node-a", 1.0, 3300, 2700),
        crashes(ns, "infer", "canary", "node-a", (3300, 2400), &[3200, 3100, 3000, 2800]),
        pods(ns, "infer", "canary", "node-a", 1.0, 120, 0),
    ]
}

/// A GPU canary: stable's 20 pods on two nodes started two days ago (10
/// start-ups each, none failed) and have not restarted since; the canary's
/// 12 pods started 25 minutes before the end, healthy.
fn gpu() -> Vec<Rec> {
    let ns = "gpu";
    let mut recs = Vec::new();
    for node in ["node-a", "node-b"] {
        let labels = |revision| format!("{},api=\"hip\"", owner(ns, "infer", revision, node));
        let history = 2 * 86_400;
        recs.push(rec(STARTUPS, labels("stable"), history, 0, |b| ((history - b) / 60).min(10) as f64));
        recs.push(pods(ns, "infer", "stable", node, 10.0, history, 0));
        recs.push(rec(STARTUPS, labels("canary"), 1500, 0, |b| ((1500 - b) / 15).min(6) as f64));
        recs.push(pods(ns, "infer", "canary", node, 6.0, 1500, 0));
    }
    recs
}

/// One canary crash in 1,800 pod-seconds against none in 5,400.
fn one_against_none() -> Vec<Rec> {
    let ns = "evidence";
    vec![
        pods(ns, "infer", "stable", "node-a", 3.0, 5400, 0),
        pods(ns, "infer", "canary", "node-a", 1.0, 1800, 0),
        crashes(ns, "infer", "canary", "node-a", (1800, 0), &[900]),
    ]
}

/// The canary is clean on node-a, which both run, and crashes 10 times
/// on node-b, which only it runs; its data began 1,000 s before the end.
fn alone() -> Vec<Rec> {
    let ns = "alone";
    vec![
        pods(ns, "infer", "stable", "node-a", 3.0, 5400, 0),
        pods(ns, "infer", "canary", "node-a", 1.0, 1000, 0),
        pods(ns, "infer", "canary", "node-b", 1.0, 1000, 0),
        crashes(
            ns,
            "infer",
            "canary",
            "node-b",
            (1000, 0),
            &[950, 900, 800, 700, 600, 500, 400, 300, 200, 100],
        ),
    ]
}

/// Flagger: release `bad` crashed 12 times and was rolled back 35 minutes
/// before the end; the fix (`fix`) was deployed 30 minutes after it and
/// runs clean beside the primary's three pods.
fn rolled_back() -> Vec<Rec> {
    let ns = "flagger";
    let at: Vec<i64> = (0..12).map(|i| 2950 - 60 * i).collect();
    vec![
        pods(ns, "svc-primary", "prim", "node-a", 3.0, 5400, 0),
        pods(ns, "svc", "bad", "node-a", 1.0, 3000, 2100),
        crashes(ns, "svc", "bad", "node-a", (3000, 2100), &at),
        pods(ns, "svc", "fix", "node-a", 1.0, 1200, 0),
    ]
}

/// Five canary crashes in its first look and none since, against none in
/// 2.8 times its exposure: enough to fail at look 1 (p = 0.0052 against
/// 0.01), not at look 5 (against 0.003).
fn sticky() -> Vec<Rec> {
    let ns = "sticky";
    vec![
        pods(ns, "infer", "stable", "node-a", 2.8, 5400, 0),
        pods(ns, "infer", "canary", "node-a", 1.0, 1500, 0),
        crashes(ns, "infer", "canary", "node-a", (1500, 0), &[1450, 1400, 1350, 1300, 1250]),
    ]
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn a_daemon_restart_is_a_reset_and_the_value_before_the_window_is_not_subtracted_from_it() {
    let r = recorded(restart);
    let answer = ask(&r, "restart", "");
    let c = signal(&answer, "native_crashes");
    assert_ne!(answer["verdict"], "fail", "{answer:#}");
    let counts = [&c["canary_events"], &c["canary_exposure"], &c["baseline_events"], &c["baseline_exposure"]];
    // The scrape that straddles the span's start counts whole: 9,045.
    assert_eq!(counts.map(|v| v.as_f64()), [Some(14.0), Some(3000.0), Some(39.0), Some(9045.0)], "{c:#}");
    let from = c["baseline_span"]["from"].as_f64().expect("span");
    assert!((from - (END - 3000) as f64).abs() < 1.0, "{c:#}");
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn a_pod_replaced_after_its_series_were_purged_adds_to_its_revision() {
    let r = recorded(replaced);
    let answer = ask(&r, "replaced", "");
    assert_ne!(answer["verdict"], "fail", "{answer:#}");
    let c = signal(&answer, "native_crashes");
    assert_eq!(
        (c["canary_events"].as_u64(), c["canary_exposure"].as_f64()),
        (Some(2), Some(2640.0)),
        "{c:#}"
    );
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn a_retried_revision_is_judged_on_its_current_try() {
    let r = recorded(retried);
    let answer = ask(&r, "retried", "");
    assert_ne!(answer["verdict"], "fail", "{answer:#}");
    let c = signal(&answer, "native_crashes");
    assert_eq!((c["canary_events"].as_u64(), c["canary_exposure"].as_f64()), (Some(0), Some(120.0)), "{c:#}");
    assert_eq!(answer["look"], 1, "{answer:#}");
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn a_gpu_canary_is_compared_with_its_baselines_start_ups_of_days_before() {
    let r = recorded(gpu);
    let answer = ask(&r, "gpu", "");
    assert_eq!(answer["verdict"], "pass", "{answer:#}");
    let s = signal(&answer, "gpu_startup_failures");
    assert_eq!(
        (s["canary_exposure"].as_f64(), s["baseline_exposure"].as_f64()),
        (Some(12.0), Some(20.0)),
        "{s:#}"
    );
    let from = s["baseline_span"]["from"].as_f64().expect("span");
    assert!((from - (END - 7 * 86_400) as f64).abs() < 1.0, "the lookback's start: {s:#}");
    let canary_from = s["canary_span"]["from"].as_f64().expect("span");
    assert!((canary_from - (END - 1500) as f64).abs() < 1.0, "{s:#}");
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn one_canary_event_against_none_is_not_a_pass() {
    let r = recorded(one_against_none);
    let answer = ask(&r, "evidence", "");
    assert_eq!(answer["verdict"], "inconclusive", "{answer:#}");
    let c = signal(&answer, "native_crashes");
    assert_eq!(c["rule"], "not_shown_no_worse", "{c:#}");
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn events_on_a_node_without_the_baseline_are_told_and_never_pass() {
    let r = recorded(alone);
    let answer = ask(&r, "alone", "");
    assert_eq!(answer["verdict"], "inconclusive", "{answer:#}");
    assert!(answer["reason"].as_str().is_some_and(|r| r.contains("node-b")), "{answer:#}");
    let c = signal(&answer, "native_crashes");
    assert_eq!(
        (c["canary_only"]["events"].as_u64(), &c["canary_only"]["nodes"]),
        (Some(10), &serde_json::json!(["node-b"])),
        "{c:#}"
    );
    // Its data began 1,000 s before the end: look 4 at 5-minute intervals.
    assert_eq!(answer["look"], 4, "{answer:#}");
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn flaggers_canary_is_the_targets_current_revision() {
    let r = recorded(rolled_back);
    let body = format!(
        r#"{{"name":"svc","namespace":"flagger","phase":"Progressing","metadata":{{"interval":"5m","window":"1h","end":"{END}"}}}}"#
    );
    let (code, answer) = http_request(r.judge_port, "POST", "/v1/flagger/rollout", &body).expect("answer");
    assert_eq!(code, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).expect("json");
    assert_eq!(answer["question"]["canary"]["revision"], "fix", "{answer:#}");
    assert_eq!(signal(&answer, "native_crashes")["canary_events"], 0, "{answer:#}");
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn a_failure_at_an_earlier_look_stays_a_failure_on_the_same_counts() {
    let r = recorded(sticky);
    let answer = ask(&r, "sticky", "");
    assert_eq!(answer["look"], 5, "{answer:#}");
    assert_eq!(answer["verdict"], "fail", "{answer:#}");
    assert!(answer["reason"].as_str().is_some_and(|r| r.contains("failed at look 1")), "{answer:#}");
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn questions_that_would_mislead_are_refused_or_inconclusive() {
    let r = recorded(restart);
    let port = r.judge_port;
    let path = |extra: &str| format!("/v1/judge?namespace=restart&workload=infer&end={END}&window=1h{extra}");
    let (code, body) =
        http_request(port, "GET", &path("&canary=canary&baseline=stable&interval=1s"), "").expect("answer");
    assert_eq!((code, body.lines().count()), (400, 1), "{body}");
    assert!(body.contains("interval"), "{body}");
    let (code, body) =
        http_request(port, "GET", &path("&canary=canary&baseline=canary"), "").expect("answer");
    assert_eq!((code, body.lines().count()), (400, 1), "{body}");
    assert!(body.contains("baseline"), "{body}");
    // The canary's data began 50 minutes before the end: a 20-minute
    // window would leave out its first 30 minutes.
    let answer = ask(&r, "restart", "&window=20m");
    assert_eq!(answer["verdict"], "inconclusive", "{answer:#}");
    assert!(answer["reason"].as_str().is_some_and(|r| r.contains("began before")), "{answer:#}");
    // A window that ends before the canary's first data.
    let answer = ask(&r, "restart", &format!("&end={}", END - 3300));
    assert_eq!(answer["verdict"], "inconclusive", "{answer:#}");
    assert!(answer["reason"].as_str().is_some_and(|r| r.contains("no data for the canary")), "{answer:#}");
}

/// A stand-in for a slow Prometheus: every request waits `delay`, then goes
/// to the real one. Returns its port.
fn slow_proxy(target: u16, delay: Duration) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    thread::spawn(move || {
        for client in listener.incoming().flatten() {
            thread::spawn(move || forward(client, target, delay));
        }
    });
    port
}

fn forward(mut client: TcpStream, target: u16, delay: Duration) {
    let mut request = Vec::new();
    let mut chunk = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&chunk[..n]),
        }
    }
    thread::sleep(delay);
    let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", target)) else { return };
    let mut answer = Vec::new();
    if upstream.write_all(&request).is_ok() && upstream.read_to_end(&mut answer).is_ok() {
        let _ = client.write_all(&answer);
    }
}

#[test]
#[ignore = "needs prometheus and promtool (Debian's prometheus package); run by `cargo xtask test`"]
fn queries_run_at_once_under_one_deadline_that_names_what_was_slow() {
    let shared = recorded(restart);
    // Each query takes 1 s: one after another, 20 of them would take 20 s.
    let proxy = slow_proxy(shared.prom_port, Duration::from_secs(1));
    let (_judge, port) = start_judge(proxy, &["--deadline", "5s"]);
    let started = Instant::now();
    let answer = ask_on(port, "restart", "canary", "stable", "");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(signal(&answer, "native_crashes")["canary_events"], 14, "{answer:#}");
    let (_judge, port) = start_judge(proxy, &["--deadline", "500ms"]);
    let answer = ask_on(port, "restart", "canary", "stable", "");
    assert_eq!(answer["verdict"], "inconclusive", "{answer:#}");
    let reason = answer["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("deadline of 0.5s") && reason.contains("canary canaryscope_pod_seconds_total"),
        "{reason}"
    );
}

/// The independent simulation (`tests/judge/simulate.py`, which shares no
/// code with the judge), small and seeded: 20 analyses a case through a
/// real Prometheus and the real service, each of issue 50's defects a case
/// of its own. The bench runs 1,000 a case.
#[test]
#[ignore = "needs prometheus, promtool and numpy; run by `cargo xtask test`"]
fn an_independent_simulation_through_prometheus_meets_the_targets() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/judge/simulate.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(["--judge", &canaryscope().to_string_lossy(), "--analyses", "20", "--seed", "50"])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    let sampler = report["sampler"].as_array().expect("sampler checks");
    assert!(!sampler.is_empty() && sampler.iter().all(|c| c["ok"] == true), "{report:#}");
    let case = |name: &str| -> &Value {
        let cases = report["cases"].as_array().expect("cases");
        cases.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no case {name}"))
    };
    let share = |name: &str, what: &str| case(name)[what].as_f64().unwrap_or(f64::NAN);
    // Within tolerance, nothing fails in 20; at 5x nearly all do. The runs:
    // as long, exactly 1.25x as long, the baseline's share of limit endings
    // are within it; twice as long, three times the share are not.
    let within =
        ["equal", "edge", "restart", "retried", "canary_only", "gpu_equal", "gpu_rare", "flagger_newest"];
    let runs_within = ["runs_p99_equal", "runs_p99_edge", "runs_limits_edge"];
    for name in within.iter().chain(&runs_within) {
        assert!(share(name, "failed_share") <= 0.05, "{name}: {report:#}");
    }
    for name in ["detect", "gpu_detect", "runs_p99_detect", "runs_limits_detect"] {
        assert!(share(name, "failed_share") >= 0.85, "{name}: {report:#}");
        // A worse canary never passes: a pass must be shown.
        assert_eq!(share(name, "passed_share"), 0.0, "{name}: {report:#}");
    }
    // A GPU canary whose baseline started days before can pass: most
    // healthy ones with rare start-up failures do (about two in three).
    assert!(share("gpu_rare", "passed_share") >= 0.4, "{report:#}");
    // Flagger's answers are about the Deployment's newest revision only.
    assert_eq!(share("flagger_newest", "newest_judged_share"), 1.0, "{report:#}");
    // The parameters and the deadline get their documented answers.
    for name in ["parameters", "deadline"] {
        assert_eq!(share(name, "as_documented_share"), 1.0, "{name}: {report:#}");
    }
}
