//! `canaryscope run`: the node daemon. All probes, a Prometheus exporter,
//! pod attribution from the Kubernetes API when there is one.
use std::{
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use log::info;
use settings::Settings;
use tokio::net::TcpListener;

use crate::{
    attribution::{
        cgroup_path::parse_pod_cgroup,
        kube::{self, PodCache, CONDITION_TYPE},
        rollouts::{self, canary_reason},
    },
    config::{self, ProbeArgs, ProbeOptionHelp},
    discovery::{hold_scope::PodHold, hot::Policy},
    error::{require_root, CliError},
    event_loop::{self, Schedule},
    gate::{patcher::Patcher, Gate},
    metrics::{
        recorder::Recorder,
        server::{self, Published, Readiness, Shared, SharedMetrics},
        Metrics,
    },
    pipeline::{never_initialized::NeverInitialized, Options, Pipeline},
};
use exporter::{Exporter, HeldPods};
use gate_runner::{unix_now, GateRunner};

mod exporter;
mod gate_runner;
pub mod settings;

/// Events are rare, so a short tick keeps detection latency low without
/// re-rendering per event under a flood.
const TICK: Duration = Duration::from_millis(100);

#[derive(clap::Args, Debug, Clone, Default)]
#[command(
    probe_option(
        "stall_threshold",
        "max_cgroups",
        config::with_default("A GPU call in flight longer than this counts as stalled", config::DEFAULT_STALL_THRESHOLD)
    ),
    probe_option("libs", "stall_threshold", "Also probe this GPU runtime library; repeatable"),
    probe_option(
        "probes",
        "no_kubernetes",
        config::with_default("Probe families to attach, comma-separated: gpu, kfd, cpu, exits, http", "all")
    ),
    // Checked with the config file's value, after the two are merged, so
    // that either is refused in the same words.
    mut_arg("stall_threshold", |a| a.value_parser(clap::value_parser!(String))),
    mut_arg("probes", |a| a.value_parser(clap::value_parser!(String)))
)]
pub struct Args {
    /// Address of the Prometheus exporter (/metrics, /healthz, /readyz).
    #[arg(long, env = "CANARYSCOPE_LISTEN", help = config::with_default("Address of the Prometheus exporter (/metrics, /healthz, /readyz)", config::DEFAULT_LISTEN))]
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
    /// Pod label whose value becomes the `track` label (canary/stable).
    #[arg(long, help = config::with_default("Pod label whose value becomes the `track` label (canary/stable)", config::DEFAULT_TRACK_LABEL))]
    pub track_label: Option<String>,
    /// Keep series of a deleted pod this long so the last increase is scraped.
    #[arg(long, help = config::with_default("Keep series of a deleted pod this long so the last increase is scraped", config::DEFAULT_SERIES_GRACE))]
    pub series_grace: Option<String>,
    /// Most cgroups with series on this node; beyond it updates are counted, not exported.
    #[arg(long, help = config::with_default("Most cgroups with series on this node; beyond it updates are counted, not exported", config::DEFAULT_MAX_CGROUPS))]
    pub max_cgroups: Option<usize>,
    /// Do not talk to the Kubernetes API even when a config is found.
    #[arg(long)]
    pub no_kubernetes: bool,
    /// Stop a process that maps a GPU runtime file never seen before until
    /// its probes are attached, so its first call is seen (see docs/how-it-sees.md: the hold).
    #[arg(long)]
    pub hold: bool,
    /// Where launches, asynchronous copies and other per-operation GPU calls
    /// are trapped: selected (canary pods, and cgroups with a GPU failure,
    /// stall or crash within --hot-window), all, or none.
    #[arg(long, value_name = "MODE", help = config::with_default("Where per-operation GPU calls (launches, async copies) are trapped: selected (canary pods and cgroups with a recent GPU failure, stall or crash), all, or none", config::DEFAULT_HOT_CALLS))]
    pub hot_calls: Option<String>,
    /// How long a cgroup stays selected after its last GPU failure, stall or crash.
    #[arg(long, value_name = "DURATION", help = config::with_default("How long a cgroup stays selected for hot-call probes after its last GPU failure, stall or crash", config::DEFAULT_HOT_WINDOW))]
    pub hot_window: Option<String>,
    /// What a selected process's hot calls are probed for: counts (a return
    /// probe: calls and failures) or timed (an entry probe too: durations,
    /// stalls, the call a crash was in; about twice the cost per call).
    #[arg(long, value_name = "DETAIL", help = config::with_default("What a selected process's hot calls are probed for: counts (calls and failures, at return) or timed (also durations, stalls and the call a crash was in; about twice the cost per call)", config::DEFAULT_HOT_DETAIL_RUN))]
    pub hot_detail: Option<String>,
    /// Also report run-queue latency for the cgroups under this cgroup2
    /// path (besides the kubepods hierarchy); repeatable.
    #[arg(long = "cgroup", value_name = "PREFIX")]
    pub cgroups: Vec<String>,
    /// Do not keep the `canaryscope.io/gpu-runtime` condition of pods that
    /// declare that readiness gate (the daemon then needs no write access).
    #[arg(long)]
    pub no_readiness_gate: bool,
    /// A pod with the readiness gate that has not started its GPU runtime
    /// this long after its start gets the condition False with reason
    /// NoRuntimeActivity; without it such a pod has no condition (unready).
    #[arg(long, value_name = "DURATION")]
    pub gate_timeout: Option<String>,
    /// Also count this extended resource of a container's limits as a GPU
    /// (besides nvidia.com/gpu, nvidia.com/mig-*, amd.com/gpu and
    /// gpu.intel.com/*); a trailing * matches any rest; repeatable.
    #[arg(long = "gpu-resource", value_name = "NAME")]
    pub gpu_resources: Vec<String>,
    /// A running container whose limits request a GPU and that has made no
    /// successful GPU initialisation this long after its start is reported
    /// (canaryscope_gpu_never_initialized) and, with the readiness gate, its
    /// pod gets False, GpuNeverInitialized; 0 turns this off.
    #[arg(long, value_name = "DURATION", help = config::with_default("A running container whose limits request a GPU and that has made no successful GPU initialisation this long after its start is reported (canaryscope_gpu_never_initialized; a gated pod gets False, GpuNeverInitialized); 0 turns this off", config::DEFAULT_GPU_INIT_TIMEOUT))]
    pub gpu_init_timeout: Option<String>,
    /// --lib, --probes and --stall-threshold, shown among the options above.
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// Check the flags, the environment and the config file as `run` does,
    /// print the settings it would run with, and exit (0; or 2 with `run`'s
    /// own error). Needs no root and starts nothing: deploy/check.sh runs
    /// the chart's rendered arguments through it.
    #[arg(long)]
    pub check_config: bool,
}

