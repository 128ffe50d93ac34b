//! `canaryscope trace`: attach, then print every failure as it happens until
//! Ctrl-C, SIGTERM or `--duration`.

use std::{
    io::{self, Write},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use log::warn;

use crate::{
    config::{self, parse_duration, Families, ProbeArgs, ProbeOptionHelp},
    discovery::hot::Policy,
    error::{require_root, CliError},
    event_loop::{self, Consumer, Flow, Schedule},
    events::Event,
    pipeline::{Options, Pipeline},
    probes::gpu::HotPlacement,
    render,
};

/// How often stalls are scanned and the ring buffer is drained anyway.
const TICK: Duration = Duration::from_millis(250);
/// How often CPU limits are sampled.
const CPU_EVERY: Duration = Duration::from_secs(1);

#[derive(clap::Args, Debug, Clone)]
#[command(
    probe_option(
        "libs",
        "comm",
        "Also probe this GPU runtime library (libamdhip64.so*, libcuda.so*, libnvcuda.so*, libcudart*.so*); repeatable"
    ),
    probe_option("stall_threshold", "libs", "A GPU call in flight longer than this is reported as stalled (e.g. 10s, 500ms)"),
    mut_arg("stall_threshold", |a| a.default_value(config::DEFAULT_STALL_THRESHOLD)),
    probe_option("probes", "duration", "Probe families to attach, comma-separated: gpu, kfd, cpu, exits, http"),
    mut_arg("probes", |a| a.default_value("all"))
)]
pub struct Args {
    /// One JSON object per line instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Print successful calls too, not only failures (costs a ring-buffer record per call).
    #[arg(long)]
    pub all: bool,
    /// Only events of these process ids (repeatable).
    #[arg(long = "pid", value_name = "PID")]
    pub pids: Vec<u32>,
    /// Only events whose cgroup path starts with this prefix (e.g. /kubepods.slice).
    #[arg(long, value_name = "PATH_PREFIX")]
    pub cgroup: Option<String>,
    /// Only events of processes with this command name (as in /proc/PID/comm).
    #[arg(long)]
    pub comm: Option<String>,
    /// Stop after this long (for scripts); runs until Ctrl-C / SIGTERM by default.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Stop a process that maps a GPU runtime file never seen before until
    /// its probes are attached, so its first call is seen (see docs/how-it-sees.md: the hold).
    #[arg(long)]
    pub hold: bool,
    /// Where launches, asynchronous copies and other per-operation GPU calls
    /// are trapped: selected (the processes --pid, --comm and --cgroup match;
    /// every process without a filter), all, or none.
    #[arg(long, value_name = "MODE", value_parser = config::parse_hot_calls, default_value = config::DEFAULT_HOT_CALLS)]
    pub hot_calls: config::HotCalls,
    /// What the selected processes' hot calls are probed for: timed (entry
    /// and return: durations, stalls, the call a crash was in) or counts (a
    /// return probe alone: calls and failures, about half the cost per call).
    #[arg(long, value_name = "DETAIL", value_parser = config::parse_hot_detail, default_value = config::DEFAULT_HOT_DETAIL_TRACE)]
    pub hot_detail: config::HotDetail,
    /// Character device whose ioctls count as KFD ioctls when the kernel has
    /// no kprobes (default /dev/kfd; tests point it at another device).
    #[arg(long, value_name = "PATH", hide = true)]
    pub kfd_device: Option<PathBuf>,
    /// Count KFD ioctls through the syscall fallback even where the
    /// kfd_ioctl kprobe works (tests run the fallback on such kernels).
    #[arg(long, hide = true)]
    pub kfd_syscall_fallback: bool,
    /// Probe GPU functions through a perf-event link each even where the
    /// kernel has uprobe_multi links (the bench compares the two).
    #[arg(long, hide = true)]
    pub per_function_uprobes: bool,
    /// --lib, --probes and --stall-threshold, shown among the options above.
    #[command(flatten)]
    pub probe: ProbeArgs,
}

/// What `canaryscope` alone runs: the flags' defaults.
impl Default for Args {
    fn default() -> Self {
        <Self as clap::FromArgMatches>::from_arg_matches(
            &<Self as clap::Args>::augment_args(clap::Command::new("trace")).get_matches_from(["trace"]),
        )
        .unwrap_or_else(|e| unreachable!("the defaults parse: {e}"))
    }
}

/// Which events the user asked to see.
pub struct Filter {
    /// A successful call this slow is shown anyway: it is a stall ending.
    slow_ns: u64,
    pids: Vec<u32>,
    cgroup_prefix: Option<String>,
    comm: Option<String>,
    all: bool,
}

impl Filter {
    pub fn from_args(args: &Args, stall_threshold: Duration) -> Self {
        Self {
            slow_ns: stall_threshold.as_nanos().min(u128::from(u64::MAX)) as u64,
            pids: args.pids.clone(),
            cgroup_prefix: args.cgroup.clone(),
            comm: args.comm.clone(),
            all: args.all,
        }
    }

    pub fn matches(&self, event: &Event) -> bool {
        let o = &event.origin;
        // What the tracer itself starts probing is always shown.
        if matches!(event.detail, crate::events::Detail::LibraryProbed { .. }) {
            return true;
        }
        let slow = matches!(event.detail, crate::events::Detail::GpuCall { duration_ns: Some(ns), .. } if ns >= self.slow_ns);
        if !self.all && !event.is_failure() && !slow {
            return false;
        }
        if !self.pids.is_empty() && !self.pids.contains(&o.pid) {
            return false;
        }
        if let Some(prefix) = &self.cgroup_prefix {
            if !o.cgroup.as_deref().is_some_and(|c| c.starts_with(prefix.as_str())) {
                return false;
            }
        }
        if let Some(comm) = &self.comm {
            if &o.comm != comm {
                return false;
            }
        }
        true
    }
}

