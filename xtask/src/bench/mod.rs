//! `cargo xtask bench [--quick]`: what canaryscope costs and how fast it
//! notices, measured side by side with the peers that run on this kernel
//! (bpftrace one-liners, libbpf-tools' runqlat) and with the cheapest probe
//! that could do the job at all (an empty uprobe+uretprobe pair).
//!
//! Cases, one module each:
//! - `gpu_call_overhead` (gpu_calls.rs): ns per probed call of a cheap CUDA
//!   entry point (`cuda_app --version-loop N` through the ZLUDA-shaped
//!   libcuda.so.1), bare / canaryscope / bpftrace counting per result with
//!   a latency histogram / an empty uprobe+uretprobe pair (the floor).
//!   Rounds are interleaved (the order rotates every round) and medians
//!   reported (rounds.rs, shared with the next two cases).
//! - `launch_bound_loop` (launch_loop.rs): ns per launch of a loop calling
//!   `cuLaunchKernel` of the ZLUDA-shaped library over a HIP stand-in with a
//!   fixed cost per launch (`cuda_app_standin --launch-loop N`): bare /
//!   `canaryscope run --hot-calls selected` with the process not selected /
//!   selected by a failing cuInit / bpftrace pairs on both layers / the
//!   empty pairs (the floor). It checks that both launch entries start with
//!   a push, as real runtime entries do.
//! - `sched_overhead_pod`/`_system` (sched.rs): ns per round trip of `pingpong` (two
//!   processes pinned to CPU 0) bare / canaryscope / runqlat, in a reported
//!   cgroup and in one that is not.
//! - `detection_latency` (detection.rs): time from a failing `hipInit`
//!   (process exit) and from an OOM kill (waitpid return) to the counter
//!   moving on /metrics.
//! - `footprint` (footprint.rs): daemon RSS, CPU and BPF map memory, idle
//!   and with many cgroups running the real HIP runtime; it shares the
//!   detection case's daemon.
//! - `first_call` (first_call.rs): how long `--hold` stops a process
//!   mapping a GPU runtime file never seen before, p50/p99, and the default
//!   mode's share of first calls seen where it races with the attach.
//! - `attach` (attach.rs): for the real HIP runtime and NVIDIA's libcuda,
//!   p50/p99 from the record that revealed a fresh copy to its init
//!   functions' probes and to all of them, and the default mode's share of
//!   first calls seen 0, 10 and 50 ms after exec.
//! - `stop` (stop.rs): `trace`'s prompt after SIGINT and SIGTERM, `top`'s
//!   after q in a terminal (top_quit.rs), the kernel's release of the
//!   probes behind them, with HIP only and with libcuda copies, by link
//!   kind; the daemon's exit after SIGTERM with ten files probed.
//! - `dlopen_startup` (dlopen.rs): the start-up of a process that loads
//!   500 generated shared objects, and of a real Python import of scipy,
//!   pandas and statsmodels, bare and with `canaryscope trace` running:
//!   what the `dlopen` probes and the per-`mmap` discovery filter cost
//!   processes that load no GPU library. Its 2% target is required: a miss
//!   fails the run. Left out of `--quick` unless named with `--only`.
//! - `judge` (judge.rs): the canary judge's statistics by simulation, not
//!   timed: false rollbacks at equal rates and 5x canaries failed, over
//!   10,000 analyses of 10 looks at a 25% and a 10% canary share
//!   (`canaryscope judge --simulate`); then the independent simulation
//!   through a real Prometheus (`tests/judge/simulate.py`).
//!
//! What the cases share: the processes they start (process.rs), the
//! daemon and its /metrics (daemon.rs), the peers (peers.rs), BPF program
//! statistics and map memory (bpf_stats.rs), cgroups (cgroups.rs) and the
//! report (report.rs). This file holds the options, the sizes of a run, the
//! case list and the rows every case fills.
//!
//! Diagnostic rows (`*_bpf_prog_time`) come from `kernel.bpf_stats_enabled`
//! (run_time_ns per program from /proc/PID/fdinfo) in a separate pass, so
//! the timed runs are not disturbed by the statistics themselves.
//!
//! Targets are printed next to the measured values ("met" / "missed by X"),
//! and asserted only where a row marks its target required (the dlopen
//! start-up's). The task fails when a case could not run at all, when
//! canaryscope got a result wrong while measured (a detection that never
//! showed, a miscounted call, a first call missed under the hold), or when a
//! required target is missed; a missing peer tool is a note.
use std::{
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

use crate::{root, step};

mod attach;
mod bpf_stats;
mod cgroups;
mod daemon;
mod detection;
mod dlopen;
mod empty_skb;
mod first_call;
mod footprint;
mod gpu_calls;
mod http;
mod http_config;
mod http_floor;
mod judge;
mod launch_loop;
mod peers;
mod process;
mod report;
mod rounds;
mod sched;
mod stop;
mod top_quit;

use bpf_stats::BPF_STATS;
use report::{load_average, num, opt, render_json, render_markdown};

#[derive(Args)]
pub struct BenchArgs {
    /// A small smoke run for the test suite (about a minute).
    #[arg(long)]
    pub quick: bool,
    /// Use target/release/canaryscope and target/fixtures as they are (no build).
    #[arg(long)]
    pub no_build: bool,
    /// Only run these cases (repeatable); all by default.
    #[arg(long, value_enum)]
    pub only: Vec<Case>,
    /// Rounds of the overhead cases (default: 5, or with --quick 2, and 1 for
    /// the launch-bound loop).
    #[arg(long)]
    pub rounds: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
pub enum Case {
    /// Per-call cost of the GPU uprobes (cuda_app --version-loop).
    Gpu,
    /// Launch-bound loop: hot-call probes, process selected and not, against
    /// bare and the empty-pair floor (cuda_app_standin --launch-loop).
    LaunchLoop,
    /// Scheduler probe cost (pingpong) against runqlat.
    Sched,
    /// Time to a failing hipInit and an OOM kill showing on /metrics.
    Detection,
    /// Daemon RSS, CPU and BPF map memory, idle and with many cgroups.
    Footprint,
    /// How long `--hold` stops a process that maps a new GPU runtime file,
    /// and the default mode's share of first calls seen for racing shapes.
    FirstCall,
    /// How soon a real runtime file's probes exist once revealed, and the
    /// default mode's share of first calls seen 0, 10 and 50 ms after exec.
    Attach,
    /// What stopping `trace` costs with real libraries probed: the prompt,
    /// and the kernel's release behind it.
    Stop,
    /// The canary judge's false-rollback and detection shares, simulated.
    Judge,
    /// What the HTTP request hooks add to a keep-alive server (nginx under
    /// wrk), in a pod and outside every pod.
    Http,
    /// Start-up of processes that load hundreds of shared objects, bare and
    /// traced (not in `--quick` unless named).
    DlopenStartup,
}

/// A case pushes its rows as it goes, so an error keeps what was measured.
type CaseFn = fn(&Env, &Plan, &mut Vec<Row>) -> Result<()>;

/// Sizes of one run.
struct Plan {
    quick: bool,
    detection: bool,
    footprint: bool,
    gpu_calls: u64,
    gpu_rounds: usize,
    launch_calls: u64,
    launch_rounds: usize,
    pingpong_rounds: u64,
    sched_rounds: usize,
    hip_trials: usize,
    oom_trials: usize,
    cgroups: usize,
    wave: usize,
    sleep_before_ms: u64,
    window: Duration,
}

impl Plan {
    fn new(args: &BenchArgs) -> Plan {
        let rounds = args.rounds.unwrap_or(if args.quick { 2 } else { 5 }).max(1);
        if args.quick {
            Plan {
                quick: true,
                detection: true,
                footprint: true,
                gpu_calls: 20_000,
                gpu_rounds: rounds,
                // Daemon and bpftrace start-ups and stops are most of this
                // case's time: one round keeps it within the smoke run's
                // budget and still runs every configuration once.
                launch_calls: 2_000,
                launch_rounds: args.rounds.unwrap_or(1).max(1),
                pingpong_rounds: 20_000,
                sched_rounds: rounds,
                hip_trials: 3,
                oom_trials: 2,
                cgroups: 50,
                wave: 10,
                sleep_before_ms: 500,
                window: Duration::from_secs(2),
            }
        } else {
            Plan {
                quick: false,
                detection: true,
                footprint: true,
                gpu_calls: 2_000_000,
                gpu_rounds: rounds,
                launch_calls: 100_000,
                launch_rounds: rounds,
                pingpong_rounds: 200_000,
                sched_rounds: rounds,
                hip_trials: 20,
                oom_trials: 5,
                cgroups: 1_000,
                wave: 200,
                sleep_before_ms: 2_000,
                // CPU time is counted in 10 ms ticks: over 5 s one tick
                // was 0.2% of a core, a fifth of the 1% target.
                window: Duration::from_secs(20),
            }
        }
    }
}

/// Where everything is.
struct Env {
    bin: PathBuf,
    fixtures: PathBuf,
    cuda_lib: PathBuf,
    out: PathBuf,
    logs: PathBuf,
    bpftrace: Option<PathBuf>,
    bpftool: Option<PathBuf>,
    runqlat: Option<PathBuf>,
}

impl Env {
    fn fixture(&self, name: &str) -> PathBuf {
        self.fixtures.join(name)
    }
}

// ---------------------------------------------------------------------------
// Entry point

pub fn run(args: BenchArgs) -> Result<()> {
    let started = Instant::now();
    // The smoke run keeps its time: the dlopen start-up case runs in it
    // only when named.
    let wanted = |c: Case| {
        if args.only.is_empty() {
            !(args.quick && c == Case::DlopenStartup)
        } else {
            args.only.contains(&c)
        }
    };
    let mut plan = Plan::new(&args);
    plan.detection = wanted(Case::Detection);
    plan.footprint = wanted(Case::Footprint);
    if !process::is_root() {
        bail!("the benchmarks load eBPF programs, create cgroups and cause OOM kills: run them as root");
    }
    if !args.no_build {
        crate::fixtures::build_all()?;
        crate::build()?;
    }
    let measuring = Instant::now();
    let env = Env::find()?;
    let _ = fs::remove_dir_all(&env.logs);
    fs::create_dir_all(&env.logs).with_context(|| format!("cannot create {}", env.logs.display()))?;
    step(&format!(
        "benchmarks ({}): logs of every observer under {}",
        if plan.quick { "quick" } else { "full" },
        env.logs.display()
    ));
    cgroups::cleanup_stale_cgroups();
    let load_before = describe_host(&env);
    let (rows, failed) = run_cases(&env, &plan, wanted);

    let md = render_markdown(&rows, &plan, &env, (load_before, load_average()));
    let json = render_json(&rows);
    fs::write(env.out.join("results.md"), &md)?;
    fs::write(env.out.join("results.json"), serde_json::to_string_pretty(&json)? + "\n")?;
    println!("{md}");
    step(&format!(
        "bench finished in {:.0?} ({:.0?} measuring): {} and {}",
        started.elapsed(),
        measuring.elapsed(),
        env.out.join("results.md").display(),
        env.out.join("results.json").display()
    ));
    if !failed.is_empty() {
        bail!("could not run: {}", failed.join(", "));
    }
    let wrong: Vec<String> =
        rows.iter().flat_map(|r| r.wrong.iter().map(move |w| format!("{}: {w}", r.name))).collect();
    if !wrong.is_empty() {
        bail!("canaryscope got results wrong while measured:\n  {}", wrong.join("\n  "));
    }
    let missed: Vec<String> = rows
        .iter()
        .filter_map(|r| r.target.as_ref().filter(|t| t.required && !t.met()).map(|t| (r, t)))
        .map(|(r, t)| format!("{}: {}: {}", r.name, t.description, t.verdict()))
        .collect();
    if !missed.is_empty() {
        bail!("required targets missed:\n  {}", missed.join("\n  "));
    }
    Ok(())
}

impl Env {
    /// The binary, the fixtures and the peer tools, each checked to be
    /// there (the peers are optional: their comparisons are noted as
    /// skipped).
    fn find() -> Result<Env> {
        let root = root();
        let fixtures = root.join("target/fixtures");
        let env = Env {
            bin: root.join("target/release/canaryscope"),
            cuda_lib: fixtures.join("zluda/libcuda.so.1"),
            fixtures,
            out: root.join("target/bench"),
            logs: root.join("target/bench/logs"),
            bpftrace: process::find_tool("bpftrace"),
            bpftool: process::find_tool("bpftool"),
            runqlat: process::find_tool("runqlat"),
        };
        for needed in [&env.bin, &env.cuda_lib] {
            if !needed.exists() {
                bail!(
                    "{} is missing: run `cargo xtask build` and `cargo xtask fixtures` first",
                    needed.display()
                );
            }
        }
        for f in ["cuda_app", "pingpong", "hip_probe", "oom_hog", "hip_loop"] {
            if !env.fixture(f).exists() {
                bail!("{} is missing: run `cargo xtask fixtures` first", env.fixture(f).display());
            }
        }
        Ok(env)
    }
}

/// Says which peer tools were found and what on this host makes the
/// figures noisier; returns the load average before the bench.
fn describe_host(env: &Env) -> Option<f64> {
    for (tool, path) in [("bpftrace", &env.bpftrace), ("bpftool", &env.bpftool), ("runqlat", &env.runqlat)] {
        match path {
            Some(p) => eprintln!("    {tool}: {}", p.display()),
            None => eprintln!("    {tool}: not found (its comparisons are skipped and noted)"),
        }
    }
    let load_before = load_average();
    if load_before.is_some_and(|l| l > 1.0) {
        eprintln!(
            "    warning: load average {} before the bench: other work on this host makes the figures noisier",
            opt(load_before)
        );
    }
    if fs::read_to_string(BPF_STATS).is_ok_and(|v| v.trim() == "1") {
        eprintln!(
            "    warning: kernel.bpf_stats_enabled=1 (left by an interrupted bench?): every BPF program run \
             pays two extra clock reads; `sysctl kernel.bpf_stats_enabled=0` to measure without"
        );
    }
    load_before
}

/// Runs each wanted case; a case that cannot run leaves a row saying why
/// and its name in the second list, and the others still run.
fn run_cases(env: &Env, plan: &Plan, wanted: impl Fn(Case) -> bool) -> (Vec<Row>, Vec<String>) {
    let mut rows: Vec<Row> = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let cases: [(Case, &str, CaseFn); 10] = [
        (Case::Gpu, "gpu_call_overhead", gpu_calls::gpu_case),
        (Case::LaunchLoop, "launch_bound_loop", launch_loop::launch_case),
        (Case::FirstCall, "first_call", first_call::first_call_case),
        (Case::Attach, "attach", attach::attach_case),
        (Case::Stop, "stop", stop::stop_case),
        (Case::Sched, "sched_overhead", sched::sched_case),
        (Case::Detection, "detection_latency + footprint", detection::detection_and_footprint_case),
        (Case::Judge, "judge", judge::judge_case),
        (Case::Http, "http_overhead", http::http_case),
        (Case::DlopenStartup, "dlopen_startup", dlopen::dlopen_case),
    ];
    for (case, name, f) in cases {
        let run_it = if case == Case::Detection {
            wanted(Case::Detection) || wanted(Case::Footprint)
        } else {
            wanted(case)
        };
        if !run_it {
            continue;
        }
        let t = Instant::now();
        match f(env, plan, &mut rows) {
            Ok(()) => eprintln!("    {name}: done in {:.0?}", t.elapsed()),
            Err(e) => {
                eprintln!("xtask: bench case {name} could not run: {e:#}");
                failed.push(name.to_string());
                rows.push(Row {
                    name: name.to_string(),
                    notes: vec![format!("could not run: {e:#}")],
                    ..Row::default()
                });
            }
        }
    }
    (rows, failed)
}

// ---------------------------------------------------------------------------
// Results

#[derive(Default)]
struct Row {
    name: String,
    unit: String,
    baseline: Option<f64>,
    canaryscope: Option<f64>,
    peer: Option<f64>,
    peer_tool: Option<String>,
    floor: Option<f64>,
    ratios: Vec<(String, f64)>,
    samples: Vec<(String, Vec<f64>)>,
    target: Option<Target>,
    notes: Vec<String>,
    /// What the observer got wrong while being measured (a missed
    /// detection, a miscount): the run fails on any, whatever the timings.
    wrong: Vec<String>,
}

impl Row {
    fn new(name: &str, unit: &str) -> Row {
        Row { name: name.into(), unit: unit.into(), ..Row::default() }
    }

    /// Notes a wrong result; it also fails the run.
    fn wrong(&mut self, what: String) {
        self.notes.push(what.clone());
        self.wrong.push(what);
    }

    fn ratio(&mut self, name: &str, v: Option<f64>) {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            self.ratios.push((name.into(), v));
        }
    }
}

/// Lower is better: met when `measured <= limit`.
struct Target {
    description: String,
    limit: f64,
    measured: Option<f64>,
    unit: String,
    /// A miss fails the run (a target the issue that set it made a gate).
    required: bool,
}

impl Target {
    fn new(description: &str, limit: f64, measured: Option<f64>, unit: &str) -> Target {
        Target { description: description.into(), limit, measured, unit: unit.into(), required: false }
    }

    /// Marks the target as one whose miss (or a missing figure) fails the run.
    fn required(self) -> Target {
        Target { required: true, ..self }
    }

    fn met(&self) -> bool {
        self.measured.is_some_and(|m| m <= self.limit)
    }

    fn verdict(&self) -> String {
        match self.measured {
            None => "n/a".into(),
            Some(m) if m <= self.limit => format!("met ({}{})", num(m), self.unit),
            Some(m) => format!("missed by {}{} ({}{})", num(m - self.limit), self.unit, num(m), self.unit),
        }
    }
}

// ---------------------------------------------------------------------------
// Statistics

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 })
}

/// Nearest-rank percentile (p99 of 20 samples is the largest).
fn percentile(v: &[f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

fn div(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(a / b),
        _ => None,
    }
}

fn sub(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? - b?)
}
