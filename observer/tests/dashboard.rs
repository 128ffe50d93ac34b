//! The Grafana dashboard against real data: the Kubernetes end-to-end setup
//! (stand-in API server, the real daemon, a real Prometheus scraping it)
//! with a canary that asked for a GPU, fails its GPU runtime (so never
//! initialises it), crashes in it, stalls in it, is
//! throttled, is OOM killed and answers HTTP requests, beside a stable pod
//! that is healthy but for one crash in the library; and a second daemon whose series cap is spent
//! and whose ring buffer overflowed. Every panel query of
//! deploy/grafana/canaryscope.json runs against that Prometheus; each panel
//! this machine can feed must show its data, the stable's one failure must
//! show as the stable's, and the stable must show on no other failure panel.
//!
//! Two panels get no data here, for want of hardware: "KFD ioctl errors"
//! needs /dev/kfd (vm_kfd.rs shows it data in the VM), and "GPU faults" a
//! GPU that faults. Their queries are run all the same.

use std::{
    fs,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};
use test_support::{
    assert_root,
    dashboard::{dashboard, panel_queries, shows},
    fixture, free_port, http_get,
    k8s::{
        prom, prom_query, repo, scheduled_pod, scratch_dir, start_apiserver, start_prometheus_of,
        write_kubeconfig, NodePod, Proc, NS,
    },
    random_hex, random_pod_uid, Daemon, PodCgroup,
};

/// Whether the query returns at least one series now.
fn has_series(port: u16, query: &str) -> bool {
    prom(port, query)["data"]["result"].as_array().is_some_and(|r| !r.is_empty())
}

/// Panels whose events this test causes in the canary, and so must show it.
const CAUSED: &[&str] = &[
    "GPU init failures by function",
    "GPU call failures by function (cold tier)",
    "GPU call latency p99 (cold tier)",
    "Stalled GPU calls",
    "GPU requested, never initialised",
    "Native crashes by library",
    "OOM kills",
    "Abnormal exits by cause",
    "Throttled-period ratio",
    "Run-queue latency p99",
    "HTTP requests by status class",
    "HTTP error ratio (5xx and closed)",
    "HTTP latency p99",
    "Run p99 by executable",
    "Runs by ending",
];
/// Node-level panels: the probes of both daemons, the second one's lost
/// events and refused series.
const NODE: &[&str] = &["Probes attached", "Events lost", "Series overflow"];
/// Workload-level panels (no revision): the canary's OOM-killed pod counts
/// toward a cascade.
const WORKLOAD: &[&str] = &["Kill cascade: pods killed within 10m"];
/// The stable pod's one failure: a crash inside the library, which these
/// panels must show as the stable's.
const STABLE_FAILED: &[&str] = &["Native crashes by library", "Abnormal exits by cause"];
/// Failure panels on which the stable, which failed nothing else, must not
/// show.
const STABLE_CLEAN: &[&str] = &[
    "GPU init failures by function",
    "GPU call failures by function (cold tier)",
    "Stalled GPU calls",
    "GPU requested, never initialised",
    "OOM kills",
];

