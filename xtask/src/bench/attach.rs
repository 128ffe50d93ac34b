//! `attach`: how soon the probes of a real runtime file exist once a
//! process reveals it, and what share of first calls the default mode (no
//! hold) sees because of that. Real files only, never the one-function
//! fixture: the host's HIP runtime and NVIDIA's `libcuda`, a fresh copy (a
//! new inode, so a file never seen before) for every run.
//!
//! Each run is `gpu_dlopen --after D NAME` with the copy's folder in
//! `LD_LIBRARY_PATH`: the tracer finds the file at exec through the
//! loader's search path (the record that reveals it), and the process
//! dlopens it by name and makes its first call D ms later, D in 0, 10, 50.
//! The figures are the tracer's own, from its `library_probed` event:
//! exec to the init functions' probes (attached first), and exec to all.
use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::{
    median, percentile,
    process::{Proc, SIGINT},
    stop::{nvidia_libcuda, stop_and_await_release, wait_for},
    Env, Plan, Row,
};

/// Milliseconds from exec to the dlopen and first call.
const DELAYS_MS: [u64; 3] = [0, 10, 50];

/// The host's HIP runtime (Debian's libamdhip64-5).
fn host_hip() -> Result<PathBuf> {
    ["/lib/x86_64-linux-gnu/libamdhip64.so.5", "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .context("no libamdhip64.so.5 on this host (scripts/setup.sh installs libamdhip64-5)")
}

struct Run {
    pid: u32,
    delay_ms: u64,
    dir: PathBuf,
}

/// One runtime: a default-mode tracer, `trials` runs per delay, each with a
/// fresh copy; returns the runs and the tracer's events.
fn runs_of(env: &Env, label: &str, lib: &Path, name: &str, trials: usize) -> Result<(Vec<Run>, Vec<Value>)> {
    let base = std::env::temp_dir().join(format!("canaryscope-bench-attach-{}-{label}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let result = runs_in(env, label, lib, name, trials, &base);
    let _ = std::fs::remove_dir_all(&base);
    result
}

fn runs_in(
    env: &Env,
    label: &str,
    lib: &Path,
    name: &str,
    trials: usize,
    base: &Path,
) -> Result<(Vec<Run>, Vec<Value>)> {
    let mut cmd = Command::new(&env.bin);
    cmd.args(["trace", "--json"]);
    let mut tracer =
        Proc::spawn(env, &format!("attach-{label}"), &mut cmd, SIGINT, Duration::from_secs(300))?;
    wait_for(&mut tracer, "tracing;", 1)?;
    let mut runs = Vec::new();
    for trial in 0..trials {
        for delay_ms in DELAYS_MS {
            let dir = base.join(format!("{trial}-{delay_ms}"));
            std::fs::create_dir_all(&dir)?;
            std::fs::copy(lib, dir.join(name)).with_context(|| format!("copy {}", lib.display()))?;
            let mut child = Command::new(env.fixture("gpu_dlopen"));
            // Alive a second after its call: a tracer that lags (the suite
            // runs this beside VM boots) reads a gone process's files from
            // nowhere, and the copy would never be probed.
            child.args(["--after", &delay_ms.to_string(), "--linger", "1000", name]);
            child.env("LD_LIBRARY_PATH", &dir);
            let out = child.stdout(Stdio::piped()).stderr(Stdio::null()).output()?;
            if !out.status.success() {
                bail!("gpu_dlopen {name} from {} failed: {}", dir.display(), out.status);
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            let pid = stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix("pid="))
                .and_then(|p| p.parse().ok())
                .with_context(|| format!("gpu_dlopen printed no pid: {stdout}"))?;
            runs.push(Run { pid, delay_ms, dir });
            // Each copy's probes exist before the next run starts, so one
            // run's attach does not queue behind the last one's.
            let dir = runs.last().map(|r| r.dir.display().to_string()).unwrap_or_default();
            let deadline = Instant::now() + Duration::from_secs(60);
            while !tracer.output().lines().any(|l| l.contains("\"library_probed\"") && l.contains(&dir)) {
                if tracer.exited().is_some() || Instant::now() > deadline {
                    bail!("no library_probed for {dir} within 60 s; {}", tracer.log_tail());
                }
                sleep(Duration::from_millis(10));
            }
        }
    }
    stop_and_await_release(&mut tracer)?;
    let events = tracer.output().lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect();
    Ok((runs, events))
}

pub(super) fn attach_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    let trials = if plan.quick { 1 } else { 5 };
    let libs = [
        ("hip", host_hip()?, "libamdhip64.so.5", "hipInit"),
        ("libcuda", nvidia_libcuda(env)?, "libcuda.so.1", "cuInit"),
    ];
    for (label, lib, name, init) in libs {
        eprintln!(
            "    attach: {} runs of a fresh copy of {} found at exec, called {DELAYS_MS:?} ms after it",
            trials * DELAYS_MS.len(),
            lib.display()
        );
        let (runs, events) = runs_of(env, label, &lib, name, trials)?;
        let probed = |run: &Run| {
            let dir = run.dir.display().to_string();
            events.iter().find(|e| {
                e["kind"] == "library_probed" && e["library"].as_str().is_some_and(|l| l.starts_with(&dir))
            })
        };
        let figure = |key: &str| -> Vec<f64> {
            runs.iter().filter_map(|r| probed(r)?[key].as_f64()).map(|ns| ns / 1e6).collect()
        };
        let functions = runs.iter().find_map(|r| probed(r)?["functions"].as_u64()).unwrap_or(0);
        let reason = runs.iter().find_map(|r| probed(r)?["reason"].as_str()).unwrap_or("-").to_string();
        for (key, what) in [("init_probes_after_ns", "init"), ("probes_after_ns", "all")] {
            let ms = figure(key);
            let mut row = Row::new(&format!("attach_{label}_{what}_probes_ms"), "ms");
            row.canaryscope = median(&ms);
            row.ratio("p99 ms", percentile(&ms, 99.0));
            row.notes.push(format!(
                "the record that revealed the file (first run's reason: {reason}) to {} of its {functions} \
                 probed functions attached, {} of {} runs timed",
                if what == "init" { "the init functions" } else { "all" },
                ms.len(),
                runs.len()
            ));
            if ms.len() != runs.len() {
                row.wrong(format!(
                    "{} of {} fresh copies had no probe timing",
                    runs.len() - ms.len(),
                    runs.len()
                ));
            }
            row.samples.push((what.into(), ms));
            out.push(row);
        }
        let mut row = Row::new(&format!("attach_{label}_default_seen_pct"), "%");
        let mut all_seen = 0;
        for delay in DELAYS_MS {
            let at: Vec<&Run> = runs.iter().filter(|r| r.delay_ms == delay).collect();
            let seen = at
                .iter()
                .filter(|r| {
                    events
                        .iter()
                        .any(|e| e["kind"] == "gpu_call" && e["function"] == init && e["pid"] == r.pid)
                })
                .count();
            all_seen += seen;
            row.ratio(&format!("seen % at {delay} ms"), Some(100.0 * seen as f64 / at.len().max(1) as f64));
        }
        row.canaryscope = Some(100.0 * all_seen as f64 / runs.len().max(1) as f64);
        row.notes.push(format!(
            "default mode (no hold): {init} seen in {all_seen} of {} processes calling it 0, 10 or 50 ms after exec",
            runs.len()
        ));
        out.push(row);
    }
    Ok(())
}
