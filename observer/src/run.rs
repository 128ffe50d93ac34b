//! `canaryscope run`: the node daemon. All probes, a Prometheus exporter,
//! pod attribution from the Kubernetes API when there is one.
use std::{
    collections::HashSet,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use log::info;
use serde::Deserialize;
use tokio::{io::unix::AsyncFd, net::TcpListener, signal::unix::SignalKind};

use crate::{
    attribution::{
        kube::{self, KubeOptions, PodCache},
        labels::{labels_for, Liveness},
    },
    cli_error::{require_root, CliError},
    metrics::{
        server::{self, Exposition, Shared},
        CpuSnapshot, Metrics,
    },
    probes::{Families, KernelSettings},
    session::{Session, SessionError, SessionOptions},
    RunArgs,
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
}

pub fn settings(args: &RunArgs) -> Result<Settings, CliError> {
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| CliError::usage(format!("--config {}: {e}", path.display())))?;
            toml::from_str::<ConfigFile>(&text).map_err(|e| {
                CliError::usage(format!("--config {}: {}", path.display(), one_line(&e.to_string())))
            })?
        }
        None => ConfigFile::default(),
    };
    let listen_text = args.listen.clone().or(file.listen).unwrap_or_else(|| "0.0.0.0:9464".into());
    let listen = server::parse_listen(&listen_text).map_err(CliError::usage)?;
    let duration = |flag: &str, v: Option<String>, default: Duration| -> Result<Duration, CliError> {
        match v {
            Some(s) => crate::parse_duration(&s).map_err(|e| CliError::usage(format!("{flag}: {e}"))),
            None => Ok(default),
        }
    };
    let series_grace = duration(
        "--series-grace",
        args.series_grace.clone().or(file.series_grace),
        Duration::from_secs(300),
    )?;
    let stall_threshold = duration(
        "--stall-threshold",
        args.stall_threshold.clone().or(file.stall_threshold),
        Duration::from_secs(10),
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
        track_label: args.track_label.clone().or(file.track_label).unwrap_or_else(|| "track".into()),
    });
    let mut libs = args.libs.clone();
    libs.extend(file.libs);
    for lib in &libs {
        if let Err(e) = std::fs::metadata(lib) {
            return Err(CliError::usage(format!("--lib {}: {e}", lib.display())));
        }
    }
    let probes = match args.probes.clone().or(file.probes) {
        Some(list) => Families::parse(&list).map_err(|e| CliError::usage(format!("--probes: {e}")))?,
        None => Families::ALL,
    };
    if !libs.is_empty() && !probes.gpu {
        return Err(CliError::usage("--lib needs the gpu probes: add gpu to --probes"));
    }
    let hold = args.hold || file.hold.unwrap_or(false);
    if hold && !probes.gpu {
        return Err(CliError::usage("--hold needs the gpu probes: add gpu to --probes"));
    }
    Ok(Settings {
        hold,
        probes,
        listen,
        kube,
        series_grace,
        max_cgroups: args.max_cgroups.or(file.max_cgroups).unwrap_or(5000),
        stall_threshold,
        libs,
    })
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub fn run(args: RunArgs) -> Result<ExitCode, CliError> {
    let settings = settings(&args)?;
    require_root("canaryscope run")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(daemon(settings))
}

