//! `canaryscope run`: the node daemon. All probes, a Prometheus exporter,
//! pod attribution from the Kubernetes API when there is one.
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant},
};

use log::info;
use settings::Settings;
use tokio::net::TcpListener;

use crate::{
    attribution::{
        cgroup_path::parse_pod_cgroup,
        kube::{self, PodCache},
        labels::{labels_for, Liveness},
        rollouts::{self, canary_reason},
    },
    config,
    discovery::hot::Policy,
    error::{require_root, CliError},
    event_loop::{self, Consumer, Flow, Schedule},
    events::{Detail, Event},
    exit_cause::{self, SenderScope},
    gate::{
        hold_scope::{PodChoice, PodHold},
        patcher::{Patcher, Target},
        startup_counts, Gate, CONDITION_TYPE,
    },
    metrics::{
        server::{self, Exposition, Published, Shared, SharedMetrics},
        Metrics,
    },
    pipeline::{Options, Pipeline},
    probes::KernelSettings,
};

pub mod settings;

/// Events are rare, so a short tick keeps detection latency low without
/// re-rendering per event under a flood.
const TICK: Duration = Duration::from_millis(100);
/// How often kernel aggregates, stalls, CPU limits and labels are read.
/// Each read walks every tracked cgroup's map entries and `cpu.stat`, which
/// at a thousand pods is most of an idle daemon's CPU; failures, crashes,
/// exits and OOM kills do not wait for it (they are events).
const REFRESH_EVERY: Duration = Duration::from_secs(1);

#[derive(clap::Args, Debug, Clone, Default)]
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
    /// A GPU call in flight longer than this counts as stalled.
    #[arg(long, help = config::with_default("A GPU call in flight longer than this counts as stalled", config::DEFAULT_STALL_THRESHOLD))]
    pub stall_threshold: Option<String>,
    /// Also probe this GPU runtime library; repeatable.
    #[arg(long = "lib", value_name = "PATH")]
    pub libs: Vec<PathBuf>,
    /// Do not talk to the Kubernetes API even when a config is found.
    #[arg(long)]
    pub no_kubernetes: bool,
    /// Probe families to attach, comma-separated: gpu, kfd, cpu, exits.
    #[arg(long, value_name = "LIST", help = config::with_default("Probe families to attach, comma-separated: gpu, kfd, cpu, exits", "all"))]
    pub probes: Option<String>,
    /// Stop a process that maps a GPU runtime file never seen before until
    /// its probes are attached, so its first call is seen (see README: the hold).
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
}

