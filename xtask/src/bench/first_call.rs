//! `first_call`: a process that maps a GPU runtime file never seen before.
//!
//! - Held (`trace --hold`): how long the process is stopped until its probes
//!   exist (`held_ns` of the tracer's `library_probed` event), and the
//!   process's whole run (exec to exit, the first call inside) against the
//!   same run with no observer, p50/p99.
//! - Default mode (`trace`, no hold): the share of first calls seen for the
//!   shapes that race with the attach, reported, never asserted:
//!   a DT_NEEDED program calling cuInit as its first statement (library in
//!   LD_LIBRARY_PATH), and a dlopen of an arbitrary path straight after exec.
//!
//! `--hold` trades a stop of every process that maps a new runtime file for
//! never missing its first call; this case puts a figure on that stop, and
//! on what the default mode misses without it.
use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{
    div, median, percentile,
    process::{Proc, SIGTERM},
    Env, Plan, Row,
};

/// A fresh copy of the library (a new inode) for every trial.
struct FreshLib {
    dir: PathBuf,
}

impl FreshLib {
    fn new(lib: &Path, trial: usize) -> Result<FreshLib> {
        let dir =
            std::env::temp_dir().join(format!("canaryscope-bench-first-call-{}-{trial}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        fs::copy(lib, dir.join("libcuda.so.1")).with_context(|| format!("copy {}", lib.display()))?;
        Ok(FreshLib { dir })
    }

    fn lib(&self) -> PathBuf {
        self.dir.join("libcuda.so.1")
    }
}

impl Drop for FreshLib {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Runs `cmd` in its own session (the hold skips processes with a terminal)
/// and returns (wall ms from spawn to exit, pid).
fn timed_run(cmd: &mut Command) -> Result<(f64, u32)> {
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            setsid();
            Ok(())
        });
    }
    let started = Instant::now();
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn()?;
    let pid = child.id();
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    Ok((started.elapsed().as_secs_f64() * 1e3, pid))
}

extern "C" {
    fn setsid() -> i32;
}

/// `trace --json [extra]` started and ready.
pub(super) fn start_tracer(env: &Env, name: &str, extra: &[&str]) -> Result<Proc> {
    let mut cmd = Command::new(&env.bin);
    cmd.args(["trace", "--json"]).args(extra);
    let mut tracer = Proc::spawn(env, name, &mut cmd, SIGTERM, Duration::from_secs(60))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while !tracer.output().contains("tracing;") {
        if tracer.exited().is_some() || Instant::now() > deadline {
            bail!("canaryscope trace did not start; {}", tracer.log_tail());
        }
        sleep(Duration::from_millis(20));
    }
    Ok(tracer)
}

/// The tracer's JSON events.
fn events(tracer: &Proc) -> Vec<Value> {
    tracer.output().lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect()
}

fn saw_first_call(events: &[Value], pid: u32) -> bool {
    events.iter().any(|e| e["kind"] == "gpu_call" && e["function"] == "cuInit" && e["pid"] == pid)
}

pub(super) fn first_call_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    let trials = if plan.quick { 5 } else { 30 };
    let files = Files {
        loader: env.fixture("gpu_dlopen"),
        needed: env.fixture("cuda_first"),
        // The one-function ZLUDA-shaped library: each trial probes a new
        // copy, and its two links are quick for the kernel to release again.
        cuda_lib: env.fixture("zluda-min/libcuda.so.1"),
    };
    for f in [&files.loader, &files.needed, &files.cuda_lib] {
        if !f.exists() {
            bail!("{} is missing: run `cargo xtask fixtures` first", f.display());
        }
    }
    held_runs(env, &files, trials, out)?;
    default_mode_runs(env, &files, trials, out)
}

/// The case's programs and the library they load.
struct Files {
    loader: PathBuf,
    needed: PathBuf,
    cuda_lib: PathBuf,
}

impl Files {
    /// `gpu_dlopen` of a new copy of the library: (wall ms, pid).
    fn dlopen_run(&self, trial: usize) -> Result<(f64, u32)> {
        let fresh = FreshLib::new(&self.cuda_lib, trial)?;
        timed_run(Command::new(&self.loader).arg(fresh.lib()))
    }
}

