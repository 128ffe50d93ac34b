//! The daemon's settings: `canaryscope run`'s flags merged over its
//! optional TOML config file, each checked with the error a user reads.
use std::{path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::{
    attribution::kube::KubeOptions,
    config::{
        check_gpu_options, default_duration, parse_cgroup_prefix, parse_duration, parse_gpu_init_timeout,
        parse_hot_calls, parse_hot_detail, parse_hot_window, parse_listen, Families, GpuResources, HotCalls,
        HotDetail, ProbeArgs, DEFAULT_GPU_INIT_TIMEOUT, DEFAULT_HOT_DETAIL_RUN, DEFAULT_HOT_WINDOW,
        DEFAULT_LISTEN, DEFAULT_MAX_CGROUPS, DEFAULT_SERIES_GRACE, DEFAULT_TRACK_LABEL,
    },
    error::CliError,
    run::Args,
};

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
    /// `--gpu-resource`: more resource names that are GPUs (added to the
    /// flags' and the defaults).
    pub gpu_resources: Vec<String>,
    /// `--gpu-init-timeout`.
    pub gpu_init_timeout: Option<String>,
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
    /// The resource names that are GPUs in a container's limits.
    pub gpu_resources: GpuResources,
    /// How long a container that requested a GPU may run without
    /// initialising one; `None` turns the check off.
    pub gpu_init_timeout: Option<Duration>,
}

