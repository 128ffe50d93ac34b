//! A group OOM kill (`memory.oom.group`, as kubelet sets on cgroup v2 since
//! Kubernetes 1.28): one OOM kills every process of the container. That is
//! one OOM kill, with its victims counted, and one `oom_kill` exit each.

use std::{fs, os::unix::process::ExitStatusExt, path::Path, time::Duration};
use test_support::{
    assert_root, cgroup2_root, fixture, in_vm, metric_value, random_hex, random_pod_uid, self_killing_marker,
    skip, Daemon, PodCgroup, Tracer,
};

/// Whether the memory controller is on the unified hierarchy; only there
/// does `memory.oom.group` exist.
fn memory_on_v2() -> bool {
    fs::read_to_string(cgroup2_root().join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"))
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_group_oom_is_one_kill_with_every_process_an_oom_kill_exit() {
    assert_root();
    if !memory_on_v2() {
        // The VM (Debian 6.1, unified hierarchy) must run this test.
        assert!(!in_vm(), "the VM's memory controller must be on cgroup v2");
        skip(
            "a_group_oom_is_one_kill_with_every_process_an_oom_kill_exit",
            "the memory controller is not on cgroup v2 here, so there is no memory.oom.group; the VM runs it",
        );
        return;
    }
    let hog = fixture("oom_hog");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let mut pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    pod.limit_memory(50 << 20);
    fs::write(pod.dir.join("memory.oom.group"), "1").expect("memory.oom.group");
    let tracer = Tracer::start(&["--cgroup", &pod.rel]);
    let sleepers: Vec<_> = (0..2)
        .map(|_| pod.command(Path::new("/bin/sleep")).arg("600").spawn().expect("spawn sleep"))
        .collect();
    let child = pod.command(&hog).arg("200").stdout(std::process::Stdio::null()).spawn().expect("spawn");
    let hog_pid = child.id() as u64;
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.signal(), Some(9), "{out:?}");
    for mut s in sleepers {
        // The group kill took the sleepers too.
        assert_eq!(s.wait().expect("wait sleep").signal(), Some(9));
    }

    let oom = tracer.wait_for("oom_kill", Duration::from_secs(10), |e| e["kind"] == "oom_kill");
    assert_eq!(oom["pid"], hog_pid, "the event is about the chosen victim: {oom}");
    assert_eq!(oom["victims"], 3, "{oom}");
    assert_eq!(oom["scope"], "memcg", "{oom}");

    let container = format!("container=\"{}\"", pod.short_container_id());
    let exits = |l: &str| {
        l.starts_with("canaryscope_abnormal_exits_total{")
            && l.contains(&container)
            && l.contains("cause=\"oom_kill\"")
    };
    daemon
        .wait_metric("three oom_kill exits", Duration::from_secs(10), |l| exits(l) && metric_value(l) >= 3.0);
    // Nothing more may arrive: once a later record of the same container is
    // counted (a shell that kills itself), every OOM record before it is too.
    self_killing_marker(&pod);
    daemon.wait_metric("the marker's exit", Duration::from_secs(20), |l| {
        l.starts_with("canaryscope_abnormal_exits_total{")
            && l.contains(&container)
            && l.contains("sender_scope=\"self\"")
    });
    let _marker = tracer.barrier(&pod);
    let text = daemon.metrics();
    let sum = |pred: &dyn Fn(&str) -> bool| text.lines().filter(|l| pred(l)).map(metric_value).sum::<f64>();
    let kills = sum(&|l: &str| l.starts_with("canaryscope_oom_kills_total{") && l.contains(&container));
    assert_eq!(kills, 1.0, "one group OOM is one kill:\n{text}");
    assert_eq!(sum(&exits), 3.0, "each victim's exit counts:\n{text}");

    let (_, events) = tracer.stop();
    assert_eq!(events.iter().filter(|e| e["kind"] == "oom_kill").count(), 1, "{events:#?}");
    let oom_exits = events.iter().filter(|e| e["kind"] == "exit" && e["cause"] == "oom_kill").count();
    assert_eq!(oom_exits, 3, "{events:#?}");
}
