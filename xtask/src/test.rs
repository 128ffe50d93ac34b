//! `cargo xtask test`: the whole suite, in the order that fails fastest.
use std::{process::Command, time::Instant};

use anyhow::{bail, Result};
use clap::Args;

use crate::{cargo, fixtures, root, run, side_jobs::SideJobs, step};

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
    // Clippy, fuzzing, the deploy/ checks, the image and the benchmark smoke
    // run assert nothing about time. With VM boots ahead, whose emulator
    // keeps one of the two cores busy, they run beside the boots on the
    // other core; without, in turn.
    let mut checks = Checks { beside_vms: !args.no_vm, side: SideJobs::default() };
    if !args.no_lint {
        lint(checks.beside_vms)?;
    }
    fixtures::build_all()?;
    crate::build()?;
    step("unit tests");
    run(cargo().args(["test", "--release", "--workspace", "--exclude", "observer-ebpf"]))?;
    let skips = integration_tests(args.filter.as_deref())?;
    // Every boot's test binaries, found before anything beside the boots
    // takes cargo's locks; and the host's column of the kernel matrix,
    // before the benchmark beside the boots attaches and releases probes:
    // the kernel does both one probe at a time, so `check` would wait
    // minutes behind it.
    let boot_args = if checks.beside_vms { vm_boot_args()? } else { Vec::new() };
    if checks.beside_vms {
        crate::matrix::check_host()?;
    }
    checks.run_all(&args)?;
    if checks.beside_vms {
        for (boot, args) in VM_BOOTS.iter().zip(&boot_args) {
            step(&format!("VM tests on {}: {}", boot.kernel_name, boot.why));
            let mut vm = Command::new(root().join("tests/vm/test.sh"));
            run(vm.args(["--kernel", boot.kernel]).args(args).env(SHAPE_VAR, boot.shape))?;
        }
        step("docs/kernels.md: the kernel matrix from each kernel's `canaryscope check`");
        crate::matrix::write_page()?;
    }
    checks.side.finish()?;
    report_skips(&skips);
    step(&format!("all tests passed in {:.0?}", started.elapsed()));
    Ok(())
}

/// The checks that assert nothing about time, run beside the VM boots or,
/// without them, in turn.
struct Checks {
    beside_vms: bool,
    side: SideJobs,
}

impl Checks {
    fn inline_or_beside(&mut self, name: &'static str, what: &str, mut cmd: Command) -> Result<()> {
        if self.beside_vms {
            self.side.start(name, what, cmd)
        } else {
            step(what);
            run(&mut cmd)
        }
    }

    /// Clippy over the host crates (when beside the boots), the bounded
    /// fuzzing, deploy/, the image and the benchmark smoke run.
    fn run_all(&mut self, args: &TestArgs) -> Result<()> {
        if !args.no_lint && self.beside_vms {
            self.inline_or_beside("clippy", "clippy (warnings are errors)", clippy_host())?;
        }
        if !args.no_fuzz {
            let mut fuzz = Command::new(root().join("fuzz/run.sh"));
            fuzz.arg("15");
            let what =
                "fuzzing the parsers of outside input: 7 libFuzzer targets x 15 s (cargo xtask fuzz runs longer)";
            self.inline_or_beside("fuzz", what, fuzz)?;
        }
        let deploy_check = root().join("deploy/check.sh");
        if deploy_check.exists() {
            let what =
                "deploy/: the Helm chart and its renders, promtool rules, alert unit tests, manifest validation";
            self.inline_or_beside("deploy-check", what, Command::new(deploy_check))?;
        }
        if !args.no_image {
            let what =
                "container image: buildah FROM scratch, OCI archive, config check, run from its rootfs";
            if self.beside_vms {
                let mut image = Command::new(std::env::current_exe()?);
                image.arg("image");
                self.inline_or_beside("image", what, image)?;
            } else {
                step(what);
                crate::image::run()?;
            }
        }
        if !args.no_bench {
            // This xtask, as `cargo xtask bench` runs it: a release build of
            // xtask would unify features anew and rebuild kube and the observer.
            // The smoke run asserts results, never times, and shares no kernel
            // with the guests, so it too runs beside the boots.
            let mut bench = Command::new(std::env::current_exe()?);
            bench.args(["bench", "--quick"]);
            self.inline_or_beside("bench", "benchmark smoke run (cargo xtask bench --quick)", bench)?;
        }
        Ok(())
    }
}

