//! Memory-limit refusals: a process under RLIMIT_AS whose allocation is
//! refused gets no signal and may not even die (Python raises MemoryError),
//! so the refusal itself is the event. Real processes in real cgroups.

use std::{path::Path, time::Duration};

use serde_json::Value;
use test_support::{
    assert_root, fixture, metric_value, random_hex, random_pod_uid, Daemon, PodCgroup, Tracer,
};

const PYTHON: &str = "/usr/bin/python3";
const MIB: u64 = 1 << 20;

/// `key=value` of the fixture's output.
fn field(text: &str, key: &str) -> u64 {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {text:?}"))
}

fn refusals_of(events: &[Value], pid: u64) -> Vec<Value> {
    events.iter().filter(|e| e["kind"] == "memory_limit_refusal" && e["pid"] == pid).cloned().collect()
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_python_memoryerror_under_rlimit_as_is_a_refusal_and_no_signal_death() {
    assert_root();
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let tracer = Tracer::start(&["--cgroup", &pod.rel]);
    // The solver runbook caps provers with RLIMIT_AS; Python turns the
    // refused allocation into MemoryError and exits 1, with no signal.
    let script = r#"
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (256 << 20, 256 << 20))
print(os.getpid(), flush=True)
try:
    b = bytearray(1 << 30)
except MemoryError:
    sys.exit(1)
"#;
    let out = pod.command(Path::new(PYTHON)).args(["-c", script]).output().expect("python3");
    assert_eq!(out.status.code(), Some(1), "MemoryError, exit 1: {out:?}");
    let pid: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("python printed its pid");
    let refusal = tracer.wait_for(&format!("refusal of {pid}"), Duration::from_secs(5), |e| {
        e["kind"] == "memory_limit_refusal" && e["pid"] == pid
    });
    assert_eq!(refusal["limit"], "as", "{refusal}");
    assert_eq!(refusal["limit_bytes"], 256 * MIB, "{refusal}");
    assert!(refusal["requested_bytes"].as_u64().is_some_and(|b| b >= 1 << 30), "{refusal}");
    assert!(["mmap", "brk", "mremap"].contains(&refusal["syscall"].as_str().unwrap_or("")), "{refusal}");
    assert_eq!(refusal["cgroup"], pod.rel.as_str(), "{refusal}");
    // No signal ended it: no exit event for that process.
    let _marker = tracer.barrier(&pod);
    let exits: Vec<Value> =
        tracer.events().into_iter().filter(|e| e["kind"] == "exit" && e["pid"] == pid).collect();
    assert!(exits.is_empty(), "a MemoryError is no signal death: {exits:?}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_tight_mmap_refusal_loop_gives_one_record_a_second_and_an_exact_count() {
    assert_root();
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let tracer = Tracer::start(&["--cgroup", &pod.rel]);
    // 2.5 s of refused calls as fast as they come: records at 0 s, 1 s and
    // 2 s, and every call counted.
    let out = pod.command(&fixture("mmap_refused")).args(["2.5", "64"]).output().expect("mmap_refused");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (pid, refused, elapsed_ns) =
        (field(&text, "pid"), field(&text, "refused"), field(&text, "elapsed_ns"));
    assert!(refused > 1000, "a tight loop: {text}");
    let expected_records = elapsed_ns / 1_000_000_000 + 1;
    let first = tracer.wait_for("the first refusal", Duration::from_secs(5), |e| {
        e["kind"] == "memory_limit_refusal" && e["pid"] == pid
    });
    assert_eq!((first["limit"].as_str(), first["syscall"].as_str()), (Some("as"), Some("mmap")), "{first}");
    assert_eq!(first["requested_bytes"], 1u64 << 30, "{first}");
    assert_eq!(first["limit_bytes"], 64 * MIB, "{first}");
    let _marker = tracer.barrier(&pod);
    let records = refusals_of(&tracer.events(), pid);
    assert_eq!(
        records.len() as u64,
        expected_records,
        "one record a second over {elapsed_ns} ns: {records:#?}"
    );
    for pair in records.windows(2) {
        let gap =
            pair[1]["ts_ns"].as_u64().unwrap_or(0).saturating_sub(pair[0]["ts_ns"].as_u64().unwrap_or(0));
        assert!(gap >= 1_000_000_000, "records {gap} ns apart: {records:#?}");
    }

    let container = format!("container=\"{}\"", pod.short_container_id());
    let wanted = refused as f64;
    let line = daemon.wait_metric("every refused call counted", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_memory_limit_refusals_total{")
            && l.contains(&container)
            && l.contains("limit=\"as\"")
            && metric_value(l) == wanted
    });
    assert!(line.contains("namespace="), "{line}");
}
