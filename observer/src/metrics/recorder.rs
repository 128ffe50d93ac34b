//! The daemon's series as a pipeline feeds them: events counted as they
//! come, and once a second the kernel's aggregates, stalls, CPU numbers and
//! labels. `run` publishes them to scrapes; `top` on its own probes reads
//! the same text without a server.
use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use log::info;
use observer_common::{
    gpu::{GpuStats, GpuStatsKey},
    kfd::{KfdStats, KfdStatsKey},
    sched::RunqHistogram,
};

use super::{
    server::{Published, SharedMetrics},
    Metrics,
};
use crate::{
    attribution::{
        kube::PodCache,
        labels::{labels_for, Liveness},
    },
    events::{Detail, Event},
    gate::patcher::Summary as GateSummary,
    pipeline::{never_initialized::GpuContainer, stalls::Stall, Pipeline},
    render,
};

/// How often kernel aggregates, stalls, CPU limits and labels are read.
/// Each read walks every tracked cgroup's map entries and `cpu.stat`, which
/// at a thousand pods is most of an idle daemon's CPU; failures, crashes,
/// exits and OOM kills do not wait for it (they are events).
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// The GPU, run-queue and KFD aggregates of one read of the kernel.
pub type Aggregates = (Vec<(GpuStatsKey, GpuStats)>, Vec<(u64, RunqHistogram)>, Vec<(KfdStatsKey, KfdStats)>);

/// What a refresh read of the kernel before anything was published.
pub struct KernelRead {
    pub stalls: Vec<Stall>,
    /// `None` when the kernel updated no aggregate since the last read.
    pub aggregates: Option<Aggregates>,
}

/// How often the CPU limits of cgroups are sampled for the exporter.
const CPU_SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often each tracked cgroup's directory is checked for removal: a
/// tenth of the series grace, within these bounds. A stat of a long path
/// per tracked cgroup on every refresh was, with a thousand pods, a fifth
/// of an idle daemon's CPU, and every two seconds still an eighth; a
/// removal seen a tenth of the grace late keeps a gone pod's series that
/// much longer and changes nothing else.
const GONE_CHECK_BOUNDS: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(30));

fn gone_check_every(series_grace: Duration) -> Duration {
    (series_grace / 10).clamp(GONE_CHECK_BOUNDS.0, GONE_CHECK_BOUNDS.1)
}

pub struct Recorder {
    published: SharedMetrics,
    series_grace: Duration,
    last_refresh: Instant,
    last_cpu_sample: Option<Instant>,
    /// Tracked cgroups found removed at the last check, and when it was.
    removed: HashSet<u64>,
    last_gone_check: Option<Instant>,
    /// The pod cache's generation at the last refresh.
    last_generation: u64,
    /// The kernel aggregates' generation at the last read.
    aggregates_generation: u64,
}

impl Recorder {
    pub fn new(published: SharedMetrics, series_grace: Duration) -> Self {
        Self {
            published,
            series_grace,
            last_refresh: Instant::now() - REFRESH_EVERY,
            last_cpu_sample: None,
            removed: HashSet::new(),
            last_gone_check: None,
            last_generation: 0,
            aggregates_generation: u64::MAX,
        }
    }

