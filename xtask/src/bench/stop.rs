//! `stop`: what stopping `canaryscope trace` costs once it has probed
//! real-size libraries. Two figures, each with only the host's HIP runtime
//! probed (the baseline) and with fresh copies of NVIDIA's `libcuda`
//! probed besides, side by side:
//! - the prompt: SIGINT to the tracer's exit, what the person waits for;
//! - the release: SIGINT until the kernel has released every probe (the
//!   background releaser the tracer names on leaving is gone), what a
//!   tracer started right after would wait behind, and what a daemon's
//!   `terminationGracePeriodSeconds` has to cover, per probed file.
//!
//! The prompt is also measured for SIGTERM, and for `top` quit with q in a
//! terminal (tmux), with the copies probed.
//!
//! Where the kernel has `uprobe_multi` links (6.6+), the release with the
//! copies is measured again with a perf-event link per function (the
//! tracer's hidden `--per-function-uprobes`), side by side; and the daemon
//! is stopped with ten runtime files probed, as a DaemonSet update stops it.
use std::{
    path::{Path, PathBuf},
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{
    cgroups::{own_cgroup, STOP_FLOOD_CGROUP},
    daemon::{metric_sum, Daemon},
    div, median,
    process::{Proc, SIGINT, SIGTERM},
    sub, Env, Plan, Row, Target,
};

/// The prompt must come back within this, however many files were probed.
const PROMPT_TARGET_MS: f64 = 1000.0;
/// With `uprobe_multi`, the daemon must exit within this of SIGTERM ...
const DAEMON_STOP_TARGET_MS: f64 = 5000.0;
/// ... with this many runtime files probed: the host's HIP runtime and
/// copies of NVIDIA's `libcuda`.
const DAEMON_FILES: usize = 10;

/// How the probed functions are linked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Links {
    /// The tracer's choice: `uprobe_multi` where the kernel has it.
    Default,
    /// A perf-event link per function and program.
    PerFunction,
}

/// Whether this kernel can make `uprobe_multi` links.
fn kernel_has_uprobe_multi() -> bool {
    std::fs::read_to_string("/proc/kallsyms")
        .is_ok_and(|k| k.lines().any(|l| l.split_whitespace().nth(2) == Some("bpf_uprobe_multi_link_attach")))
}

/// NVIDIA's real `libcuda.so.1`, as fetched for the suite.
pub(super) fn nvidia_libcuda(env: &Env) -> Result<PathBuf> {
    let paths = std::fs::read_to_string(env.fixtures.join("../nvidia/paths.env"))
        .context("target/nvidia/paths.env (tests/nvidia/fetch.sh; cargo xtask fixtures runs it)")?;
    paths
        .lines()
        .find_map(|l| l.strip_prefix("LIBCUDA="))
        .map(PathBuf::from)
        .context("target/nvidia/paths.env names no LIBCUDA")
}