impl Settings {
    /// Merges the flags of `canaryscope run` over its config file.
    pub fn from_run_args(args: &Args) -> Result<Self, CliError> {
        let file = match &args.config {
            Some(path) => ConfigFile::read(path)?,
            None => ConfigFile::default(),
        };
        let listen_text = args.listen.clone().or(file.listen).unwrap_or_else(|| DEFAULT_LISTEN.into());
        let listen = parse_listen(&listen_text).map_err(CliError::usage)?;
        let series_grace = flag_duration(
            "--series-grace",
            args.series_grace.clone().or(file.series_grace),
            DEFAULT_SERIES_GRACE,
        )?;
        let probe = ProbeArgs {
            libs: args.probe.libs.iter().chain(&file.libs).cloned().collect(),
            probes: args.probe.probes.clone().or(file.probes),
            stall_threshold: args.probe.stall_threshold.clone().or(file.stall_threshold),
        };
        let stall_threshold = probe.stall_threshold()?;
        let kube = kube_options(
            args,
            args.kubeconfig.clone().or(file.kubeconfig),
            file.kubernetes,
            file.node_name,
            file.track_label,
        )?;
        let probes = probe.families()?;
        let libs = probe.libs;
        let hold = args.hold || file.hold.unwrap_or(false);
        check_gpu_options(&libs, hold, probes)?;
        let (hot_calls, hot_window, hot_detail) = hot_call_settings(
            args.hot_calls.clone().or(file.hot_calls),
            args.hot_window.clone().or(file.hot_window),
            args.hot_detail.clone().or(file.hot_detail),
        )?;
        let cgroups = if args.cgroups.is_empty() { file.cgroups } else { args.cgroups.clone() };
        for c in &cgroups {
            parse_cgroup_prefix(c).map_err(|e| CliError::usage(format!("--cgroup {c:?}: {e}")))?;
        }
        let readiness_gate = kube.is_some() && !args.no_readiness_gate && file.readiness_gate.unwrap_or(true);
        let gate_timeout = gate_timeout(args.gate_timeout.clone().or(file.gate_timeout))?;
        let extra_gpus: Vec<String> = args.gpu_resources.iter().chain(&file.gpu_resources).cloned().collect();
        let gpu_resources = GpuResources::with_extra(&extra_gpus)
            .map_err(|e| CliError::usage(format!("--gpu-resource: {e}")))?;
        let init_timeout = args.gpu_init_timeout.clone().or(file.gpu_init_timeout);
        let gpu_init_timeout =
            parse_gpu_init_timeout(init_timeout.as_deref().unwrap_or(DEFAULT_GPU_INIT_TIMEOUT))
                .map_err(|e| CliError::usage(format!("--gpu-init-timeout: {e}")))?;
        Ok(Self {
            gpu_resources,
            gpu_init_timeout,
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

/// A duration flag or file value, or its built-in default.
fn flag_duration(flag: &str, value: Option<String>, default: &str) -> Result<Duration, CliError> {
    match value {
        Some(s) => parse_duration(&s).map_err(|e| CliError::usage(format!("{flag}: {e}"))),
        None => Ok(default_duration(default)),
    }
}

/// The pod watcher's options, when there is a Kubernetes API to talk to:
/// a kubeconfig given, or running in a cluster, and not turned off.
fn kube_options(
    args: &Args,
    kubeconfig: Option<PathBuf>,
    in_file: Option<bool>,
    node_name: Option<String>,
    track_label: Option<String>,
) -> Result<Option<KubeOptions>, CliError> {
    if let Some(path) = &kubeconfig {
        if let Err(e) = std::fs::File::open(path) {
            return Err(CliError::usage(format!("--kubeconfig {}: {e}", path.display())));
        }
    }
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let kubernetes = !args.no_kubernetes && in_file.unwrap_or(true) && (kubeconfig.is_some() || in_cluster);
    Ok(kubernetes.then(|| KubeOptions {
        kubeconfig,
        node_name: args.node_name.clone().or(node_name),
        track_label: args.track_label.clone().or(track_label).unwrap_or_else(|| DEFAULT_TRACK_LABEL.into()),
    }))
}

/// `--hot-calls`, `--hot-window` and `--hot-detail`, from flag or file.
fn hot_call_settings(
    calls: Option<String>,
    window: Option<String>,
    detail: Option<String>,
) -> Result<(HotCalls, Duration, HotDetail), CliError> {
    let hot_calls = match calls {
        Some(text) => parse_hot_calls(&text).map_err(|e| CliError::usage(format!("--hot-calls: {e}")))?,
        None => HotCalls::Selected,
    };
    let hot_window = match window {
        Some(text) => parse_hot_window(&text).map_err(|e| CliError::usage(format!("--hot-window: {e}")))?,
        None => default_duration(DEFAULT_HOT_WINDOW),
    };
    let hot_detail = parse_hot_detail(detail.as_deref().unwrap_or(DEFAULT_HOT_DETAIL_RUN))
        .map_err(|e| CliError::usage(format!("--hot-detail: {e}")))?;
    Ok((hot_calls, hot_window, hot_detail))
}

/// `--gate-timeout`: at least a second, or none.
fn gate_timeout(text: Option<String>) -> Result<Option<Duration>, CliError> {
    let Some(text) = text else { return Ok(None) };
    let d = parse_duration(&text).map_err(|e| CliError::usage(format!("--gate-timeout: {e}")))?;
    if d < Duration::from_secs(1) {
        return Err(CliError::usage(format!("--gate-timeout: `{text}` is shorter than 1s")));
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_settings() {
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
    fn gpu_resources_add_up_from_flags_and_file_and_the_init_timeout_can_be_turned_off() {
        let s = Settings::from_run_args(&Args::default()).expect("defaults");
        assert_eq!(s.gpu_resources, GpuResources::default());
        assert_eq!(s.gpu_init_timeout, Some(Duration::from_secs(300)));
        let file = std::env::temp_dir().join(format!("cs-gpu-{}", std::process::id()));
        std::fs::write(&file, "gpu_resources = [\"example.com/fpga\"]\ngpu_init_timeout = \"0\"\n")
            .expect("write");
        let mut a = Args {
            config: Some(file.clone()),
            gpu_resources: vec!["example.com/accel-*".into()],
            ..Args::default()
        };
        let s = Settings::from_run_args(&a).expect("valid");
        for gpu in ["nvidia.com/gpu", "example.com/fpga", "example.com/accel-x"] {
            assert!(s.gpu_resources.matches(gpu), "{gpu}");
        }
        assert_eq!(s.gpu_init_timeout, None, "0 turns the check off");
        a.gpu_init_timeout = Some("90s".into());
        assert_eq!(
            Settings::from_run_args(&a).expect("flag wins").gpu_init_timeout,
            Some(Duration::from_secs(90))
        );
        a.gpu_init_timeout = Some("100ms".into());
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.starts_with("--gpu-init-timeout: "))
        );
        a.gpu_init_timeout = None;
        a.gpu_resources = vec!["fpga".into()];
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.starts_with("--gpu-resource: `fpga`"))
        );
        let _ = std::fs::remove_file(file);
    }

    #[test]
    fn unreadable_kubeconfig_is_named() {
        let a = Args { kubeconfig: Some("/nonexistent/kubeconfig".into()), ..Args::default() };
        assert!(
            matches!(Settings::from_run_args(&a), Err(CliError::Usage(m)) if m.starts_with("--kubeconfig /nonexistent/kubeconfig"))
        );
    }
}
