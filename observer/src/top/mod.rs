//! `canaryscope top`: a live full-screen view of this node, one row per pod
//! (per cgroup without Kubernetes), refreshed each second. By default it
//! runs its own probes, as `trace` does; with `--from URL` it reads a
//! running daemon's `/metrics` and loads nothing. Either way the rows come
//! from the same text Prometheus scrapes.
pub mod format;
mod local;
pub mod screen;
pub mod table;

use std::{
    io::Write,
    process::ExitCode,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::{
    config::{self, ProbeArgs, ProbeOptionHelp},
    error::CliError,
    event_loop::{Flow, StopSignals},
    metrics::{exposition, fetch, server::PER_POD_PATH},
};
use screen::{Input, Screen};
use table::{Reading, Row, SortKey};

/// How often rows are recomputed.
const REFRESH: Duration = Duration::from_secs(1);
/// How often keys are looked at (and, on own probes, the loop ticks).
const TICK: Duration = Duration::from_millis(100);

#[derive(clap::Args, Debug, Clone)]
#[command(
    probe_option("libs", "filter", "Also probe this GPU runtime library; repeatable (own probes only)"),
    probe_option("probes", "libs", "Probe families to attach, comma-separated: gpu, kfd, cpu, exits, http (own probes only)"),
    mut_arg("probes", |a| a.default_value("all")),
    probe_option("stall_threshold", "probes", "A GPU call in flight longer than this counts as stalled (own probes only)"),
    mut_arg("stall_threshold", |a| a.default_value(config::DEFAULT_STALL_THRESHOLD))
)]
pub struct Args {
    /// Read a running daemon's metrics (e.g. http://127.0.0.1:9464; its
    /// per-pod view, /metrics/pods) instead of loading probes; needs no root.
    #[arg(long, value_name = "URL")]
    pub from: Option<String>,
    /// Print one snapshot (rates over one second) and exit.
    #[arg(long)]
    pub once: bool,
    /// With --once: the snapshot as one JSON object.
    #[arg(long, requires = "once")]
    pub json: bool,
    /// Order of the rows (`s` cycles through them).
    #[arg(long, value_enum, default_value_t = SortKey::Trouble)]
    pub sort: SortKey,
    /// Only rows of this namespace, or whose pod or cgroup path starts with
    /// this (`/` edits it in the view).
    #[arg(long, value_name = "NAMESPACE|PREFIX", default_value = "")]
    pub filter: String,
    /// --lib, --probes and --stall-threshold, for its own probes.
    #[command(flatten)]
    pub probe: ProbeArgs,
}

pub fn run(args: Args) -> Result<ExitCode, CliError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the event loop: {e}")))?;
    match args.from.clone() {
        Some(url) => {
            let mut target = fetch::Target::parse(&url).map_err(|e| CliError::usage(e.to_string()))?;
            // Prometheus's view has no per-pod calls or latencies (the
            // series budget); the same exporter serves them beside it.
            if target.path == "/metrics" {
                target.path = PER_POD_PATH.to_string();
            }
            // The first reading decides whether the URL is any good,
            // before the screen takes the terminal.
            let first = read(&target).map_err(CliError::usage)?;
            let mut driver = Driver::new(&args, format!("from {url}"))?;
            driver.accept(first);
            runtime.block_on(remote(driver, target))
        }
        None => {
            config::check_gpu_options(&args.probe.libs, false, args.probe.families()?)?;
            crate::error::require_root("canaryscope top")?;
            runtime.block_on(local::run(&args))
        }
    }
}

/// One reading of a daemon's exposition.
fn read(target: &fetch::Target) -> Result<Reading, String> {
    let text = target.get().map_err(|e| e.to_string())?;
    parse_reading(&text).map_err(|e| format!("--from: not a Prometheus exposition ({e})"))
}

fn parse_reading(text: &str) -> Result<Reading, exposition::ParseError> {
    Ok(Reading { samples: exposition::parse(text)?, at: Instant::now() })
}

async fn remote(mut driver: Driver, target: fetch::Target) -> Result<ExitCode, CliError> {
    let mut stop = StopSignals::new()?;
    let mut tick = tokio::time::interval(TICK);
    loop {
        let flow = tokio::select! {
            _ = stop.recv() => Flow::Stop,
            _ = tick.tick() => driver.step(&mut || read(&target))?,
        };
        if flow == Flow::Stop {
            return Ok(ExitCode::SUCCESS);
        }
    }
}

