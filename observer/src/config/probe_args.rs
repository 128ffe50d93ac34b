//! The options of every command that loads probes (`trace`, `run`, `top`):
//! which GPU runtime files to probe besides those found, which probe
//! families, and how long a GPU call may run before it counts as stalled.
//! One definition, one parser each; each command words their help and
//! lists them among its own options, as its `--help` always has.
use std::{path::PathBuf, time::Duration};

use clap::{builder::StyledStr, Command};

use super::{parse_duration, Families};
use crate::error::CliError;

/// Flattened into each probing command's arguments (`#[command(flatten)]`,
/// after its own options: [`ProbeOptionHelp::probe_option`] then shows each
/// where the command wants it).
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ProbeArgs {
    /// Also probe this GPU runtime library; repeatable.
    #[arg(long = "lib", value_name = "PATH")]
    pub libs: Vec<PathBuf>,
    // The two values below are kept as the text given: `run` merges them
    // with its config file's before they are read (`families`,
    // `stall_threshold`).
    /// Probe families to attach, comma-separated: gpu, kfd, cpu, exits, http.
    #[arg(long, value_name = "LIST", value_parser = checked(Families::parse))]
    pub probes: Option<String>,
    /// A GPU call in flight longer than this counts as stalled.
    #[arg(long, value_parser = checked(parse_duration))]
    pub stall_threshold: Option<String>,
}

impl ProbeArgs {
    /// The families asked for; all of them when none were named.
    pub fn families(&self) -> Result<Families, CliError> {
        families(self.probes.as_deref())
    }

    /// The stall threshold asked for, or the default.
    pub fn stall_threshold(&self) -> Result<Duration, CliError> {
        let text = self.stall_threshold.as_deref().unwrap_or(super::DEFAULT_STALL_THRESHOLD);
        parse_duration(text).map_err(|e| CliError::usage(format!("--stall-threshold: {e}")))
    }
}

/// Reads a `--probes` list, from the flag or a config file; all families
/// when there is none.
pub fn families(list: Option<&str>) -> Result<Families, CliError> {
    match list {
        Some(list) => Families::parse(list).map_err(|e| CliError::usage(format!("--probes: {e}"))),
        None => Ok(Families::ALL),
    }
}

/// A value parser that refuses what `parse` refuses, with its words, and
/// keeps the text.
fn checked<T>(parse: fn(&str) -> Result<T, String>) -> impl Fn(&str) -> Result<String, String> + Clone {
    move |text| parse(text).map(|_| text.to_string())
}

/// How a command presents a shared probe option, written as a
/// `#[command(...)]` attribute of its arguments.
pub trait ProbeOptionHelp {
    /// Gives option `id` the command's own `help` and lists it right after
    /// option `after` in the command's `--help`.
    fn probe_option(self, id: &str, after: &str, help: impl Into<StyledStr>) -> Self;
}

impl ProbeOptionHelp for Command {
    fn probe_option(self, id: &str, after: &str, help: impl Into<StyledStr>) -> Self {
        // clap lists options by display order, which it numbers as they are
        // added. Making room right after `after` and taking that place keeps
        // every other option's number, so an option propagated later from
        // the top command (--log-level) still falls where it always did.
        let Some(place) = self.get_arguments().find(|a| a.get_id() == after).map(|a| a.get_display_order())
        else {
            panic!("no option {after:?} to show --{id} after");
        };
        let help = help.into();
        self.mut_args(|arg| {
            let order = arg.get_display_order();
            if arg.get_id() == id {
                arg.help(help.clone()).long_help(None).display_order(place + 1)
            } else if order > place {
                arg.display_order(order + 1)
            } else {
                arg
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::*;

    #[derive(clap::Parser, Debug)]
    #[command(
        probe_option("stall_threshold", "first", "stalls here"),
        probe_option("libs", "stall_threshold", "libraries here"),
        probe_option("probes", "second", "families here")
    )]
    struct Example {
        #[arg(long)]
        first: bool,
        #[arg(long)]
        second: bool,
        #[arg(long)]
        third: bool,
        #[command(flatten)]
        probe: ProbeArgs,
    }

    fn help_order(command: &Command) -> Vec<String> {
        let mut options: Vec<_> = command
            .get_arguments()
            .map(|a| (a.get_display_order(), a.get_long().unwrap_or_default().to_string()))
            .collect();
        options.sort();
        options.into_iter().map(|(_, long)| long).collect()
    }

    #[test]
    fn each_probe_option_is_shown_where_the_command_places_it() {
        let command = Example::command();
        assert_eq!(help_order(&command), ["first", "stall-threshold", "lib", "second", "probes", "third"]);
        let help = command.clone().render_help().to_string();
        for words in ["stalls here", "libraries here", "families here"] {
            assert!(help.contains(words), "{help}");
        }
    }

    #[test]
    fn other_options_keep_the_numbers_they_would_have_in_place() {
        // As if declared first, stall-threshold, lib, second, probes, third:
        // an option the top command adds later with a number of its own
        // then lands among them as it would have.
        let command = Example::command();
        let orders: Vec<(String, usize)> = command
            .get_arguments()
            .map(|a| (a.get_long().unwrap_or_default().to_string(), a.get_display_order()))
            .collect();
        for (long, order) in
            [("first", 0), ("stall-threshold", 1), ("lib", 2), ("second", 3), ("probes", 4), ("third", 5)]
        {
            assert!(
                orders.contains(&(long.to_string(), order)),
                "--{long} is not number {order}: {orders:?}"
            );
        }
    }

    #[test]
    fn values_are_checked_by_clap_and_kept_as_given() {
        let parse = |args: &[&str]| {
            let matches =
                Example::command().try_get_matches_from(std::iter::once("x").chain(args.iter().copied()))?;
            Example::from_arg_matches(&matches)
        };
        let given = parse(&["--probes", "gpu,cpu", "--stall-threshold", "500ms"]).expect("parses");
        assert_eq!(given.probe.probes.as_deref(), Some("gpu,cpu"));
        assert_eq!(given.probe.stall_threshold().expect("a duration"), Duration::from_millis(500));
        assert!(!given.probe.families().expect("families").kfd);
        let none = parse(&[]).expect("parses");
        assert_eq!(none.probe.families().expect("families"), Families::ALL);
        assert_eq!(none.probe.stall_threshold().expect("default"), Duration::from_secs(10));
        let err = parse(&["--stall-threshold", "ten"]).expect_err("not a duration").to_string();
        assert!(err.contains("`ten` is not a duration"), "{err}");
        let err = parse(&["--probes", "gpu,x"]).expect_err("not a family").to_string();
        assert!(err.contains("unknown probe family `x`"), "{err}");
    }
}
