//! Defaults, durations, probe families and the other values a command line
//! or config file names, each parsed with the error a user reads. Every
//! default is written here once; help texts show it through
//! [`with_default`]. A leaf: how `run` merges them is `run::settings`.
use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::error::CliError;

mod gpu_resources;
mod probe_args;
pub use gpu_resources::{
    parse_gpu_init_timeout, parse_gpu_resource, GpuResources, DEFAULT_GPU_INIT_TIMEOUT, DEFAULT_GPU_RESOURCES,
};
pub use probe_args::{families, ProbeArgs, ProbeOptionHelp};

/// Where the daemon's exporter listens (`/metrics`, `/healthz`, `/readyz`).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:9464";
/// A GPU call in flight this long is a stall.
pub const DEFAULT_STALL_THRESHOLD: &str = "10s";
/// How long a deleted pod's series stay, so their last increase is scraped.
pub const DEFAULT_SERIES_GRACE: &str = "5m";
/// Most cgroups with series on one node.
pub const DEFAULT_MAX_CGROUPS: usize = 5000;
/// Pod label whose value becomes the `track` label.
pub const DEFAULT_TRACK_LABEL: &str = "track";
/// Which processes take traps on hot GPU calls (see [`HotCalls`]).
pub const DEFAULT_HOT_CALLS: &str = "selected";
/// What the daemon records of a hot call (see [`HotDetail`]): it counts.
pub const DEFAULT_HOT_DETAIL_RUN: &str = "counts";
/// What `trace` records of a hot call: a person tracing a process wants
/// every call timed and the call a crash was in named.
pub const DEFAULT_HOT_DETAIL_TRACE: &str = "timed";
/// How long a cgroup stays selected for hot-call probes after its last GPU
/// failure, stall or crash.
pub const DEFAULT_HOT_WINDOW: &str = "10m";
/// How long a cgroup must stay oversubscribed before it is reported.
pub const OVERSUBSCRIBED_AFTER: Duration = Duration::from_secs(2);

/// Probe families, each one optional (`--probes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    /// GPU runtime libraries: their uprobes and their discovery.
    pub gpu: bool,
    pub kfd: bool,
    pub sched: bool,
    pub exits: bool,
    /// Server-side HTTP/1.x requests of pods (cgroup_skb programs).
    pub http: bool,
}

/// The names `--probes` takes (what each covers is the help of `--probes`
/// and docs/ARCHITECTURE.md's table of families).
pub const FAMILY_NAMES: &[&str] = &["gpu", "kfd", "cpu", "exits", "http"];

/// Everything, as a node agent runs by default.
impl Default for Families {
    fn default() -> Self {
        Self::ALL
    }
}

impl Families {
    pub const ALL: Self = Self { gpu: true, kfd: true, sched: true, exits: true, http: true };

    /// Parses a comma-separated list such as `gpu,exits`, or `all`.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut families = Self { gpu: false, kfd: false, sched: false, exits: false, http: false };
        for name in list.split(',').map(str::trim) {
            match name {
                "all" => families = Self::ALL,
                "gpu" => families.gpu = true,
                "kfd" => families.kfd = true,
                "cpu" => families.sched = true,
                "exits" => families.exits = true,
                "http" => families.http = true,
                _ => {
                    return Err(format!(
                        "unknown probe family `{name}` (known: {}, or all)",
                        FAMILY_NAMES.join(", ")
                    ));
                }
            }
        }
        Ok(families)
    }
}

/// An `http://host[:port][/path]` URL as host (IPv6 without brackets),
/// port (80 when absent) and path (empty when absent); `None` when it is
/// not one. What `top --from` and the judge's `--prometheus` take.
pub fn parse_http_url(url: &str) -> Option<(String, u16, String)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        // An IPv6 literal keeps its brackets; its colons are not a port.
        Some((h, p)) if !p.contains(']') => (h, p.parse().ok()?),
        _ => (authority, 80),
    };
    let host = host.trim_matches(['[', ']']);
    (!host.is_empty()).then(|| (host.to_string(), port, path.to_string()))
}

/// Parses the exporter's address; `:9464` is every interface.
pub fn parse_listen(addr: &str) -> Result<SocketAddr, String> {
    // Accept ":9464" as shorthand for all interfaces.
    let full = if addr.starts_with(':') { format!("0.0.0.0{addr}") } else { addr.to_string() };
    full.parse()
        .map_err(|_| format!("--listen {addr}: not an address (use HOST:PORT, e.g. 0.0.0.0:9464 or :9464)"))
}

/// A help text with its default appended, as clap shows defaults.
pub fn with_default(help: &str, default: impl std::fmt::Display) -> String {
    format!("{help} [default: {default}]")
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

/// A built-in default duration; the constants above are valid by test.
pub(crate) fn default_duration(text: &str) -> Duration {
    parse_duration(text).unwrap_or(Duration::from_secs(10))
}

/// A duration in nanoseconds for the kernel side, never zero (zero would
/// make every call "slow").
pub fn kernel_ns(d: Duration) -> u64 {
    (d.as_nanos().min(u128::from(u64::MAX)) as u64).max(1)
}

/// What `--lib` and `--hold` need, checked before anything is loaded, so
/// bad input gets a clear answer without privileges.
pub fn check_gpu_options(libs: &[PathBuf], hold: bool, families: Families) -> Result<(), CliError> {
    for lib in libs {
        if let Err(e) = std::fs::metadata(lib) {
            return Err(CliError::usage(format!("--lib {}: {e}", lib.display())));
        }
    }
    if !libs.is_empty() && !families.gpu {
        return Err(CliError::usage("--lib needs the gpu probes: add gpu to --probes"));
    }
    if hold && !families.gpu {
        return Err(CliError::usage("--hold needs the gpu probes: add gpu to --probes"));
    }
    Ok(())
}

/// Where the hot tier of GPU functions (launches, asynchronous copies, error
/// polling) is probed. The cold tier is probed in every process whatever
/// this says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HotCalls {
    /// Only in selected processes, with per-process uprobes: `trace`'s
    /// filtered processes (all without a filter); `run`'s canary pods and
    /// cgroups that had a GPU failure, stall or crash within the hot window.
    Selected,
    /// In every process (a trap pair per call everywhere).
    All,
    /// Nowhere.
    None,
}