pub fn run(args: Args) -> Result<ExitCode, CliError> {
    let settings = Settings::from_run_args(&args)?;
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
    let stall_ns = config::kernel_ns(settings.stall_threshold);
    let (mut pipeline, ring) = Pipeline::start(Options {
        settings: KernelSettings {
            gpu_emit_all: false,
            gpu_slow_ns: stall_ns,
            kfd_device: None,
            hold: settings.hold,
        },
        explicit_libs: settings.libs.clone(),
        stall_threshold_ns: stall_ns,
        families: settings.probes,
        hold: settings.hold,
        // Canary and gated pods' processes are held whatever --hold says:
        // a canary ships the runtime file never seen before, and a gated
        // pod's start-up calls are the gate's evidence.
        hold_scoped: settings.kube.is_some(),
        kfd_syscall_fallback: false,
        per_function_uprobes: false,
        hot_policy: Policy::for_daemon(settings.hot_calls, settings.hot_window),
        hot_detail: settings.hot_detail,
        runq_prefixes: Some(settings.cgroups.clone()),
    })?;
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

    let mut held_pods: Option<HeldPods> = None;
    if let (Some(pods), Some(options)) = (&pods, &settings.kube) {
        // Canary pods are told by the track label, and for Argo Rollouts by
        // a revision that is not the Rollout's stable one; without read
        // access to rollouts (or without Argo) the label alone decides.
        let rollouts = rollouts::start(options).await;
        held_pods = Some(HeldPods {
            hold: PodHold::default(),
            pods: pods.clone(),
            rollouts: rollouts.clone(),
            gated: settings.readiness_gate,
        });
        let pods = pods.clone();
        // Processes of canary pods get hot-call probes from their start.
        pipeline.set_canary_judge(Box::new(move |path| {
            let pod = parse_pod_cgroup(path)?;
            canary_reason(&pods.get(&pod.pod_uid)?, Some(&rollouts))
        }));
    }

    let gate = match (&pods, &settings.kube) {
        (Some(pods), Some(options)) if settings.readiness_gate => {
            let patcher =
                Patcher::start(options, pods.clone()).await.map_err(|e| CliError::usage(e.to_string()))?;
            info!(
                "readiness gate {CONDITION_TYPE}: kept for the pods of this node that declare it; their \
                 processes are held at a GPU runtime file's first mapping until its probes exist"
            );
            Some(GateRunner {
                gate: Gate::new(settings.gate_timeout, unix_now()),
                patcher,
                pods: pods.clone(),
                stall_threshold: settings.stall_threshold,
            })
        }
        _ => None,
    };

    let mut metrics = Metrics::new(settings.max_cgroups);
    metrics.probes = pipeline.statuses();
    let published: SharedMetrics = Arc::new(Mutex::new(Published::new(metrics)));
    // Not ready until the loop has judged readiness once: a /readyz answered
    // before the first tick must not claim a synced pod cache.
    let shared: Shared = Arc::new(RwLock::new(Exposition { not_ready: Some("starting".into()) }));
    tokio::spawn(server::serve(listener, shared.clone(), published.clone()));
    eprintln!("canaryscope: exporter listening on http://{}/metrics", settings.listen);

    let mut exporter = Exporter {
        published,
        shared,
        pods,
        gate,
        held_pods,
        series_grace: settings.series_grace,
        last_refresh: Instant::now() - REFRESH_EVERY,
        last_generation: 0,
        aggregates_generation: u64::MAX,
        last_gpu: Vec::new(),
    };
    // A pod appearing is told to the kernel at once, not at the next tick:
    // its cgroup and first process may follow within milliseconds.
    let wake = exporter.held_pods.as_ref().map(|held| held.pods.change_signal());
    event_loop::run(&mut pipeline, ring, &mut exporter, Schedule { tick: TICK, deadline: None, wake })
        .await?;
    eprintln!("canaryscope: stopping; detaching probes");
    Ok(ExitCode::SUCCESS)
}

/// Counts events into series and publishes them for scrapes (and for
/// `top` on its own probes, which reads the same text without a server).
pub(crate) struct Exporter {
    published: SharedMetrics,
    shared: Shared,
    pods: Option<PodCache>,
    /// The readiness gate, with Kubernetes unless turned off.
    gate: Option<GateRunner>,
    /// The pods whose processes are held at a never-seen GPU runtime file
    /// (with Kubernetes).
    held_pods: Option<HeldPods>,
    series_grace: Duration,
    last_refresh: Instant,
    /// The pod cache's generation at the last refresh.
    last_generation: u64,
    /// The kernel aggregates' generation at the last read.
    aggregates_generation: u64,
    /// GPU call counts of that read (the readiness gate judges start-ups
    /// from them on every refresh).
    last_gpu: Vec<(observer_common::gpu::GpuStatsKey, observer_common::gpu::GpuStats)>,
}

impl Consumer for Exporter {
    fn events(&mut self, pipeline: &mut Pipeline, mut events: Vec<Event>) -> Result<Flow, CliError> {
        if let Some(gate) = &mut self.gate {
            gate.events(pipeline, &events);
        }
        let mut published = self.lock();
        for event in &mut events {
            // A host kill of a pod's container: a liveness restart fails a
            // canary, a rollout deleting the pod must not.
            if let (Detail::Exit { sender: Some(sender), kill_reason, .. }, Some(pods)) =
                (&mut event.detail, &self.pods)
            {
                if sender.scope == SenderScope::Host {
                    *kill_reason = exit_cause::kill_reason(event.origin.cgroup.as_deref(), pods);
                }
            }
            // A newly probed library is also logged with its reason.
            if let Detail::LibraryProbed { .. } = &event.detail {
                eprintln!("canaryscope: probing {}", crate::trace::render::detail(event));
            }
            published.metrics.record(event);
        }
        Ok(Flow::Continue)
    }

