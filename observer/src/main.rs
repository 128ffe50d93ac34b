//! `canaryscope`: node-level eBPF observer for GPU and CPU inference workloads.
//!
//! This file only defines the command line; each subcommand lives in its module.
use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};

mod attribution;
mod check;
mod cli_error;
mod clock;
mod cpu;
mod discovery;
mod events;
mod metrics;
mod oom;
mod probes;
mod run;
mod session;
mod trace;

/// Node-level eBPF observer: GPU runtime failures, KFD driver errors, CPU
/// throttling, OOM kills and crashes, attributed to cgroups and pods.
#[derive(Parser, Debug)]
#[command(name = "canaryscope", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Log level for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, env = "CANARYSCOPE_LOG", default_value = "warn")]
    log_level: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print GPU runtime failures and other low-level events on this node as they happen (default).
    Trace(TraceArgs),
    /// Run as the node daemon: all probes and a Prometheus exporter.
    Run(RunArgs),
    /// Report what this node supports and what the observer would attach.
    Check(CheckArgs),
    /// Resumes processes held by `--hold` if the daemon that held them is
    /// stuck or gone (started by the daemon itself).
    #[command(hide = true)]
    HoldWatchdog {
        #[arg(long)]
        map: PathBuf,
        #[arg(long)]
        daemon_pid: u32,
    },
}

#[derive(Args, Debug, Clone, Default)]
pub struct RunArgs {
    /// Address of the Prometheus exporter (/metrics, /healthz, /readyz) [default: 0.0.0.0:9464].
    #[arg(long, env = "CANARYSCOPE_LISTEN")]
    pub listen: Option<String>,
    /// Config file (TOML); flags override its values.
    #[arg(long, env = "CANARYSCOPE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Kubeconfig for the pod watcher; in-cluster config is used when absent.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name: only its pods are watched (the DaemonSet sets NODE_NAME).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Pod label whose value becomes the `track` label (canary/stable) [default: track].
    #[arg(long)]
    pub track_label: Option<String>,
    /// Keep series of a deleted pod this long so the last increase is scraped [default: 5m].
    #[arg(long)]
    pub series_grace: Option<String>,
    /// Most cgroups with series on this node; beyond it updates are counted, not exported [default: 5000].
    #[arg(long)]
    pub max_cgroups: Option<usize>,
    /// A GPU call in flight longer than this counts as stalled [default: 10s].
    #[arg(long)]
    pub stall_threshold: Option<String>,
    /// Also probe this GPU runtime library; repeatable.
    #[arg(long = "lib", value_name = "PATH")]
    pub libs: Vec<PathBuf>,
    /// Do not talk to the Kubernetes API even when a config is found.
    #[arg(long)]
    pub no_kubernetes: bool,
    /// Probe families to attach, comma-separated: gpu, kfd, cpu, exits [default: all].
    #[arg(long, value_name = "LIST")]
    pub probes: Option<String>,
    /// Stop a process that maps a GPU runtime file never seen before until
    /// its probes are attached, so its first call is seen (see README: the hold).
    #[arg(long)]
    pub hold: bool,
}

#[derive(Args, Debug, Clone, Default)]
pub struct TraceArgs {
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
    /// Also probe this GPU runtime library (libamdhip64.so*, libcuda.so*, libnvcuda.so*); repeatable.
    #[arg(long = "lib", value_name = "PATH")]
    pub libs: Vec<PathBuf>,
    /// A GPU call in flight longer than this is reported as stalled (e.g. 10s, 500ms).
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub stall_threshold: Duration,
    /// Stop after this long (for scripts); runs until Ctrl-C / SIGTERM by default.
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Probe families to attach, comma-separated: gpu, kfd, cpu, exits.
    #[arg(long, value_name = "LIST", value_parser = crate::probes::Families::parse, default_value = "all")]
    pub probes: crate::probes::Families,
    /// Stop a process that maps a GPU runtime file never seen before until
    /// its probes are attached, so its first call is seen (see README: the hold).
    #[arg(long)]
    pub hold: bool,
    /// Character device whose ioctls count as KFD ioctls when the kernel has
    /// no kprobes (default /dev/kfd; tests point it at another device).
    #[arg(long, value_name = "PATH", hide = true)]
    pub kfd_device: Option<PathBuf>,
}

#[derive(Args, Debug, Clone, Default)]
pub struct CheckArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also look for this GPU runtime library; repeatable.
    #[arg(long = "lib", value_name = "PATH")]
    pub libs: Vec<PathBuf>,
}

/// Parses `10s`, `500ms`, `2m`, `1h` or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = num.parse().map_err(|_| format!("`{s}` is not a duration (try 10s, 500ms, 2m)"))?;
    let secs = match unit {
        "ns" => value / 1e9,
        "us" | "µs" => value / 1e6,
        "ms" => value / 1e3,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("`{s}` is not a valid duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses the command line; a mistake is one line naming it and the way to
/// the fix, exit status 2 (help and version print in full, status 0).
fn parse_cli() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    Cli::try_parse().map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        _ => cli_error::CliError::usage(cli_error::one_line_clap(&e.to_string())).report(),
    })
}

fn main() -> ExitCode {
    let cli = match parse_cli() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    env_logger::Builder::new().parse_filters(&cli.log_level).format_target(false).init();
    let result = match cli.command.unwrap_or(Command::Trace(TraceArgs {
        stall_threshold: Duration::from_secs(10),
        ..TraceArgs::default()
    })) {
        Command::Trace(args) => trace::run(args),
        Command::Run(args) => run::run(args),
        Command::Check(args) => check::run(args),
        Command::HoldWatchdog { map, daemon_pid } => return discovery::hold::run_watchdog(&map, daemon_pid),
    };
    match result {
        Ok(code) => code,
        Err(err) => err.report(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("5 parsecs").is_err());
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