async fn daemon(settings: Settings) -> Result<ExitCode, CliError> {
    // Bind first: a taken port is the user's to fix, before probes load.
    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|e| CliError::usage(format!("--listen {}: {e}", settings.listen)))?;
    let stall_ns = settings.stall_threshold.as_nanos().min(u128::from(u64::MAX)) as u64;
    let session = Session::start(SessionOptions {
        settings: KernelSettings {
            gpu_emit_all: false,
            gpu_slow_ns: stall_ns.max(1),
            kfd_device: None,
            hold: settings.hold,
        },
        explicit_libs: settings.libs.clone(),
        stall_threshold_ns: stall_ns.max(1),
        families: settings.probes,
        oversubscribed_after: Duration::from_secs(2),
        hold: settings.hold,
    })
    .map_err(SessionError::into_cli)?;

    let pods: Option<PodCache> = match &settings.kube {
        Some(options) => {
            Some(kube::start(options.clone()).await.map_err(|e| CliError::usage(e.to_string()))?)
        }
        None => {
            info!("no Kubernetes API configured: labels come from cgroup paths");
            None
        }
    };

    let shared: Shared = Arc::new(RwLock::new(Exposition::default()));
    tokio::spawn(server::serve(listener, shared.clone()));
    eprintln!("canaryscope: exporter listening on http://{}/metrics", settings.listen);

    let mut metrics = Metrics::new(settings.max_cgroups);
    metrics.probes = probe_status(&session);

    // SAFETY: the ring buffer fd is owned by the session and outlives this AsyncFd.
    let mut fd = unsafe { AsyncFd::register_with_interest(session, tokio::io::Interest::READABLE) }
        .map_err(|e| CliError::runtime(format!("ring buffer: {}", e.into_parts().1)))?;
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate())
        .map_err(|e| CliError::runtime(format!("cannot handle SIGTERM: {e}")))?;
    // Events are rare, so a short render tick keeps detection latency low
    // without re-rendering per event under a flood.
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut last_slow = Instant::now() - Duration::from_secs(10);
    let mut dirty = true;
    let mut last_generation = 0;

    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            guard = fd.readable_mut() => {
                let mut guard = guard.map_err(|e| CliError::runtime(format!("ring buffer: {e}")))?;
                guard.get_inner_mut().drain(|e| record(&mut metrics, &e));
                guard.clear_ready();
                // The kernel wakes a reader only when it has caught up, so
                // a record that arrived between the drain and clear_ready
                // would sit unseen, and hold back every wakeup after it.
                guard.get_inner_mut().drain(|e| record(&mut metrics, &e));
                dirty = true;
            }
            _ = tick.tick() => {
                let session = fd.get_mut();
                // A missed wakeup costs at most one tick, never the stream.
                session.drain(|e| record(&mut metrics, &e));
                session.run_pending_scans();
                // A pod added, changed or deleted in the API: relabel now.
                let generation = pods.as_ref().map(|p| p.generation()).unwrap_or(0);
                if last_slow.elapsed() >= Duration::from_millis(500) || generation != last_generation {
                    last_generation = generation;
                    last_slow = Instant::now();
                    slow_refresh(session, &mut metrics, pods.as_ref(), settings.series_grace);
                    dirty = true;
                }
                if dirty {
                    dirty = false;
                    let text = metrics.render();
                    let not_ready = readiness(&metrics, pods.as_ref());
                    let mut state = shared.write().unwrap_or_else(|p| p.into_inner());
                    state.metrics = text;
                    state.not_ready = not_ready;
                }
            }
        }
    }
    eprintln!("canaryscope: stopping; detaching probes");
    Ok(ExitCode::SUCCESS)
}

/// Counts an event; a newly probed library is also logged with its reason.
fn record(metrics: &mut Metrics, event: &crate::events::Event) {
    if let crate::events::Detail::LibraryProbed { .. } = &event.detail {
        eprintln!("canaryscope: probing {}", crate::trace::render::detail(event));
    }
    metrics.record(event);
}

/// Tracepoint families, then every GPU library found so far.
fn probe_status(session: &Session) -> Vec<crate::probes::ProbeStatus> {
    let mut all = session.probe_status.clone();
    all.extend(session.gpu.status());
    all
}

