//! The Prometheus side: what events and kernel aggregates mean as series,
//! labelled by workload, with gone pods dropped after a grace period and a
//! cap that protects Prometheus from a cardinality explosion.
pub mod catalog;
pub mod contract;
pub mod exposition;
pub mod exposure;
pub mod families;
pub mod fetch;
pub mod recorder;
pub mod revision;
pub mod server;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use catalog::*;
use families::FamilySet;
use observer_common::{
    gpu::{Api, GpuStats, GpuStatsKey},
    kfd::{HwKind, KfdStats, KfdStatsKey},
    memlimit::{MemLimit, MemLimitKey},
    sched::RunqHistogram,
    LatencyHistogram,
};
use prometheus::{Encoder, TextEncoder};
use revision::{owner, owner_labels, retired_owner, revision_key, Owner, Retired, RevisionKey};

use crate::{
    attribution::labels::{Liveness, WorkloadLabels},
    cpu::CpuSnapshot,
    events::{result_name, Detail, Event},
    probes::ProbeStatus,
};

/// An abnormal exit's label values after the workload's: signal, cause,
/// sender scope, kill reason. All bounded; never a pid or a comm.
type ExitKey = (String, &'static str, &'static str, &'static str);

/// The value of a label that does not apply to a series.
const NONE: &str = "none";

struct SeriesLabels {
    labels: WorkloadLabels,
    gone_since: Option<Instant>,
}

#[derive(Default)]
pub struct Metrics {
    init_failures: BTreeMap<(u64, &'static str, String, String), u64>,
    crashes: BTreeMap<(u64, String, String), u64>,
    ooms: BTreeMap<(u64, &'static str), u64>,
    exits: BTreeMap<(u64, ExitKey), u64>,
    stalled: BTreeMap<(u64, &'static str, String), u64>,
    /// Node-level hardware events by kind (the driver context is a kernel
    /// worker, not the workload).
    hardware: BTreeMap<u32, u64>,
    /// Hardware events the driver attributed to a workload's process.
    hardware_by_cgroup: BTreeMap<(u64, u32), u64>,
    kfd: Vec<(KfdStatsKey, KfdStats)>,
    gpu: Vec<(GpuStatsKey, GpuStats)>,
    /// The driver version each cgroup's processes were told.
    driver_versions: Vec<(u64, i32)>,
    runq: Vec<(u64, RunqHistogram)>,
    /// Refused calls per (cgroup, limit), from the kernel's counters.
    mem_limits: Vec<(MemLimitKey, u64)>,
    cpu: Vec<(u64, CpuSnapshot)>,
    pub probes: Vec<ProbeStatus>,
    /// GPU processes with hot-call probes, by reason (set by the daemon loop).
    pub hot: crate::discovery::hot::HotCounts,
    /// The readiness gate's numbers; `None` when it is off.
    pub gate: Option<crate::gate::patcher::Summary>,
    pub events_lost: u64,
    /// Ring-buffer records that failed to decode (set by the daemon loop).
    pub decode_errors: u64,
    pub series_overflow: u64,
    /// Ring-buffer records received, by kind (shows that aggregation works).
    pub records: BTreeMap<&'static str, u64>,
    series_labels: HashMap<u64, SeriesLabels>,
    /// What purged pods left to their revisions' shared series.
    retired: Retired,
    /// The canary judge's exposure per revision (start-ups, pod-seconds,
    /// process starts).
    exposure: exposure::Exposure,
    /// VRAM per (cgroup, KFD gpu_id): a pair once above 0 stays, at 0 when
    /// its processes hold none, until its cgroup is purged.
    vram: BTreeMap<(u64, u32), u64>,
    /// Stranded VRAM per GPU now (the node's gauge).
    vram_stranded_now: Vec<(u32, u64)>,
    /// Stranded bytes put on each revision, while it has a pod here.
    vram_stranded: BTreeMap<RevisionKey, u64>,
    /// Stranded bytes put on no pod.
    vram_stranded_unattributed: u64,
    pub max_cgroups: usize,
    /// Whether a series changed since the last [`Metrics::take_changed`]:
    /// the exposition is rendered only then, so a scrape costs no rendering
    /// and is the same bytes while nothing happens.
    changed: bool,
}

/// Series a render holds as protos at most, per family: a few hundred
/// kilobytes, where a whole family at a thousand pods is megabytes.
const RENDER_CHUNK: usize = 256;

/// `family` as exposition text into `out` (cleared first); a continuation
/// part without the `# HELP` and `# TYPE` lines its first part had.
fn encode_part(family: &prometheus::proto::MetricFamily, first: bool, out: &mut Vec<u8>) -> bool {
    out.clear();
    if TextEncoder::new().encode(std::slice::from_ref(family), out).is_err() {
        return false;
    }
    if !first {
        // The header is two lines; help text is escaped, so has no newline.
        let header = out.iter().enumerate().filter(|(_, b)| **b == b'\n').nth(1).map_or(0, |(i, _)| i + 1);
        out.drain(..header);
    }
    true
}

/// The owners of one render's revision-scoped series, by number.
struct Owners<'a> {
    list: Vec<Owner<'a>>,
    by_cgroup: HashMap<u64, u32>,
    /// The owner of entries whose cgroup has no labels.
    empty: u32,
}

impl<'a> Owners<'a> {
    fn of_cgroup(&self, cgroup: u64) -> u32 {
        self.by_cgroup.get(&cgroup).copied().unwrap_or(self.empty)
    }

    fn of(&self, owner: &Owner) -> u32 {
        self.list.binary_search(owner).map_or(self.empty, |i| i as u32)
    }

    fn get(&self, id: u32) -> &Owner<'a> {
        &self.list[id as usize]
    }
}

/// Cgroups whose series were removed; the caller drops their kernel entries.
pub type Purged = Vec<u64>;

impl Metrics {
    pub fn new(max_cgroups: usize) -> Self {
        // Changed: the first exposition is rendered before anything happens.
        Self { max_cgroups, changed: true, ..Default::default() }
    }

    /// Admits a cgroup under the cardinality cap.
    fn admit(&mut self, cgroup: u64) -> bool {
        if self.series_labels.contains_key(&cgroup) {
            return true;
        }
        // Both change what a scrape shows.
        self.changed = true;
        if self.series_labels.len() >= self.max_cgroups {
            self.series_overflow += 1;
            return false;
        }
        self.series_labels
            .insert(cgroup, SeriesLabels { labels: WorkloadLabels::default(), gone_since: None });
        true
    }

    pub fn record(&mut self, event: &Event) {
        self.changed = true;
        let cgroup = event.origin.cgroup_id;
        match &event.detail {
            Detail::GpuCall { api, function, result, .. } => {
                if *result != 0 && observer_common::gpu::is_init_function(function) && self.admit(cgroup) {
                    self.exposure.init_failed(cgroup, *api);
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
            Detail::Exit { signal, exit_code, cause, sender, kill_reason, .. } => {
                if self.admit(cgroup) {
                    let label = if *signal != 0 {
                        crate::events::signal_label(*signal)
                    } else {
                        format!("exit{exit_code}")
                    };
                    let scope = sender.as_ref().map(|s| s.scope.as_str()).unwrap_or(NONE);
                    let reason = kill_reason.map(|r| r.as_str()).unwrap_or(NONE);
                    *self.exits.entry((cgroup, (label, cause.as_str(), scope, reason))).or_default() += 1;
                }
            }
            Detail::GpuHardware { kind, attributed, .. } => {
                if *attributed && cgroup != 0 && self.admit(cgroup) {
                    *self.hardware_by_cgroup.entry((cgroup, *kind as u32)).or_default() += 1;
                } else {
                    *self.hardware.entry(*kind as u32).or_default() += 1;
                }
            }
            Detail::GpuVramStranded { bytes, attributed, .. } => self.vram_left(cgroup, *bytes, *attributed),
            Detail::GpuStall { .. }
            | Detail::KfdIoctl { .. }
            // Counted in the kernel, every call; records are rate-limited.
            | Detail::MemoryLimitRefusal { .. }
            | Detail::CpuThrottle { .. }
            | Detail::CpuOversubscribed { .. }
            | Detail::LibraryProbed { .. } => {}
        }
    }

    /// Stranded bytes: the revision's, when the event names a pod whose
    /// labels are known, else the node's.
    fn vram_left(&mut self, cgroup: u64, bytes: u64, attributed: bool) {
        if attributed && cgroup != 0 && self.admit(cgroup) {
            let labels = self.series_labels.get(&cgroup).map(|a| &a.labels);
            if let Some(labels) = labels.filter(|l| **l != WorkloadLabels::default()) {
                *self.vram_stranded.entry(revision_key(labels)).or_default() += bytes;
                return;
            }
        }
        self.vram_stranded_unattributed += bytes;
    }

    /// VRAM per (cgroup, KFD gpu_id) of live processes now.
    pub fn set_vram(&mut self, vram: Vec<(u64, u32, u64)>) {
        let mut now: BTreeMap<(u64, u32), u64> = self.vram.keys().map(|k| (*k, 0)).collect();
        for (cgroup, gpu, bytes) in vram {
            if (bytes > 0 || now.contains_key(&(cgroup, gpu))) && self.admit(cgroup) {
                now.insert((cgroup, gpu), bytes);
            }
        }
        self.changed |= now != self.vram;
        self.vram = now;
    }

    /// Stranded VRAM per KFD gpu_id now.
    pub fn set_vram_stranded(&mut self, stranded: Vec<(u32, u64)>) {
        self.changed |= stranded != self.vram_stranded_now;
        self.vram_stranded_now = stranded;
    }

    /// Calls in flight past the stall threshold right now.
    pub fn set_stalled(&mut self, stalled: impl IntoIterator<Item = (u64, Api, String)>) {
        let mut now = BTreeMap::new();
        for (cgroup, api, function) in stalled {
            if self.admit(cgroup) {
                *now.entry((cgroup, api.as_str(), function)).or_default() += 1;
            }
        }
        self.changed |= now != self.stalled;
        self.stalled = now;
    }

    // Kernel maps and directory walks list their entries in no fixed
    // order; sorted, an unchanged snapshot renders the same bytes.

    pub fn set_gpu(&mut self, stats: Vec<(GpuStatsKey, GpuStats)>) {
        let now = self.admitted(stats, |k| k.cgroup_id);
        for (k, s) in &now {
            let Some(api) = Api::from_u32(k.api) else { continue };
            let init = api
                .functions()
                .get(k.function as usize)
                .is_some_and(|f| observer_common::gpu::is_init_function(f.name));
            if init && s.count > 0 {
                self.exposure.init_called(k.cgroup_id, api);
            }
        }
        self.changed |= now != self.gpu;
        self.gpu = now;
    }

    /// Programs started per cgroup since the last refresh (tracked
    /// cgroups' count toward their revision's exposure).
    pub fn add_process_starts(&mut self, starts: impl IntoIterator<Item = (u64, u64)>) {
        for (cgroup, n) in starts {
            self.exposure.processes_started(cgroup, n);
        }
    }

    pub fn set_driver_versions(&mut self, versions: Vec<(u64, i32)>) {
        let now = self.admitted(versions, |cgroup| *cgroup);
        self.changed |= now != self.driver_versions;
        self.driver_versions = now;
    }

    pub fn set_kfd(&mut self, stats: Vec<(KfdStatsKey, KfdStats)>) {
        let now = self.admitted(stats, |k| k.cgroup_id);
        self.changed |= now != self.kfd;
        self.kfd = now;
    }

    pub fn set_runq(&mut self, runq: Vec<(u64, RunqHistogram)>) {
        let now = self.admitted(runq, |c| *c);
        self.changed |= now != self.runq;
        self.runq = now;
    }

    pub fn set_mem_limits(&mut self, refusals: Vec<(MemLimitKey, u64)>) {
        let now = self.admitted(refusals, |k| k.cgroup_id);
        self.changed |= now != self.mem_limits;
        self.mem_limits = now;
    }

    pub fn set_cpu(&mut self, cpu: Vec<(u64, CpuSnapshot)>) {
        let cpu = cpu.into_iter().filter(|(c, _)| *c != 0).collect();
        let now = self.admitted(cpu, |c| *c);
        self.changed |= now != self.cpu;
        self.cpu = now;
    }

    /// The node-level state the daemon loop reads: probes, hot-call
    /// processes and the pipeline's counters.
    pub fn set_node_state(
        &mut self,
        probes: Vec<ProbeStatus>,
        hot: crate::discovery::hot::HotCounts,
        events_lost: u64,
        decode_errors: u64,
        records: BTreeMap<&'static str, u64>,
    ) {
        let now = (probes, hot, events_lost, decode_errors, records);
        let changed = (now.0 != self.probes)
            || (now.1 != self.hot)
            || (now.2 != self.events_lost)
            || (now.3 != self.decode_errors)
            || (now.4 != self.records);
        self.changed |= changed;
        (self.probes, self.hot, self.events_lost, self.decode_errors, self.records) = now;
    }

    /// The readiness gate's numbers (`None`: the gate is off).
    pub fn set_gate(&mut self, gate: Option<crate::gate::patcher::Summary>) {
        self.changed |= gate != self.gate;
        self.gate = gate;
    }

    /// Whether anything changed since the last call.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// Entries of cgroups admitted under the cap, sorted by key.
    fn admitted<K: Ord, V>(&mut self, entries: Vec<(K, V)>, cgroup: impl Fn(&K) -> u64) -> Vec<(K, V)> {
        let mut kept: Vec<(K, V)> = entries.into_iter().filter(|(k, _)| self.admit(cgroup(k))).collect();
        kept.sort_by(|a, b| a.0.cmp(&b.0));
        kept
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
        let mut relabelled = false;
        for (cgroup, a) in self.series_labels.iter_mut() {
            let (labels, liveness) = resolve(*cgroup);
            match liveness {
                Liveness::Live => {
                    relabelled |= a.labels != labels;
                    a.labels = labels;
                    a.gone_since = None;
                }
                Liveness::Gone => {
                    // Keep the last good labels through the grace period.
                    if a.labels == WorkloadLabels::default() {
                        relabelled |= a.labels != labels;
                        a.labels = labels;
                    }
                    let since = *a.gone_since.get_or_insert(now);
                    if now.duration_since(since) >= grace {
                        purged.push(*cgroup);
                    }
                }
            }
        }
        self.changed |= relabelled || !purged.is_empty();
        let live = self.series_labels.iter().filter(|(_, a)| a.gone_since.is_none());
        self.changed |= self.exposure.account(now, live.map(|(c, a)| (*c, &a.labels)));
        for cgroup in &purged {
            self.retire(*cgroup);
            self.exposure.forget(*cgroup);
            self.series_labels.remove(cgroup);
            self.hardware_by_cgroup.retain(|k, _| k.0 != *cgroup);
            self.init_failures.retain(|k, _| k.0 != *cgroup);
            self.crashes.retain(|k, _| k.0 != *cgroup);
            self.ooms.retain(|k, _| k.0 != *cgroup);
            self.exits.retain(|k, _| k.0 != *cgroup);
            self.stalled.retain(|k, _| k.0 != *cgroup);
            self.gpu.retain(|(k, _)| k.cgroup_id != *cgroup);
            self.driver_versions.retain(|(c, _)| c != cgroup);
            self.kfd.retain(|(k, _)| k.cgroup_id != *cgroup);
            self.runq.retain(|(c, _)| c != cgroup);
            self.mem_limits.retain(|(k, _)| k.cgroup_id != *cgroup);
            self.cpu.retain(|(c, _)| c != cgroup);
            self.vram.retain(|(c, _), _| c != cgroup);
        }
        if !purged.is_empty() {
            let live: HashSet<RevisionKey> =
                self.series_labels.values().map(|a| revision_key(&a.labels)).collect();
            self.retired.keep_only(&live);
            self.exposure.keep_only(&live);
            self.vram_stranded.retain(|k, _| live.contains(k));
        }
        purged
    }

    /// Hands a cgroup's kernel totals to its revision before they go.
    fn retire(&mut self, cgroup: u64) {
        let Some(a) = self.series_labels.get(&cgroup) else { return };
        let key = revision_key(&a.labels);
        self.retired.fold_gpu(&key, self.gpu.iter().filter(|(k, _)| k.cgroup_id == cgroup));
        self.retired.fold_kfd(&key, self.kfd.iter().filter(|(k, _)| k.cgroup_id == cgroup));
        self.retired.fold_runq(&key, self.runq.iter().filter(|(c, _)| *c == cgroup));
    }

    /// Whether the cgroup has series (admitted under the cap).
    pub fn is_tracked(&self, cgroup: u64) -> bool {
        self.series_labels.contains_key(&cgroup)
    }

    #[cfg(test)]
    pub fn tracked_cgroups(&self) -> usize {
        self.series_labels.len()
    }

    fn labels(&self, cgroup: u64) -> [&str; 6] {
        match self.series_labels.get(&cgroup) {
            Some(a) => a.labels.values(),
            None => ["", "", "", "", "", ""],
        }
    }

    /// The text exposition of every series. `size_hint`: the last one's
    /// length, so the buffer is allocated once, not doubled up to twice
    /// the text's size.
    pub fn render(&self, view: View, size_hint: usize) -> Vec<u8> {
        self.render_in_parts(view, size_hint, RENDER_CHUNK)
    }

    fn render_in_parts(&self, view: View, size_hint: usize, chunk: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(size_hint + size_hint / 16);
        let mut part = Vec::new();
        let mut failed = false;
        self.families_into(view, chunk, &mut |family, first| {
            failed |= !encode_part(&family, first, &mut part);
            out.extend_from_slice(&part);
        });
        if failed {
            return Vec::new();
        }
        out
    }

    /// The exposition of `view` gzip-compressed, family by family, so that
    /// the whole text never exists at once.
    pub fn render_gzip(&self, view: View) -> Vec<u8> {
        use flate2::{write::GzEncoder, Compression};
        use std::io::Write;
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        // One part's text at a time, handed to the compressor whole: its
        // output buffer is prepared on every write, so writing a sample at
        // a time cost more than the compression.
        let mut part = Vec::new();
        let mut failed = false;
        self.families_into(view, RENDER_CHUNK, &mut |family, first| {
            failed |= !encode_part(&family, first, &mut part) || gz.write_all(&part).is_err();
        });
        if failed {
            return Vec::new();
        }
        gz.finish().unwrap_or_default()
    }

    /// The scraped exposition as text (tests and tools).
    pub fn render_text(&self) -> String {
        self.render_text_in(View::Scrape)
    }

    /// The exposition of `view` as text.
    pub fn render_text_in(&self, view: View) -> String {
        String::from_utf8(self.render(view, 0)).unwrap_or_default()
    }

    /// The workload's label values followed by `extra`, in the order of a
    /// workload family's declared label names.
    fn vals<'a>(&'a self, cgroup: u64, extra: &[&'a str]) -> Vec<&'a str> {
        let mut v = self.labels(cgroup).to_vec();
        v.extend_from_slice(extra);
        v
    }

    /// Every owner of a revision-scoped series in `view`, numbered in sort
    /// order: the series maps below key by that number rather than by six
    /// strings, and iterate in the same order. Comparing owners whose cgroup
    /// paths share a long prefix was most of a render's time at a thousand
    /// pods.
    fn owners(&self, view: View) -> Owners<'_> {
        let live = self.series_labels.keys().map(|c| owner(self.labels(*c), view));
        let retired = [self.retired.gpu.keys().map(|(r, _)| r).collect::<Vec<_>>()]
            .into_iter()
            .chain([self.retired.kfd.keys().map(|(r, _)| r).collect()])
            .chain([self.retired.runq.keys().map(|(r, _)| r).collect()])
            .flatten()
            .filter(|_| view == View::Scrape)
            .map(retired_owner);
        let mut list: Vec<Owner> =
            live.chain(retired).chain([owner(["", "", "", "", "", ""], view)]).collect();
        list.sort_unstable();
        list.dedup();
        let id = |o: &Owner| list.binary_search(o).unwrap_or(0) as u32;
        let by_cgroup = self.series_labels.keys().map(|c| (*c, id(&owner(self.labels(*c), view)))).collect();
        let empty = id(&owner(["", "", "", "", "", ""], view));
        Owners { by_cgroup, empty, list }
    }

    /// Kernel entries with their owners' numbers in `view`: the live
    /// cgroups', and when scraped, what purged pods left to their revisions.
    fn owned<'a, K>(
        &'a self,
        owners: &'a Owners<'a>,
        view: View,
        live: &'a [(K, LatencyHistogram)],
        cgroup: impl Fn(&K) -> u64 + 'a,
        retired: &'a BTreeMap<(RevisionKey, K), LatencyHistogram>,
    ) -> impl Iterator<Item = (u32, &'a K, &'a LatencyHistogram)> + 'a {
        let live = live.iter().map(move |(k, s)| (owners.of_cgroup(cgroup(k)), k, s));
        let retired = retired.iter().filter(move |_| view == View::Scrape);
        live.chain(retired.map(move |((r, k), s)| (owners.of(&retired_owner(r)), k, s)))
    }

    #[cfg(test)]
    fn families(&self, view: View) -> Vec<prometheus::proto::MetricFamily> {
        let mut all = Vec::new();
        self.families_into(view, RENDER_CHUNK, &mut families::collect_into(&mut all));
        all
    }

    /// Every family in catalog order, passed to `sink` in parts of at most
    /// `chunk` series (see `FamilySet`).
    fn families_into<'s>(&self, view: View, chunk: usize, sink: &'s mut families::Sink<'s>) {
        let mut fams = FamilySet::new(view, chunk, sink);
        let owners = self.owners(view);
        self.gpu_call_families(&mut fams, &owners, view);
        self.failure_families(&mut fams);
        self.exposure_families(&mut fams, view);
        self.kfd_and_hardware_families(&mut fams, &owners, view);
        self.vram_families(&mut fams, view);
        self.memory_and_cpu_families(&mut fams, &owners, view);
        self.node_families(&mut fams);
        fams.finish();
    }

    fn gpu_call_families(&self, fams: &mut FamilySet, owners: &Owners, view: View) {
        // GPU calls: counters per result, durations per function (the kernel
        // keeps a histogram per result; they are merged here). Hot calls
        // counted at return only add to the counters and have no durations.
        // Both are per revision when scraped, with purged pods' totals, and
        // failures also per pod.
        let mut calls: BTreeMap<(u32, u32, u32, i32), u64> = BTreeMap::new();
        // Durations per tier when scraped, per function in the per-pod view.
        let mut durations: BTreeMap<(u32, u32, &'static str), LatencyHistogram> = BTreeMap::new();
        for (owner, k, s) in self.owned(owners, view, &self.gpu, |k| k.cgroup_id, &self.retired.gpu) {
            *calls.entry((owner, k.api, k.function, k.result)).or_default() += s.count;
            if let (0, Some(api)) = (k.untimed, Api::from_u32(k.api)) {
                let function = api.functions().get(k.function as usize);
                let split = match view {
                    View::Scrape => function.map_or("unknown", |f| f.tier.as_str()),
                    View::PerPod => function.map_or("unknown", |f| f.name),
                };
                durations.entry((owner, k.api, split)).or_default().add(s);
            }
        }
        let mut failures: BTreeMap<(u64, u32, u32, i32), u64> = BTreeMap::new();
        for (k, s) in self.gpu.iter().filter(|(k, _)| k.result != 0) {
            *failures.entry((k.cgroup_id, k.api, k.function, k.result)).or_default() += s.count;
        }
        let named = |api: u32, function: u32, result: i32| {
            let api = Api::from_u32(api)?;
            let function = crate::events::function_name(api, function);
            let result = result_name(api, result).map(str::to_string).unwrap_or_else(|| result.to_string());
            Some((api, function, result))
        };
        for ((owner, api, function, result), count) in &calls {
            let Some((api, function, result)) = named(*api, *function, *result) else { continue };
            let v = owner_labels(owners.get(*owner), view, &[api.as_str(), &function, &result]);
            fams.get(&GPU_API_CALLS).value(&v, *count as f64);
        }
        for ((owner, api, split), merged) in &durations {
            let Some(api) = Api::from_u32(*api) else { continue };
            let v = owner_labels(owners.get(*owner), view, &[api.as_str(), split]);
            fams.get(&GPU_API_CALL_DURATION).latency(&v, merged);
        }
        for ((cgroup, api, function, result), count) in &failures {
            let Some((api, function, result)) = named(*api, *function, *result) else { continue };
            let v = self.vals(*cgroup, &[api.as_str(), &function, &result]);
            fams.get(&GPU_API_CALL_FAILURES).value(&v, *count as f64);
        }
    }

    /// What the judge weighs events against, per revision in either view.
    fn exposure_families(&self, fams: &mut FamilySet, view: View) {
        // A family at a time: a render passes families on in catalog order.
        let totals = || self.exposure.totals().map(|(key, e)| (retired_owner(key), e));
        for (owner, e) in totals() {
            for (api, n) in &e.startups {
                fams.get(&GPU_STARTUPS).value(&owner_labels(&owner, view, &[api]), *n as f64);
            }
        }
        for (owner, e) in totals() {
            for (api, n) in &e.startup_failures {
                fams.get(&GPU_STARTUP_FAILURES).value(&owner_labels(&owner, view, &[api]), *n as f64);
            }
        }
        for (owner, e) in totals() {
            fams.get(&POD_SECONDS).value(&owner_labels(&owner, view, &[]), e.pod_seconds_shown());
        }
        for (owner, e) in totals() {
            fams.get(&PROCESS_STARTS).value(&owner_labels(&owner, view, &[]), e.process_starts as f64);
        }
    }

    /// Init failures, stalls, crashes, OOM kills and abnormal exits.
    fn failure_families(&self, fams: &mut FamilySet) {
        for ((cgroup, api, function, result), n) in &self.init_failures {
            fams.get(&GPU_INIT_FAILURES).value(&self.vals(*cgroup, &[api, function, result]), *n as f64);
        }
        for (cgroup, version) in &self.driver_versions {
            fams.get(&GPU_DRIVER_VERSION).value(&self.vals(*cgroup, &[]), f64::from(*version));
        }
        for ((cgroup, api, function), n) in &self.stalled {
            fams.get(&GPU_API_STALLED_CALLS).value(&self.vals(*cgroup, &[api, function]), *n as f64);
        }
        for ((cgroup, signal, library), n) in &self.crashes {
            fams.get(&NATIVE_CRASHES).value(&self.vals(*cgroup, &[signal, library]), *n as f64);
        }
        for ((cgroup, scope), n) in &self.ooms {
            fams.get(&OOM_KILLS).value(&self.vals(*cgroup, &[scope]), *n as f64);
        }
        for ((cgroup, (signal, cause, scope, reason)), n) in &self.exits {
            fams.get(&ABNORMAL_EXITS).value(&self.vals(*cgroup, &[signal, cause, scope, reason]), *n as f64);
        }
    }

    fn kfd_and_hardware_families(&self, fams: &mut FamilySet, owners: &Owners, view: View) {
        // KFD ioctls: as GPU calls, counters per result and durations per
        // ioctl per revision, failures also per pod.
        let mut ioctls: BTreeMap<(u32, u32, i32), u64> = BTreeMap::new();
        let mut by_ioctl: BTreeMap<(u32, u32), LatencyHistogram> = BTreeMap::new();
        for (owner, k, s) in self.owned(owners, view, &self.kfd, |k| k.cgroup_id, &self.retired.kfd) {
            *ioctls.entry((owner, k.nr, k.result)).or_default() += s.count;
            by_ioctl.entry((owner, k.nr)).or_default().add(s);
        }
        let errno = |r: i32| match r {
            0 => "0".to_string(),
            r => crate::names::errno_name(-r).map(str::to_string).unwrap_or_else(|| r.to_string()),
        };
        for ((owner, nr, result), count) in &ioctls {
            let (ioctl, result) = (crate::events::kfd_ioctl_label(*nr), errno(*result));
            let v = owner_labels(owners.get(*owner), view, &[ioctl.as_str(), &result]);
            fams.get(&KFD_IOCTLS).value(&v, *count as f64);
        }
        for (k, s) in self.kfd.iter().filter(|(k, _)| k.result != 0) {
            let (ioctl, result) = (crate::events::kfd_ioctl_label(k.nr), errno(k.result));
            fams.get(&KFD_IOCTL_FAILURES).value(&self.vals(k.cgroup_id, &[&ioctl, &result]), s.count as f64);
        }
        for ((owner, nr), merged) in &by_ioctl {
            let ioctl = crate::events::kfd_ioctl_label(*nr);
            fams.get(&KFD_IOCTL_DURATION).latency(&owner_labels(owners.get(*owner), view, &[&ioctl]), merged);
        }

        let kinds = [
            (HwKind::MemoryFault, &GPU_MEMORY_FAULTS, &NODE_GPU_MEMORY_FAULTS),
            (HwKind::Reset, &GPU_RESETS, &NODE_GPU_RESETS),
            (HwKind::QueueEviction, &GPU_QUEUE_EVICTIONS, &NODE_GPU_QUEUE_EVICTIONS),
        ];
        for (kind, workload, _) in kinds {
            for ((cgroup, _), n) in self.hardware_by_cgroup.iter().filter(|((_, k), _)| *k == kind as u32) {
                fams.get(workload).value(&self.vals(*cgroup, &[]), *n as f64);
            }
        }
        for (kind, _, node) in kinds {
            fams.get(node).value(&[], self.hardware.get(&(kind as u32)).copied().unwrap_or(0) as f64);
        }
    }

    /// VRAM per container, what dead processes left per revision, and per
    /// GPU and node.
    fn vram_families(&self, fams: &mut FamilySet, view: View) {
        for ((cgroup, gpu), bytes) in &self.vram {
            let gpu = gpu.to_string();
            fams.get(&GPU_VRAM).value(&self.vals(*cgroup, &[&gpu]), *bytes as f64);
        }
        for (key, bytes) in &self.vram_stranded {
            fams.get(&GPU_VRAM_STRANDED).value(&owner_labels(&retired_owner(key), view, &[]), *bytes as f64);
        }
        for (gpu, bytes) in &self.vram_stranded_now {
            fams.get(&NODE_GPU_VRAM_STRANDED).value(&[&gpu.to_string()], *bytes as f64);
        }
        fams.get(&NODE_GPU_VRAM_STRANDED_UNATTRIBUTED).value(&[], self.vram_stranded_unattributed as f64);
    }

    fn memory_and_cpu_families(&self, fams: &mut FamilySet, owners: &Owners, view: View) {
        for (k, n) in &self.mem_limits {
            let Some(limit) = MemLimit::from_u32(k.limit) else { continue };
            fams.get(&MEMORY_LIMIT_REFUSALS).value(&self.vals(k.cgroup_id, &[limit.as_str()]), *n as f64);
        }
        let mut runq: BTreeMap<u32, LatencyHistogram> = BTreeMap::new();
        for (owner, _, h) in self.owned(owners, view, &self.runq, |c| *c, &self.retired.runq) {
            runq.entry(owner).or_default().add(h);
        }
        for (owner, h) in &runq {
            fams.get(&CPU_RUNQUEUE_LATENCY).latency(&owner_labels(owners.get(*owner), view, &[]), h);
        }
        type Number = (&'static MetricDecl, fn(&CpuSnapshot) -> f64);
        let numbers: [Number; 5] = [
            (&CPU_PERIODS, |c| c.periods as f64),
            (&CPU_THROTTLED_PERIODS, |c| c.throttled_periods as f64),
            (&CPU_THROTTLED_SECONDS, |c| c.throttled_ns as f64 * 1e-9),
            (&CPU_RUNNABLE_THREADS, |c| f64::from(c.runnable)),
            (&CPU_QUOTA_CORES, |c| c.quota_cores),
        ];
        // A family at a time: a render passes families on in catalog order.
        for (decl, number) in numbers {
            for (cgroup, c) in &self.cpu {
                fams.get(decl).value(&self.vals(*cgroup, &[]), number(c));
            }
        }
    }

    /// The node's own state: probes, hot-call selection, the gate, the
    /// pipeline's counters and the series budget.
    fn node_families(&self, fams: &mut FamilySet) {
        for p in &self.probes {
            fams.get(&PROBE_ATTACHED).value(&[p.probe, &p.target], if p.attached { 1.0 } else { 0.0 });
        }
        // The daemon's two reasons always have a series, so a rule can
        // tell "none selected" from "not exported".
        use crate::discovery::hot::Reason;
        for reason in [Reason::Canary, Reason::GpuTrouble] {
            if !self.hot.contains_key(&reason) {
                fams.get(&GPU_HOT_PROBED_PROCESSES).value(&[reason.as_str()], 0.0);
            }
        }
        for (reason, n) in &self.hot {
            fams.get(&GPU_HOT_PROBED_PROCESSES).value(&[reason.as_str()], *n as f64);
        }
        fams.get(&READINESS_GATE_ENABLED).value(&[], if self.gate.is_some() { 1.0 } else { 0.0 });
        if let Some(gate) = &self.gate {
            for (condition, n) in
                [("true", gate.pods_true), ("false", gate.pods_false), ("none", gate.pods_none)]
            {
                fams.get(&READINESS_GATE_PODS).value(&[condition], n as f64);
            }
            fams.get(&READINESS_GATE_PENDING).value(&[], gate.pending as f64);
            fams.get(&READINESS_GATE_PATCHES).value(&["ok"], gate.patches_ok as f64);
            fams.get(&READINESS_GATE_PATCHES).value(&["error"], gate.patches_failed as f64);
        }
        fams.get(&EVENTS_LOST).value(&[], self.events_lost as f64);
        fams.get(&DECODE_ERRORS).value(&[], self.decode_errors as f64);
        for (kind, n) in &self.records {
            fams.get(&RING_EVENTS).value(&[kind], *n as f64);
        }
        fams.get(&SERIES_OVERFLOW).value(&[], self.series_overflow as f64);
        fams.get(&TRACKED_CGROUPS).value(&[], self.series_labels.len() as f64);
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        events::Origin,
        exit_cause::{Cause, KillReason, Sender, SenderScope},
    };

    /// An exit; a sent one from the host, killed for a container restart.
    fn kill(signal: i32, exit_code: i32, cause: Cause) -> Detail {
        let sent = cause == Cause::Sent;
        Detail::Exit {
            signal,
            exit_code,
            core_dumped: false,
            cause,
            sender: sent.then(|| Sender {
                pid: 1,
                comm: "kubelet".into(),
                cgroup_id: 1,
                cgroup: Some("/".into()),
                scope: SenderScope::Host,
            }),
            kill_reason: sent.then_some(KillReason::ContainerRestart),
            vram: None,
        }
    }

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
            duration_ns: Some(10),
            driver_version: None,
        };
        m.record(&event(1, call(101)));
        m.record(&event(1, call(101)));
        m.record(&event(2, call(0)));
        m.refresh_labels(Duration::from_secs(60), labelled);
        let text = m.render_text();
        assert!(
            text.contains(r#"canaryscope_gpu_init_failures_total{namespace="ml",pod="pod-1",container="worker",workload="infer",revision="abc",track="canary",api="hip",function="hipInit",result="hipErrorInvalidDevice"} 2"#),
            "{text}"
        );
        assert!(!text.contains(r#"pod="pod-2""#), "a successful call is no failure: {text}");
    }

    #[test]
    fn an_unchanged_snapshot_in_another_order_is_no_change() {
        let mut m = Metrics::new(100);
        let h = |n| LatencyHistogram { count: n, ..Default::default() };
        m.set_runq(vec![(1, h(1)), (2, h(2))]);
        m.refresh_labels(Duration::from_secs(60), labelled);
        assert!(m.take_changed());
        let text = m.render_text();
        // Kernel maps list keys in hash order, which may differ next time.
        m.set_runq(vec![(2, h(2)), (1, h(1))]);
        m.refresh_labels(Duration::from_secs(60), labelled);
        assert!(!m.take_changed(), "same numbers, same labels");
        assert_eq!(m.render_text(), text);
        m.set_runq(vec![(2, h(3)), (1, h(1))]);
        assert!(m.take_changed(), "a histogram moved");
        m.record(&event(1, Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 }));
        assert!(m.take_changed(), "an event was counted");
    }

    #[test]
    fn gone_cgroups_are_dropped_after_the_grace_period() {
        let mut m = Metrics::new(100);
        m.record(&event(7, Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 }));
        m.refresh_labels(Duration::ZERO, labelled);
        assert!(m.render_text().contains("canaryscope_oom_kills_total"));
        let gone = |_| (WorkloadLabels::default(), Liveness::Gone);
        let purged = m.refresh_labels(Duration::ZERO, gone);
        assert_eq!(purged, vec![7]);
        assert!(!m.render_text().contains("canaryscope_oom_kills_total"));
    }

    #[test]
    fn the_cardinality_cap_counts_what_it_drops() {
        let mut m = Metrics::new(2);
        for cgroup in 1..=5 {
            m.record(&event(cgroup, kill(9, 0, Cause::Sent)));
        }
        assert_eq!(m.tracked_cgroups(), 2);
        assert_eq!(m.series_overflow, 3);
        assert!(m.render_text().contains("canaryscope_series_overflow_total 3"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut m = Metrics::new(10);
        m.record(&event(3, kill(9, 0, Cause::Sent)));
        m.refresh_labels(Duration::ZERO, |_| {
            (WorkloadLabels { workload: "a\"b\\c\nd".into(), ..Default::default() }, Liveness::Live)
        });
        let text = m.render_text();
        assert!(text.contains(r#"workload="a\"b\\c\nd""#), "{text}");
    }

    fn hist(count: u64, total_ns: u64, buckets: &[(usize, u64)]) -> observer_common::LatencyHistogram {
        let mut h = observer_common::LatencyHistogram { count, total_ns, ..Default::default() };
        for (i, n) in buckets {
            h.buckets[*i] = *n;
        }
        h
    }

    /// Every family populated, with merges across results and an unlabelled
    /// (gone, never resolved) cgroup.
    fn rich() -> Metrics {
        let mut m = Metrics::new(100);
        let call = |api, function: &str, result| Detail::GpuCall {
            api,
            library: "/x/lib.so".into(),
            function: function.into(),
            result,
            duration_ns: Some(10),
            driver_version: None,
        };
        m.record(&event(1, call(Api::Hip, "hipInit", 101)));
        m.record(&event(1, call(Api::Hip, "hipInit", 101)));
        m.record(&event(2, call(Api::Cuda, "cuInit", 100)));
        m.record(&event(2, call(Api::Cuda, "cuInit", 7777)));
        let crash = |library: Option<&str>| Detail::Crash {
            signal: 11,
            si_code: 1,
            addr: 0,
            ip: 0,
            library: library.map(str::to_string),
            library_offset: None,
            in_call: None,
            crash_tid: 1,
        };
        m.record(&event(1, crash(Some("/opt/rocm/lib/libamdhip64.so.5"))));
        m.record(&event(2, crash(None)));
        m.record(&event(1, Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 }));
        m.record(&event(2, Detail::OomKill { scope: "global", anon_rss_bytes: Some(1), victims: 1 }));
        m.record(&event(1, kill(9, 0, Cause::Sent)));
        m.record(&event(2, kill(0, 137, Cause::Wrapped)));
        let hw =
            |kind, attributed| Detail::GpuHardware { kind, function: "f", detail: String::new(), attributed };
        m.record(&event(0, hw(HwKind::MemoryFault, false)));
        m.record(&event(0, hw(HwKind::MemoryFault, false)));
        m.record(&event(0, hw(HwKind::Reset, false)));
        m.record(&event(0, hw(HwKind::QueueEviction, false)));
        m.record(&event(1, hw(HwKind::MemoryFault, true)));
        m.record(&event(2, hw(HwKind::QueueEviction, true)));
        m.record(&event(2, hw(HwKind::Reset, true)));
        m.set_stalled([(1, Api::Hip, "hipMemcpy".to_string()), (1, Api::Hip, "hipMemcpy".to_string())]);
        m.set_driver_versions(vec![(2, 12020)]);
        m.set_vram(vec![(1, 48879, 2 << 30), (2, 1234, 0), (2, 48879, 1 << 30)]);
        m.set_vram_stranded(vec![(1234, 0), (48879, 3 << 30)]);
        let stranded = |attributed| Detail::GpuVramStranded {
            gpu: 48879,
            bytes: 1 << 30,
            held_bytes: 2 << 30,
            cause: Some(Cause::Fault),
            attributed,
        };

        let gk =
            |cgroup_id, api, function, result| GpuStatsKey { cgroup_id, api, function, result, untimed: 0 };
        m.set_gpu(vec![
            (gk(1, 0, 0, 0), hist(3, 3_000, &[(0, 1), (10, 2)])),
            (gk(1, 0, 0, 101), hist(1, 1_500_000_000, &[(31, 1)])),
            (gk(1, 0, 2, 0), hist(2, 20, &[(3, 2)])),
            (gk(2, 1, 1, 0), hist(4, 4_000_000, &[(20, 4)])),
            (gk(2, 1, 9999, -5), hist(1, 7, &[(2, 1)])),
            (gk(3, 0, 1, 0), hist(1, 1, &[(0, 1)])),
            (gk(2, 42, 0, 0), hist(1, 1, &[(0, 1)])),
        ]);
        let kk = |cgroup_id, nr, result| KfdStatsKey { cgroup_id, nr, result };
        m.set_kfd(vec![
            (kk(1, 0x01, 0), hist(5, 5_000, &[(9, 5)])),
            (kk(1, 0x01, -22), hist(1, 100, &[(6, 1)])),
            (kk(2, 0xee, -4095), hist(2, 2, &[(1, 2)])),
        ]);
        m.set_runq(vec![(1, hist(6, 6_000_000, &[(0, 1), (15, 4), (25, 1)])), (2, hist(0, 0, &[]))]);
        let mk = |cgroup_id, limit: MemLimit| MemLimitKey { cgroup_id, limit: limit as u32, _pad: 0 };
        // An unknown limit number (a newer kernel side) is skipped, not mislabelled.
        m.set_mem_limits(vec![
            (mk(1, MemLimit::As), 4127),
            (mk(2, MemLimit::Data), 3),
            (MemLimitKey { cgroup_id: 1, limit: 7, _pad: 0 }, 1),
        ]);
        let cpu = |periods, runnable, quota_cores| CpuSnapshot {
            periods,
            throttled_periods: periods / 2,
            throttled_ns: 1_234_567_890,
            runnable,
            quota_cores,
        };
        m.set_cpu(vec![(0, cpu(1, 1, 1.0)), (1, cpu(100, 3, 0.5)), (2, cpu(7, 0, 2.25))]);
        m.probes = vec![
            ProbeStatus {
                probe: "gpu",
                target: "/x/libamdhip64.so".into(),
                attached: true,
                detail: String::new(),
            },
            ProbeStatus { probe: "kfd", target: "kfd_ioctl".into(), attached: false, detail: "no".into() },
        ];
        m.gate = Some(crate::gate::patcher::Summary {
            pods_true: 2,
            pods_false: 1,
            pods_none: 1,
            pending: 1,
            patches_ok: 5,
            patches_failed: 2,
        });
        m.events_lost = 17;
        m.decode_errors = 2;
        m.series_overflow = 4;
        m.records = BTreeMap::from([("gpu_call", 12), ("exit", 3)]);
        m.refresh_labels(Duration::from_secs(600), |cgroup| match cgroup {
            3 => (WorkloadLabels::default(), Liveness::Gone),
            c => labelled(c),
        });
        // Put on a revision once its pod's labels are known.
        m.record(&event(1, stranded(true)));
        m.record(&event(2, stranded(false)));
        m
    }

    #[test]
    fn a_render_in_parts_of_one_series_is_the_render_in_one_part() {
        let m = rich();
        for view in [View::Scrape, View::PerPod] {
            let whole = m.render_in_parts(view, 0, usize::MAX);
            assert_eq!(
                String::from_utf8_lossy(&m.render_in_parts(view, 0, 1)),
                String::from_utf8_lossy(&whole)
            );
            assert_eq!(m.render(view, 0), whole);
        }
    }

    #[test]
    fn every_family_renders_as_declared() {
        for view in [View::Scrape, View::PerPod] {
            families_render_as_declared(view);
        }
    }

    fn families_render_as_declared(view: View) {
        let families = rich().families(view);
        let rendered: Vec<&str> = families.iter().map(|f| f.name()).collect();
        let declared: Vec<String> = CATALOG.iter().map(|d| format!("{PREFIX}{}", d.name)).collect();
        assert_eq!(rendered, declared, "the fixture populates every family, in catalog order");
        for (f, d) in families.iter().zip(CATALOG) {
            assert_eq!(f.help(), d.help);
            let kind = match d.kind {
                Kind::Counter => prometheus::proto::MetricType::COUNTER,
                Kind::Gauge => prometheus::proto::MetricType::GAUGE,
                Kind::Histogram => prometheus::proto::MetricType::HISTOGRAM,
            };
            assert_eq!(f.get_field_type(), kind, "{}", d.name);
            let names: Vec<&str> = d.label_names_in(view).collect();
            for m in f.get_metric() {
                let got: Vec<&str> = m.get_label().iter().map(|l| l.name()).collect();
                assert_eq!(got, names, "{}: a sample's labels differ from the declaration", d.name);
                // The plain data model has no field presence: a sample of
                // another type shows as a non-default field of that type.
                let counter = *m.get_counter() != Default::default();
                let gauge = *m.get_gauge() != Default::default();
                let histogram = !m.get_histogram().get_bucket().is_empty();
                let ok = match d.kind {
                    Kind::Counter => !gauge && !histogram,
                    Kind::Gauge => !counter && !histogram,
                    Kind::Histogram => !counter && !gauge && histogram,
                };
                assert!(ok, "{}: a sample of another type", d.name);
            }
        }
    }

    #[test]
    fn exits_are_counted_by_cause_with_bounded_labels() {
        let mut m = Metrics::new(10);
        m.record(&event(1, kill(9, 0, Cause::Sent)));
        m.record(&event(1, kill(9, 0, Cause::Sent)));
        m.record(&event(1, kill(9, 0, Cause::OomKill)));
        m.record(&event(1, kill(0, 137, Cause::Wrapped)));
        let text = m.render_text();
        let line = |labels: &str| {
            text.lines()
                .find(|l| l.starts_with("canaryscope_abnormal_exits_total{") && l.contains(labels))
                .unwrap_or_else(|| panic!("no series with {labels} in {text}"))
                .to_string()
        };
        let sent =
            line(r#"signal="SIGKILL",cause="sent",sender_scope="host",kill_reason="container_restart""#);
        assert!(sent.ends_with(" 2"), "{sent}");
        assert!(!sent.contains("kubelet"), "never a comm in a label: {sent}");
        line(r#"signal="SIGKILL",cause="oom_kill",sender_scope="none",kill_reason="none""#);
        line(r#"signal="exit137",cause="wrapped",sender_scope="none",kill_reason="none""#);
    }

    #[test]
    fn calls_counted_at_return_add_to_the_counter_and_not_to_durations() {
        let mut m = Metrics::new(10);
        let key = |function, untimed| GpuStatsKey { cgroup_id: 1, api: 0, function, result: 0, untimed };
        let counted = LatencyHistogram { count: 5, ..LatencyHistogram::default() };
        m.set_gpu(vec![
            (key(0, 0), hist(3, 3_000, &[(0, 1), (10, 2)])),
            (key(0, 1), counted),
            (key(1, 1), counted),
        ]);
        let text = m.render_text();
        let timed_function = format!("function=\"{}\"", crate::events::function_name(Api::Hip, 0));
        let counted_only = format!("function=\"{}\"", crate::events::function_name(Api::Hip, 1));
        let sample = |prefix: &str, function: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix) && l.contains(function))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        let calls = "canaryscope_gpu_api_calls_total{";
        assert_eq!(sample(calls, &timed_function), Some(8.0), "one series, both counts: {text}");
        assert_eq!(text.lines().filter(|l| l.starts_with(calls)).count(), 2, "{text}");
        assert_eq!(sample(calls, &counted_only), Some(5.0), "{text}");
        let durations = "canaryscope_gpu_api_call_duration_seconds_count{";
        // Scraped, durations are per tier: the timed calls alone.
        assert_eq!(sample(durations, "tier=\"cold\""), Some(3.0), "timed calls only: {text}");
        let per_pod = m.render_text_in(View::PerPod);
        let sample = |prefix: &str, function: &str| {
            per_pod
                .lines()
                .find(|l| l.starts_with(prefix) && l.contains(function))
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        };
        assert_eq!(sample(durations, &timed_function), Some(3.0), "timed calls only: {per_pod}");
        // A function only counted has no duration series: an empty one would
        // read as a function that was never called.
        assert_eq!(sample(durations, &counted_only), None, "{per_pod}");
    }

    #[test]
    fn decode_errors_are_a_node_counter() {
        let mut m = Metrics::new(10);
        m.decode_errors = 3;
        let text = m.render_text();
        assert!(
            text.contains(
                "# HELP canaryscope_decode_errors_total Ring-buffer records that could not be decoded \
                 (a kernel/userspace layout mismatch); their events are lost.\n\
                 # TYPE canaryscope_decode_errors_total counter\n\
                 canaryscope_decode_errors_total 3\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn vram_is_per_container_and_what_a_death_left_per_revision() {
        let mut m = Metrics::new(10);
        m.set_vram(vec![(1, 48879, 2 << 30), (1, 1234, 0)]);
        m.refresh_labels(Duration::from_secs(60), labelled);
        let text = m.render_text();
        let pod =
            r#"namespace="ml",pod="pod-1",container="worker",workload="infer",revision="abc",track="canary""#;
        assert!(
            text.contains(&format!("canaryscope_gpu_vram_bytes{{{pod},gpu=\"48879\"}} 2147483648\n")),
            "{text}"
        );
        assert!(!text.contains("gpu=\"1234\""), "a GPU it never held memory on has no series: {text}");
        // Freed: the series stays at 0 while the container lives.
        m.set_vram(vec![(1, 1234, 0)]);
        assert!(m.take_changed());
        assert!(m.render_text().contains(&format!("canaryscope_gpu_vram_bytes{{{pod},gpu=\"48879\"}} 0\n")));
        let stranded = |attributed| Detail::GpuVramStranded {
            gpu: 48879,
            bytes: 1 << 30,
            held_bytes: 2 << 30,
            cause: Some(Cause::Fault),
            attributed,
        };
        m.record(&event(1, stranded(true)));
        m.record(&event(1, stranded(true)));
        m.record(&event(1, stranded(false)));
        m.record(&event(9, stranded(true)));
        let text = m.render_text();
        let revision = r#"namespace="ml",workload="infer",revision="abc",track="canary""#;
        assert!(
            text.contains(&format!("canaryscope_gpu_vram_stranded_bytes_total{{{revision}}} 2147483648\n")),
            "{text}"
        );
        // Put on no pod, and a cgroup whose labels are unknown.
        assert!(
            text.contains("canaryscope_node_gpu_vram_stranded_unattributed_bytes_total 2147483648\n"),
            "{text}"
        );
        m.set_vram_stranded(vec![(48879, 3 << 30)]);
        assert!(m
            .render_text()
            .contains("canaryscope_node_gpu_vram_stranded_bytes{gpu=\"48879\"} 3221225472\n"));
        let gone = |_| (WorkloadLabels::default(), Liveness::Gone);
        m.refresh_labels(Duration::ZERO, gone);
        m.refresh_labels(Duration::ZERO, gone);
        let text = m.render_text();
        assert!(!text.contains("canaryscope_gpu_vram_bytes{"), "gone with its cgroup: {text}");
        assert!(
            !text.contains("canaryscope_gpu_vram_stranded_bytes_total{"),
            "gone with its revision: {text}"
        );
    }

    #[test]
    fn the_stranded_familys_help_names_the_settle_time() {
        let settle = format!("{} s after", crate::pipeline::vram::SETTLE.as_secs());
        assert!(GPU_VRAM_STRANDED.help.contains(&settle), "{}", GPU_VRAM_STRANDED.help);
    }
}
