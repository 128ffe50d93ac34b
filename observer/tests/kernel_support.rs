//! What canaryscope offers on the kernel it runs on, as `check` and the
//! daemon's probe metric say it: on any kernel of the VM matrix (5.10 to
//! 6.18) every probe is attached, or it is detached with the kernel feature
//! it lacks named, and only where the kernel really lacks it. GPU calls are
//! probed everywhere, in the shape the kernel allows. The families that
//! attach are exercised by the other suites run on the same kernel.
//!
//! Which shape each family must take comes from the matrix's declaration of
//! the kernel (`test_support::shape`), not from the observer's own helper table
//! or BTF reading, which a bug would move along with the expectation.

use std::{collections::BTreeSet, process::Command, time::Duration};

use serde_json::Value;
use test_support::{assert_root, canaryscope, cgroup2_root, metric_value, shape::KernelShape, Daemon};

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn every_probe_attaches_or_names_the_kernel_feature_it_lacks() {
    assert_root();
    let shape = KernelShape::declared();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    eprintln!("kernel {}: declared {shape:?}", kernel.trim());
    // A node runs pods below a parent cgroup kubelet makes: the HTTP
    // programs attach there, and nowhere else. A bare VM has none yet.
    let pods_parent = cgroup2_root().join("kubepods.slice");
    std::fs::create_dir_all(&pods_parent).unwrap_or_else(|e| panic!("{}: {e}", pods_parent.display()));

    let out = Command::new(canaryscope()).args(["check", "--json"]).output().expect("run check");
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("check --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    let probes = report["probes"].as_array().expect("probes");
    let mut seen = BTreeSet::new();
    for probe in probes {
        let name = probe["probe"].as_str().unwrap_or_default();
        seen.insert(name.to_string());
        match name {
            // Where the kernel lacks the helpers, the shape for older
            // kernels is attached instead, and says so.
            "crash" => {
                assert_eq!(probe["attached"], true, "{probe}");
                let fallback = probe["target"] == "signal_generate:stack";
                assert_eq!(fallback, !shape.find_vma, "{probe}");
                // Kernels before the maple tree (6.1) keep a process's
                // mappings in a tree the fallback walks at the fault itself,
                // so an init crash is placed without racing userspace.
                if fallback {
                    let walks = probe["detail"].as_str().unwrap_or_default().contains("tree of mappings");
                    assert_eq!(walks, shape.mapping_tree, "{probe}");
                }
            }
            // One line per GPU runtime file found on the node: probed on
            // every kernel, through a program pair per function where
            // there are no attach cookies.
            "gpu" => {
                assert_eq!(probe["attached"], true, "{probe}");
                let detail = probe["detail"].as_str().unwrap_or_default();
                let per_function = detail.contains("a program pair per function");
                assert_eq!(per_function, !shape.attach_cookies, "{detail}");
            }
            // Attached as links to the pods' parent cgroup, on every kernel
            // of the matrix (links need 5.7).
            "http" => {
                assert_eq!(probe["attached"], true, "{probe}");
                assert!(probe["target"].as_str().unwrap_or_default().contains("/kubepods.slice"), "{probe}");
            }
            // Everything else attaches on every kernel of the matrix.
            _ => assert_eq!(probe["attached"], true, "{probe}"),
        }
    }
    for family in [
        "exit",
        "exit_cause",
        "crash",
        "oom",
        "memlimit",
        "runs",
        "discovery",
        "sched",
        "throttle",
        "gpu",
        "http",
    ] {
        assert!(seen.contains(family), "check reports {family}: {seen:?}");
    }
    assert_eq!(report["observable"], true, "{report}");

    // The daemon says the same on its probe metric, and keeps running.
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let crash = daemon.wait_metric("the crash probe's state", Duration::from_secs(5), |l| {
        l.starts_with("canaryscope_probe_attached{") && l.contains("probe=\"crash\"")
    });
    assert_eq!(metric_value(&crash), 1.0, "{crash}");
    let sched = daemon.wait_metric("the run-queue probe's state", Duration::from_secs(5), |l| {
        l.starts_with("canaryscope_probe_attached{") && l.contains("target=\"sched_switch\"")
    });
    assert_eq!(metric_value(&sched), 1.0, "{sched}");
}