/// What the person sees and chose: rows, order, filter.
pub struct View {
    source: String,
    rows: Vec<Row>,
    pub sort: SortKey,
    pub filter: String,
    /// Whether keys are typed into the filter.
    pub editing: bool,
    /// Why the last reading failed, shown until one succeeds.
    error: Option<String>,
    /// Seconds between the last two readings.
    interval_s: Option<f64>,
}

impl View {
    /// The rows that pass the filter, in the chosen order.
    pub fn shown(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = self.rows.iter().filter(|r| r.matches(&self.filter)).cloned().collect();
        table::sort(&mut rows, self.sort);
        rows
    }

    fn header(&self) -> String {
        let shown = self.rows.iter().filter(|r| r.matches(&self.filter)).count();
        let mut line = format!("canaryscope top — {} — {shown}/{} rows", self.source, self.rows.len());
        if let Some(e) = &self.error {
            line.push_str(&format!(" — {e}"));
        }
        line
    }

    fn footer(&self) -> String {
        let filter = if self.editing { format!("{}▏", self.filter) } else { self.filter.clone() };
        format!(" q quit   s sort: {}   / filter: {filter}   Esc clear", self.sort.as_str())
    }
}

/// Where the rows go: the screen, or one printed snapshot.
enum Output {
    Screen(Box<Screen>),
    Once { json: bool },
}

/// Readings in, rows out, once a second; keys in between.
pub struct Driver {
    output: Output,
    view: View,
    last: Option<Reading>,
}

/// The `--once --json` snapshot.
#[derive(Serialize)]
struct Snapshot<'a> {
    source: &'a str,
    /// Seconds between the two readings the rates come from.
    interval_s: f64,
    rows: Vec<Row>,
}

impl Driver {
    pub fn new(args: &Args, source: String) -> Result<Self, CliError> {
        let output = if args.once {
            Output::Once { json: args.json }
        } else {
            let screen =
                Screen::open().map_err(|e| CliError::runtime(format!("cannot take the terminal: {e}")))?;
            Output::Screen(Box::new(screen))
        };
        let view = View {
            source,
            rows: Vec::new(),
            sort: args.sort,
            filter: args.filter.clone(),
            editing: false,
            error: None,
            interval_s: None,
        };
        Ok(Self { output, view, last: None })
    }

    /// Takes a reading as the latest.
    fn accept(&mut self, reading: Reading) {
        self.view.rows = table::rows(&reading, self.last.as_ref());
        self.view.interval_s = self.last.as_ref().map(|l| reading.at.duration_since(l.at).as_secs_f64());
        self.view.error = None;
        self.last = Some(reading);
    }

    /// Looks at keys, reads again once a second, and draws. `read` is only
    /// called when a reading is due.
    pub fn step(&mut self, read: &mut dyn FnMut() -> Result<Reading, String>) -> Result<Flow, CliError> {
        let mut redraw = false;
        if let Output::Screen(screen) = &mut self.output {
            match screen
                .input(&mut self.view, Duration::ZERO)
                .map_err(|e| CliError::runtime(format!("terminal: {e}")))?
            {
                Input::Quit => return Ok(Flow::Stop),
                Input::Redraw => redraw = true,
                Input::Nothing => {}
            }
        }
        let due = self.last.as_ref().is_none_or(|l| l.at.elapsed() >= REFRESH);
        if due {
            let first = self.last.is_none();
            match read() {
                Ok(reading) => self.accept(reading),
                // On the screen a failed reading is shown and retried; a
                // snapshot has nothing to show without it.
                Err(e) if matches!(self.output, Output::Screen(_)) => self.view.error = Some(e),
                Err(e) => return Err(CliError::runtime(e)),
            }
            redraw = true;
            if let Output::Once { json } = self.output {
                // The first reading only starts the one-second window.
                if !first {
                    self.print(json)?;
                    return Ok(Flow::Stop);
                }
            }
        }
        if let (true, Output::Screen(screen)) = (redraw, &mut self.output) {
            screen.draw(&self.view).map_err(|e| CliError::runtime(format!("terminal: {e}")))?;
        }
        Ok(Flow::Continue)
    }

    fn print(&self, json: bool) -> Result<(), CliError> {
        let rows = self.view.shown();
        let text = if json {
            let snapshot = Snapshot {
                source: &self.view.source,
                interval_s: self.view.interval_s.unwrap_or_default(),
                rows,
            };
            let mut line =
                serde_json::to_string(&snapshot).map_err(|e| CliError::runtime(format!("json: {e}")))?;
            line.push('\n');
            line
        } else {
            format::plain(&rows)
        };
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| CliError::runtime(format!("stdout: {e}")))
    }
}