pub fn run(args: Args) -> Result<ExitCode, CliError> {
    let families = args.probe.families()?;
    let stall_threshold = args.probe.stall_threshold()?;
    config::check_gpu_options(&args.probe.libs, args.hold, families)?;
    require_root("canaryscope trace")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the event loop: {e}")))?;
    runtime.block_on(trace(args, families, stall_threshold))
}

async fn trace(args: Args, families: Families, stall_threshold: Duration) -> Result<ExitCode, CliError> {
    let stall_ns = config::kernel_ns(stall_threshold);
    let hot_policy =
        Policy::for_trace(args.hot_calls, &args.pids, args.comm.as_deref(), args.cgroup.as_deref());
    let mut options = Options::new(families, stall_ns, hot_policy)
        .libs(args.probe.libs.clone())
        .hold(args.hold)
        .hot_detail(args.hot_detail);
    options.settings.gpu_emit_all = args.all;
    options.settings.kfd_device = args.kfd_device.clone();
    options.kfd_syscall_fallback = args.kfd_syscall_fallback;
    options.per_function_uprobes = args.per_function_uprobes;
    let (mut pipeline, ring) = Pipeline::start(options)?;
    greet(&pipeline, &args);
    let mut printer = Printer {
        out: io::BufWriter::new(io::stdout().lock()),
        filter: Filter::from_args(&args, stall_threshold),
        json: args.json,
        lost_reported: 0,
        last_cpu_sample: std::time::Instant::now(),
    };
    if !args.json {
        let _ = writeln!(printer.out, "{}", render::HEADER);
        let _ = printer.out.flush();
    }
    let schedule = Schedule { tick: TICK, deadline: args.duration, wake: None };
    event_loop::run(&mut pipeline, ring, &mut printer, schedule).await?;
    let _ = printer.out.flush();
    drop(printer);
    event_loop::leave(&mut pipeline);
    Ok(ExitCode::SUCCESS)
}

/// The filter flags given, as the user typed them.
fn filter_flags(args: &Args) -> String {
    let mut flags = Vec::new();
    if !args.pids.is_empty() {
        flags.push("--pid");
    }
    if args.comm.is_some() {
        flags.push("--comm");
    }
    if args.cgroup.is_some() {
        flags.push("--cgroup");
    }
    flags.join(" and ")
}

/// What is probed and what is not, before the first event.
fn greet(pipeline: &Pipeline, args: &Args) {
    let libraries: Vec<String> = pipeline
        .gpu()
        .libraries()
        .map(|l| format!("{} ({} functions)", l.library().display_path, l.functions()))
        .collect();
    if libraries.is_empty() {
        eprintln!("canaryscope: no GPU runtime library found yet; watching for processes that load one");
    } else {
        eprintln!("canaryscope: probing {}", libraries.join(", "));
    }
    for p in pipeline.statuses().iter().filter(|p| !p.attached) {
        eprintln!("canaryscope: not watching {} ({}): {}", p.probe, p.target, p.detail);
    }
    let hot = match pipeline.gpu().hot_placement() {
        HotPlacement::Everywhere => "in every process".to_string(),
        HotPlacement::Nowhere => "nowhere (--hot-calls none): launch errors are seen at the next synchronisation".into(),
        HotPlacement::PerProcess => format!(
            "only in the processes {} match ({} now); others' launch errors are seen at their next synchronisation",
            filter_flags(args),
            pipeline.hot_counts().values().sum::<usize>()
        ),
    };
    eprintln!("canaryscope: hot GPU calls (launches, async copies) probed {hot}");
    if let Some(watchdog) = pipeline.hold_watchdog() {
        eprintln!(
            "canaryscope: --hold: a process mapping a GPU runtime file never seen before waits until it is probed (watchdog pid {watchdog})"
        );
    }
    eprintln!("canaryscope: tracing; Ctrl-C to stop");
}

/// Prints the events the filter lets through.
struct Printer<W: Write> {
    out: W,
    filter: Filter,
    json: bool,
    lost_reported: u64,
    last_cpu_sample: std::time::Instant,
}

impl<W: Write> Consumer for Printer<W> {
    type Error = CliError;

    fn events(&mut self, _: &mut Pipeline, events: Vec<Event>) -> Result<Flow, CliError> {
        for event in events.iter().filter(|e| self.filter.matches(e)) {
            let line = if self.json { event.to_json().to_string() } else { render::line(event) };
            // A closed pipe (`| head`) ends the trace quietly.
            if writeln!(self.out, "{line}").and_then(|_| self.out.flush()).is_err() {
                return Ok(Flow::Stop);
            }
        }
        Ok(Flow::Continue)
    }

    fn tick(&mut self, pipeline: &mut Pipeline) -> Result<Flow, CliError> {
        let mut events: Vec<Event> = Vec::new();
        for stall in pipeline.stalls().iter().filter(|s| !s.reported) {
            events.push(pipeline.stall_event(stall));
        }
        if self.last_cpu_sample.elapsed() >= CPU_EVERY {
            self.last_cpu_sample = std::time::Instant::now();
            for finding in pipeline.sample_cpu() {
                events.push(pipeline.cpu_event(finding));
            }
        }
        let lost = pipeline.kernel().events_lost();
        if lost > self.lost_reported {
            warn!("{} events lost: the ring buffer was full", lost - self.lost_reported);
            self.lost_reported = lost;
        }
        self.events(pipeline, events)
    }
}
