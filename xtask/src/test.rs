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
    /// Skip rustfmt and clippy.
    #[arg(long)]
    pub no_lint: bool,
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
    let deploy_check = root().join("deploy/check.sh");
    if deploy_check.exists() {
        step("deploy/: promtool rules, alert unit tests, manifest validation");
        run(&mut Command::new(deploy_check))?;
    }
    if !args.no_vm {
        step("VM tests: Debian 6.1 kernel with kprobes and amdgpu");
        run(Command::new(root().join("tests/vm/test.sh")).arg(root().join("target/release/canaryscope")))?;
    }
    step(&format!("all tests passed in {:.0?}", started.elapsed()));
    Ok(())
}
