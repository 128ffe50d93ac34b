//! `detection_latency`: how long after a GPU runtime fails, or the kernel
//! OOM-kills a process, the counter moves on /metrics, p50/p99.
//!
//! The clock starts where a supervisor of the process would see the end
//! (waitpid returns) and stops at the first scrape that shows the counter
//! increased: the delay a user of /metrics actually waits, the daemon's
//! render tick included. A failing `hipInit` is the real HIP runtime's
//! init failing without a GPU; the OOM kill happens in a 50 MiB memory
//! cgroup.
//!
//! The footprint case (footprint.rs) runs on the same daemon, its idle
//! window first, before anything has run under the daemon.
use std::{
    os::unix::process::ExitStatusExt,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    cgroups::oom_cgroup,
    daemon::{metric_sum, Daemon},
    footprint, median, percentile,
    process::SIGKILL,
    report::opt,
    step, Env, Plan, Row, Target,
};

pub(super) fn detection_and_footprint_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    step("detection_latency + footprint: starting canaryscope run");
    // The footprint's cgroups stand for pods: reported, with run-queue
    // histograms, as kubepods would be.
    let bench = format!("/{}", super::cgroups::BENCH_CGROUP);
    let d = Daemon::start(env, "canaryscope-detect", &["--cgroup", &bench])?;

    // Footprint, idle (first, before anything has run under the daemon).
    let idle = plan.footprint.then(|| footprint::idle(plan, d.pid()));
    if plan.detection {
        out.extend(hip_trials(env, plan, &d)?);
        step(&format!(
            "detection_latency: {} OOM kills (oom_hog 200 in a 50 MiB memory cgroup)",
            plan.oom_trials
        ));
        out.extend(oom_trials(env, plan, &d));
    }
    if let Some(idle) = idle {
        // The footprint stops this daemon itself, between its two loads.
        return footprint::idle_and_load(env, plan, d, idle, out);
    }
    let took = d.stop();
    eprintln!("    canaryscope run took {took:.1?} to exit");
    Ok(())
}

fn hip_trials(env: &Env, plan: &Plan, d: &Daemon) -> Result<Vec<Row>> {
    step(&format!("detection_latency: {} hip_probe runs (hipInit fails with 101)", plan.hip_trials));
    let hip_name = "canaryscope_gpu_init_failures_total";
    let hip_labels = [("function", "hipInit")];
    let mut from_exit = Vec::new();
    let mut from_spawn = Vec::new();
    let mut run_ms = Vec::new();
    let mut hip_missed = Vec::new();
    for trial in 0..plan.hip_trials {
        tick_jitter(trial);
        let before = metric_sum(&d.metrics()?, hip_name, &hip_labels);
        let spawned = Instant::now();
        let mut child = Command::new(env.fixture("hip_probe"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start hip_probe")?;
        let status = child.wait()?;
        let exited = Instant::now();
        match poll_increase(d, hip_name, &hip_labels, before, Duration::from_secs(5)) {
            Some(seen) => {
                from_exit.push(seen.saturating_duration_since(exited).as_secs_f64() * 1e3);
                from_spawn.push(seen.duration_since(spawned).as_secs_f64() * 1e3);
                run_ms.push(exited.duration_since(spawned).as_secs_f64() * 1e3);
            }
            None => hip_missed
                .push(format!("trial {}: no hipInit failure on /metrics within 5 s ({status})", trial + 1)),
        }
    }
    let mut hip_p50 = Row::new("detection_hip_init_p50", "ms");
    let mut hip_p99 = Row::new("detection_hip_init_p99", "ms");
    hip_p50.canaryscope = percentile(&from_exit, 50.0);
    hip_p99.canaryscope = percentile(&from_exit, 99.0);
    hip_p99.target = Some(Target::new("p99 < 250 ms", 250.0, hip_p99.canaryscope, " ms"));
    hip_p50.samples.push(("from_exit_ms".into(), from_exit.clone()));
    hip_p50.samples.push(("from_spawn_ms".into(), from_spawn.clone()));
    hip_p50.samples.push(("process_run_ms".into(), run_ms.clone()));
    hip_p50.notes.push(format!(
        "{} trials (spread over the daemon's 100 ms render tick); time from hip_probe's exit (waitpid \
         return) to the first /metrics scrape (every 5 ms) \
         showing canaryscope_gpu_init_failures_total{{function=\"hipInit\"}} increased; hipInit fails within \
         the process's short life (median run {} ms), so this slightly understates; counted from the spawn \
         instead (an upper bound): p50 {} ms, p99 {} ms",
        plan.hip_trials,
        opt(median(&run_ms)),
        opt(percentile(&from_spawn, 50.0)),
        opt(percentile(&from_spawn, 99.0)),
    ));
    for missed in hip_missed {
        hip_p50.wrong(missed);
    }
    hip_p99.samples.push(("from_exit_ms".into(), from_exit));
    Ok(vec![hip_p50, hip_p99])
}

/// The daemon renders /metrics on a 100 ms tick. Back-to-back trials lock
/// onto its phase (each starts just after the tick that ended the last), so
/// trial `i` first waits `(i * 37) mod 100` ms: the phases spread evenly.
fn tick_jitter(trial: usize) {
    sleep(Duration::from_millis((trial as u64 * 37) % 100));
}

/// Polls /metrics every 5 ms until the sum rises above `before`; returns
/// when the answer that showed it arrived.
fn poll_increase(
    d: &Daemon,
    name: &str,
    labels: &[(&str, &str)],
    before: f64,
    timeout: Duration,
) -> Option<Instant> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(text) = d.metrics() {
            if metric_sum(&text, name, labels) > before {
                return Some(Instant::now());
            }
        }
        sleep(Duration::from_millis(5));
    }
    None
}

