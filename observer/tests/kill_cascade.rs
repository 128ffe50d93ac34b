//! A kill cascade end to end: the solver runbook's poison job, redelivered
//! from worker to worker, OOM-kills pods of both revisions (real OOM kills
//! in real memory-limited cgroups, seen by the real daemon). A real
//! Prometheus evaluates deploy/prometheus/rules.yaml (the cascade's
//! recording rules and CanaryscopeKillCascade), and the judge says a
//! cascade is under way, naming its pods, rather than blaming the canary
//! it hit most; with the cascade rule raised past three pods, the same
//! counts fail the canary.
use std::{os::unix::process::ExitStatusExt, process::Stdio, time::Duration};

use serde_json::Value;
use test_support::{
    assert_root, fixture,
    judge::{ask_judge, signal, start_judge},
    k8s::{repo, scheduled_pod, scratch_dir, start_prometheus, wait_prom, NodePod, Proc, NS},
    random_pod_uid, Daemon, PodCgroup,
};

/// A pod of the `solver` workload running its worker (a long sleep here),
/// scheduled as a rollout does, its container limited to 50 MiB.
fn solver_pod(api_port: u16, hash: &str, track: &str, i: usize) -> (Proc, PodCgroup, NodePod) {
    let mut pod = scheduled_pod(&format!("solver-{hash}-{i}"), &random_pod_uid(), track, hash);
    pod["metadata"]["ownerReferences"][0]["name"] = Value::from(format!("solver-{hash}"));
    let node_pod = NodePod::schedule(api_port, pod, Duration::from_millis(300));
    let mut cg = node_pod.create("worker");
    cg.limit_memory(50 << 20);
    let worker = Proc(node_pod.spawn(&cg, cg.command(std::path::Path::new("/bin/sleep")).arg("600")));
    // Dropped in this order: the worker, then its cgroup.
    (worker, cg, node_pod)
}

fn ask(judge_port: u16) -> Value {
    let path = format!(
        "/v1/judge?namespace={NS}&workload=solver&canary=poisonhash&baseline=stablehash&window=10m&interval=10m"
    );
    ask_judge(judge_port, &path)
}

#[test]
#[ignore = "needs root and prometheus; run by `cargo xtask test`"]
fn an_oom_cascade_across_three_pods_of_two_revisions_is_named_not_blamed_on_the_canary() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port, daemon) = Daemon::with_apiserver(&dir, &[]);
    let rules = repo().join("deploy/prometheus/rules.yaml");
    let (_prom, prom_port) = start_prometheus(&dir, daemon.port, Some(&rules));
    // Two canary pods and four stable ones.
    let canary: Vec<_> = (0..2).map(|i| solver_pod(api_port, "poisonhash", "canary", i)).collect();
    let stable: Vec<_> = (0..4).map(|i| solver_pod(api_port, "stablehash", "stable", i)).collect();
    // The kills come after each revision's first data (its pods' seconds).
    for hash in ["poisonhash", "stablehash"] {
        let q = format!("sum(canaryscope_pod_seconds_total{{revision=\"{hash}\"}})");
        wait_prom(prom_port, "pod-seconds", &q, |v| v > 0.0);
    }
    // The poison job: canary pod 0, stable pod 0 (the old revision dies of
    // the new one's poison), canary pod 1, then back and forth between the
    // canary pods as the queue redelivers it.
    let poison = |cg: &PodCgroup| {
        let out = cg.command(&fixture("oom_hog")).arg("200").stdout(Stdio::null()).output().expect("oom_hog");
        assert_eq!(out.status.signal(), Some(9), "OOM-killed: {out:?}");
    };
    poison(&canary[0].1);
    poison(&stable[0].1);
    poison(&canary[1].1);
    for _ in 0..4 {
        poison(&canary[0].1);
        poison(&canary[1].1);
    }
    wait_prom(
        prom_port,
        "canary OOM kills",
        "sum(canaryscope_oom_kills_total{revision=\"poisonhash\"})",
        |v| v == 10.0,
    );
    wait_prom(
        prom_port,
        "stable OOM kills",
        "sum(canaryscope_oom_kills_total{revision=\"stablehash\"})",
        |v| v == 1.0,
    );
    // The rules see it: three pods, two revisions, the alert firing.
    let pods = "canaryscope:kill_cascade_pods:10m{workload=\"solver\"}";
    wait_prom(prom_port, "the cascade's pods", pods, |v| v == 3.0);
    let revisions = "canaryscope:kill_cascade_revisions:10m{workload=\"solver\"}";
    wait_prom(prom_port, "the cascade's revisions", revisions, |v| v == 2.0);
    let alert = "ALERTS{alertname=\"CanaryscopeKillCascade\",alertstate=\"firing\",workload=\"solver\"}";
    wait_prom(prom_port, "CanaryscopeKillCascade", alert, |v| v == 1.0);

    // The judge names the cascade and sets its kills aside.
    let (_judge, judge_port) = start_judge(prom_port, &[]);
    let answer = ask(judge_port);
    assert_eq!(answer["verdict"], "inconclusive", "{answer:#}");
    let reason = answer["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("cascade under way: 3 pods"), "{reason}");
    for name in ["solver-poisonhash-0", "solver-poisonhash-1", "solver-stablehash-0"] {
        assert!(reason.contains(name), "{name} in {reason}");
    }
    let cascade = &answer["cascade"];
    assert_eq!(cascade["pods"].as_array().map(Vec::len), Some(3), "{cascade:#}");
    assert_eq!(cascade["revisions"], serde_json::json!(["poisonhash", "stablehash"]), "{cascade:#}");
    let oom = signal(&answer, "oom_kills");
    assert_eq!((&oom["rule"], oom["canary_events"].as_u64()), (&Value::from("cascade"), Some(10)), "{oom:#}");

    // Without the cascade (four pods needed, three were hit), the same
    // counts blame the canary: 10 kills in 2 pods against 1 in 4.
    let (_strict, strict_port) = start_judge(prom_port, &["--cascade-pods", "4"]);
    let answer = ask(strict_port);
    assert_eq!(answer["verdict"], "fail", "{answer:#}");
    assert_eq!(signal(&answer, "oom_kills")["verdict"], "fail", "{answer:#}");
    assert_eq!(answer["cascade"], Value::Null);
    drop((canary, stable, daemon));
    let _ = std::fs::remove_dir_all(&dir);
}