/// The layers, the docs' links, rustfmt and the eBPF crate's clippy: seconds, and the
/// cheapest way to learn a change broke them. The host crates' clippy
/// (minutes) runs here only when there are no VM boots to run beside.
pub fn lint(beside_vms: bool) -> Result<()> {
    step("layers: observer/src imports run downward only");
    crate::layers::check()?;
    step("documentation: relative links resolve, every docs/ page linked from README.md");
    crate::doclinks::check()?;
    step("rustfmt --check");
    run(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().args(["fmt", "--manifest-path", "fuzz/Cargo.toml", "--", "--check"]))?;
    step("clippy over the eBPF programs (Debian's clippy, bpfel-unknown-none; warnings are errors)");
    run(&mut clippy_ebpf()?)?;
    if !beside_vms {
        step("clippy (warnings are errors)");
        run(&mut clippy_host())?;
    }
    Ok(())
}

/// Clippy over every crate but the eBPF one, whose target rustup's
/// toolchain cannot check (see `clippy_ebpf`).
fn clippy_host() -> Command {
    let mut cmd = cargo();
    cmd.args(["clippy", "--release", "--all-targets", "--", "-D", "warnings"]);
    cmd
}

/// Debian's toolchain, the one observer/build.rs builds the eBPF crate
/// with (rustup's has no `core` for bpfel-unknown-none, so its clippy
/// cannot check the crate).
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const DEBIAN_CLIPPY: &str = "/usr/bin/cargo-clippy";

/// Clippy over the eBPF crate with Debian's clippy (`rust-web-clippy`), as
/// the crate is built: same compiler, target and flags, so the workspace's
/// lints hold there too.
fn clippy_ebpf() -> Result<Command> {
    if !std::path::Path::new(DEBIAN_CLIPPY).exists() {
        bail!("{DEBIAN_CLIPPY} is missing: the eBPF crate's lints need Debian's rust-web-clippy (scripts/setup.sh)");
    }
    let mut cmd = Command::new(DEBIAN_CARGO);
    // The outer cargo's toolchain, flags and jobserver belong to the host
    // build (observer/build.rs clears them for the same reason).
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO") || key.starts_with("RUST") {
            cmd.env_remove(&key);
        }
    }
    // `cargo clippy` runs the first `cargo-clippy` on PATH: rustup's proxy
    // would come first and check with rustup's compiler.
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("/usr/bin:{path}"))
        .env("RUSTC", "/usr/bin/rustc")
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", root().join("target/ebpf"))
        // Its own .cargo/config.toml names the target, linker and flags.
        .current_dir(root().join("observer-ebpf"))
        .args(["clippy", "--release", "--target", "bpfel-unknown-none", "--", "-D", "warnings"]);
    Ok(cmd)
}

/// The integration tests as root on this kernel; returns the file where
/// tests that could not run here noted why.
fn integration_tests(filter: Option<&str>) -> Result<std::path::PathBuf> {
    step("integration tests as root on this kernel (real eBPF, real HIP runtime, real cgroups)");
    let mut integration = cargo();
    integration.args(["test", "--release", "-p", "observer", "--test", "*", "--"]);
    integration.args(["--ignored", "--test-threads=1"]);
    if let Some(filter) = filter {
        integration.arg(filter);
    }
    // Tests that cannot run on a kernel note it here (support::skip), host
    // and guests alike (the guests share the checkout); the summary lists them.
    let skips = root().join("target/ci/skips.txt");
    std::fs::create_dir_all(root().join("target/ci"))?;
    let _ = std::fs::remove_file(&skips);
    std::env::set_var("CANARYSCOPE_SKIPS", &skips);
    // The host is CI's 6.18; a developer on another kernel declares its
    // features in the same variable.
    let host_shape = std::env::var(SHAPE_VAR).unwrap_or_else(|_| SHAPE_HOST.to_string());
    integration.env(SHAPE_VAR, host_shape);
    run(integration.env("CANARYSCOPE_FIXTURES", root().join("target/fixtures")))?;
    Ok(skips)
}