    fn tick(&mut self, pipeline: &mut Pipeline) -> Result<Flow, CliError> {
        // A pod added, changed or deleted in the API: relabel now.
        let generation = self.pods.as_ref().map(PodCache::generation).unwrap_or(0);
        if self.last_refresh.elapsed() >= REFRESH_EVERY || generation != self.last_generation {
            self.last_generation = generation;
            self.last_refresh = Instant::now();
            self.refresh(pipeline);
        }
        let not_ready = readiness(&self.lock().metrics, self.pods.as_ref());
        let mut state = self.shared.write().unwrap_or_else(|p| p.into_inner());
        if state.not_ready != not_ready {
            state.not_ready = not_ready;
        }
        Ok(Flow::Continue)
    }

    fn wake(&mut self, pipeline: &mut Pipeline) -> Result<Flow, CliError> {
        if let Some(held) = &mut self.held_pods {
            held.refresh(pipeline);
        }
        Ok(Flow::Continue)
    }
}

impl Exporter {
    /// The daemon's series without Kubernetes or the readiness gate:
    /// labels come from cgroup paths, as for `run --no-kubernetes`.
    pub(crate) fn standalone(pipeline: &Pipeline, max_cgroups: usize) -> Self {
        let mut metrics = Metrics::new(max_cgroups);
        metrics.probes = pipeline.statuses();
        Self {
            published: Arc::new(Mutex::new(Published::new(metrics))),
            shared: Arc::new(RwLock::new(Exposition::default())),
            pods: None,
            gate: None,
            held_pods: None,
            series_grace: Duration::from_secs(60),
            last_refresh: Instant::now() - REFRESH_EVERY,
            last_generation: 0,
            aggregates_generation: u64::MAX,
            last_gpu: Vec::new(),
        }
    }

