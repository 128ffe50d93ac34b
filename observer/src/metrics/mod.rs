//! The Prometheus side: what events and kernel aggregates mean as series,
//! labelled by workload, with gone pods dropped after a grace period and a
//! cap that protects Prometheus from a cardinality explosion.
pub mod families;
pub mod server;

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use observer_common::{
    gpu::{Api, GpuStats, GpuStatsKey},
    kfd::{HwKind, KfdStats, KfdStatsKey},
    sched::RunqHistogram,
    LATENCY_BUCKETS,
};
use prometheus::{proto::MetricType, Encoder, TextEncoder};

use crate::{
    attribution::labels::{Liveness, WorkloadLabels, LABEL_NAMES},
    events::{result_name, Detail, Event},
    probes::ProbeStatus,
};
use families::Family;

/// Per-cgroup CPU numbers from the CPU monitor.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSnapshot {
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
    pub runnable: u32,
    pub quota_cores: f64,
}

/// Kernel histograms kept per result, merged into one per function or ioctl.
struct MergedLatency {
    buckets: [u64; LATENCY_BUCKETS],
    total_ns: u64,
}

impl Default for MergedLatency {
    fn default() -> Self {
        Self { buckets: [0; LATENCY_BUCKETS], total_ns: 0 }
    }
}

impl MergedLatency {
    fn add(&mut self, buckets: &[u64], total_ns: u64) {
        for (into, from) in self.buckets.iter_mut().zip(buckets) {
            *into += from;
        }
        self.total_ns += total_ns;
    }
}

struct Attribution {
    labels: WorkloadLabels,
    gone_since: Option<Instant>,
}

