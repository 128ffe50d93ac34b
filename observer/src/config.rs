//! Defaults, durations, and the daemon's settings: command-line flags merged
//! over the optional TOML file. Every default is written here once; help
//! texts show it through [`with_default`].
use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::{attribution::kube::KubeOptions, cli::CliError, metrics::server, probes::Families};

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
fn default_duration(text: &str) -> Duration {
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
    /// the cost of a timed pair per call (README: hot calls).
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

/// The optional config file (TOML); flags override it.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConfigFile {
    pub listen: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub node_name: Option<String>,
    pub track_label: Option<String>,
    pub series_grace: Option<String>,
    pub max_cgroups: Option<usize>,
    pub stall_threshold: Option<String>,
    pub libs: Vec<PathBuf>,
    pub kubernetes: Option<bool>,
    pub probes: Option<String>,
    /// Hold a process that maps an unknown GPU runtime file until it is probed.
    pub hold: Option<bool>,
    /// `selected`, `all` or `none` (`--hot-calls`).
    pub hot_calls: Option<String>,
    /// `--hot-window`.
    pub hot_window: Option<String>,
    /// `counts` or `timed` (`--hot-detail`).
    pub hot_detail: Option<String>,
    /// `--cgroup`: cgroup2 paths whose cgroups get run-queue histograms
    /// besides the kubepods hierarchy.
    pub cgroups: Vec<String>,
    /// `false` is `--no-readiness-gate`.
    pub readiness_gate: Option<bool>,
    /// `--gate-timeout`.
    pub gate_timeout: Option<String>,
}

impl ConfigFile {
    pub fn read(path: &std::path::Path) -> Result<Self, CliError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::usage(format!("--config {}: {e}", path.display())))?;
        toml::from_str(&text).map_err(|e| {
            CliError::usage(format!("--config {}: {}", path.display(), one_line(&e.to_string())))
        })
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Everything the daemon runs with, after flags, environment and file.
#[derive(Debug, Clone)]
pub struct Settings {
    pub listen: std::net::SocketAddr,
    pub kube: Option<KubeOptions>,
    pub series_grace: Duration,
    pub max_cgroups: usize,
    pub stall_threshold: Duration,
    pub libs: Vec<PathBuf>,
    pub probes: Families,
    pub hold: bool,
    pub hot_calls: HotCalls,
    pub hot_window: Duration,
    pub hot_detail: HotDetail,
    /// Cgroup prefixes with run-queue accounting besides kubepods.
    pub cgroups: Vec<String>,
    /// Keep the `canaryscope.io/gpu-runtime` condition of gated pods
    /// (with Kubernetes only).
    pub readiness_gate: bool,
    /// After this long without a start-up, a gated pod without the
    /// condition gets `False`, `NoRuntimeActivity`.
    pub gate_timeout: Option<Duration>,
}

