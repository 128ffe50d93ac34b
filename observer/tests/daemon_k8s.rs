//! The daemon as a DaemonSet would run it, against a stand-in Kubernetes API
//! server (tests/fake-apiserver: the only mocked part, serving real Pod
//! objects to kube-rs) and a real Prometheus evaluating the shipped alert
//! rules and the Argo Rollouts analysis query. Two "pods" on this node,
//! canary and stable, are real cgroups laid out as kubelet + containerd do.

use std::{
    fs,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::json;
use test_support::{
    assert_root, entry_bytes, fixture,
    k8s::{
        control, node_daemon, prom_query, repo, schedule_canary_and_stable, scheduled_pod, scratch_dir,
        start_apiserver, start_prometheus, write_kubeconfig, NodePod, NS,
    },
    metric_value, out_pid, random_pod_uid, wait_trapped, Daemon, PodCgroup, Stepped, BREAKPOINT,
};

#[expect(clippy::too_many_lines, reason = "one scenario against the real daemon, read top to bottom")]
#[test]
#[ignore = "needs root, python3 and prometheus; run by `cargo xtask test`"]
fn canary_failures_carry_pod_labels_alerts_fire_and_series_go_with_the_pod() {
    assert_root();
    let dir = scratch_dir();
    let (mut api, api_port) = start_apiserver(&dir, None);
    let kubeconfig = write_kubeconfig(&dir, api_port);
    // The stable pod's ZLUDA-shaped library is found as a user's would be,
    // when its process starts; --hold makes its first calls count too.
    let daemon = node_daemon(&kubeconfig, "3s");

    // Both revisions' pods are scheduled while the daemon runs: the API
    // server has them, then the kubelet makes their cgroups.
    // The kubelet names each container half a second after its start.
    let rollout = schedule_canary_and_stable(api_port, Duration::from_millis(500));
    let (canary_cg, stable_cg) = (&rollout.canary_cg, &rollout.stable_cg);

    // The canary's HIP runtime fails to initialise; the stable one makes
    // real GPU calls that succeed. They are their containers' first
    // processes.
    let out = rollout.canary.output(canary_cg, &mut canary_cg.command(&fixture("hip_probe")));
    assert!(out.status.success());
    let out = rollout.stable.output(
        stable_cg,
        stable_cg
            .command(&fixture("cuda_app"))
            .args(["--version-loop", "1000"])
            .env("ZLUDA_FIXTURE_HEALTHY", "1"),
    );
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("cuInit=0 "), "a healthy runtime: {out:?}");
    // Successful calls are counted per revision on the node, not per pod.
    let stable_calls =
        daemon.wait_metric("the stable revision's successful calls", Duration::from_secs(10), |l| {
            l.starts_with("canaryscope_gpu_api_calls_total{")
                && l.contains("revision=\"stablehash\"")
                && l.contains("function=\"cuDriverGetVersion\"")
                && l.contains("result=\"CUDA_SUCCESS\"")
                // Series are refreshed twice a second: wait for the one taken
                // after the process ended.
                && metric_value(l) >= 1000.0
        });
    for label in ["namespace=\"inference\"", "track=\"stable\"", "workload=\"infer\""] {
        assert!(stable_calls.contains(label), "{label} missing in {stable_calls}");
    }
    assert!(!stable_calls.contains("pod=") && !stable_calls.contains("container="), "{stable_calls}");
    assert_eq!(metric_value(&stable_calls), 1000.0, "{stable_calls}");
    // The stable revision fails too, in one way: a crash inside its
    // library, which must be the stable pod's, and its only failure.
    let out = stable_cg
        .command(&fixture("cuda_app"))
        .arg("--launch")
        .env("ZLUDA_FIXTURE_HEALTHY", "1")
        .env("ZLUDA_FIXTURE_CRASH", "1")
        .output()
        .expect("stable crash");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(11), "{out:?}");
    let stable_crash = daemon.wait_metric("the stable pod's crash", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_native_crashes_total{") && l.contains("pod=\"infer-stablehash-fghij\"")
    });
    for label in ["track=\"stable\"", "revision=\"stablehash\"", "container=\"worker\""] {
        assert!(stable_crash.contains(label), "{label} missing in {stable_crash}");
    }
    daemon.wait_metric("the stable pod's abnormal exit", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_abnormal_exits_total{")
            && l.contains("pod=\"infer-stablehash-fghij\"")
            && l.contains("cause=\"fault\"")
    });

    let line = daemon.wait_metric("canary init failure", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_gpu_init_failures_total{")
            && l.contains("function=\"hipInit\"")
            && l.contains("pod=\"infer-canaryhash-abcde\"")
    });
    for label in [
        "namespace=\"inference\"",
        "container=\"worker\"",
        "workload=\"infer\"",
        "revision=\"canaryhash\"",
        "track=\"canary\"",
        "result=\"hipErrorInvalidDevice\"",
    ] {
        assert!(line.contains(label), "{label} missing in {line}");
    }
    let metrics = daemon.metrics();
    let failures_of_stable: Vec<&str> = metrics
        .lines()
        .filter(|l| l.contains("pod=\"infer-stablehash-fghij\""))
        .filter(|l| {
            ["gpu_init_failures", "native_crashes", "oom_kills", "abnormal_exits"]
                .iter()
                .any(|f| l.starts_with(&format!("canaryscope_{f}")))
                || l.starts_with("canaryscope_gpu_api_call_failures_total{")
        })
        .collect();
    // Its crash, and the exit it caused; nothing of the canary's.
    let mut families: Vec<&str> =
        failures_of_stable.iter().map(|l| l.split('{').next().unwrap_or_default()).collect();
    families.sort_unstable();
    assert_eq!(
        families,
        ["canaryscope_abnormal_exits_total", "canaryscope_native_crashes_total"],
        "the stable pod's failure series: {failures_of_stable:#?}"
    );

    // The exposition is valid by Prometheus' own linter.
    let mut lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    {
        use std::io::Write;
        let mut stdin = lint.stdin.take().expect("stdin");
        stdin.write_all(metrics.as_bytes()).expect("feed promtool");
    }
    let lint = lint.wait_with_output().expect("promtool");
    assert!(lint.status.success(), "promtool check metrics: {}", String::from_utf8_lossy(&lint.stderr));

    // A real Prometheus scrapes the daemon and evaluates the shipped rules.
    let (_prom, prom_port) =
        start_prometheus(&dir, daemon.port, Some(&repo().join("deploy/prometheus/rules.yaml")));
    let deadline = Instant::now() + Duration::from_secs(60);
    let alert = loop {
        let alerts = prom_query(prom_port, "ALERTS{alertname=\"CanaryGpuRuntimeInitFailure\"}");
        if let Some(a) = alerts.into_iter().next() {
            break a;
        }
        assert!(Instant::now() < deadline, "CanaryGpuRuntimeInitFailure never became pending or firing");
        thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(alert["metric"]["track"], "canary", "{alert}");
    assert_eq!(alert["metric"]["workload"], "infer", "{alert}");

    // The Argo Rollouts analysis query, with its arguments filled in:
    // the canary revision fails `result[0] == 0`, the stable one passes.
    let template = fs::read_to_string(repo().join("deploy/argo-analysistemplate.yaml")).expect("template");
    let query = template
        .split("- name: gpu-init-failures")
        .nth(1)
        .and_then(|s| s.split("query: |").nth(1))
        .map(|s| {
            s.lines()
                .skip(1)
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .expect("gpu-init-failures query in the AnalysisTemplate");
    let fill = |hash: &str| {
        query
            .replace("{{args.namespace}}", NS)
            .replace("{{args.workload}}", "infer")
            .replace("{{args.canary-hash}}", hash)
    };
    let value = |q: &str| -> f64 {
        prom_query(prom_port, q)
            .first()
            .and_then(|r| r["value"][1].as_str().and_then(|v| v.parse().ok()))
            .unwrap_or(f64::NAN)
    };
    assert!(value(&fill("canaryhash")) > 0.0, "analysis must fail the canary: {}", fill("canaryhash"));
    assert_eq!(value(&fill("stablehash")), 0.0, "analysis must pass the stable revision");

    // The API server goes away and comes back: the exporter keeps serving.
    let pods = control(api_port, "GET", "/control/pods", "");
    drop(api);
    thread::sleep(Duration::from_secs(2));
    assert!(daemon.get("/metrics").is_some_and(|(c, _)| c == 200), "exporter alive while the API is down");
    let (api2, _) = start_apiserver(&dir, Some(api_port));
    api = api2;
    control(api_port, "POST", "/control/pods", &pods);

    // Deleting the canary pod drops its series after the grace period.
    control(api_port, "DELETE", &format!("/control/pods/{NS}/infer-canaryhash-abcde"), "");
    // Every scrape on the way must be answered: a daemon that died here
    // would otherwise pass as "series gone".
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = daemon.get("/metrics").expect("the daemon serves while the pod is deleted");
        assert_eq!(code, 200, "{body}");
        if !body.contains("pod=\"infer-canaryhash-abcde\"") {
            assert!(body.contains("canaryscope_probe_attached"), "a real exposition: {body}");
            break;
        }
        assert!(Instant::now() < deadline, "series of the deleted pod are still exported");
        thread::sleep(Duration::from_millis(250));
    }
    // Our child: a daemon that died would linger as a zombie until reaped.
    let status = fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap_or_default();
    let state = status.lines().find(|l| l.starts_with("State:")).unwrap_or("State: gone");
    assert!(!state.contains("zombie") && !state.contains("gone"), "the daemon after the deletion: {state}");
    drop(api);
    let _ = fs::remove_dir_all(&dir);
}

/// A worker in `cg` that sleeps before crashing, started as the
/// container's process; returns it and its pid.
fn sleeping_worker(pod: &NodePod, cg: &PodCgroup) -> (std::process::Child, u64) {
    let mut command = cg.command(&fixture("segv_app"));
    command.args(["--sleep-before", "30000"]).stdout(Stdio::piped());
    let mut worker = pod.spawn(cg, &mut command);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(worker.stdout.as_mut().expect("stdout")),
        &mut line,
    )
    .expect("pid line");
    (worker, out_pid(line.as_bytes()))
}