/// One VM boot of the suite: a kernel, why it is booted, and what runs there.
struct Boot {
    kernel: &'static str,
    kernel_name: &'static str,
    why: &'static str,
    /// What the kernel offers, declared here rather than read by the code
    /// under test: the tests expect each family's shape from it
    /// (test-support/src/shape.rs names the features).
    shape: &'static str,
    /// Lists of suites, run one list after another.
    suites: &'static [&'static [Suite]],
}

/// Lists the tests that did not run on some kernel, with where and why, so
/// that a pass is never a silent skip.
fn report_skips(file: &std::path::Path) {
    let noted = std::fs::read_to_string(file).unwrap_or_default();
    if noted.trim().is_empty() {
        eprintln!("    no test skipped itself on any kernel");
        return;
    }
    step("tests that skipped themselves (each runs on another kernel of the matrix)");
    for line in noted.lines() {
        // "KERNEL TEST: WHY"
        let (kernel, rest) = line.split_once(' ').unwrap_or(("?", line));
        eprintln!("    on {kernel}: {rest}");
    }
}

/// An integration-test binary, and the tests of it to run (all when empty).
type Suite = (&'static str, &'static [&'static str]);

/// The VM suites proper: KFD with amdgpu and its syscall fallback, the GPU
/// runtimes, CPU/OOM/exit. Whole on both of Debian 12's kernels.
const VM_SUITES: &[Suite] = &[
    ("vm_kfd", &[]),
    ("kfd_fallback", &[]),
    ("gpu_hip", &[]),
    ("gpu_cuda", &[]),
    ("gpu_cudart", CUDART_LAYERS),
    ("cpu_oom_exit", &[]),
];

/// NVIDIA's CUDA runtime over NVIDIA's driver library: the runtime's own
/// failure with the driver version read at a version call's return, and a
/// failure seen at both layers. The rest of its suite (discovery, the gate,
/// error names) is the same userspace on every kernel.
const CUDART_LAYERS: &[&str] = &[
    "the_cuda_13_runtimes_insufficient_driver_is_a_runtime_failure",
    "no_device_is_seen_at_both_layers_of_the_11_8_and_12_runtimes",
];

/// Solver runs from exec to exit, each ending a real z3 can have: the runs
/// family's programs once per kernel.
const Z3_RUNS: &str = "a_real_z3_under_the_runbooks_wrapper_ends_each_way_and_only_its_runs_count";

/// The suites of the later families, whole on 6.1.
const LATER_SUITES: &[Suite] = &[
    ("solver_runs", &[Z3_RUNS]),
    ("hot_calls", &[]),
    ("exit_causes", &[]),
    ("memory_limits", &[]),
    ("group_oom", &[]),
    ("sched_scope", &[]),
    ("kernel_support", &[]),
];

/// Every probe family once, in the shape the kernel gets, for the kernels
/// CI cannot afford whole suites on: `check` (kernel_support), the hold
/// (a process stopped at a new runtime file's mapping), a GPU call
/// failure through both runtime layers, a crash in the library, a library
/// found after start, per-process hot probes (counted, or timed where the
/// kernel has no attach cookies), the CPU/OOM/exit suite
/// (throttling, OOM kill, exits), a sender of a fatal signal, a refused
/// allocation, the run-queue histogram and a solver's runs. KFD comes on
/// its own, for the kernels that have amdgpu.
const ONE_PER_FAMILY: &[Suite] = &[
    ("kernel_support", &[]),
    ("first_call", &["a_held_process_has_its_immediate_first_call_seen"]),
    (
        "gpu_cuda",
        &[
            "cu_init_failure_is_reported_with_the_hip_call_beneath",
            "a_crash_inside_the_library_names_library_and_call",
            "a_library_loaded_later_is_found_within_a_second",
            "a_probed_file_takes_one_uprobe_multi_link_per_program_where_the_kernel_has_them",
        ],
    ),
    (
        "hot_calls",
        &[
            "trace_pid_traps_every_thread_of_its_process_and_no_other_process",
            "the_daemon_counts_hot_calls_at_return_and_times_them_on_request",
        ],
    ),
    ("cpu_oom_exit", &[]),
    ("exit_causes", &["kill_9_from_elsewhere_names_the_senders_scope"]),
    ("memory_limits", &["a_tight_mmap_refusal_loop_gives_one_record_a_second_and_an_exact_count"]),
    ("sched_scope", &["a_cgroups_histogram_total_is_the_kernels_run_delay_of_its_threads"]),
    ("solver_runs", &[Z3_RUNS]),
];
const KFD_ONCE: &[Suite] = &[("vm_kfd", &["real_hip_runtime_kfd_ioctls_and_its_crash_are_seen"])];

/// The kernels' features that decide each family's shape (attach cookies
/// since 5.15, bpf_find_vma since 5.17, the tree of mappings until 6.1's
/// maple tree, uprobe_multi links since 6.6), written down per kernel of the
/// matrix from Debian's builds, so that a wrong table in the observer cannot
/// move the tests' expectation with it.
const SHAPE_HOST: &str = "attach_cookies,find_vma,uprobe_multi";
const SHAPE_6_12: &str = "attach_cookies,find_vma,uprobe_multi";
const SHAPE_6_1: &str = "attach_cookies,find_vma";
const SHAPE_5_10: &str = "mapping_tree";
const SHAPE_VAR: &str = "CANARYSCOPE_KERNEL_SHAPE";

/// The matrix, one boot after another: emulated CPUs run no faster side by
/// side on two cores, and starved guests report lockups of their own.
const VM_BOOTS: &[Boot] = &[
    Boot {
        kernel: "6.1",
        kernel_name: "Debian 12's 6.1",
        why: "every suite (kprobes, amdgpu, /dev/kfd; QEMU, software emulation)",
        shape: SHAPE_6_1,
        suites: &[VM_SUITES, LATER_SUITES],
    },
    // A boot of its own, so the first-call runs (ten of each case, many
    // processes) get a timeout of their own under emulation.
    Boot {
        kernel: "6.1",
        kernel_name: "Debian 12's 6.1",
        why: "first GPU calls of never-seen libraries, default mode and --hold",
        shape: SHAPE_6_1,
        suites: &[&[("first_call", &[])]],
    },
    // Debian 12's other kernel: the same programs as 6.1's and the host's,
    // so what can differ is the verifier and the kernel's layouts, which
    // one test per family exercises (as on 5.10 and the cloud flavour).
    // Whole suites there cost CI minutes that found nothing 6.1 did not.
    Boot {
        kernel: "6.12",
        kernel_name: "Debian 12's 6.12",
        why: "check, and one test per probe family, KFD with amdgpu included",
        shape: SHAPE_6_12,
        suites: &[KFD_ONCE, ONE_PER_FAMILY],
    },
    // Debian 11's 5.10: GPU calls through a program pair per function (no
    // attach cookies) and crashes from the signal's own registers (no
    // bpf_find_vma), each exercised once; `check` names what it lacks.
    Boot {
        kernel: "5.10",
        kernel_name: "Debian 11's 5.10",
        why: "check, and one test per probe family in the shapes older kernels get",
        shape: SHAPE_5_10,
        // The slot programs read a version call's pointer too.
        suites: &[KFD_ONCE, ONE_PER_FAMILY, &[("gpu_cudart", CUDART_LAYERS)]],
    },
    // The cloud flavour: no 9p (the harness shares over virtiofs), no amdgpu.
    Boot {
        kernel: "6.1-cloud",
        kernel_name: "Debian 12's 6.1 cloud flavour",
        why: "check, and one test per probe family (no amdgpu: KFD through its syscall fallback)",
        shape: SHAPE_6_1,
        suites: &[ONE_PER_FAMILY],
    },
];

/// tests/vm/test.sh's arguments for each boot of `VM_BOOTS`: `--only NAME`
/// before a binary for each test it is limited to.
fn vm_boot_args() -> Result<Vec<Vec<String>>> {
    let mut names: Vec<&str> =
        VM_BOOTS.iter().flat_map(|b| b.suites.iter()).flat_map(|l| l.iter()).map(|(n, _)| *n).collect();
    names.sort_unstable();
    names.dedup();
    let paths = test_binaries(&names)?;
    let args: Vec<Vec<String>> =
        VM_BOOTS.iter().map(|boot| arrange(boot.suites, &paths)).collect::<Result<_>>()?;
    // A named test that was renamed would run nothing in its boot (which
    // fails there too): say so here, before minutes of booting.
    for (boot, boot_args) in VM_BOOTS.iter().zip(&args) {
        for (name, only) in boot.suites.iter().flat_map(|l| l.iter()).filter(|(_, only)| !only.is_empty()) {
            let path = boot_args
                .iter()
                .find(|a| a.rsplit('/').next().is_some_and(|f| f.starts_with(&format!("{name}-"))));
            let Some(path) = path else { continue };
            let listed = Command::new(path).args(["--list", "--include-ignored"]).output()?;
            let listed = String::from_utf8_lossy(&listed.stdout);
            let tests: Vec<&str> = listed.lines().filter_map(|l| l.strip_suffix(": test")).collect();
            if let Some(missing) = only.iter().find(|t| !tests.contains(t)) {
                bail!(
                    "VM boot on {}: {name} has no test named {missing} (VM_BOOTS in xtask/src/test.rs)",
                    boot.kernel_name
                );
            }
        }
    }
    Ok(args)
}

/// Each suite's binary among `paths`, after a `--only` per test it is
/// limited to, in the order of `lists`.
fn arrange(lists: &[&[Suite]], paths: &[String]) -> Result<Vec<String>> {
    let mut args = Vec::new();
    for (name, only) in lists.iter().flat_map(|l| l.iter()) {
        let path = paths
            .iter()
            .find(|p| p.rsplit('/').next().is_some_and(|f| f.starts_with(&format!("{name}-"))))
            .ok_or_else(|| anyhow::anyhow!("no test binary {name} among {paths:?}"))?;
        for test in *only {
            args.extend(["--only".to_string(), test.to_string()]);
        }
        args.push(path.clone());
    }
    Ok(args)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limited_suite_gets_its_tests_named_before_its_binary() {
        let paths: Vec<String> = ["vm_kfd-1a", "gpu_cuda-2b", "kernel_support-3c", "cpu_oom_exit-4d"]
            .iter()
            .map(|f| format!("/t/deps/{f}"))
            .collect();
        let lists: &[&[Suite]] = &[KFD_ONCE, &[("kernel_support", &[]), ("gpu_cuda", &["a", "b"])]];
        let args = arrange(lists, &paths).expect("arranged");
        assert_eq!(
            args,
            [
                "--only",
                "real_hip_runtime_kfd_ioctls_and_its_crash_are_seen",
                "/t/deps/vm_kfd-1a",
                "/t/deps/kernel_support-3c",
                "--only",
                "a",
                "--only",
                "b",
                "/t/deps/gpu_cuda-2b",
            ]
        );
        assert!(arrange(&[&[("hot_calls", &[])]], &paths).is_err(), "a missing binary is an error");
    }

    /// A misspelt feature would declare less than the kernel has and fail
    /// only in its boot, minutes later; the words are the tests' own.
    #[test]
    fn every_declared_kernel_shape_names_known_features() {
        let known = std::fs::read_to_string(root().join("test-support/src/shape.rs")).unwrap();
        for shape in VM_BOOTS.iter().map(|b| b.shape).chain([SHAPE_HOST]) {
            for word in shape.split(',') {
                assert!(known.contains(&format!("has(\"{word}\")")), "{word} in {shape}");
            }
        }
    }

    #[test]
    fn every_kernel_of_the_matrix_runs_check_and_each_family_once_or_more() {
        let first_call_only =
            |b: &&Boot| b.suites.iter().flat_map(|l| l.iter()).all(|(n, _)| *n == "first_call");
        // Each kernel holds a process at a new runtime file's mapping once.
        for kernel in ["6.1", "6.12", "5.10", "6.1-cloud"] {
            let holds = VM_BOOTS
                .iter()
                .filter(|b| b.kernel == kernel)
                .flat_map(|b| b.suites.iter().flat_map(|l| l.iter()))
                .any(|(n, _)| *n == "first_call");
            assert!(holds, "{kernel} runs no first-call case with the hold");
        }
        // Every boot but the first-call suite's own.
        for boot in VM_BOOTS.iter().filter(|b| !first_call_only(b)) {
            let names: Vec<&str> = boot.suites.iter().flat_map(|l| l.iter()).map(|(n, _)| *n).collect();
            for must in [
                "kernel_support",
                "gpu_cuda",
                "hot_calls",
                "cpu_oom_exit",
                "exit_causes",
                "memory_limits",
                "sched_scope",
                "solver_runs",
            ] {
                assert!(names.contains(&must), "{} lacks {must}", boot.kernel);
            }
        }
    }
}