/// Kernel aggregates, stalls, CPU limits and labels: refreshed twice a second.
fn slow_refresh(session: &mut Session, metrics: &mut Metrics, pods: Option<&PodCache>, grace: Duration) {
    // Libraries found since the start (a pod's own copy) show up too.
    metrics.probes = probe_status(session);
    let _ = session.scan_stalls();
    metrics.set_stalled(session.stalled_now.clone());
    let (gpu, runq, kfd) = (session.gpu_stats(), session.runq_stats(), session.kfd_stats());
    let in_kernel: HashSet<u64> = gpu
        .iter()
        .map(|(k, _)| k.cgroup_id)
        .chain(runq.iter().map(|(c, _)| *c))
        .chain(kfd.iter().map(|(k, _)| k.cgroup_id))
        .collect();
    metrics.set_gpu(gpu);
    metrics.set_runq(runq);
    metrics.set_kfd(kfd);
    let _findings = session.sample_cpu();
    if let Some(cpu) = &session.cpu {
        let snapshots: Vec<(u64, CpuSnapshot)> = cpu
            .cgroups
            .values()
            .map(|c| {
                let id = session.cgroups.id_of(&c.rel).unwrap_or(0);
                let snap = CpuSnapshot {
                    periods: c.stat.nr_periods,
                    throttled_periods: c.stat.nr_throttled,
                    throttled_ns: c.stat.throttled_ns,
                    runnable: c.runnable,
                    quota_cores: c.quota_cores,
                };
                (id, snap)
            })
            .collect();
        metrics.set_cpu(snapshots);
    }
    metrics.events_lost = session.events_lost();
    metrics.records = session.records.clone();
    let resolver = &mut session.cgroups;
    let mut purged = metrics.refresh_labels(grace, |id| {
        let path = resolver.path(id);
        let (labels, liveness) = labels_for(path.as_deref(), pods);
        // A removed cgroup is gone whatever the API says: a restarted
        // container leaves its old cgroup behind in a pod that lives on.
        let liveness =
            if liveness == Liveness::Live && !resolver.exists(id) { Liveness::Gone } else { liveness };
        (labels, liveness)
    });
    // Kernel entries of cgroups that never got series (over the cap) and
    // are gone now: nobody else would ever remove them.
    purged.extend(
        in_kernel
            .into_iter()
            .filter(|id| !metrics.is_tracked(*id) && (resolver.path(*id).is_none() || !resolver.exists(*id))),
    );
    if !purged.is_empty() {
        info!("dropped series and kernel entries of {} gone cgroups", purged.len());
        session.purge_cgroups(&purged);
        // Hand the freed memory of those series back to the system now;
        // otherwise a burst of short-lived pods sets the RSS for good.
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
    }
}

fn readiness(metrics: &Metrics, pods: Option<&PodCache>) -> Option<String> {
    if !metrics.probes.iter().any(|p| p.attached) {
        return Some("no probe attached".into());
    }
    if let Some(p) = pods {
        if !p.is_synced() {
            return Some("pod cache not synced with the Kubernetes API yet".into());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> RunArgs {
        RunArgs::default()
    }

    #[test]
    fn bad_listen_and_config_are_usage_errors() {
        let mut a = args();
        a.listen = Some("nonsense".into());
        assert!(matches!(settings(&a), Err(CliError::Usage(m)) if m.contains("--listen nonsense")));
        let mut a = args();
        a.config = Some("/nonexistent/canaryscope.toml".into());
        assert!(matches!(settings(&a), Err(CliError::Usage(m)) if m.contains("--config /nonexistent")));
        let dir = std::env::temp_dir().join(format!("cs-config-{}", std::process::id()));
        std::fs::write(&dir, "listen = \":9999\"\nno_such_key = 1\n").expect("write");
        let mut a = args();
        a.config = Some(dir.clone());
        let err = settings(&a).expect_err("unknown key");
        assert!(
            matches!(&err, CliError::Usage(m) if m.contains("no_such_key") && !m.contains('\n')),
            "{err}"
        );
        std::fs::write(&dir, "listen = \":9999\"\nseries_grace = \"30s\"\n").expect("write");
        let s = settings(&a).expect("valid config");
        assert_eq!(s.listen.port(), 9999);
        assert_eq!(s.series_grace, Duration::from_secs(30));
        let _ = std::fs::remove_file(dir);
    }

    #[test]
    fn unreadable_kubeconfig_is_named() {
        let mut a = args();
        a.kubeconfig = Some("/nonexistent/kubeconfig".into());
        assert!(
            matches!(settings(&a), Err(CliError::Usage(m)) if m.starts_with("--kubeconfig /nonexistent/kubeconfig"))
        );
    }
}