    /// The exposition a scrape would get now.
    pub(crate) fn scrape(&self) -> bytes::Bytes {
        self.lock().scrape()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Kernel aggregates, stalls, CPU limits and labels.
    fn refresh(&mut self, pipeline: &mut Pipeline) {
        // Read outside the lock: a scrape rendering meanwhile is not held up
        // by map reads and directory walks.
        let stalls = pipeline.stalls();
        let kernel = pipeline.kernel();
        // The latency aggregates are thousands of map entries at a thousand
        // pods, two system calls each: read only when the kernel updated one.
        let generation = kernel.aggregates_generation();
        let aggregates = (generation != self.aggregates_generation)
            .then(|| (kernel.gpu_stats(), kernel.runq_stats(), kernel.kfd_stats()));
        self.aggregates_generation = generation;
        if let Some(held) = &mut self.held_pods {
            held.refresh(pipeline);
        }
        if let Some(gate) = &mut self.gate {
            // Only the gate needs the last counts again when nothing moved.
            if let Some((gpu, _, _)) = &aggregates {
                self.last_gpu.clone_from(gpu);
            }
            gate.refresh(pipeline, &stalls, &self.last_gpu);
        }
        let kernel = pipeline.kernel();
        let mem_limits = kernel.mem_limit_refusals();
        let in_kernel: HashSet<u64> = aggregates
            .iter()
            .flat_map(|(gpu, runq, kfd)| {
                gpu.iter()
                    .map(|(k, _)| k.cgroup_id)
                    .chain(runq.iter().map(|(c, _)| *c))
                    .chain(kfd.iter().map(|(k, _)| k.cgroup_id))
            })
            .chain(mem_limits.iter().map(|(k, _)| k.cgroup_id))
            .collect();
        pipeline.refresh_runq_scope();
        // Only the samples are exported; findings are for people (`trace`).
        pipeline.sample_cpu();
        let cpu = pipeline.cpu_snapshots();
        let driver_versions = pipeline.driver_versions();
        let counters = pipeline.counters();
        let (statuses, hot) = (pipeline.statuses(), pipeline.hot_counts());
        let mut published = self.lock();
        let metrics = &mut published.metrics;
        metrics.set_stalled(stalls.into_iter().map(|s| (s.cgroup_id, s.api, s.function)));
        metrics.set_gate(self.gate.as_ref().map(|g| g.patcher.summary()));
        if let Some((gpu, runq, kfd)) = aggregates {
            metrics.set_gpu(gpu);
            metrics.set_runq(runq);
            metrics.set_kfd(kfd);
        }
        metrics.set_mem_limits(mem_limits);
        metrics.set_cpu(cpu);
        metrics.set_driver_versions(driver_versions);
        // Libraries found since the start (a pod's own copy) show up too.
        metrics.set_node_state(statuses, hot, counters.events_lost, counters.decode_errors, counters.records);
        let pods = self.pods.as_ref();
        let resolver = pipeline.cgroups_mut();
        let mut purged = metrics.refresh_labels(self.series_grace, |id| {
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
        purged.extend(in_kernel.into_iter().filter(|id| {
            !metrics.is_tracked(*id) && (resolver.path(*id).is_none() || !resolver.exists(*id))
        }));
        if !purged.is_empty() {
            info!("dropped series and kernel entries of {} gone cgroups", purged.len());
            pipeline.purge_cgroups(&purged);
            // Hand the freed memory of those series back to the system now;
            // otherwise a burst of short-lived pods sets the RSS for good.
            // SAFETY: malloc_trim has no preconditions.
            unsafe { libc::malloc_trim(0) };
        }
    }
}

/// The pods whose processes the kernel holds at a GPU runtime file it has
/// not seen until that file's probes exist (see `gate::hold_scope`): canary
/// pods, whose new runtime file is the one a rollback decision rests on, and
/// with the readiness gate the pods that declare it.
struct HeldPods {
    hold: PodHold,
    pods: PodCache,
    rollouts: rollouts::RolloutCache,
    gated: bool,
}

impl HeldPods {
    fn refresh(&mut self, pipeline: &mut Pipeline) {
        let (rollouts, gated) = (&self.rollouts, self.gated);
        let pods = self.pods.classify(|meta| {
            let canary = canary_reason(meta, Some(rollouts)).is_some();
            PodChoice { chosen: canary || (gated && meta.gate.is_some()), qos: meta.qos }
        });
        pipeline.hold_pods(&mut self.hold, &pods);
    }
}

/// The readiness gate in the daemon loop: evidence in, targets out.
struct GateRunner {
    gate: Gate,
    patcher: Patcher,
    pods: PodCache,
    stall_threshold: Duration,
}

impl GateRunner {
    /// Init failures and GPU crashes. The kernel's start-up counts are read
    /// now, once per batch with trouble, as the baseline that a later
    /// start-up must exceed (the counts of the last refresh may be half a
    /// second old and miss the start-up just before a crash).
    fn events(&mut self, pipeline: &Pipeline, events: &[Event]) {
        let pods = &self.pods;
        let troubles: Vec<_> = events
            .iter()
            .filter(|e| {
                // Pods known not to declare the gate cost no map read.
                let pod = e.origin.cgroup.as_deref().and_then(parse_pod_cgroup);
                pod.is_some_and(|p| pods.get(&p.pod_uid).is_none_or(|m| m.gate.is_some()))
            })
            .filter_map(|e| Gate::trouble_of(e).map(|t| (e, t)))
            .collect();
        if troubles.is_empty() {
            return;
        }
        let counts = startup_counts(&pipeline.kernel().gpu_stats());
        for (event, (reason, message, api)) in troubles {
            let origin = &event.origin;
            self.gate.note_trouble(origin.cgroup_id, origin.cgroup.as_deref(), reason, message, api, &counts);
        }
        self.publish();
    }

    /// Stalls and start-ups, from the refresh's reads of the kernel.
    fn refresh(
        &mut self,
        pipeline: &mut Pipeline,
        stalls: &[crate::pipeline::stalls::Stall],
        gpu: &[(observer_common::gpu::GpuStatsKey, observer_common::gpu::GpuStats)],
    ) {
        let counts = startup_counts(gpu);
        let resolver = pipeline.cgroups_mut();
        self.gate.note_stalls(stalls, self.stall_threshold, &counts, |id| resolver.path(id));
        self.gate.note_counts(&counts, |id| resolver.path(id));
        // Evidence is kept for gated pods while the API knows them, and for
        // pods it does not know (yet: too new for the watch) while their
        // cgroups exist; a pod known without the gate never needs any.
        if self.pods.is_synced() {
            let pods = &self.pods;
            self.gate.retain(|cgroup, uid| match pods.get(uid) {
                Some(meta) => meta.gate.is_some(),
                None => resolver.exists(cgroup),
            });
        }
        self.publish();
    }

    fn publish(&mut self) {
        let now = unix_now();
        let mut targets = HashMap::new();
        for (uid, meta) in self.pods.gated() {
            if let Some(desired) = self.gate.desired(&uid, &meta, now) {
                targets.insert(uid, Target { namespace: meta.namespace, name: meta.name, desired });
            }
        }
        self.patcher.set_targets(targets);
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
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
