//! `canaryscope judge` end to end: the real daemon counts GPU start-ups of
//! pods of several revisions (stand-in API server, real cgroups, the real
//! HIP runtime failing below the ZLUDA-shaped library), a real Prometheus
//! scrapes it, and the judge answers from Prometheus as Argo's `web`
//! provider asks it. Then the multi-node cases over recorded series
//! (`promtool tsdb create-blocks-from openmetrics`), where a node-wide
//! fault must not fail the canary and a fault on most nodes must.

use std::{
    fs, thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use test_support::{
    assert_root, fixture, http_get, http_request,
    judge::{ask_judge, signal, start_judge},
    k8s::{prom_query, prom_value, scheduled_pod, scratch_dir, start_prometheus, wait_prom, NodePod, NS},
    random_pod_uid,
    recorded::Blocks,
    Daemon, PodCgroup,
};

/// The judge's answer to Argo's question about `canary` against `baseline`.
fn ask(judge_port: u16, canary: &str, baseline: &str, extra: &str) -> Value {
    let path = format!(
        "/v1/judge?namespace={NS}&workload=infer&canary={canary}&baseline={baseline}&window=10m&interval=10m{extra}"
    );
    ask_judge(judge_port, &path)
}

/// Pods of one revision, created in the API as a rollout's ReplicaSet does,
/// then started: `failing` of them run a start-up that fails (the real HIP
/// runtime finds no GPU), the rest a healthy one.
fn start_pods(api_port: u16, hash: &str, track: &str, total: usize, failing: usize) -> Vec<PodCgroup> {
    start_workload_pods(api_port, "infer", hash, track, total, failing)
}

/// As [`start_pods`], for pods of the Deployment `workload` (its
/// ReplicaSet `<workload>-<hash>`).
fn start_workload_pods(
    api_port: u16,
    workload: &str,
    hash: &str,
    track: &str,
    total: usize,
    failing: usize,
) -> Vec<PodCgroup> {
    // As the kubelet runs them: scheduled with their containers waiting,
    // each container's ID reported a moment after it starts.
    let pods: Vec<Value> = (0..total)
        .map(|i| {
            let mut p = scheduled_pod(&format!("{workload}-{hash}-{i}"), &random_pod_uid(), track, hash);
            p["metadata"]["ownerReferences"][0]["name"] = Value::from(format!("{workload}-{hash}"));
            p
        })
        .collect();
    let node_pods = NodePod::schedule_all(api_port, pods, Duration::from_millis(300));
    let mut cgroups = Vec::new();
    for (i, node_pod) in node_pods.iter().enumerate() {
        let cg = node_pod.create("worker");
        let mut start = cg.command(&fixture("cuda_app"));
        start.arg("--alloc");
        if i >= failing {
            start.env("ZLUDA_FIXTURE_HEALTHY", "1");
        }
        let out = node_pod.output(&cg, &mut start);
        assert!(out.status.success(), "{out:?}");
        let printed = String::from_utf8_lossy(&out.stdout);
        assert_eq!(printed.contains("cuInit=0"), i >= failing, "{printed}");
        cgroups.push(cg);
    }
    cgroups
}

#[test]
#[ignore = "needs root, the HIP runtime and prometheus; run by `cargo xtask test`"]
fn the_judge_fails_failing_start_ups_waits_on_little_data_and_passes_a_healthy_canary() {
    assert_root();
    let dir = scratch_dir();
    // The daemon first, as on a node: every pod below is scheduled to it
    // while it runs.
    let (_api, api_port, daemon) = Daemon::with_apiserver(&dir, &[]);
    let (_prom, prom_port) = start_prometheus(&dir, daemon.port, None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while prom_query(prom_port, "up{job=\"canaryscope\"} == 1").is_empty() {
        assert!(Instant::now() < deadline, "Prometheus never scraped the daemon");
        thread::sleep(Duration::from_millis(200));
    }

    // Stable's 20 healthy start-ups; a canary failing 8 of 20; a canary too
    // small to tell (1 of 2 against 0 of 2); a healthy canary of 12.
    let _stable = start_pods(api_port, "stablehash", "stable", 20, 0);
    let _bad = start_pods(api_port, "badhash", "canary", 20, 8);
    let _small_stable = start_pods(api_port, "smallstable", "stable", 2, 0);
    let _small = start_pods(api_port, "smallhash", "canary", 2, 1);
    let _good = start_pods(api_port, "goodhash", "canary", 12, 0);
    // Flagger's pair: the target Deployment's pods and its primary's.
    let _flagger_canary = start_workload_pods(api_port, "svc", "svchash", "canary", 20, 8);
    let _flagger_primary = start_workload_pods(api_port, "svc-primary", "primaryhash", "stable", 20, 0);

    let startups = |hash: &str| format!("sum(canaryscope_gpu_startups_total{{revision=\"{hash}\"}})");
    let failures = |hash: &str| format!("sum(canaryscope_gpu_startup_failures_total{{revision=\"{hash}\"}})");
    wait_prom(prom_port, "the failing canary's start-ups", &failures("badhash"), |v| v == 8.0);
    wait_prom(prom_port, "the small canary's failure", &failures("smallhash"), |v| v == 1.0);
    wait_prom(prom_port, "Flagger's canary's failures", &failures("svchash"), |v| v == 8.0);
    // Every failing start-up is held to its first call; a healthy one whose
    // first call raced the attach may go uncounted, never miscounted.
    for (hash, total) in [
        ("badhash", 20.0),
        ("stablehash", 20.0),
        ("goodhash", 12.0),
        ("smallstable", 2.0),
        ("primaryhash", 20.0),
    ] {
        wait_prom(prom_port, "start-ups", &startups(hash), |v| v >= total - 1.0 && v <= total);
    }
    // Enough pod-seconds for the healthy canary to pass (12 pods, 10 s steps).
    wait_prom(prom_port, "pod-seconds", "sum(canaryscope_pod_seconds_total{revision=\"goodhash\"})", |v| {
        v >= 60.0
    });
    assert_eq!(prom_value(prom_port, &failures("stablehash")).unwrap_or(0.0), 0.0);

    let (_judge, judge_port) = start_judge(prom_port, &["--min-pod-seconds", "60"]);
    let bad = ask(judge_port, "badhash", "stablehash", "");
    assert_eq!(bad["verdict"], "fail", "{bad:#}");
    let startup = signal(&bad, "gpu_startup_failures");
    assert_eq!(startup["canary_events"], 8, "{startup:#}");
    assert!(startup["p_value"].as_f64().is_some_and(|p| p < 0.01), "{startup:#}");
    assert!(startup["rule"].as_str().is_some_and(|r| r.contains("fisher")), "{startup:#}");

    let small = ask(judge_port, "smallhash", "smallstable", "");
    assert_eq!(small["verdict"], "inconclusive", "{small:#}");

    let good = ask(judge_port, "goodhash", "stablehash", "");
    assert_eq!(good["verdict"], "pass", "{good:#}");
    assert_eq!(signal(&good, "gpu_startup_failures")["canary_events"], 0);

    // Flagger: a failing canary fails its rollout hook (409, toward the
    // rollback threshold) and holds its promotion (412); a Canary with no
    // data is not a failure (200) but holds the promotion.
    let flagger = |hook: &str, name: &str| {
        let body = format!(
            r#"{{"name":"{name}","namespace":"{NS}","phase":"Progressing","metadata":{{"interval":"10m","window":"10m"}}}}"#
        );
        http_request(judge_port, "POST", &format!("/v1/flagger/{hook}"), &body).expect("the judge answers")
    };
    let (code, body) = flagger("rollout", "svc");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("\"verdict\": \"fail\""), "{body}");
    assert_eq!(flagger("confirm-promotion", "svc").0, 412);
    assert_eq!(flagger("rollout", "nosuchcanary").0, 200);
    assert_eq!(flagger("confirm-promotion", "nosuchcanary").0, 412);

    // Unknown workloads and unreachable data are never a pass.
    let unknown = ask(judge_port, "nosuchhash", "stablehash", "");
    assert_eq!(unknown["verdict"], "inconclusive", "{unknown:#}");
    assert!(unknown["reason"].as_str().is_some_and(|r| r.contains("no data")), "{unknown:#}");
    let (code, body) = http_get(judge_port, "/v1/judge?namespace=x&workload=y&canary=z").expect("answer");
    assert_eq!((code, body.trim()), (400, "missing `baseline`"));
    drop(daemon);
    let _ = fs::remove_dir_all(&dir);
}

/// One node's counters for one revision, as a daemon on it exports them.
struct Recorded {
    node: &'static str,
    revision: &'static str,
    pods: u32,
    /// Crashes by the minute they happened in (0-based, of 20).
    crashes_at: Vec<u32>,
}

/// OpenMetrics text of `series` sampled every 15 s for 20 minutes ending at
/// `end`: pod-seconds grow with the pods, crashes step at their minute.
fn openmetrics(series: &[Recorded], end: i64) -> String {
    let start = end - 20 * 60;
    let mut pod_seconds = String::from("# TYPE canaryscope_pod_seconds counter\n");
    let mut crashes = String::from("# TYPE canaryscope_native_crashes counter\n");
    for s in series {
        let owner = format!(
            "namespace=\"{NS}\",workload=\"infer\",revision=\"{}\",track=\"x\",node=\"{}\"",
            s.revision, s.node
        );
        for t in (start..=end).step_by(15) {
            let elapsed = (t - start) as f64;
            pod_seconds.push_str(&format!(
                "canaryscope_pod_seconds_total{{{owner}}} {} {t}\n",
                elapsed * f64::from(s.pods)
            ));
            let n = s.crashes_at.iter().filter(|m| i64::from(**m) * 60 < t - start).count();
            crashes.push_str(&format!(
                "canaryscope_native_crashes_total{{{owner},pod=\"p\",container=\"c\",signal=\"SIGSEGV\",library=\"libamdhip64.so\"}} {n} {t}\n"
            ));
        }
    }
    format!("{pod_seconds}{crashes}# EOF\n")
}

/// A Prometheus over blocks made from `series` (no scraping), the judge
/// asking it at the end of the recording.
fn judge_recorded(series: &[Recorded]) -> Value {
    let end = 1_700_000_000i64 + 3600 * 3;
    let blocks = Blocks::from_openmetrics("judge-nodes", &openmetrics(series, end));
    let (_judge, judge_port) = start_judge(blocks.port, &[]);
    ask(judge_port, "canary", "stable", &format!("&window=30m&interval=5m&end={end}"))
}

#[test]
#[ignore = "needs prometheus, promtool and the release binary; run by `cargo xtask test`"]
fn a_node_wide_fault_is_not_the_canarys_and_a_fault_on_most_nodes_is() {
    let r = |node, revision, pods, crashes_at: &[u32]| Recorded {
        node,
        revision,
        pods,
        crashes_at: crashes_at.to_vec(),
    };
    // A GPU reset on node-b at minute 12 kills every pod there, of both
    // revisions (one canary pod and three stable ones).
    let reset = [
        r("node-a", "canary", 1, &[]),
        r("node-a", "stable", 3, &[]),
        r("node-b", "canary", 1, &[12]),
        r("node-b", "stable", 3, &[12, 12, 12]),
        r("node-c", "canary", 1, &[]),
        r("node-c", "stable", 3, &[]),
    ];
    let answer = judge_recorded(&reset);
    assert_ne!(answer["verdict"], "fail", "{answer:#}");
    let crashes = signal(&answer, "native_crashes");
    assert_eq!((crashes["canary_events"].as_u64(), crashes["baseline_events"].as_u64()), (Some(1), Some(3)));
    // The canary crashes on two of three nodes where stable never does.
    let fault = [
        r("node-a", "canary", 1, &[1, 2, 4, 6, 9, 13]),
        r("node-a", "stable", 3, &[]),
        r("node-b", "canary", 1, &[3, 5, 7, 10, 12, 16]),
        r("node-b", "stable", 3, &[]),
        r("node-c", "canary", 1, &[]),
        r("node-c", "stable", 3, &[]),
    ];
    let answer = judge_recorded(&fault);
    assert_eq!(answer["verdict"], "fail", "{answer:#}");
    assert_eq!(signal(&answer, "native_crashes")["canary_events"], 12, "{answer:#}");
    // A node running only the canary is reported, not used to blame.
    let alone = [r("node-a", "canary", 1, &[2, 5, 9, 14, 15, 17]), r("node-b", "stable", 3, &[])];
    let answer = judge_recorded(&alone);
    assert_ne!(answer["verdict"], "fail", "{answer:#}");
}