pub fn run(args: Args) -> Result<ExitCode, CliError> {
    let settings = Settings::from_run_args(&args)?;
    if args.check_config {
        println!("canaryscope run would start with {settings:#?}");
        return Ok(ExitCode::SUCCESS);
    }
    require_root("canaryscope run")?;
    // The exposition is megabytes at a thousand pods and is replaced as a
    // whole. glibc raises its mmap threshold to the size of the largest
    // block freed, after which such buffers come from the heap and their
    // pages stay with the process; a fixed threshold keeps every large
    // buffer mmapped, and returned to the system when dropped.
    // SAFETY: mallopt only changes allocator tuning.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 256 * 1024) };
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
    let (mut pipeline, ring) = start_pipeline(&settings)?;
    let attached_at = unix_now();
    if settings.probes.sched {
        eprintln!("canaryscope: run-queue latency for tasks under {}", pipeline.runq_roots().join(", "));
    }
    let pods: Option<PodCache> = match &settings.kube {
        Some(options) => {
            Some(kube::start(options.clone()).await.map_err(|e| CliError::usage(e.to_string()))?)
        }
        None => {
            info!("no Kubernetes API configured: labels come from cgroup paths");
            None
        }
    };
    if let Some(pods) = &pods {
        pipeline.set_pods(pods.clone());
    }
    let held_pods = hold_canaries(&settings, &mut pipeline, pods.as_ref()).await;
    let gate = start_gate(&settings, pods.as_ref()).await?;

    let mut metrics = Metrics::new(settings.max_cgroups);
    metrics.node.probes = pipeline.statuses();
    let published: SharedMetrics = Arc::new(Mutex::new(Published::new(metrics)));
    // Not ready until the loop has judged readiness once: a /readyz answered
    // before the first tick must not claim a synced pod cache.
    let shared: Shared = Arc::new(RwLock::new(Readiness { not_ready: Some("starting".into()) }));
    tokio::spawn(server::serve(listener, shared.clone(), published.clone()));
    eprintln!("canaryscope: exporter listening on http://{}/metrics", settings.listen);

    let never_initialized = match (&pods, settings.gpu_init_timeout) {
        // Containers that started once the probes were attached are judged.
        (Some(_), Some(timeout)) => {
            Some(NeverInitialized::new(timeout, settings.gpu_resources.clone(), attached_at))
        }
        _ => None,
    };
    let mut exporter = Exporter {
        recorder: Recorder::new(published, settings.series_grace),
        shared,
        pods,
        gate,
        held_pods,
        last_gpu: Vec::new(),
        never_initialized,
    };
    // A pod appearing is told to the kernel at once, not at the next tick:
    // its cgroup and first process may follow within milliseconds.
    let wake = exporter.held_pods.as_ref().map(|held| held.pods.change_signal());
    event_loop::run(&mut pipeline, ring, &mut exporter, Schedule { tick: TICK, deadline: None, wake })
        .await?;
    eprintln!("canaryscope: stopping; detaching probes");
    Ok(ExitCode::SUCCESS)
}

