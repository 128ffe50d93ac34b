//! The peers the overhead cases compare against: bpftrace (a one-liner per
//! case, and the empty uprobe+uretprobe pair that is the floor) and
//! libbpf-tools' runqlat.
//!
//! A peer is measured only once its probes are attached, so its figures
//! are its steady cost, not its start-up; a peer that cannot run is a note
//! in the report, never a failed case.
use std::{
    path::Path,
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Result};
use serde_json::Value;

use super::{
    bpf_stats::bpf_links_of,
    process::{Proc, SIGINT},
    Env,
};

/// bpftrace with `script`, back once `probes` probes are attached.
pub(super) fn start_bpftrace(env: &Env, name: &str, script: &str, probes: usize) -> Result<Proc> {
    let bpftrace = env.bpftrace.as_ref().ok_or_else(|| anyhow!("bpftrace not installed"))?;
    let mut cmd = Command::new(bpftrace);
    cmd.arg("-e").arg(script);
    // bpftrace may take many seconds to exit with uretprobes attached.
    let mut p = Proc::spawn(env, name, &mut cmd, SIGINT, Duration::from_secs(60))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(s) = p.exited() {
            bail!("bpftrace exited before attaching ({s}); {}", p.log_tail());
        }
        match &env.bpftool {
            Some(tool) => {
                if perf_probes_of(tool, p.pid()) >= probes {
                    sleep(Duration::from_millis(200));
                    return Ok(p);
                }
            }
            None => {
                if p.output().contains("Attaching") {
                    sleep(Duration::from_secs(3));
                    return Ok(p);
                }
            }
        }
        if Instant::now() >= deadline {
            bail!("bpftrace did not attach within 60 s; {}", p.log_tail());
        }
        sleep(Duration::from_millis(50));
    }
}

/// Perf-event attached BPF programs (uprobes, tracepoints) held by `pid`.
fn perf_probes_of(bpftool: &Path, pid: u32) -> usize {
    let Ok(out) = Command::new(bpftool).args(["-j", "perf", "show"]).output() else { return 0 };
    let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) else { return 0 };
    v.as_array()
        .map(|a| a.iter().filter(|e| e.get("pid").and_then(Value::as_u64) == Some(pid as u64)).count())
        .unwrap_or(0)
}

pub(super) fn start_runqlat(env: &Env, name: &str) -> Result<Proc> {
    let runqlat = env.runqlat.as_ref().ok_or_else(|| anyhow!("runqlat (libbpf-tools) not installed"))?;
    let mut p = Proc::spawn(env, name, &mut Command::new(runqlat), SIGINT, Duration::from_secs(30))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = p.exited() {
            bail!("runqlat exited before attaching ({s}); {}", p.log_tail());
        }
        // runqlat attaches three programs (sched_wakeup, sched_wakeup_new,
        // sched_switch) and then prints this line (its stdout is a file,
        // fully buffered, so the line may come only at exit).
        if bpf_links_of(p.pid()) >= 3 || p.output().contains("Tracing run queue latency") {
            sleep(Duration::from_millis(100));
            return Ok(p);
        }
        if Instant::now() >= deadline {
            bail!("runqlat did not start tracing within 30 s; {}", p.log_tail());
        }
        sleep(Duration::from_millis(20));
    }
}

/// The peer `started`, or `None` when it could not run: printed and noted
/// in `notes`, and the caller leaves it out of the remaining rounds.
pub(super) fn peer_or_note(started: Result<Proc>, what: &str, notes: &mut Vec<String>) -> Option<Proc> {
    match started {
        Ok(p) => Some(p),
        Err(e) => {
            eprintln!("    {what} could not run: {e:#}");
            notes.push(format!("{what} could not run: {e:#}"));
            None
        }
    }
}