    /// The daemon's series without Kubernetes or the readiness gate:
    /// labels come from cgroup paths, as for `run --no-kubernetes`.
    pub fn standalone(pipeline: &Pipeline, max_cgroups: usize) -> Self {
        let mut metrics = Metrics::new(max_cgroups);
        metrics.node.probes = pipeline.statuses();
        Self::new(Arc::new(Mutex::new(Published::new(metrics))), Duration::from_secs(60))
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        self.published.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every family per pod now, as `/metrics/pods` serves it.
    pub fn per_pod(&self) -> bytes::Bytes {
        self.lock().per_pod()
    }

    /// Whether a refresh is due: a second has passed, or the pod cache
    /// moved (`generation`), so a pod added, changed or deleted relabels now.
    pub fn due(&mut self, generation: u64) -> bool {
        if self.last_refresh.elapsed() < REFRESH_EVERY && generation == self.last_generation {
            return false;
        }
        self.last_generation = generation;
        self.last_refresh = Instant::now();
        true
    }

    /// Counts a batch of events.
    pub fn record(&mut self, events: &[Event]) {
        let mut published = self.lock();
        for event in events.iter() {
            // A newly probed library is also logged with its reason.
            if let Detail::LibraryProbed { .. } = &event.detail {
                eprintln!("canaryscope: probing {}", render::detail(event));
            }
            published.metrics.record(event);
        }
    }

    /// The running containers that requested a GPU, as judged now.
    pub fn set_gpu_never_initialized(&mut self, containers: &[GpuContainer]) {
        let verdicts = containers.iter().map(|c| (c.cgroup, c.never_initialized)).collect();
        self.lock().metrics.set_gpu_never_initialized(verdicts);
    }

    /// Stalls, and the kernel's aggregates if they moved. Read outside the
    /// lock: a scrape rendering meanwhile is not held up by map reads.
    pub fn read_kernel(&mut self, pipeline: &mut Pipeline) -> KernelRead {
        let stalls = pipeline.stalls();
        let kernel = pipeline.kernel();
        // The latency aggregates are thousands of map entries at a thousand
        // pods, two system calls each: read only when the kernel updated one.
        let generation = kernel.aggregates_generation();
        let aggregates = (generation != self.aggregates_generation)
            .then(|| (kernel.gpu_stats(), kernel.runq_stats(), kernel.kfd_stats()));
        self.aggregates_generation = generation;
        KernelRead { stalls, aggregates }
    }

    /// Publishes a refresh: what `read` found, CPU numbers, node state and
    /// labels; drops the series and kernel entries of gone cgroups.
    pub fn publish(
        &mut self,
        pipeline: &mut Pipeline,
        read: KernelRead,
        pods: Option<&PodCache>,
        gate: Option<GateSummary>,
    ) {
        let KernelRead { stalls, aggregates } = read;
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
        // Once a second, as `trace` samples: the counters are cumulative,
        // so `rate()` loses nothing, and a thousand limited pods cost half
        // the file reads of sampling on every refresh.
        if let Some((_, runq, _)) = &aggregates {
            pipeline.note_run_queue(runq);
        }
        if self.last_cpu_sample.is_none_or(|t| t.elapsed() >= CPU_SAMPLE_EVERY) {
            self.last_cpu_sample = Some(Instant::now());
            pipeline.sample_cpu();
        }
        let cpu = pipeline.cpu_snapshots();
        let driver_versions = pipeline.driver_versions();
        let (vram, vram_stranded) = (pipeline.vram_by_cgroup(), pipeline.vram_stranded());
        let process_starts = pipeline.take_process_starts();
        let counters = pipeline.counters();
        let http_lost = pipeline.http_segments_lost();
        let (statuses, hot) = (pipeline.statuses(), pipeline.hot_counts());
        let check_removed =
            self.last_gone_check.is_none_or(|t| t.elapsed() >= gone_check_every(self.series_grace));
        if check_removed {
            self.last_gone_check = Some(Instant::now());
        }
        let mut removed_set = std::mem::take(&mut self.removed);
        let mut published = self.lock();
        let metrics = &mut published.metrics;
        metrics.set_stalled(stalls.into_iter().map(|s| (s.cgroup_id, s.api, s.function)));
        metrics.set_gate(gate);
        if let Some((gpu, runq, kfd)) = aggregates {
            metrics.set_gpu(gpu);
            metrics.set_runq(runq);
            metrics.set_kfd(kfd);
        }
        metrics.set_mem_limits(mem_limits);
        metrics.set_cpu(cpu);
        metrics.set_driver_versions(driver_versions);
        metrics.set_vram(vram);
        metrics.set_vram_stranded(vram_stranded);
        metrics.add_process_starts(process_starts);
        // Libraries found since the start (a pod's own copy) show up too.
        metrics.set_node_state(statuses, hot, counters.events_lost, counters.decode_errors, counters.records);
        metrics.set_http_segments_lost(http_lost);
        let removed = Removed { check_now: check_removed, found: &mut removed_set };
        let purged = relabel(metrics, pipeline, pods, self.series_grace, in_kernel, removed);
        drop(published);
        self.removed = removed_set;
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

/// Labels every tracked cgroup anew; returns the cgroups whose series and
/// kernel entries are to go.
/// Which tracked cgroups were removed: checked now, or as last checked.
struct Removed<'a> {
    check_now: bool,
    found: &'a mut HashSet<u64>,
}

fn relabel(
    metrics: &mut Metrics,
    pipeline: &mut Pipeline,
    pods: Option<&PodCache>,
    series_grace: Duration,
    in_kernel: HashSet<u64>,
    removed: Removed<'_>,
) -> Vec<u64> {
    let resolver = pipeline.cgroups_mut();
    if removed.check_now {
        removed.found.clear();
    }
    // The pods the API lists here: a purged container's counts stay in its
    // pod's series while the pod is on the node (a crash loop's back-off
    // outlasts a series grace).
    let listed: HashSet<(String, String)> = pods
        .map(|p| p.classify(|m| (m.namespace.clone(), m.name.clone())).into_values().collect())
        .unwrap_or_default();
    let mut purged = metrics.refresh_labels(series_grace, &listed, |id| {
        let path = resolver.path(id);
        let mut resolved = labels_for(path.as_deref(), pods);
        // A removed cgroup is gone whatever the API says: a restarted
        // container leaves its old cgroup behind in a pod that lives on.
        let gone = if removed.check_now {
            let gone = !resolver.exists(id);
            if gone {
                removed.found.insert(id);
            }
            gone
        } else {
            removed.found.contains(&id)
        };
        if gone {
            resolved.liveness = Liveness::Gone;
        }
        resolved
    });
    // Kernel entries of cgroups that never got series (over the cap) and
    // are gone now: nobody else would ever remove them.
    purged.extend(
        in_kernel
            .into_iter()
            .filter(|id| !metrics.is_tracked(*id) && (resolver.path(*id).is_none() || !resolver.exists(*id))),
    );
    purged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removals_are_checked_a_tenth_of_the_grace_apart_within_bounds() {
        assert_eq!(gone_check_every(Duration::from_secs(5)), Duration::from_secs(2));
        assert_eq!(gone_check_every(Duration::from_secs(100)), Duration::from_secs(10));
        assert_eq!(gone_check_every(Duration::from_secs(300)), Duration::from_secs(30));
        assert_eq!(gone_check_every(Duration::from_secs(3600)), Duration::from_secs(30));
    }
}
