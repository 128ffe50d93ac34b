//! The KFD path on a stock kernel with amdgpu (the test VM: Debian 6.1,
//! kprobes, /dev/kfd with one CPU-only node). The real HIP runtime issues
//! real KFD ioctls, some of which fail, and then crashes in hipMalloc. Its
//! entry in KFD's process table has a pasid and no GPU device: its VRAM
//! reads as none, not as an error. The dashboard's KFD panel shows the
//! failing ioctls from a real Prometheus.

use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use test_support::{
    assert_root, canaryscope,
    dashboard::{dashboard, panel_queries, shows},
    fixture, in_vm, random_hex, random_pod_uid, skip, Daemon, PodCgroup, Tracer,
};

/// Whether /dev/kfd is here; where it is not (any host of this kind), the
/// test is noted as skipped, and the VM, which must have it, runs it.
fn kfd_here(test: &str) -> bool {
    if Path::new("/dev/kfd").exists() {
        return true;
    }
    assert!(!in_vm(), "the VM must have /dev/kfd (amdgpu loaded)");
    skip(test, "no /dev/kfd here; the VM runs it");
    false
}

#[test]
#[ignore = "needs root and /dev/kfd; run in the VM by `cargo xtask test`"]
fn real_hip_runtime_kfd_ioctls_and_its_crash_are_seen() {
    assert_root();
    if !kfd_here("real_hip_runtime_kfd_ioctls_and_its_crash_are_seen") {
        return;
    }
    let probe = fixture("hip_probe");
    let tracer = Tracer::start(&["--all"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    // Long enough after /dev/kfd is open for a read of KFD's table (each
    // second) to find the process, before it crashes.
    let child = pod
        .command(&probe)
        .args(["--sleep-after-init", "2500", "--malloc"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn hip_probe");
    let pid = child.id() as u64;
    let out = child.wait_with_output().expect("wait");
    eprintln!("hip_probe: {} ({:?})", String::from_utf8_lossy(&out.stdout).trim(), out.status);

    let version = tracer.wait_for("GET_VERSION", Duration::from_secs(20), |e| {
        e["kind"] == "kfd_ioctl" && e["pid"] == pid && e["ioctl"] == "GET_VERSION"
    });
    assert_eq!(version["result"], 0, "{version}");
    assert_eq!(version["via"], "kprobe");
    assert_eq!(version["cgroup"], pod.rel.as_str());
    let failed = tracer.wait_for("a failing ioctl", Duration::from_secs(20), |e| {
        e["kind"] == "kfd_ioctl" && e["pid"] == pid && e["result"].as_i64().is_some_and(|r| r < 0)
    });
    assert!(failed["errno"].as_str().is_some_and(|e| e.starts_with('E')), "{failed}");
    assert_eq!(failed["cgroup"], pod.rel.as_str());

    // The VM's node has no GPU: hipMalloc crashes there, every time. On a
    // machine with a real GPU the allocation may succeed.
    let crashed = std::os::unix::process::ExitStatusExt::signal(&out.status) == Some(11);
    assert!(crashed || !in_vm(), "in the VM hip_probe --malloc dies of SIGSEGV: {:?}", out.status);
    if crashed {
        let crash = tracer.wait_for("crash in hipMalloc", Duration::from_secs(20), |e| {
            e["kind"] == "crash" && e["pid"] == pid
        });
        assert_eq!(crash["signal"], "SIGSEGV");
        assert!(crash["library"].as_str().is_some_and(|l| l.contains("libamdhip64")), "{crash}");
        assert_eq!(crash["in_call"], "hipMalloc");
        assert_eq!(crash["cgroup"], pod.rel.as_str());
        // KFD listed it with its pasid only: it held no VRAM, and the exit
        // says so (a process without /dev/kfd has no such fields).
        let exit = tracer.wait_for("its exit", Duration::from_secs(20), |e| {
            e["kind"] == "exit" && e["pid"] == pid && e["cause"] == "fault"
        });
        assert_eq!(exit["vram_bytes"], 0, "{exit}");
        assert_eq!(exit["vram_by_gpu"], serde_json::json!({}), "{exit}");
    }
    let (_, events) = tracer.stop();
    let mut seen: Vec<String> = events
        .iter()
        .filter(|e| e["kind"] == "kfd_ioctl" && e["pid"] == pid)
        .map(|e| format!("{}={}", e["ioctl"].as_str().unwrap_or("?"), e["errno"].as_str().unwrap_or("0")))
        .collect();
    seen.dedup();
    eprintln!("KFD ioctls of hip_probe: {}", seen.join(", "));
}

#[test]
#[ignore = "needs root and amdgpu; run in the VM by `cargo xtask test`"]
fn check_lists_the_kfd_kprobe_and_hardware_hooks() {
    assert_root();
    if !kfd_here("check_lists_the_kfd_kprobe_and_hardware_hooks") {
        return;
    }
    let out = Command::new(canaryscope()).args(["check", "--json"]).output().expect("check");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let probes = report["probes"].as_array().cloned().unwrap_or_default();
    let find = |target: &str| probes.iter().find(|p| p["target"].as_str() == Some(target)).cloned();
    let kfd = find("kprobe:kfd_ioctl").unwrap_or_else(|| panic!("no kfd probe in {report:#}"));
    assert_eq!(kfd["attached"], true, "{kfd}");
    let hw: Vec<_> = probes.iter().filter(|p| p["probe"] == "gpu_hw").collect();
    assert!(!hw.is_empty(), "fault/reset/eviction hooks listed: {report:#}");
    assert!(hw.iter().all(|p| p["attached"] == true), "{hw:#?}");
    // VRAM per pod reads KFD's process table; with no GPU device there is
    // no used memory to find stranded VRAM in.
    let facilities = report["facilities"].as_array().cloned().unwrap_or_default();
    let facility = |name: &str| facilities.iter().find(|f| f["name"] == name).cloned();
    let vram = facility("kfd_vram").unwrap_or_else(|| panic!("no kfd_vram in {report:#}"));
    assert_eq!(vram["ok"], true, "{vram}");
    let stranded = facility("vram_stranded").unwrap_or_else(|| panic!("no vram_stranded in {report:#}"));
    assert!(stranded["detail"].as_str().is_some_and(|d| d.contains("no GPU")), "{stranded}");
}

/// The dashboard's "KFD ioctl errors" panel, which no host without /dev/kfd
/// can feed: a real Prometheus scrapes the daemon while a pod's real HIP
/// runtime makes KFD ioctls that fail, twice (a rate needs a sample before
/// the increase), and the panel, with the variables at Grafana's "All",
/// must show the pod's failing ioctls with their errno.
#[test]
#[ignore = "needs root, /dev/kfd and prometheus; run in the VM by `cargo xtask test`"]
fn the_dashboards_kfd_panel_shows_a_pods_failing_ioctls() {
    assert_root();
    if !kfd_here("the_dashboards_kfd_panel_shows_a_pods_failing_ioctls") {
        return;
    }
    let queries: Vec<(String, String)> = panel_queries(&dashboard(), ".*", ".*")
        .into_iter()
        .filter(|(title, _)| title == "KFD ioctl errors")
        .collect();
    assert!(!queries.is_empty(), "no KFD ioctl errors panel");
    let dir = test_support::k8s::scratch_dir();
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let (_prom, prom_port) = test_support::k8s::start_prometheus(&dir, daemon.port, None);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while test_support::k8s::prom_query(prom_port, "up{job=\"canaryscope\"} == 1").is_empty() {
        assert!(std::time::Instant::now() < deadline, "Prometheus never scraped the daemon");
        std::thread::sleep(Duration::from_millis(200));
    }
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let failing_ioctls = || {
        // As in the test above: its init makes failing KFD ioctls, and
        // its allocation crashes on a node without a GPU.
        let out = pod.command(&fixture("hip_probe")).arg("--malloc").output().expect("hip_probe");
        eprintln!("hip_probe: {} ({:?})", String::from_utf8_lossy(&out.stdout).trim(), out.status);
    };
    failing_ioctls();
    let stored = "canaryscope_kfd_ioctls_total{result!=\"0\"}";
    while test_support::k8s::prom_query(prom_port, stored).is_empty() {
        assert!(std::time::Instant::now() < deadline, "Prometheus never stored {stored}");
        std::thread::sleep(Duration::from_millis(200));
    }
    failing_ioctls();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let short = pod.short_container_id();
    loop {
        let answers: Vec<Value> =
            queries.iter().map(|(_, q)| test_support::k8s::prom(prom_port, q)).collect();
        if answers.iter().any(|a| shows(a, |s| s["metric"]["ioctl"].is_string())) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the KFD ioctl errors panel never showed the pod ({short}): {answers:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
