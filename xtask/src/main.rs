//! Project tasks: `cargo xtask <build|run|test|lint|vm|matrix|bench|image|fixtures|layers>`.
//!
//! Every task says what it is doing before it does it: builds, VM boots and
//! benchmarks take long enough that silence would look like a hang.
use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    sync::OnceLock,
    time::Instant,
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod bench;
mod doclinks;
mod fixtures;
mod image;
mod layers;
mod matrix;
mod side_jobs;
mod test;

#[derive(Parser)]
#[command(name = "xtask", about = "canaryscope project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Build the eBPF object and the `canaryscope` binary (target/release/canaryscope).
    Build,
    /// Build, then run `canaryscope ARGS...` (as root; `trace` by default).
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Check that observer/src imports run downward only (layers, no cycle, no forbidden arrow).
    Layers,
    /// The suite's lint step alone: layers, rustfmt, and clippy over every crate, the eBPF one
    /// with Debian's clippy.
    Lint,
    /// Build the C test programs and libraries into target/fixtures.
    Fixtures,
    /// The whole test suite: format, lints, unit tests, root integration tests, deploy checks, image, VM, bench smoke.
    Test(test::TestArgs),
    /// Overhead and detection latency side by side with bpftrace and libbpf-tools.
    Bench(bench::BenchArgs),
    /// Boot the test VM (Debian 6.1 kernel with amdgpu) and run CMD inside it.
    Vm {
        /// Which Debian kernel the VM boots: 6.1, 6.12, 6.1-cloud or 5.10.
        #[arg(long, default_value = "6.1", value_parser = ["6.1", "6.12", "6.1-cloud", "5.10"])]
        kernel: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<String>,
    },
    /// Write docs/kernels.md's kernel matrix from the last suite's `check` reports (host and VMs).
    Matrix,
    /// Build the container image (OCI archive) the DaemonSet runs.
    Image,
    /// Fuzz the parsers of outside input (cargo-fuzz/libFuzzer) for SECONDS per target.
    Fuzz {
        #[arg(default_value_t = 300)]
        seconds: u32,
        /// Only these targets (cgroup_path, proc_maps, tracefs_format, label_values, ld_so_cache).
        targets: Vec<String>,
    },
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace root").to_path_buf()
}

/// When this xtask started: each step says how far into the run it begins,
/// so a long suite shows where its time goes.
static STARTED: OnceLock<Instant> = OnceLock::new();

pub fn step(msg: &str) {
    let secs = STARTED.get_or_init(Instant::now).elapsed().as_secs();
    eprintln!("\x1b[1m==> [{:02}:{:02}] {msg}\x1b[0m", secs / 60, secs % 60);
}

/// Runs a command from the workspace root (unless it names a folder of its
/// own), echoing it, failing on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}").replace('"', "");
    let started = Instant::now();
    if cmd.get_current_dir().is_none() {
        cmd.current_dir(root());
    }
    let status = cmd.status().with_context(|| format!("cannot start {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status}) after {:.0?}", started.elapsed());
    }
    Ok(())
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // `cargo xtask` (cargo run) exports xtask's own CARGO_MANIFEST_DIR,
    // CARGO_PKG_NAME, ...; ring's build script reruns when those change, so every
    // switch between `cargo xtask ...` and a plain `cargo build`/`cargo test`
    // would rebuild ring, rustls, kube and the observer (minutes). Builds started
    // from here see what a plain cargo sees (CARGO_HOME, CARGO_TARGET_DIR,
    // CARGO_BUILD_* and the like are kept).
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_xtask = ["CARGO_PKG_", "CARGO_MANIFEST_"].iter().any(|p| name.starts_with(p))
            || ["CARGO_CRATE_NAME", "CARGO_BIN_NAME", "CARGO_PRIMARY_PACKAGE", "CARGO_RUSTC_CURRENT_DIR"]
                .contains(&name.as_ref());
        if set_for_xtask {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd
}

pub fn build() -> Result<PathBuf> {
    step("building eBPF programs (Debian rustc, bpfel-unknown-none) and canaryscope (release)");
    run(cargo().args(["build", "--release", "-p", "observer"]))?;
    let bin = root().join("target/release/canaryscope");
    eprintln!("    built {}", bin.display());
    Ok(bin)
}

fn main() -> ExitCode {
    STARTED.get_or_init(Instant::now);
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Build => build().map(|_| ()),
        Task::Run { args } => build().and_then(|bin| {
            let args = if args.is_empty() { vec!["trace".to_string()] } else { args };
            step(&format!("running canaryscope {}", args.join(" ")));
            run(Command::new(bin).args(args))
        }),
        Task::Layers => layers::check(),
        Task::Lint => test::lint(false),
        Task::Fixtures => fixtures::build_all().map(|_| ()),
        Task::Test(args) => test::run_all(args),
        Task::Bench(args) => bench::run(args),
        Task::Image => image::run(),
        Task::Matrix => matrix::write_page(),
        Task::Fuzz { seconds, targets } => {
            run(Command::new(root().join("fuzz/run.sh")).arg(seconds.to_string()).args(targets))
        }
        Task::Vm { kernel, cmd } => run(Command::new(root().join("tests/vm/run.sh"))
            .args(["--kernel", kernel.as_str(), "--"])
            .args(cmd)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}
