//! The command line: subcommands, global options, and how a mistake in
//! them is reported (one line, exit status 2).
use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

use crate::{error::CliError, event_loop::LoopError, pipeline::StartError};

/// Node-level eBPF observer: GPU runtime failures, KFD driver errors, CPU
/// throttling, OOM kills and crashes, attributed to cgroups and pods.
#[derive(Parser, Debug)]
#[command(name = "canaryscope", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Log level for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, env = "CANARYSCOPE_LOG", default_value = "warn")]
    pub log_level: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print GPU runtime failures and other low-level events on this node as they happen (default).
    Trace(crate::trace::Args),
    /// Run as the node daemon: all probes and a Prometheus exporter.
    // Boxed: the daemon's options are most of the enum's size.
    Run(Box<crate::run::Args>),
    /// A live full-screen view of this node: one row per pod (or cgroup), each second.
    Top(crate::top::Args),
    /// Report what this node supports and what the observer would attach.
    Check(crate::check::Args),
    /// Answer Argo Rollouts and Flagger: does the canary fail more often than its baseline?
    Judge(crate::judge::Args),
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

/// Parses the command line; a mistake is one line naming it and the way to
/// the fix, exit status 2 (help and version print in full, status 0).
pub fn parse() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    Cli::try_parse().map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::SUCCESS
        }
        _ => CliError::usage(one_line_clap(&e.to_string())).report(),
    })
}

/// Clap's usage errors span several lines ("error: ...", the usage, a hint);
/// keep the first, without its "error: " tag, and point at --help.
pub fn one_line_clap(rendered: &str) -> String {
    let first = rendered.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid command line");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    format!("{first} (see canaryscope --help)")
}

// Exit codes are chosen here, at the edge, from the data path's typed errors.

impl From<StartError> for CliError {
    /// A library the user named is their mistake to fix (exit 2); the
    /// kernel or the machine refusing is not (exit 1).
    fn from(e: StartError) -> Self {
        match e {
            StartError::Library(_) => Self::usage(e.to_string()),
            _ => Self::runtime(e.to_string()),
        }
    }
}

impl From<LoopError> for CliError {
    /// The ring buffer or signal handling failing is the machine's (exit 1).
    fn from(e: LoopError) -> Self {
        Self::runtime(e.to_string())
    }
}

/// Runs one subcommand; `trace` when none is given.
pub fn dispatch(command: Option<Command>) -> ExitCode {
    let result = match command.unwrap_or_else(|| Command::Trace(crate::trace::Args::default())) {
        Command::Trace(args) => crate::trace::run(args),
        Command::Run(args) => crate::run::run(*args),
        Command::Check(args) => crate::check::run(args),
        Command::Top(args) => crate::top::run(args),
        Command::Judge(args) => crate::judge::run(args),
        Command::HoldWatchdog { map, daemon_pid } => {
            return crate::discovery::hold::run_watchdog(&map, daemon_pid)
        }
    };
    result.unwrap_or_else(|err| err.report())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn no_subcommand_means_trace_with_its_defaults() {
        let parsed = Cli::try_parse_from(["canaryscope", "trace"]).expect("parses");
        let Some(Command::Trace(from_flags)) = parsed.command else { panic!("trace") };
        let default = crate::trace::Args::default();
        assert_eq!(from_flags.probe, default.probe);
        assert_eq!(default.probe.families().expect("all"), crate::config::Families::ALL);
    }

    #[test]
    fn clap_errors_become_one_line() {
        let rendered = "error: unexpected argument '--nope' found\n\nUsage: canaryscope trace [OPTIONS]\n\nFor more information, try '--help'.\n";
        assert_eq!(one_line_clap(rendered), "unexpected argument '--nope' found (see canaryscope --help)");
    }
}