#[expect(clippy::too_many_lines, reason = "one scenario against the real daemon, read top to bottom")]
#[test]
#[ignore = "needs root, python3 with grafana-foundation-sdk, and prometheus; run by `cargo xtask test`"]
fn every_panel_query_parses_and_the_canary_shows_on_the_panels_of_its_failures() {
    assert_root();
    let board = dashboard();

    // The JSON loads back through the library that built it.
    let load = Command::new("python3")
        .args(["-c", "import json,sys\nfrom grafana_foundation_sdk.models.dashboard import Dashboard\nd = Dashboard.from_json(json.load(open(sys.argv[1])))\nprint(d.title, len(d.panels))"])
        .arg(repo().join("deploy/grafana/canaryscope.json"))
        .output()
        .expect("python3");
    assert!(load.status.success(), "Dashboard.from_json: {}", String::from_utf8_lossy(&load.stderr));
    let panels = board["panels"].as_array().expect("panels");
    assert_eq!(
        String::from_utf8_lossy(&load.stdout).trim(),
        format!("{} {}", board["title"].as_str().unwrap_or(""), panels.len())
    );

    let dir = scratch_dir();
    let (_api, api_port) = start_apiserver(&dir, None);
    let kubeconfig = write_kubeconfig(&dir, api_port);
    // As the DaemonSet runs it, without --hold: the canary's processes are
    // held at its runtime file all the same. A stall threshold of seconds
    // rather than the default ten keeps the stalled call's wait short.
    let daemon = Daemon::on_node(&kubeconfig, &["--stall-threshold", "2s", "--gpu-init-timeout", "2s"]);
    // A second node's daemon, capped at one cgroup's series, whose reader
    // falls behind below.
    let behind = Daemon::start(&["--no-kubernetes", "--max-cgroups", "1"]);

    let (_prom, prom_port) = start_prometheus_of(&dir, &[daemon.port, behind.port], None);

    // The rollout schedules both revisions' pods while the daemon runs:
    // the API server has them, then the kubelet makes their cgroups.
    // The kubelet names each container a second after its start.
    // The canary's worker asked for a GPU, which its failing runtime never
    // initialises; the stable's asked for none.
    let mut canary_spec = scheduled_pod("infer-canaryhash-abcde", &random_pod_uid(), "canary", "canaryhash");
    canary_spec["spec"]["containers"][0]["resources"] =
        serde_json::json!({"limits": {"nvidia.com/gpu": "1"}});
    let stable_spec = scheduled_pod("infer-stablehash-fghij", &random_pod_uid(), "stable", "stablehash");
    let mut pods = NodePod::schedule_all(api_port, vec![canary_spec, stable_spec], Duration::from_secs(1));
    let (stable_pod, canary_pod) = (pods.pop().expect("stable"), pods.pop().expect("canary"));
    let (mut canary, stable) = (canary_pod.create("worker"), stable_pod.create("worker"));

    // Counters are born with their first event, and `rate`/`increase` need
    // a scrape before the event to see it: first Prometheus' first scrape
    // of both daemons, later a second round of the canary's failures.
    let deadline = Instant::now() + Duration::from_secs(30);
    while prom_query(prom_port, "up{job=\"canaryscope\"} == 1").len() < 2 {
        assert!(Instant::now() < deadline, "Prometheus never scraped both daemons");
        thread::sleep(Duration::from_millis(200));
    }

    // The second daemon's ring buffer overflows under a flood of failing
    // calls from a pod of its own while it is frozen; every cgroup past the
    // first is refused its series.
    let noisy = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let flood =
        Proc(noisy.command(&fixture("hip_loop")).args(["--fail", "1000000000"]).spawn().expect("flood"));
    behind.overflow_ring_while_frozen();
    drop(flood);

    // The stable pod is healthy; the canary fails its HIP runtime, runs
    // too many threads for its CPU limit while the test lasts, and
    // outgrows its memory limit: twice, as a crash-looping canary would.
    let out = stable_pod.output(
        &stable,
        stable
            .command(&fixture("cuda_app"))
            .args(["--version-loop", "100"])
            .env("ZLUDA_FIXTURE_HEALTHY", "1"),
    );
    assert!(out.status.success(), "{out:?}");
    // A crash inside the library, in cuLaunchKernel.
    let crash_in_launch = |pod: &PodCgroup, healthy: bool| {
        let mut app = pod.command(&fixture("cuda_app"));
        app.arg("--launch").env("ZLUDA_FIXTURE_CRASH", "1").stdout(Stdio::null());
        if healthy {
            app.env("ZLUDA_FIXTURE_HEALTHY", "1");
        }
        let out = app.output().expect("cuda_app --launch");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(11), "{out:?}");
    };

    let cpus = thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    canary.limit_cpu(cpus as f64 * 2.0 / 32.0);
    let _busy = Proc(canary_pod.spawn(
        &canary,
        canary.command(&fixture("busy_threads")).args([&cpus.to_string(), "120"]).stdout(Stdio::null()),
    ));
    // The canary serves HTTP too (Python's own server: 200, 404 and 501),
    // measured from the node.
    let web_port = free_port();
    let _web = Proc(
        canary_pod.spawn(
            &canary,
            canary
                .command(std::path::Path::new("/usr/bin/python3"))
                .args(["-m", "http.server", &web_port.to_string(), "--bind", "127.0.0.1"])
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        ),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", web_port)).is_err() {
        assert!(Instant::now() < deadline, "the canary's web server did not listen");
        thread::sleep(Duration::from_millis(50));
    }
    canary.limit_memory(50 << 20);
    let failing_round = || {
        for path in ["/", "/missing", "/", "/"] {
            assert!(http_get(web_port, path).is_some(), "the canary answers {path}");
        }
        // A method Python's server does not implement: 501, a 5xx.
        let mut s = std::net::TcpStream::connect(("127.0.0.1", web_port)).expect("connect");
        std::io::Write::write_all(&mut s, b"DELETE / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut answer);
        assert!(answer.starts_with("HTTP/1.0 501"), "{answer}");
        let out = canary.command(&fixture("hip_probe")).output().expect("hip_probe");
        assert!(out.status.success(), "{out:?}");
        crash_in_launch(&canary, false);
        // The stable's one kind of failure, which the checks below must
        // find as its.
        crash_in_launch(&stable, true);
        // A run: a program the canary's own process starts.
        let run = canary
            .command(std::path::Path::new("/usr/bin/python3"))
            .args(["-c", "import subprocess; subprocess.run(['/bin/true'], check=True)"])
            .status();
        assert!(run.expect("python3").success());
        let out =
            canary.command(&fixture("oom_hog")).arg("200").stdout(Stdio::null()).output().expect("oom_hog");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&out.status), Some(9), "{out:?}");
    };
    failing_round();
    // The first round's series are in Prometheus before the second round.
    let first_round = [
        "canaryscope_http_server_request_duration_seconds_count{track=\"canary\"}",
        "canaryscope_gpu_init_failures_total{track=\"canary\"}",
        "canaryscope_oom_kills_total{track=\"canary\"}",
        "canaryscope_run_endings_total{track=\"canary\"}",
        "canaryscope_native_crashes_total{track=\"canary\"}",
        "canaryscope_native_crashes_total{track=\"stable\"}",
        "canaryscope_abnormal_exits_total{track=\"stable\"}",
    ];
    for q in first_round {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !has_series(prom_port, q) {
            assert!(Instant::now() < deadline, "Prometheus never stored {q}");
            thread::sleep(Duration::from_millis(200));
        }
    }
    failing_round();
    // A call that hangs in the canary while the panels are read.
    let _stalled = Proc(
        canary
            .command(&fixture("cuda_app"))
            .arg("--sync")
            .env("ZLUDA_FIXTURE_SYNC_SLEEP_MS", "120000")
            .stdout(Stdio::null())
            .spawn()
            .expect("cuda_app --sync"),
    );

    // Every target of every panel, with Grafana's variables filled in as a
    // person choosing the workload would.
    let queries = panel_queries(&board, NS, "infer");
    assert!(queries.len() >= 12, "{queries:#?}");
    for (title, q) in &queries {
        let answer = prom(prom_port, q);
        assert_eq!(answer["status"], "success", "{title}: {q}: {answer}");
    }
    for title in CAUSED.iter().chain(NODE).chain(WORKLOAD).chain(STABLE_CLEAN) {
        assert!(queries.iter().any(|(t, _)| t == title), "no panel {title}");
    }

    // The canary's series reach every panel of its failures, the stable's
    // its crash, and the second daemon's the node panels (scraped each
    // second; rates need two scrapes after the event).
    let deadline = Instant::now() + Duration::from_secs(60);
    let wanted = CAUSED
        .iter()
        .map(|t| (*t, "canary"))
        .chain(STABLE_FAILED.iter().map(|t| (*t, "stable")))
        .chain(NODE.iter().chain(WORKLOAD).map(|t| (*t, "")));
    let mut missing: Vec<(&str, &str)> = wanted.collect();
    while !missing.is_empty() {
        missing.retain(|(title, track)| {
            !queries.iter().filter(|(t, _)| t == title).any(|(_, q)| {
                shows(&prom(prom_port, q), |s| track.is_empty() || s["metric"]["track"] == *track)
            })
        });
        if Instant::now() >= deadline {
            let answers: Vec<String> = queries
                .iter()
                .filter(|(t, _)| missing.iter().any(|(m, _)| m == t))
                .map(|(t, q)| format!("{t}: {q}\n  {}", prom(prom_port, q)["data"]["result"]))
                .collect();
            panic!("panels without the canary's data: {missing:?}\n{}", answers.join("\n"));
        }
        thread::sleep(Duration::from_millis(500));
    }
    // The stable revision, which crashed once and failed nothing else,
    // shows on no other failure panel.
    for (title, q) in queries.iter().filter(|(t, _)| STABLE_CLEAN.contains(&t.as_str())) {
        let result = prom(prom_port, q)["data"]["result"].clone();
        assert!(
            result.as_array().into_iter().flatten().all(|s| s["metric"]["track"] != "stable"),
            "{title}: {result}"
        );
    }
    if let Some(out) = std::env::var_os("CANARYSCOPE_DASHBOARD_PICTURE") {
        picture(prom_port, &queries, std::path::Path::new(&out));
    }
    drop((daemon, behind));
    let _ = fs::remove_dir_all(&dir);
}