#[derive(Default)]
pub struct Metrics {
    init_failures: BTreeMap<(u64, &'static str, String, String), u64>,
    crashes: BTreeMap<(u64, String, String), u64>,
    ooms: BTreeMap<(u64, &'static str), u64>,
    exits: BTreeMap<(u64, String), u64>,
    stalled: BTreeMap<(u64, &'static str, String), u64>,
    /// Node-level hardware events by kind (the driver context is a kernel
    /// worker, not the workload).
    hardware: BTreeMap<u32, u64>,
    kfd: Vec<(KfdStatsKey, KfdStats)>,
    gpu: Vec<(GpuStatsKey, GpuStats)>,
    runq: Vec<(u64, RunqHistogram)>,
    cpu: Vec<(u64, CpuSnapshot)>,
    pub probes: Vec<ProbeStatus>,
    pub events_lost: u64,
    pub series_overflow: u64,
    /// Ring-buffer records received, by kind (shows that aggregation works).
    pub records: BTreeMap<&'static str, u64>,
    attribution: HashMap<u64, Attribution>,
    pub max_cgroups: usize,
}

/// Cgroups whose series were removed; the caller drops their kernel entries.
pub type Purged = Vec<u64>;

impl Metrics {
    pub fn new(max_cgroups: usize) -> Self {
        Self { max_cgroups, ..Default::default() }
    }

    /// Admits a cgroup under the cardinality cap.
    fn admit(&mut self, cgroup: u64) -> bool {
        if self.attribution.contains_key(&cgroup) {
            return true;
        }
        if self.attribution.len() >= self.max_cgroups {
            self.series_overflow += 1;
            return false;
        }
        self.attribution.insert(cgroup, Attribution { labels: WorkloadLabels::default(), gone_since: None });
        true
    }

    pub fn record(&mut self, event: &Event) {
        let cgroup = event.origin.cgroup_id;
        match &event.detail {
            Detail::GpuCall { api, function, result, .. } => {
                if *result != 0 && observer_common::gpu::is_init_function(function) && self.admit(cgroup) {
                    let name =
                        result_name(*api, *result).map(str::to_string).unwrap_or_else(|| result.to_string());
                    *self.init_failures.entry((cgroup, api.as_str(), function.clone(), name)).or_default() +=
                        1;
                }
            }
            Detail::Crash { signal, library, .. } => {
                if self.admit(cgroup) {
                    let lib = library.as_deref().map(base_name).unwrap_or("unknown").to_string();
                    let sig = crate::events::signal_label(*signal);
                    *self.crashes.entry((cgroup, sig, lib)).or_default() += 1;
                }
            }
            Detail::OomKill { scope, .. } => {
                if self.admit(cgroup) {
                    *self.ooms.entry((cgroup, scope)).or_default() += 1;
                }
            }
            Detail::Exit { signal, exit_code, .. } => {
                if self.admit(cgroup) {
                    let label = if *signal != 0 {
                        crate::events::signal_label(*signal)
                    } else {
                        format!("exit{exit_code}")
                    };
                    *self.exits.entry((cgroup, label)).or_default() += 1;
                }
            }
            Detail::GpuHardware { kind, .. } => {
                *self.hardware.entry(*kind as u32).or_default() += 1;
            }
            Detail::GpuStall { .. }
            | Detail::KfdIoctl { .. }
            | Detail::CpuThrottle { .. }
            | Detail::CpuOversubscribed { .. }
            | Detail::LibraryProbed { .. } => {}
        }
    }

    /// Calls in flight past the stall threshold right now.
    pub fn set_stalled(&mut self, stalled: impl IntoIterator<Item = (u64, Api, String)>) {
        self.stalled.clear();
        for (cgroup, api, function) in stalled {
            if self.admit(cgroup) {
                *self.stalled.entry((cgroup, api.as_str(), function)).or_default() += 1;
            }
        }
    }

    pub fn set_gpu(&mut self, stats: Vec<(GpuStatsKey, GpuStats)>) {
        self.gpu = stats.into_iter().filter(|(k, _)| self.admit(k.cgroup_id)).collect();
    }

    pub fn set_kfd(&mut self, stats: Vec<(KfdStatsKey, KfdStats)>) {
        self.kfd = stats.into_iter().filter(|(k, _)| self.admit(k.cgroup_id)).collect();
    }

    pub fn set_runq(&mut self, runq: Vec<(u64, RunqHistogram)>) {
        self.runq = runq.into_iter().filter(|(c, _)| self.admit(*c)).collect();
    }

    pub fn set_cpu(&mut self, cpu: Vec<(u64, CpuSnapshot)>) {
        self.cpu = cpu.into_iter().filter(|(c, _)| *c != 0 && self.admit(*c)).collect();
    }

    /// Refreshes labels; series of cgroups gone longer than `grace` are
    /// dropped and returned so their kernel map entries can go too.
    pub fn refresh_labels(
        &mut self,
        grace: Duration,
        mut resolve: impl FnMut(u64) -> (WorkloadLabels, Liveness),
    ) -> Purged {
        let now = Instant::now();
        let mut purged = Vec::new();
        for (cgroup, a) in self.attribution.iter_mut() {
            let (labels, liveness) = resolve(*cgroup);
            match liveness {
                Liveness::Live => {
                    a.labels = labels;
                    a.gone_since = None;
                }
                Liveness::Gone => {
                    // Keep the last good labels through the grace period.
                    if a.labels == WorkloadLabels::default() {
                        a.labels = labels;
                    }
                    let since = *a.gone_since.get_or_insert(now);
                    if now.duration_since(since) >= grace {
                        purged.push(*cgroup);
                    }
                }
            }
        }
        for cgroup in &purged {
            self.attribution.remove(cgroup);
            self.init_failures.retain(|k, _| k.0 != *cgroup);
            self.crashes.retain(|k, _| k.0 != *cgroup);
            self.ooms.retain(|k, _| k.0 != *cgroup);
            self.exits.retain(|k, _| k.0 != *cgroup);
            self.stalled.retain(|k, _| k.0 != *cgroup);
            self.gpu.retain(|(k, _)| k.cgroup_id != *cgroup);
            self.kfd.retain(|(k, _)| k.cgroup_id != *cgroup);
            self.runq.retain(|(c, _)| c != cgroup);
            self.cpu.retain(|(c, _)| c != cgroup);
        }
        purged
    }

    /// Whether the cgroup has series (admitted under the cap).
    pub fn is_tracked(&self, cgroup: u64) -> bool {
        self.attribution.contains_key(&cgroup)
    }

    #[cfg(test)]
    pub fn tracked_cgroups(&self) -> usize {
        self.attribution.len()
    }

    fn labels(&self, cgroup: u64) -> [&str; 6] {
        match self.attribution.get(&cgroup) {
            Some(a) => a.labels.values(),
            None => ["", "", "", "", "", ""],
        }
    }

    /// The text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        let encoder = TextEncoder::new();
        let families = self.families();
        if encoder.encode(&families, &mut out).is_err() {
            return String::new();
        }
        String::from_utf8(out).unwrap_or_default()
    }

    fn families(&self) -> Vec<prometheus::proto::MetricFamily> {
        let w = &LABEL_NAMES;
        let with = |extra: &[&'static str]| -> Vec<&'static str> {
            w.iter().copied().chain(extra.iter().copied()).collect()
        };
        let vals = |cgroup: u64, extra: &[&str]| -> Vec<String> {
            self.labels(cgroup)
                .iter()
                .map(|s| s.to_string())
                .chain(extra.iter().map(|s| s.to_string()))
                .collect()
        };
        let mut fams = Vec::new();

        // GPU calls: counters per result, durations per function.
        let calls_names = with(&["api", "function", "result"]);
        let mut calls =
            Family::new("gpu_api_calls_total", "GPU runtime API calls by result.", MetricType::COUNTER);
        let dur_names = with(&["api", "function"]);
        let mut durations = Family::new(
            "gpu_api_call_duration_seconds",
            "Duration of GPU runtime API calls, measured in the kernel.",
            MetricType::HISTOGRAM,
        );
        let mut by_function: BTreeMap<(u64, u32, u32), MergedLatency> = BTreeMap::new();
        for (k, s) in &self.gpu {
            let Some(api) = Api::from_u32(k.api) else { continue };
            let function = crate::events::function_name(api, k.function);
            let result =
                result_name(api, k.result).map(str::to_string).unwrap_or_else(|| k.result.to_string());
            let v = vals(k.cgroup_id, &[api.as_str(), &function, &result]);
            calls.counter(&calls_names, &v.iter().map(String::as_str).collect::<Vec<_>>(), s.count as f64);
            by_function.entry((k.cgroup_id, k.api, k.function)).or_default().add(&s.buckets, s.total_ns);
        }
        for ((cgroup, api, function), merged) in &by_function {
            let Some(api) = Api::from_u32(*api) else { continue };
            let function = crate::events::function_name(api, *function);
            let v = vals(*cgroup, &[api.as_str(), &function]);
            let v: Vec<&str> = v.iter().map(String::as_str).collect();
            durations.latency(&dur_names, &v, &merged.buckets, merged.total_ns);
        }
        fams.push(calls.finish());
        fams.push(durations.finish());

        let mut init = Family::new(
            "gpu_init_failures_total",
            "GPU runtime initialisation calls that failed (hipInit, cuInit, device and context setup).",
            MetricType::COUNTER,
        );
        let init_names = with(&["api", "function", "result"]);
        for ((cgroup, api, function, result), n) in &self.init_failures {
            let v = vals(*cgroup, &[api, function, result]);
            init.counter(&init_names, &v.iter().map(String::as_str).collect::<Vec<_>>(), *n as f64);
        }
        fams.push(init.finish());

        let mut stalled = Family::new(
            "gpu_api_stalled_calls",
            "GPU calls in flight longer than the stall threshold.",
            MetricType::GAUGE,
        );
        let stalled_names = with(&["api", "function"]);
        for ((cgroup, api, function), n) in &self.stalled {
            let v = vals(*cgroup, &[api, function]);
            stalled.gauge(&stalled_names, &v.iter().map(String::as_str).collect::<Vec<_>>(), *n as f64);
        }
        fams.push(stalled.finish());

        let mut crashes = Family::new(
            "native_crashes_total",
            "Processes killed by a fault or abort in native code.",
            MetricType::COUNTER,
        );
        let crash_names = with(&["signal", "library"]);
        for ((cgroup, signal, library), n) in &self.crashes {
            let v = vals(*cgroup, &[signal, library]);
            crashes.counter(&crash_names, &v.iter().map(String::as_str).collect::<Vec<_>>(), *n as f64);
        }
        fams.push(crashes.finish());

        let mut ooms =
            Family::new("oom_kills_total", "Processes killed by the OOM killer.", MetricType::COUNTER);
        let oom_names = with(&["scope"]);
        for ((cgroup, scope), n) in &self.ooms {
            let v = vals(*cgroup, &[scope]);
            ooms.counter(&oom_names, &v.iter().map(String::as_str).collect::<Vec<_>>(), *n as f64);
        }
        fams.push(ooms.finish());

        let mut exits = Family::new(
            "abnormal_exits_total",
            "Processes that died by a signal or exited with status 137.",
            MetricType::COUNTER,
        );
        let exit_names = with(&["signal"]);
        for ((cgroup, signal), n) in &self.exits {
            let v = vals(*cgroup, &[signal]);
            exits.counter(&exit_names, &v.iter().map(String::as_str).collect::<Vec<_>>(), *n as f64);
        }
        fams.push(exits.finish());

        let mut kfd_calls =
            Family::new("kfd_ioctls_total", "AMD KFD driver ioctls by result.", MetricType::COUNTER);
        let mut kfd_dur = Family::new(
            "kfd_ioctl_duration_seconds",
            "Duration of AMD KFD driver ioctls.",
            MetricType::HISTOGRAM,
        );
        let kfd_names = with(&["ioctl", "result"]);
        let kfd_dur_names = with(&["ioctl"]);
        let mut kfd_by_ioctl: BTreeMap<(u64, u32), MergedLatency> = BTreeMap::new();
        for (k, s) in &self.kfd {
            let ioctl = crate::events::kfd_ioctl_label(k.nr);
            let result = match k.result {
                0 => "0".to_string(),
                r => observer_common::names::errno_name(-r)
                    .map(str::to_string)
                    .unwrap_or_else(|| r.to_string()),
            };
            let v = vals(k.cgroup_id, &[&ioctl, &result]);
            kfd_calls.counter(&kfd_names, &v.iter().map(String::as_str).collect::<Vec<_>>(), s.count as f64);
            kfd_by_ioctl.entry((k.cgroup_id, k.nr)).or_default().add(&s.buckets, s.total_ns);
        }
        for ((cgroup, nr), merged) in &kfd_by_ioctl {
            let v = vals(*cgroup, &[&crate::events::kfd_ioctl_label(*nr)]);
            let v: Vec<&str> = v.iter().map(String::as_str).collect();
            kfd_dur.latency(&kfd_dur_names, &v, &merged.buckets, merged.total_ns);
        }
        fams.push(kfd_calls.finish());
        fams.push(kfd_dur.finish());
        for (kind, name, help) in [
            (
                HwKind::MemoryFault,
                "gpu_memory_faults_total",
                "GPU memory faults seen by the KFD driver on this node.",
            ),
            (HwKind::Reset, "gpu_resets_total", "GPU resets on this node."),
            (HwKind::QueueEviction, "gpu_queue_evictions_total", "KFD queue evictions on this node."),
        ] {
            let mut f = Family::new(name, help, MetricType::COUNTER);
            f.counter(&[], &[], self.hardware.get(&(kind as u32)).copied().unwrap_or(0) as f64);
            fams.push(f.finish());
        }

        let mut runq = Family::new(
            "cpu_runqueue_latency_seconds",
            "Time runnable threads waited for a CPU.",
            MetricType::HISTOGRAM,
        );
        for (cgroup, h) in &self.runq {
            let v = vals(*cgroup, &[]);
            let v: Vec<&str> = v.iter().map(String::as_str).collect();
            runq.latency(w, &v, &h.buckets, h.total_ns);
        }
        fams.push(runq.finish());

        let mut periods =
            Family::new("cpu_periods_total", "CFS bandwidth periods elapsed.", MetricType::COUNTER);
        let mut throttled = Family::new(
            "cpu_throttled_periods_total",
            "CFS periods in which the cgroup was throttled.",
            MetricType::COUNTER,
        );
        let mut throttled_s = Family::new(
            "cpu_throttled_seconds_total",
            "Time the cgroup spent throttled.",
            MetricType::COUNTER,
        );
        let mut runnable = Family::new(
            "cpu_runnable_threads",
            "Threads of the cgroup that are runnable.",
            MetricType::GAUGE,
        );
        let mut quota =
            Family::new("cpu_quota_cores", "CPU quota of the cgroup in cores.", MetricType::GAUGE);
        for (cgroup, c) in &self.cpu {
            let v = vals(*cgroup, &[]);
            let v: Vec<&str> = v.iter().map(String::as_str).collect();
            periods.counter(w, &v, c.periods as f64);
            throttled.counter(w, &v, c.throttled_periods as f64);
            throttled_s.counter(w, &v, c.throttled_ns as f64 * 1e-9);
            runnable.gauge(w, &v, f64::from(c.runnable));
            quota.gauge(w, &v, c.quota_cores);
        }
        fams.extend([
            periods.finish(),
            throttled.finish(),
            throttled_s.finish(),
            runnable.finish(),
            quota.finish(),
        ]);

        let mut attached = Family::new(
            "probe_attached",
            "Whether a probe is attached (1) or could not be (0) on this node.",
            MetricType::GAUGE,
        );
        for p in &self.probes {
            attached.gauge(&["probe", "target"], &[p.probe, &p.target], if p.attached { 1.0 } else { 0.0 });
        }
        fams.push(attached.finish());
        let mut lost = Family::new(
            "events_lost_total",
            "Events dropped in the kernel because the ring buffer was full.",
            MetricType::COUNTER,
        );
        lost.counter(&[], &[], self.events_lost as f64);
        fams.push(lost.finish());
        let mut records = Family::new(
            "ring_events_total",
            "Records received from the kernel ring buffer, by kind.",
            MetricType::COUNTER,
        );
        for (kind, n) in &self.records {
            records.counter(&["kind"], &[kind], *n as f64);
        }
        fams.push(records.finish());
        let mut overflow = Family::new(
            "series_overflow_total",
            "Updates dropped because the per-node cgroup cap was reached.",
            MetricType::COUNTER,
        );
        overflow.counter(&[], &[], self.series_overflow as f64);
        fams.push(overflow.finish());
        let mut tracked =
            Family::new("tracked_cgroups", "Cgroups with series on this node.", MetricType::GAUGE);
        tracked.gauge(&[], &[], self.attribution.len() as f64);
        fams.push(tracked.finish());
        // Families with no series are still valid exposition; drop them to
        // keep the output short.
        fams.retain(|f| !f.get_metric().is_empty());
        fams
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Origin;

    fn event(cgroup: u64, detail: Detail) -> Event {
        Event { origin: Origin { cgroup_id: cgroup, ..Default::default() }, detail }
    }

    fn labelled(cgroup: u64) -> (WorkloadLabels, Liveness) {
        let l = WorkloadLabels {
            namespace: "ml".into(),
            pod: format!("pod-{cgroup}"),
            container: "worker".into(),
            workload: "infer".into(),
            revision: "abc".into(),
            track: if cgroup == 1 { "canary".into() } else { "stable".into() },
        };
        (l, Liveness::Live)
    }

    #[test]
    fn init_failures_are_counted_with_workload_labels() {
        let mut m = Metrics::new(100);
        let call = |result| Detail::GpuCall {
            api: Api::Hip,
            library: "/x/libamdhip64.so.5".into(),
            function: "hipInit".into(),
            result,
            duration_ns: 10,
        };
        m.record(&event(1, call(101)));
        m.record(&event(1, call(101)));
        m.record(&event(2, call(0)));
        m.refresh_labels(Duration::from_secs(60), labelled);
        let text = m.render();
        assert!(
            text.contains(r#"canaryscope_gpu_init_failures_total{namespace="ml",pod="pod-1",container="worker",workload="infer",revision="abc",track="canary",api="hip",function="hipInit",result="hipErrorInvalidDevice"} 2"#),
            "{text}"
        );
        assert!(!text.contains(r#"pod="pod-2""#), "a successful call is no failure: {text}");
    }

    #[test]
    fn gone_cgroups_are_dropped_after_the_grace_period() {
        let mut m = Metrics::new(100);
        m.record(&event(7, Detail::OomKill { scope: "memcg", anon_rss_bytes: None }));
        m.refresh_labels(Duration::ZERO, labelled);
        assert!(m.render().contains("canaryscope_oom_kills_total"));
        let gone = |_| (WorkloadLabels::default(), Liveness::Gone);
        let purged = m.refresh_labels(Duration::ZERO, gone);
        assert_eq!(purged, vec![7]);
        assert!(!m.render().contains("canaryscope_oom_kills_total"));
    }

    #[test]
    fn the_cardinality_cap_counts_what_it_drops() {
        let mut m = Metrics::new(2);
        for cgroup in 1..=5 {
            m.record(&event(cgroup, Detail::Exit { signal: 9, exit_code: 0, core_dumped: false }));
        }
        assert_eq!(m.tracked_cgroups(), 2);
        assert_eq!(m.series_overflow, 3);
        assert!(m.render().contains("canaryscope_series_overflow_total 3"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut m = Metrics::new(10);
        m.record(&event(3, Detail::Exit { signal: 9, exit_code: 0, core_dumped: false }));
        m.refresh_labels(Duration::ZERO, |_| {
            (WorkloadLabels { workload: "a\"b\\c\nd".into(), ..Default::default() }, Liveness::Live)
        });
        let text = m.render();
        assert!(text.contains(r#"workload="a\"b\\c\nd""#), "{text}");
    }
}