/// SIGKILL from the host, as the kubelet and the runtime send it (this
/// test stands in for them: outside every pod).
fn host_kill(pid: u64) {
    let status = Command::new("/bin/kill").args(["-9", &pid.to_string()]).status();
    assert!(status.expect("kill").success());
}

/// Host kills while the daemon runs: of a live pod's container (a
/// restart), and of the containers of two pods a rollout deletes. The
/// deletion reaches the daemon as a watch update (the deletion timestamp)
/// while the kubelet kills the container at about the same time: once the
/// update first, the kill right behind it; once the kill first, before the
/// update can have reached the daemon. Then the kubelet removes the
/// container's cgroup and the pod. Either order is `pod_deleted`.
#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn a_host_kill_says_whether_the_pod_was_being_deleted_or_its_container_restarted() {
    assert_root();
    let dir = scratch_dir();
    let (_api, api_port, daemon) = Daemon::with_apiserver(&dir, &[]);
    let specs = vec![
        scheduled_pod("infer-canaryhash-live1", &random_pod_uid(), "canary", "canaryhash"),
        scheduled_pod("infer-canaryhash-gone1", &random_pod_uid(), "canary", "canaryhash"),
        scheduled_pod("infer-canaryhash-gone2", &random_pod_uid(), "canary", "canaryhash"),
    ];
    let pods = NodePod::schedule_all(api_port, specs, Duration::from_millis(700));
    let running: Vec<_> = pods
        .iter()
        .map(|pod| {
            let cg = pod.create("worker");
            let (worker, pid) = sleeping_worker(pod, &cg);
            (cg, worker, pid)
        })
        .collect();
    // The pods run, named in their status, before anything kills them.
    for pod in &pods {
        pod.reported();
    }
    let mut running = running.into_iter();
    let (live, gone1, gone2) = (&pods[0], &pods[1], &pods[2]);

    // The live pod's container is killed and restarted.
    let (cg, mut worker, pid) = running.next().expect("live");
    host_kill(pid);
    let status = worker.wait().expect("wait");
    let _restarted = live.restart(cg, status);

    // The rollout deletes gone1, and the kubelet kills it right away.
    let (cg, mut worker, pid) = running.next().expect("gone1");
    gone1.terminate();
    host_kill(pid);
    let status = worker.wait().expect("wait");
    gone1.exited(&cg, status);
    drop(cg);
    gone1.remove();

    // gone2's container is killed before its deletion reaches the daemon.
    let (cg, mut worker, pid) = running.next().expect("gone2");
    host_kill(pid);
    gone2.terminate();
    let status = worker.wait().expect("wait");
    gone2.exited(&cg, status);
    drop(cg);
    gone2.remove();

    for (pod, reason) in [(live, "container_restart"), (gone1, "pod_deleted"), (gone2, "pod_deleted")] {
        // Waits for the reason and the name, not the first line: labels
        // bound late may change once.
        let exit = daemon.wait_metric(reason, Duration::from_secs(10), |l| {
            l.starts_with("canaryscope_abnormal_exits_total{")
                && l.contains(&format!("pod=\"{}\"", pod.name))
                && l.contains(&format!("kill_reason=\"{reason}\""))
                && l.contains("container=\"worker\"")
        });
        for label in [
            "signal=\"SIGKILL\"",
            "cause=\"sent\"",
            "sender_scope=\"host\"",
            "container=\"worker\"",
            &format!("kill_reason=\"{reason}\""),
        ] {
            assert!(exit.contains(label), "{}: {label} missing in {exit}", pod.name);
        }
    }
    let _ = fs::remove_dir_all(&dir);
}