/// For docs/dashboard.md, on request (CANARYSCOPE_DASHBOARD_PICTURE=out.png): the
/// panels of the canary's failures drawn by Prometheus' own graph page (one
/// graph per panel query, over the test's last 30 s) in headless
/// Chromium. Grafana itself is not installed here.
fn picture(prom_port: u16, queries: &[(String, String)], out: &std::path::Path) {
    let enc = |s: &str| -> String {
        s.bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect()
    };
    let shown: Vec<&(String, String)> =
        queries.iter().filter(|(t, _)| CAUSED.contains(&t.as_str())).collect();
    let params: Vec<String> = shown
        .iter()
        .enumerate()
        .map(|(i, (_, q))| format!("g{i}.expr={}&g{i}.tab=0&g{i}.range_input=30s&g{i}.stacked=0", enc(q)))
        .collect();
    let url = format!("http://127.0.0.1:{prom_port}/graph?{}", params.join("&"));
    // Taller than the page, so nothing scrolls it.
    let height = 400 + 700 * shown.len();
    let status = Command::new("chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .arg(format!("--window-size=1280,{height}"))
        .arg("--virtual-time-budget=15000")
        .arg(format!("--screenshot={}", out.display()))
        .arg(&url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("chromium (scripts/setup.sh installs it)");
    assert!(status.success() && out.exists(), "chromium drew nothing: {status}");
}