/// With `--hold`: how long a process is held, whether its first call is
/// seen, and what the hold costs its wall time against bare runs.
fn held_runs(env: &Env, files: &Files, trials: usize, out: &mut Vec<Row>) -> Result<()> {
    // Bare and held runs, interleaved in pairs so drift hits both alike:
    // the held runs need the tracer up, so it runs throughout and the bare
    // runs use a library it ignores (a name no GPU runtime has).
    eprintln!("    first_call: {trials} held runs of gpu_dlopen and {trials} bare ones, each with a new library file");
    let mut tracer = start_tracer(env, "trace-hold", &["--hold"])?;
    let (mut bare, mut held_wall, mut held_pids) = (Vec::new(), Vec::new(), Vec::new());
    for trial in 0..trials {
        let fresh = FreshLib::new(&files.cuda_lib, 1000 + trial)?;
        let unseen = fresh.dir.join("libzl_unprobed.so");
        fs::rename(fresh.lib(), &unseen)?;
        bare.push(timed_run(Command::new(&files.loader).arg(&unseen))?.0);
        let (ms, pid) = files.dlopen_run(trial)?;
        held_wall.push(ms);
        held_pids.push(pid);
    }
    sleep(Duration::from_millis(500));
    tracer.stop();
    let seen = events(&tracer);
    let held_ms: Vec<f64> = held_pids
        .iter()
        .filter_map(|pid| {
            seen.iter()
                .find(|e| e["kind"] == "library_probed" && e["pid"] == *pid)
                .and_then(|e| e["held_ns"].as_f64())
                .map(|ns| ns / 1e6)
        })
        .collect();
    let held_seen = held_pids.iter().filter(|pid| saw_first_call(&seen, **pid)).count();

    let mut row = Row::new("first_call_hold_ms", "ms");
    row.canaryscope = median(&held_ms);
    row.ratio("hold p99 ms", percentile(&held_ms, 99.0));
    row.samples.push(("held".into(), held_ms.clone()));
    row.notes.push(format!(
        "{} of {trials} processes held; first call seen in {held_seen} of {trials}",
        held_ms.len()
    ));
    // The hold exists so that no first call is missed.
    if held_seen != trials {
        row.wrong(format!("with --hold, the first call was seen in only {held_seen} of {trials} processes"));
    }
    out.push(row);

    let mut row = Row::new("first_call_process_wall_ms", "ms");
    row.baseline = median(&bare);
    row.canaryscope = median(&held_wall);
    row.ratio("held/bare p50", div(median(&held_wall), median(&bare)));
    row.ratio("bare p99 ms", percentile(&bare, 99.0));
    row.ratio("held p99 ms", percentile(&held_wall, 99.0));
    row.samples.push(("bare".into(), bare));
    row.samples.push(("held".into(), held_wall));
    row.notes.push("exec to exit of gpu_dlopen (dlopen of a new file, cuInit, exit)".into());
    out.push(row);
    Ok(())
}

/// The default mode: what share of first calls it sees for the shapes that
/// race with one uprobe registration (an RCU grace period).
fn default_mode_runs(env: &Env, files: &Files, trials: usize, out: &mut Vec<Row>) -> Result<()> {
    eprintln!("    first_call: {trials} default-mode runs of each racing shape");
    let mut tracer = start_tracer(env, "trace-default", &[])?;
    let (mut needed_pids, mut dlopen_pids) = (Vec::new(), Vec::new());
    for trial in 0..trials {
        let fresh = FreshLib::new(&files.cuda_lib, 2000 + trial)?;
        let mut cmd = Command::new(&files.needed);
        cmd.env("LD_LIBRARY_PATH", &fresh.dir);
        needed_pids.push(timed_run(&mut cmd)?.1);
        dlopen_pids.push(files.dlopen_run(3000 + trial)?.1);
    }
    sleep(Duration::from_millis(500));
    tracer.stop();
    let seen = events(&tracer);
    for (name, pids) in
        [("dt_needed_first_statement", &needed_pids), ("dlopen_any_path_at_exec", &dlopen_pids)]
    {
        let caught = pids.iter().filter(|pid| saw_first_call(&seen, **pid)).count();
        let mut row = Row::new(&format!("first_call_default_{name}_seen_pct"), "%");
        row.canaryscope = Some(100.0 * caught as f64 / pids.len().max(1) as f64);
        row.notes.push(format!("{caught} of {} first calls seen without the hold", pids.len()));
        out.push(row);
    }
    Ok(())
}
