//! What canaryscope offers on the kernel it runs on, as `check` and the
//! daemon's probe metric say it: on any kernel of the VM matrix (5.10 to
//! 6.18) every probe is attached, or it is detached with the kernel feature
//! it lacks named, and only where the kernel really lacks it. GPU calls are
//! probed everywhere, in the shape the kernel allows. The families that
//! attach are exercised by the other suites run on the same kernel.
mod support;

use std::{collections::BTreeSet, process::Command, time::Duration};

use observer::probes::{
    btf::{kernel_helpers, member_offset, vmlinux},
    table::{KernelHelper, CRASH_HELPERS, GPU_CALL_HELPERS},
};
use serde_json::Value;
use support::*;

/// The helpers of `wanted` this kernel lacks, as `check` names them.
fn lacking(known: &BTreeSet<String>, wanted: &[KernelHelper]) -> Vec<String> {
    wanted
        .iter()
        .filter(|h| !known.contains(h.name))
        .map(|h| format!("bpf_{} (Linux {})", h.name, h.since))
        .collect()
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn every_probe_attaches_or_names_the_kernel_feature_it_lacks() {
    assert_root();
    let btf = vmlinux().expect("kernel BTF");
    let known = kernel_helpers(&btf).expect("enum bpf_func_id in kernel BTF");
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let (crash_missing, gpu_missing) = (lacking(&known, CRASH_HELPERS), lacking(&known, GPU_CALL_HELPERS));
    eprintln!("kernel {}: lacks {crash_missing:?} {gpu_missing:?}", kernel.trim());

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
                assert_eq!(fallback, !crash_missing.is_empty(), "{probe}");
                // Kernels before the maple tree (6.1) keep a process's
                // mappings in a tree the fallback walks at the fault itself,
                // so an init crash is placed without racing userspace.
                if fallback {
                    let has_tree = member_offset(&btf, "mm_struct", "mm_rb").is_some();
                    let walks = probe["detail"].as_str().unwrap_or_default().contains("tree of mappings");
                    assert_eq!(walks, has_tree, "{probe}");
                }
            }
            // One line per GPU runtime file found on the node: probed on
            // every kernel, through a program pair per function where
            // there are no attach cookies.
            "gpu" => {
                assert_eq!(probe["attached"], true, "{probe}");
                let detail = probe["detail"].as_str().unwrap_or_default();
                let per_function = detail.contains("a program pair per function");
                assert_eq!(per_function, !gpu_missing.is_empty(), "{detail}");
            }
            // Everything else attaches on every kernel of the matrix.
            _ => assert_eq!(probe["attached"], true, "{probe}"),
        }
    }
    for family in ["exit", "exit_cause", "crash", "oom", "memlimit", "discovery", "sched", "throttle", "gpu"]
    {
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