/// A healthy worker (its runtime starts: no GPU trouble) paused before it
/// exits, as the first process of its pod's container.
fn healthy_worker(pod: &NodePod, cg: &PodCgroup) -> Stepped {
    let mut command = cg.command(&fixture("cuda_app"));
    command.args(["--pause-before", "exit"]).env("ZLUDA_FIXTURE_HEALTHY", "1");
    let mut worker = Stepped::spawn(command);
    pod.started(cg);
    let init = worker.wait_line("cuInit=");
    assert!(init.starts_with("cuInit=0 "), "a healthy runtime: {init}");
    worker
}

#[test]
#[ignore = "needs root and python3; run by `cargo xtask test`"]
fn canary_pods_get_hot_call_probes_by_track_label_or_argo_revision() {
    assert_root();
    let dir = scratch_dir();
    let wait = Duration::from_secs(20);
    let (_api, api_port) = start_apiserver(&dir, None);
    // Rollout `infer`: revision oldhash is stable, newhash is being rolled
    // out. Only the first pod carries a canary track label.
    let rollout = |stable: &str| {
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
               "metadata": {"name": "infer", "namespace": NS, "uid": "00000000-0000-0000-0000-0000000000aa",
                            "resourceVersion": "1"},
               "status": {"stableRS": stable}})
        .to_string()
    };
    control(api_port, "POST", "/control/rollouts", &rollout("oldhash"));
    let kubeconfig = write_kubeconfig(&dir, api_port);
    let daemon = Daemon::on_node(&kubeconfig, &["--hold"]);
    // The pods are scheduled while the daemon runs; a busy kubelet names
    // their containers 1.5 s after their start.
    let specs = vec![
        scheduled_pod("infer-newhash-label", &random_pod_uid(), "canary", "newhash"),
        scheduled_pod("infer-newhash-argo1", &random_pod_uid(), "", "newhash"),
        scheduled_pod("infer-oldhash-argo2", &random_pod_uid(), "", "oldhash"),
    ];
    let pods = NodePod::schedule_all(api_port, specs, Duration::from_millis(1500));
    let (labelled_pod, argo_new_pod, argo_old_pod) = (&pods[0], &pods[1], &pods[2]);
    let labelled_cg = labelled_pod.create("worker");
    let argo_new_cg = argo_new_pod.create("worker");
    let argo_old_cg = argo_old_pod.create("worker");

    // The stable pod's worker starts first, so it is known before the
    // canaries are probed; no worker fails anything.
    let mut stable = healthy_worker(argo_old_pod, &argo_old_cg);
    let mut labelled = healthy_worker(labelled_pod, &labelled_cg);
    let mut argo_new = healthy_worker(argo_new_pod, &argo_new_cg);
    wait_trapped(labelled.pid(), true, wait);
    wait_trapped(argo_new.pid(), true, wait);
    daemon.wait_metric("two canary processes", wait, |l| {
        l.starts_with("canaryscope_gpu_hot_probed_processes{reason=\"canary\"}") && metric_value(l) == 2.0
    });
    let (stable_byte, stable_on_disk) = entry_bytes(stable.pid(), "libcuda.so.1", "cuLaunchKernel");
    assert_eq!(stable_byte, stable_on_disk, "the stable revision's worker carries no breakpoint");

    // Promotion: newhash is stable now. Its worker leaves the selection and
    // the old revision's lingering worker is the one that differs.
    control(api_port, "POST", "/control/rollouts", &rollout("newhash"));
    wait_trapped(argo_new.pid(), false, wait);
    wait_trapped(stable.pid(), true, wait);
    assert_eq!(entry_bytes(labelled.pid(), "libcuda.so.1", "cuLaunchKernel").0, BREAKPOINT);

    // No access to rollouts any more: the track label alone decides.
    control(api_port, "POST", "/control/rollouts-access", r#"{"code": 403}"#);
    wait_trapped(stable.pid(), false, wait);
    assert_eq!(entry_bytes(labelled.pid(), "libcuda.so.1", "cuLaunchKernel").0, BREAKPOINT);
    let (promoted_byte, promoted_on_disk) = entry_bytes(argo_new.pid(), "libcuda.so.1", "cuLaunchKernel");
    assert_eq!(promoted_byte, promoted_on_disk, "the promoted revision stays unselected");

    for worker in [&mut stable, &mut labelled, &mut argo_new] {
        worker.go();
    }
    for worker in [stable, labelled, argo_new] {
        assert!(worker.finish().success());
    }
    let _ = fs::remove_dir_all(&dir);
}