fn oom_trials(env: &Env, plan: &Plan, d: &Daemon) -> Vec<Row> {
    let mut p50 = Row::new("detection_oom_kill_p50", "ms");
    let mut p99 = Row::new("detection_oom_kill_p99", "ms");
    let name = "canaryscope_oom_kills_total";
    let result = (|| -> Result<Vec<f64>> {
        let (_tree, tasks, what) = oom_cgroup()?;
        p50.notes.push(format!("memory limit 50M in {what}"));
        let mut lat = Vec::new();
        for trial in 0..plan.oom_trials {
            tick_jitter(trial);
            let before = metric_sum(&d.metrics()?, name, &[]);
            let script =
                format!("echo $$ > {}; exec {} 200", tasks.display(), env.fixture("oom_hog").display());
            let status = Command::new("sh")
                .arg("-c")
                .arg(&script)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .context("cannot start sh -c ... oom_hog")?;
            let died = Instant::now();
            if status.signal() != Some(SIGKILL) {
                p50.notes.push(format!("trial {}: oom_hog was not OOM-killed ({status})", trial + 1));
                continue;
            }
            match poll_increase(d, name, &[], before, Duration::from_secs(5)) {
                Some(seen) => lat.push(seen.saturating_duration_since(died).as_secs_f64() * 1e3),
                None => p50.wrong(format!("trial {}: no OOM kill on /metrics within 5 s", trial + 1)),
            }
        }
        Ok(lat)
    })();
    match result {
        Ok(lat) => {
            p50.canaryscope = percentile(&lat, 50.0);
            p99.canaryscope = percentile(&lat, 99.0);
            p50.notes.push(format!(
                "{} trials (spread over the daemon's 100 ms render tick); time from the killed child's \
                 waitpid return to the first /metrics scrape (every \
                 5 ms) showing canaryscope_oom_kills_total increased",
                plan.oom_trials
            ));
            p50.samples.push(("from_death_ms".into(), lat.clone()));
            p99.samples.push(("from_death_ms".into(), lat));
        }
        Err(e) => p50.notes.push(format!("could not run: {e:#}")),
    }
    p99.target = Some(Target::new("p99 < 250 ms", 250.0, p99.canaryscope, " ms"));
    vec![p50, p99]
}