impl HotCalls {
    const NAMES: &[(&str, Self)] = &[("selected", Self::Selected), ("all", Self::All), ("none", Self::None)];
}

impl std::str::FromStr for HotCalls {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        choose(s, "mode", Self::NAMES)
    }
}

/// One of `choices` by name; the error lists them (`use a, b or c`).
fn choose<T: Copy>(text: &str, what: &str, choices: &[(&str, T)]) -> Result<T, String> {
    let text = text.trim();
    if let Some((_, value)) = choices.iter().find(|(name, _)| *name == text) {
        return Ok(*value);
    }
    let names: Vec<&str> = choices.iter().map(|(name, _)| *name).collect();
    let listed = match names.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Err(format!("`{text}` is not a {what} (use {listed})"))
}

/// What a selected process's hot calls are probed for (`--hot-detail`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HotDetail {
    /// A return probe alone: every call counted by result, every failure an
    /// event; no duration, no stall, no "in call" for a crash. About half
    /// the cost of a timed pair per call (docs/how-it-sees.md: hot calls).
    Counts,
    /// An entry and a return probe, as for cold calls: durations, stalls,
    /// and the call a crash happened in.
    Timed,
}

impl HotDetail {
    const NAMES: &[(&str, Self)] = &[("counts", Self::Counts), ("timed", Self::Timed)];
}

impl std::str::FromStr for HotDetail {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        choose(s, "detail level", Self::NAMES)
    }
}

/// `--hot-detail` as clap parses it.
pub fn parse_hot_detail(s: &str) -> Result<HotDetail, String> {
    s.parse()
}

/// `--hot-calls` as clap parses it.
pub fn parse_hot_calls(s: &str) -> Result<HotCalls, String> {
    s.parse()
}

/// `--hot-window`: a duration of at least one second (a shorter one would
/// add and remove probes on every failure).
/// A cgroup path as `/proc/PID/cgroup` shows it (`/solver.slice`), not a
/// path in the filesystem.
pub fn parse_cgroup_prefix(s: &str) -> Result<(), String> {
    if !s.starts_with('/') {
        return Err("a cgroup path starts with / (as in /proc/PID/cgroup)".into());
    }
    if s.starts_with("/sys/fs/cgroup") {
        return Err("name the cgroup as /proc/PID/cgroup shows it, without the cgroupfs mount".into());
    }
    if s.split('/').any(|p| p == ".." || p == ".") {
        return Err("no . or .. components".into());
    }
    Ok(())
}

pub fn parse_hot_window(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("`{s}` is shorter than 1s"));
    }
    Ok(d)
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
    fn built_in_defaults_parse() {
        assert_eq!(parse_duration(DEFAULT_STALL_THRESHOLD), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration(DEFAULT_SERIES_GRACE), Ok(Duration::from_secs(300)));
        assert_eq!(parse_hot_window(DEFAULT_HOT_WINDOW), Ok(Duration::from_secs(600)));
        assert_eq!(parse_cgroup_prefix("/solver.slice"), Ok(()));
        for bad in ["solver.slice", "/sys/fs/cgroup/solver.slice", "/a/../b"] {
            assert!(parse_cgroup_prefix(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_hot_calls(DEFAULT_HOT_CALLS), Ok(HotCalls::Selected));
        assert_eq!(parse_hot_detail(DEFAULT_HOT_DETAIL_RUN), Ok(HotDetail::Counts));
        assert_eq!(parse_hot_detail(DEFAULT_HOT_DETAIL_TRACE), Ok(HotDetail::Timed));
        assert!(parse_listen(DEFAULT_LISTEN).is_ok());
    }

    #[test]
    fn gpu_options_need_the_gpu_family() {
        let no_gpu = Families::parse("cpu").expect("valid");
        assert!(check_gpu_options(&[], true, no_gpu).is_err());
        assert!(check_gpu_options(&["/bin/sh".into()], false, no_gpu).is_err());
        assert!(check_gpu_options(&["/nonexistent/libcuda.so".into()], false, Families::ALL).is_err());
        assert!(check_gpu_options(&[], true, Families::ALL).is_ok());
    }

    #[test]
    fn probe_lists_parse_and_unknown_names_are_refused() {
        assert_eq!(Families::parse("all"), Ok(Families::ALL));
        let only = Families::parse("gpu, exits").expect("valid");
        assert!(only.gpu && only.exits && !only.kfd && !only.sched);
        assert_eq!(Families::parse("cpu").map(|f| f.sched), Ok(true));
        let err = Families::parse("gpu,kprobes").expect_err("unknown");
        assert!(err.contains("`kprobes`") && err.contains("gpu, kfd, cpu, exits, http"), "{err}");
        assert!(Families::parse("").is_err(), "an empty list selects nothing: refused");
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen(":9464").map(|a| a.port()), Ok(9464));
        assert!(parse_listen("127.0.0.1:80").is_ok());
        assert!(parse_listen("[::1]:9464").is_ok());
        let err = parse_listen("localhost").expect_err("no port");
        assert!(err.contains("--listen localhost"), "{err}");
    }
}