/// The pipeline with every probe the settings ask for.
fn start_pipeline(settings: &Settings) -> Result<(Pipeline, crate::pipeline::reader::Ring), CliError> {
    let stall_ns = config::kernel_ns(settings.stall_threshold);
    let options = Options {
        // Canary and gated pods' processes are held whatever --hold says:
        // a canary ships the runtime file never seen before, and a gated
        // pod's start-up calls are the gate's evidence; so are a GPU pod's,
        // while it is checked for a GPU initialisation.
        hold_scoped: settings.kube.is_some(),
        ..Options::new(settings.probes, stall_ns, Policy::for_daemon(settings.hot_calls, settings.hot_window))
            .libs(settings.libs.clone())
            .hold(settings.hold)
            .hot_detail(settings.hot_detail)
            .runq_prefixes(settings.cgroups.clone())
    };
    Ok(Pipeline::start(options)?)
}

/// With Kubernetes: canary pods are held at a new runtime file and get
/// hot-call probes from their start.
async fn hold_canaries(
    settings: &Settings,
    pipeline: &mut Pipeline,
    pods: Option<&PodCache>,
) -> Option<HeldPods> {
    let (Some(pods), Some(options)) = (pods, &settings.kube) else { return None };
    // Canary pods are told by the track label, and for Argo Rollouts by
    // a revision that is not the Rollout's stable one; without read
    // access to rollouts (or without Argo) the label alone decides.
    let rollouts = rollouts::start(options).await;
    let held = HeldPods {
        hold: PodHold::default(),
        pods: pods.clone(),
        rollouts: rollouts.clone(),
        gated: settings.readiness_gate,
        gpus: settings.gpu_init_timeout.map(|_| settings.gpu_resources.clone()),
    };
    let pods = pods.clone();
    // Processes of canary pods get hot-call probes from their start.
    pipeline.set_canary_judge(Box::new(move |path| {
        let pod = parse_pod_cgroup(path)?;
        canary_reason(&pods.get(&pod.pod_uid)?, Some(&rollouts))
    }));
    Some(held)
}

/// The readiness gate, with Kubernetes unless turned off.
async fn start_gate(settings: &Settings, pods: Option<&PodCache>) -> Result<Option<GateRunner>, CliError> {
    let (Some(pods), Some(options)) = (pods, &settings.kube) else { return Ok(None) };
    if !settings.readiness_gate {
        return Ok(None);
    }
    let patcher = Patcher::start(options, pods.clone()).await.map_err(|e| CliError::usage(e.to_string()))?;
    info!(
        "readiness gate {CONDITION_TYPE}: kept for the pods of this node that declare it; their \
         processes are held at a GPU runtime file's first mapping until its probes exist"
    );
    Ok(Some(GateRunner {
        gate: Gate::new(settings.gate_timeout, unix_now()),
        patcher,
        pods: pods.clone(),
        stall_threshold: settings.stall_threshold,
    }))
}