impl Settings {
    /// Merges the flags of `canaryscope run` over its config file.
    pub fn from_run_args(args: &crate::run::Args) -> Result<Self, CliError> {
        let file = match &args.config {
            Some(path) => ConfigFile::read(path)?,
            None => ConfigFile::default(),
        };
        let listen_text = args.listen.clone().or(file.listen).unwrap_or_else(|| DEFAULT_LISTEN.into());
        let listen = server::parse_listen(&listen_text).map_err(CliError::usage)?;
        let duration = |flag: &str, v: Option<String>, default: &str| -> Result<Duration, CliError> {
            match v {
                Some(s) => parse_duration(&s).map_err(|e| CliError::usage(format!("{flag}: {e}"))),
                None => Ok(default_duration(default)),
            }
        };
        let series_grace = duration(
            "--series-grace",
            args.series_grace.clone().or(file.series_grace),
            DEFAULT_SERIES_GRACE,
        )?;
        let stall_threshold = duration(
            "--stall-threshold",
            args.stall_threshold.clone().or(file.stall_threshold),
            DEFAULT_STALL_THRESHOLD,
        )?;
        let kubeconfig = args.kubeconfig.clone().or(file.kubeconfig);
        if let Some(path) = &kubeconfig {
            if let Err(e) = std::fs::File::open(path) {
                return Err(CliError::usage(format!("--kubeconfig {}: {e}", path.display())));
            }
        }
        let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        let kubernetes =
            !args.no_kubernetes && file.kubernetes.unwrap_or(true) && (kubeconfig.is_some() || in_cluster);
        let kube = kubernetes.then(|| KubeOptions {
            kubeconfig,
            node_name: args.node_name.clone().or(file.node_name),
            track_label: args
                .track_label
                .clone()
                .or(file.track_label)
                .unwrap_or_else(|| DEFAULT_TRACK_LABEL.into()),
        });
        let mut libs = args.libs.clone();
        libs.extend(file.libs);
        let probes = match args.probes.clone().or(file.probes) {
            Some(list) => Families::parse(&list).map_err(|e| CliError::usage(format!("--probes: {e}")))?,
            None => Families::ALL,
        };
        let hold = args.hold || file.hold.unwrap_or(false);
        check_gpu_options(&libs, hold, probes)?;
        let hot_calls = match args.hot_calls.clone().or(file.hot_calls) {
            Some(text) => parse_hot_calls(&text).map_err(|e| CliError::usage(format!("--hot-calls: {e}")))?,
            None => HotCalls::Selected,
        };
        let hot_window = match args.hot_window.clone().or(file.hot_window) {
            Some(text) => {
                parse_hot_window(&text).map_err(|e| CliError::usage(format!("--hot-window: {e}")))?
            }
            None => default_duration(DEFAULT_HOT_WINDOW),
        };
        let hot_detail = parse_hot_detail(
            args.hot_detail.as_deref().or(file.hot_detail.as_deref()).unwrap_or(DEFAULT_HOT_DETAIL_RUN),
        )
        .map_err(|e| CliError::usage(format!("--hot-detail: {e}")))?;
        let cgroups = if args.cgroups.is_empty() { file.cgroups } else { args.cgroups.clone() };
        for c in &cgroups {
            parse_cgroup_prefix(c).map_err(|e| CliError::usage(format!("--cgroup {c:?}: {e}")))?;
        }
        let readiness_gate = kube.is_some() && !args.no_readiness_gate && file.readiness_gate.unwrap_or(true);
        let gate_timeout = match args.gate_timeout.clone().or(file.gate_timeout) {
            Some(text) => {
                let d = parse_duration(&text).map_err(|e| CliError::usage(format!("--gate-timeout: {e}")))?;
                if d < Duration::from_secs(1) {
                    return Err(CliError::usage(format!("--gate-timeout: `{text}` is shorter than 1s")));
                }
                Some(d)
            }
            None => None,
        };
        Ok(Self {
            readiness_gate,
            gate_timeout,
            hold,
            hot_calls,
            hot_window,
            hot_detail,
            cgroups,
            probes,
            listen,
            kube,
            series_grace,
            max_cgroups: args.max_cgroups.or(file.max_cgroups).unwrap_or(DEFAULT_MAX_CGROUPS),
            stall_threshold,
            libs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::Args;

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
        assert!(server::parse_listen(DEFAULT_LISTEN).is_ok());
        let s = Settings::from_run_args(&Args::default()).expect("defaults are valid");
        assert_eq!(
            (s.stall_threshold, s.series_grace, s.max_cgroups),
            (Duration::from_secs(10), Duration::from_secs(300), 5000)
        );
    }

    #[test]
    fn bad_listen_and_config_are_usage_errors() {
        let mut a = Args { listen: Some("nonsense".into()), ..Args::default() };
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.contains("--listen nonsense"))
        );
        a = Args { config: Some("/nonexistent/canaryscope.toml".into()), ..Args::default() };
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.contains("--config /nonexistent"))
        );
        let file = std::env::temp_dir().join(format!("cs-config-{}", std::process::id()));
        std::fs::write(&file, "listen = \":9999\"\nno_such_key = 1\n").expect("write");
        a = Args { config: Some(file.clone()), ..Args::default() };
        let err = Settings::from_run_args(&a).expect_err("unknown key");
        assert!(
            matches!(&err, CliError::Usage(m) if m.contains("no_such_key") && !m.contains('\n')),
            "{err}"
        );
        std::fs::write(&file, "listen = \":9999\"\nseries_grace = \"30s\"\ncgroups = [\"/solver.slice\"]\n")
            .expect("write");
        let s = Settings::from_run_args(&a).expect("valid config");
        assert_eq!(s.listen.port(), 9999);
        assert_eq!(s.series_grace, Duration::from_secs(30));
        assert_eq!(s.cgroups, ["/solver.slice"]);
        a.cgroups = vec!["/batch.slice".into()];
        assert_eq!(Settings::from_run_args(&a).expect("flag wins").cgroups, ["/batch.slice"]);
        a.cgroups = vec!["batch.slice".into()];
        assert!(matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.contains("--cgroup")));
        a.cgroups.clear();
        let _ = std::fs::remove_file(file);
    }

    #[test]
    fn hot_call_settings_come_from_flags_or_file() {
        let s = Settings::from_run_args(&Args::default()).expect("defaults");
        assert_eq!((s.hot_calls, s.hot_window), (HotCalls::Selected, Duration::from_secs(600)));
        assert_eq!(s.hot_detail, HotDetail::Counts, "the daemon counts hot calls by default");
        let file = std::env::temp_dir().join(format!("cs-hot-{}", std::process::id()));
        std::fs::write(&file, "hot_calls = \"none\"\nhot_window = \"30s\"\nhot_detail = \"timed\"\n")
            .expect("write");
        let mut a = Args { config: Some(file.clone()), ..Args::default() };
        let s = Settings::from_run_args(&a).expect("valid config");
        assert_eq!((s.hot_calls, s.hot_window), (HotCalls::None, Duration::from_secs(30)));
        assert_eq!(s.hot_detail, HotDetail::Timed);
        a.hot_detail = Some("counts".into());
        assert_eq!(Settings::from_run_args(&a).expect("flag wins").hot_detail, HotDetail::Counts);
        a.hot_detail = Some("deep".into());
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.starts_with("--hot-detail: `deep`"))
        );
        a.hot_detail = None;
        a.hot_calls = Some("all".into());
        assert_eq!(Settings::from_run_args(&a).expect("flag wins").hot_calls, HotCalls::All);
        a.hot_calls = Some("some".into());
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.starts_with("--hot-calls: `some`"))
        );
        a.hot_calls = None;
        a.hot_window = Some("200ms".into());
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.starts_with("--hot-window: "))
        );
        let _ = std::fs::remove_file(file);
    }

    #[test]
    fn the_readiness_gate_needs_kubernetes_and_can_be_turned_off() {
        let s = Settings::from_run_args(&Args::default()).expect("defaults");
        // No kubeconfig and not in a cluster: no Kubernetes, no gate.
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
            assert!(!s.readiness_gate);
        }
        assert_eq!(s.gate_timeout, None);
        let kubeconfig = std::env::temp_dir().join(format!("cs-gate-kubeconfig-{}", std::process::id()));
        std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n").expect("write");
        let mut a = Args { kubeconfig: Some(kubeconfig.clone()), ..Args::default() };
        assert!(Settings::from_run_args(&a).expect("valid").readiness_gate);
        a.gate_timeout = Some("5m".into());
        assert_eq!(Settings::from_run_args(&a).expect("valid").gate_timeout, Some(Duration::from_secs(300)));
        a.gate_timeout = Some("10ms".into());
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.starts_with("--gate-timeout: "))
        );
        a.gate_timeout = None;
        a.no_readiness_gate = true;
        assert!(!Settings::from_run_args(&a).expect("valid").readiness_gate);
        let _ = std::fs::remove_file(kubeconfig);
    }

    #[test]
    fn unreadable_kubeconfig_is_named() {
        let a = Args { kubeconfig: Some("/nonexistent/kubeconfig".into()), ..Args::default() };
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.starts_with("--kubeconfig /nonexistent/kubeconfig"))
        );
    }

    #[test]
    fn gpu_options_need_the_gpu_family() {
        let no_gpu = Families::parse("cpu").expect("valid");
        assert!(check_gpu_options(&[], true, no_gpu).is_err());
        assert!(check_gpu_options(&["/bin/sh".into()], false, no_gpu).is_err());
        assert!(check_gpu_options(&["/nonexistent/libcuda.so".into()], false, Families::ALL).is_err());
        assert!(check_gpu_options(&[], true, Families::ALL).is_ok());
    }
}