/// One stop by `signal`: (prompt ms, release ms).
fn one_stop(
    env: &Env,
    libcuda: &Path,
    copies: usize,
    trial: usize,
    links: Links,
    signal: i32,
) -> Result<(f64, f64)> {
    let dir = scratch_dir(&format!("stop-{trial}"))?;
    let result = stop_with_copies(env, libcuda, &dir, copies, trial, links, signal);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

pub(super) fn scratch_dir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("canaryscope-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Makes `copies` fresh copies of `libcuda` under `dir` and has a process
/// map each, so that whoever watches probes them as new files. The files
/// stay (and stay probed) until the watcher stops. Each process stays a
/// while, as a worker would: a watcher still busy with the last copy reads
/// the report of this one while the process, and so the file, is there.
pub(super) fn map_copies(env: &Env, libcuda: &Path, dir: &Path, copies: usize) -> Result<()> {
    let mut mappers = Vec::new();
    for i in 0..copies {
        let copy = dir.join(format!("{i}/libcuda.so.1"));
        std::fs::create_dir_all(copy.parent().context("copy's directory")?)?;
        std::fs::copy(libcuda, &copy).with_context(|| format!("copy {}", libcuda.display()))?;
        let mapper = Command::new(env.fixture("gpu_dlopen"))
            .args(["--linger", "2000"])
            .arg(&copy)
            .stdout(std::process::Stdio::null())
            .spawn()?;
        mappers.push((copy, mapper));
    }
    for (copy, mut mapper) in mappers {
        let status = mapper.wait()?;
        if !status.success() {
            bail!("gpu_dlopen {} failed: {status}", copy.display());
        }
    }
    Ok(())
}

fn stop_with_copies(
    env: &Env,
    libcuda: &Path,
    dir: &Path,
    copies: usize,
    trial: usize,
    links: Links,
    signal: i32,
) -> Result<(f64, f64)> {
    let mut cmd = Command::new(&env.bin);
    cmd.args(["trace", "--json"]);
    if links == Links::PerFunction {
        cmd.arg("--per-function-uprobes");
    }
    let mut tracer =
        Proc::spawn(env, &format!("stop-{copies}-{trial}"), &mut cmd, signal, Duration::from_secs(120))?;
    wait_for(&mut tracer, "tracing;", 1)?;
    map_copies(env, libcuda, dir, copies)?;
    // The host's HIP runtime, and each copy.
    wait_for(&mut tracer, "\"kind\":\"library_probed\"", 1 + copies)?;
    let started = Instant::now();
    let prompt = stop_and_await_release(&mut tracer)?;
    Ok((prompt.as_secs_f64() * 1e3, started.elapsed().as_secs_f64() * 1e3))
}

/// `top` quit with q, with the host's HIP runtime and `copies` fresh
/// `libcuda` copies probed; ms from the key to its process gone.
fn top_quit_once(env: &Env, libcuda: &Path, copies: usize, trial: usize) -> Result<f64> {
    let dir = scratch_dir(&format!("top-{trial}"))?;
    let result = (|| {
        let (took, pane) = super::top_quit::quit_after(env, &dir, || map_copies(env, libcuda, &dir, copies))?;
        await_releaser(&pane)?;
        Ok(took)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Stops a tracer with its stop signal and waits until the releaser it
/// names on leaving is gone (a tracer started sooner would attach behind
/// its release); returns how long the tracer itself took to exit.
pub(super) fn stop_and_await_release(tracer: &mut Proc) -> Result<Duration> {
    let (prompt, killed) = tracer.stop();
    if killed {
        bail!("the tracer did not stop on its signal; {}", tracer.log_tail());
    }
    await_releaser(&tracer.output())?;
    Ok(prompt)
}

/// Waits until the releaser named in a command's last words has exited.
fn await_releaser(output: &str) -> Result<()> {
    let releaser = output.lines().find_map(|l| {
        l.split_once("in the background (pid ")
            .and_then(|(_, r)| r.trim().trim_end_matches(')').parse::<u32>().ok())
    });
    if let Some(pid) = releaser {
        let deadline = Instant::now() + Duration::from_secs(300);
        while still_running(pid) {
            if Instant::now() > deadline {
                bail!("the releaser (pid {pid}) still runs 300 s after the stop");
            }
            sleep(Duration::from_millis(5));
        }
    }
    Ok(())
}

/// Whether process `pid` still runs (a zombie has released everything).
fn still_running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// Waits until the tracer's output holds `needle` `count` times.
pub(super) fn wait_for(tracer: &mut Proc, needle: &str, count: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while tracer.output().matches(needle).count() < count {
        if tracer.exited().is_some() || Instant::now() > deadline {
            bail!("waiting for {count} of {needle:?}; {}", tracer.log_tail());
        }
        sleep(Duration::from_millis(20));
    }
    Ok(())
}

pub(super) fn stop_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    let libcuda = nvidia_libcuda(env)?;
    let (trials, copies) = if plan.quick { (1, 2) } else { (3, 4) };
    eprintln!("    stop: {trials} stops of a tracer with HIP only, and with {copies} copies of NVIDIA's libcuda besides");
    let multi = kernel_has_uprobe_multi();
    let s = StopSamples::take(env, &libcuda, trials, copies, multi)?;
    prompt_rows(&s, copies, out);
    release_rows(s, copies, multi, out);
    if multi {
        out.push(daemon_stop_row(env, &libcuda, plan)?);
    }
    Ok(())
}

/// Milliseconds per stop, each list one way of stopping.
#[derive(Default)]
struct StopSamples {
    bare_prompt: Vec<f64>,
    bare_release: Vec<f64>,
    full_prompt: Vec<f64>,
    full_release: Vec<f64>,
    per_function_release: Vec<f64>,
    sigterm_prompt: Vec<f64>,
    top_quit: Vec<f64>,
}

impl StopSamples {
    /// Every way, interleaved trial by trial so that drift hits all alike.
    fn take(env: &Env, libcuda: &Path, trials: usize, copies: usize, multi: bool) -> Result<Self> {
        let mut s = StopSamples::default();
        for trial in 0..trials {
            let (p, r) = one_stop(env, libcuda, 0, 5 * trial, Links::Default, SIGINT)?;
            s.bare_prompt.push(p);
            s.bare_release.push(r);
            let (p, r) = one_stop(env, libcuda, copies, 5 * trial + 1, Links::Default, SIGINT)?;
            s.full_prompt.push(p);
            s.full_release.push(r);
            let (p, _) = one_stop(env, libcuda, copies, 5 * trial + 2, Links::Default, SIGTERM)?;
            s.sigterm_prompt.push(p);
            s.top_quit.push(top_quit_once(env, libcuda, copies, 5 * trial + 3)?);
            if multi {
                let (_, r) = one_stop(env, libcuda, copies, 5 * trial + 4, Links::PerFunction, SIGINT)?;
                s.per_function_release.push(r);
            }
        }
        Ok(s)
    }
}

/// How soon the user has the prompt back: the tracer on SIGINT or SIGTERM,
/// `top` on q.
fn prompt_rows(s: &StopSamples, copies: usize, out: &mut Vec<Row>) {
    let mut row = Row::new("stop_prompt_ms", "ms");
    row.baseline = median(&s.bare_prompt);
    row.canaryscope = median(&s.full_prompt);
    row.ratio(&format!("with {copies} libcuda copies / HIP only"), div(row.canaryscope, row.baseline));
    row.samples.push(("hip only".into(), s.bare_prompt.clone()));
    row.samples.push((format!("+{copies} libcuda"), s.full_prompt.clone()));
    row.samples.push((format!("+{copies} libcuda, SIGTERM"), s.sigterm_prompt.clone()));
    row.target = Some(Target::new("SIGINT to prompt", PROMPT_TARGET_MS, row.canaryscope, " ms"));
    row.notes.push(
        "SIGINT (and SIGTERM) to the tracer's exit: the probes' release goes on in the background".into(),
    );
    out.push(row);

    let mut row = Row::new("top_quit_ms", "ms");
    row.canaryscope = median(&s.top_quit);
    row.samples.push((format!("+{copies} libcuda"), s.top_quit.clone()));
    row.target = Some(Target::new("q to the shell's prompt", PROMPT_TARGET_MS, row.canaryscope, " ms"));
    row.notes.push("`canaryscope top` in a tmux pane: the q key to the pane's process gone".into());
    out.push(row);
}

/// How long the kernel takes to release every probe, per libcuda copy and
/// by kind of link.
fn release_rows(s: StopSamples, copies: usize, multi: bool, out: &mut Vec<Row>) {
    let mut row = Row::new("stop_release_ms", "ms");
    row.baseline = median(&s.bare_release);
    row.canaryscope = median(&s.full_release);
    let per_file = sub(row.canaryscope, row.baseline).map(|d| d / copies as f64);
    row.ratio("per libcuda copy ms", per_file);
    row.samples.push(("hip only".into(), s.bare_release));
    row.samples.push((format!("+{copies} libcuda"), s.full_release.clone()));
    row.notes.push("SIGINT until the kernel has released every probe (the releaser gone)".into());
    row.notes.push(match multi {
        true => "one uprobe_multi link per program and file".into(),
        false => "no uprobe_multi on this kernel: a perf-event link per function and program".into(),
    });
    out.push(row);

    if multi {
        let mut row = Row::new("stop_release_by_link_kind_ms", "ms");
        row.baseline = median(&s.per_function_release);
        row.canaryscope = median(&s.full_release);
        row.ratio("uprobe_multi / perf-event per function", div(row.canaryscope, row.baseline));
        row.samples.push(("perf-event per function".into(), s.per_function_release));
        row.samples.push(("uprobe_multi".into(), s.full_release));
        row.notes.push(format!("the release with {copies} libcuda copies and HIP probed, each way"));
        out.push(row);
    }
}

/// The daemon's SIGTERM to exit with many runtime files probed, idle and
/// under a flood of failing calls with a scrape in flight.
fn daemon_stop_row(env: &Env, libcuda: &Path, plan: &Plan) -> Result<Row> {
    let daemon_trials = if plan.quick { 1 } else { 3 };
    eprintln!("    stop: {daemon_trials} SIGTERMs of the daemon with {DAEMON_FILES} runtime files probed");
    let (mut took, mut loaded) = (Vec::new(), Vec::new());
    for trial in 0..daemon_trials {
        took.push(daemon_stop(env, libcuda, trial, Load::Idle)?);
        loaded.push(daemon_stop(env, libcuda, trial, Load::Flood)?);
    }
    let mut row = Row::new("daemon_stop_ms", "ms");
    row.baseline = median(&took);
    row.canaryscope = median(&loaded);
    row.ratio("under a flood / idle", div(median(&loaded), median(&took)));
    row.samples.push((format!("{DAEMON_FILES} files"), took));
    row.samples.push((format!("{DAEMON_FILES} files, a flood and a scrape in flight"), loaded));
    row.target = Some(Target::new(
        &format!("SIGTERM to exit, {DAEMON_FILES} files probed, under a flood"),
        DAEMON_STOP_TARGET_MS,
        row.canaryscope,
        " ms",
    ));
    row.notes.push(
        "the daemon releases its probes before it exits: one uprobe_multi link per program and file".into(),
    );
    row.notes.push(
        "under a flood: failing HIP calls as fast as one process makes them, and a /metrics request whose \
         reply is not read, while SIGTERM comes"
            .into(),
    );
    Ok(row)
}

/// What the daemon is doing when SIGTERM comes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    Idle,
    /// A process failing HIP calls as fast as it can (every failure an
    /// event) and a scrape whose reply nobody reads.
    Flood,
}

/// One SIGTERM of a daemon probing the host's HIP runtime and fresh
/// `libcuda` copies, [`DAEMON_FILES`] files in all; ms until it exited.
fn daemon_stop(env: &Env, libcuda: &Path, trial: usize, load: Load) -> Result<f64> {
    let tag = if load == Load::Flood { "loaded-" } else { "" };
    let dir = scratch_dir(&format!("daemon-stop-{tag}{trial}"))?;
    // The flood's processes stand for a pod: the daemon reports their cgroup.
    let flood_cgroup = match load {
        Load::Flood => Some(own_cgroup(STOP_FLOOD_CGROUP)?),
        Load::Idle => None,
    };
    let result = (|| {
        let observed = format!("/{STOP_FLOOD_CGROUP}");
        let extra: &[&str] = if flood_cgroup.is_some() { &["--cgroup", &observed] } else { &[] };
        let daemon = Daemon::start(env, &format!("daemon-stop-{tag}{trial}"), extra)?;
        map_copies(env, libcuda, &dir, DAEMON_FILES - 1)?;
        let deadline = Instant::now() + Duration::from_secs(120);
        // Each copy by its own path: the host's HIP runtime was probed at start.
        let probed = |log: &str| {
            (0..DAEMON_FILES - 1).all(|i| log.contains(&format!("{}/{i}/libcuda.so.1 (", dir.display())))
        };
        while !probed(&daemon.output()) {
            if Instant::now() > deadline {
                bail!("the daemon probed fewer than {DAEMON_FILES} files in 120 s; {}", daemon.output());
            }
            sleep(Duration::from_millis(20));
        }
        let mut _flood = None;
        let mut _scrape = None;
        if let Some((_, procs, _)) = &flood_cgroup {
            let mut hip_loop = Command::new("sh");
            hip_loop.args(["-c", "echo $$ > \"$0\" && exec \"$@\""]).arg(procs);
            hip_loop.arg(env.fixture("hip_loop")).args(["--fail", "1000000000"]);
            _flood = Some(Proc::spawn_silent("flood", &mut hip_loop, SIGTERM, Duration::from_secs(5))?);
            let lost_or_read = |d: &Daemon| {
                d.metrics()
                    .map(|t| {
                        metric_sum(&t, "canaryscope_ring_events_total", &[])
                            + metric_sum(&t, "canaryscope_events_lost_total", &[])
                    })
                    .unwrap_or(0.0)
            };
            let before = lost_or_read(&daemon);
            sleep(Duration::from_secs(1));
            if lost_or_read(&daemon) - before < 1000.0 {
                bail!("the flood gave under 1,000 events a second");
            }
            let mut scrape = std::net::TcpStream::connect(&daemon.addr)?;
            std::io::Write::write_all(&mut scrape, b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")?;
            _scrape = Some(scrape);
        }
        Ok(daemon.stop().as_secs_f64() * 1e3)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
