//! `cargo xtask test`: the whole suite, in the order that fails fastest.
use std::{process::Command, time::Instant};

use anyhow::{bail, Result};
use clap::Args;

use crate::{cargo, fixtures, root, run, step};

#[derive(Args)]
pub struct TestArgs {
    /// Skip the VM tests (Debian 6.1 kernel with amdgpu under QEMU).
    #[arg(long)]
    pub no_vm: bool,
    /// Skip the container image build and its check (buildah, chroot run of the binary).
    #[arg(long)]
    pub no_image: bool,
    /// Skip rustfmt and clippy.
    #[arg(long)]
    pub no_lint: bool,
    /// Skip the benchmark smoke run.
    #[arg(long)]
    pub no_bench: bool,
    /// Skip the bounded fuzzing run of the parsers.
    #[arg(long)]
    pub no_fuzz: bool,
    /// Only run integration tests whose name contains this.
    #[arg(long)]
    pub filter: Option<String>,
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

pub fn run_all(args: TestArgs) -> Result<()> {
    let started = Instant::now();
    if !is_root() {
        bail!("the suite loads eBPF programs, creates cgroups and causes OOM kills: run it as root");
    }
    if !args.no_lint {
        step("rustfmt --check");
        run(cargo().args(["fmt", "--all", "--", "--check"]))?;
        run(cargo().args(["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"]))?;
        step("clippy (warnings are errors)");
        run(cargo().args(["clippy", "--release", "--all-targets", "--", "-D", "warnings"]))?;
    }
    fixtures::build_all()?;
    crate::build()?;
    step("unit tests");
    run(cargo().args(["test", "--release", "--workspace", "--exclude", "observer-ebpf"]))?;
    step("integration tests as root on this kernel (real eBPF, real HIP runtime, real cgroups)");
    let mut integration = cargo();
    integration.args(["test", "--release", "-p", "observer", "--test", "*", "--"]);
    integration.args(["--ignored", "--test-threads=1"]);
    if let Some(filter) = &args.filter {
        integration.arg(filter);
    }
    run(integration.env("CANARYSCOPE_FIXTURES", root().join("target/fixtures")))?;
    if !args.no_fuzz {
        step(
            "fuzzing the parsers of outside input: 5 libFuzzer targets x 15 s (cargo xtask fuzz runs longer)",
        );
        run(Command::new(root().join("fuzz/run.sh")).arg("15"))?;
    }
    let deploy_check = root().join("deploy/check.sh");
    if deploy_check.exists() {
        step("deploy/: promtool rules, alert unit tests, manifest validation");
        run(&mut Command::new(deploy_check))?;
    }
    if !args.no_image {
        step("container image: buildah FROM scratch, OCI archive, config check, run from its rootfs");
        crate::image::run()?;
    }
    if !args.no_vm {
        crate::matrix::check_host()?;
        step("VM tests: Debian 6.1 kernel with kprobes, amdgpu and /dev/kfd (QEMU, software emulation)");
        let binaries = test_binaries(&[
            "vm_kfd",
            "kfd_fallback",
            "gpu_hip",
            "gpu_cuda",
            "cpu_oom_exit",
            "hot_calls",
            "exit_causes",
            "memory_limits",
            "group_oom",
            "sched_scope",
            "kernel_support",
        ])?;
        run(Command::new(root().join("tests/vm/test.sh")).args(&binaries))?;
        // A boot of its own, so the first-call runs (ten of each case, many
        // processes) get a timeout of their own under emulation.
        step("VM tests: first GPU calls of never-seen libraries, default mode and --hold (Debian 6.1)");
        run(Command::new(root().join("tests/vm/test.sh")).args(test_binaries(&["first_call"])?))?;
        // Debian 12's other kernel: the same suites, so a verifier or layout
        // change there fails here. The first-call suite (ten runs of every
        // case, 8 minutes) stays on 6.1 to keep CI within its hour.
        step("VM tests on Debian 12's 6.12 kernel: the suites of the first boot");
        run(Command::new(root().join("tests/vm/test.sh")).args(["--kernel", "6.12"]).args(&binaries))?;
        // Debian 11's 5.10: what works there is tested there (GPU calls
        // through a program pair per function: no attach cookies), and what
        // cannot work is named (no bpf_find_vma for the crash program).
        step("VM tests on Debian 11's 5.10 kernel: what works there, and what it lacks named");
        let degraded = test_binaries(&[
            "kernel_support",
            "gpu_hip",
            "gpu_cuda",
            "hot_calls",
            "sched_scope",
            "cpu_oom_exit",
            "memory_limits",
            "exit_causes",
            "group_oom",
        ])?;
        run(Command::new(root().join("tests/vm/test.sh")).args(["--kernel", "5.10"]).args(&degraded))?;
        step("README.md: the kernel matrix from each kernel's `canaryscope check`");
        crate::matrix::write_readme()?;
    }
    if !args.no_bench {
        step("benchmark smoke run (cargo xtask bench --quick)");
        run(cargo().args(["run", "--quiet", "--release", "-p", "xtask", "--", "bench", "--quick"]))?;
    }
    step(&format!("all tests passed in {:.0?}", started.elapsed()));
    Ok(())
}

/// Paths of the release integration-test executables with these names.
fn test_binaries(names: &[&str]) -> Result<Vec<String>> {
    let out = cargo()
        .args(["test", "--release", "-p", "observer", "--tests", "--no-run", "--message-format=json"])
        .current_dir(root())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut found = Vec::new();
    for line in text.lines() {
        // Each artifact line carries `"executable":"PATH"`; no JSON parser
        // is needed for one string field.
        let Some(start) = line.find("\"executable\":\"") else { continue };
        let rest = &line[start + 14..];
        let Some(end) = rest.find('"') else { continue };
        let path = &rest[..end];
        let file = path.rsplit('/').next().unwrap_or(path);
        if names.iter().any(|n| file.starts_with(&format!("{n}-"))) {
            found.push(path.to_string());
        }
    }
    if found.len() != names.len() {
        bail!("expected test binaries {names:?}, found {found:?}");
    }
    Ok(found)
}
