//! The Prometheus side: what events and kernel aggregates mean as series,
//! labelled by workload, with gone pods dropped after a grace period and a
//! cap that protects Prometheus from a cardinality explosion.
//!
//! One file per family owns its state, its recording and its rendering;
//! `series` holds the rule they all follow: a series is its label set.
pub mod catalog;
mod context;
pub mod contract;
mod cpu;
pub mod decl;
mod exits;
pub mod exposition;
pub mod exposure;
pub mod families;
pub mod fetch;
mod gpu_calls;
mod gpu_library_loads;
mod gpu_never_initialized;
mod hardware;
mod http;
mod kfd;
mod kills;
mod node;
mod oom;
pub mod recorder;
pub mod revision;
mod runs;
pub mod series;
pub mod server;
mod vram;

use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, Instant},
};

use catalog::*;
use context::Render;
use families::FamilySet;
use observer_common::{
    gpu::{Api, GpuStats, GpuStatsKey},
    kfd::{KfdStats, KfdStatsKey},
    memlimit::MemLimitKey,
    sched::RunqHistogram,
};
use prometheus::{Encoder, TextEncoder};
use revision::{owner_labels, retired_owner, revision_key, Retired, RevisionKey};
use series::{Admission, OnNode, Series};

pub use node::NodeState;

use crate::{
    attribution::labels::Resolved,
    cpu::CpuSnapshot,
    events::{Detail, Event},
    probes::ProbeStatus,
};

#[derive(Default)]
pub struct Metrics {
    /// Every tracked cgroup's labels, under the cap.
    series: Series,
    gpu: gpu_calls::GpuCalls,
    exits: exits::Exits,
    oom: oom::Oom,
    library_loads: gpu_library_loads::GpuLibraryLoads,
    never_initialized: gpu_never_initialized::GpuNeverInitialized,
    kfd: kfd::Kfd,
    hardware: hardware::Hardware,
    vram: vram::Vram,
    cpu: cpu::Cpu,
    http: http::Http,
    runs: runs::Runs,
    kills: kills::Kills,
    pub node: NodeState,
    /// What purged pods left to their revisions' shared series.
    retired: Retired,
    /// The canary judge's exposure per revision (start-ups, pod-seconds,
    /// process starts).
    exposure: exposure::Exposure,
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

/// Cgroups whose series were removed; the caller drops their kernel entries.
pub type Purged = Vec<u64>;

impl Metrics {
    pub fn new(max_cgroups: usize) -> Self {
        // Changed: the first exposition is rendered before anything happens.
        Self { series: Series::new(max_cgroups), changed: true, ..Default::default() }
    }

    /// Admits a cgroup under the cardinality cap.
    fn admit(&mut self, cgroup: u64) -> bool {
        let admission = self.series.admit(cgroup);
        // A new cgroup and a refused one both change what a scrape shows.
        self.changed |= admission != Admission::Known;
        admission.admitted()
    }

    pub fn record(&mut self, event: &Event) {
        self.changed = true;
        let cgroup = event.origin.cgroup_id;
        match &event.detail {
            Detail::GpuCall { api, function, result, .. } => {
                if *result != 0 && observer_common::gpu::is_init_function(function) && self.admit(cgroup) {
                    self.exposure.init_failed(cgroup, *api);
                    self.gpu.init_failed(cgroup, *api, function, *result);
                }
            }
            Detail::Crash { .. } | Detail::Exit { .. } => {
                if self.admit(cgroup) {
                    self.exits.record(cgroup, &event.detail);
                    if let Detail::Crash { .. } = event.detail {
                        self.kills.killed(cgroup, "crash", event.origin.ts_ns);
                    }
                }
            }
            Detail::OomKill { scope, .. } => {
                if self.admit(cgroup) {
                    self.oom.killed(cgroup, scope);
                    self.kills.killed(cgroup, "oom_kill", event.origin.ts_ns);
                }
            }
            Detail::RunEnded { executable, duration_ns, ending, .. } => {
                if self.admit(cgroup) {
                    self.runs.ended(cgroup, executable, *duration_ns, *ending);
                }
            }
            Detail::GpuHardware { kind, attributed, .. } => {
                if *attributed && cgroup != 0 && self.admit(cgroup) {
                    self.hardware.on_pod(cgroup, *kind);
                } else {
                    self.hardware.on_node(*kind);
                }
            }
            Detail::GpuVramStranded { bytes, attributed, .. } => {
                let known = *attributed && cgroup != 0 && self.admit(cgroup);
                let labels = self.series.get(cgroup).filter(|_| known).map(|t| &t.labels);
                self.vram.left(labels, *bytes);
            }
            Detail::GpuStall { .. }
            | Detail::KfdIoctl { .. }
            // Counted in the kernel, every call; records are rate-limited.
            | Detail::MemoryLimitRefusal { .. }
            | Detail::CpuThrottle { .. }
            | Detail::CpuOversubscribed { .. }
            | Detail::LibraryProbed { .. } => {}
            Detail::HttpRequest { class, duration_ns, probe, .. } => {
                if self.admit(cgroup) {
                    self.http.request(cgroup, class, *duration_ns, *probe);
                }
            }
            Detail::HttpUnparsed { protocol } => {
                if self.admit(cgroup) {
                    self.http.unparsed(cgroup, protocol);
                }
            }
            Detail::LibraryLoadFailed { library, missing, gpu_library, .. } => {
                if self.admit(cgroup) {
                    self.library_loads.failed(cgroup, library, missing);
                    // A start-up that failed before any GPU call: the judge's too.
                    self.exposure.init_failed(cgroup, gpu_library_api(gpu_library));
                }
            }
        }
    }

    /// VRAM per (cgroup, KFD gpu_id) of live processes now.
    pub fn set_vram(&mut self, vram: Vec<(u64, u32, u64)>) {
        let mut admitted_new = false;
        let series = &mut self.series;
        let admit = |cgroup| {
            let admission = series.admit(cgroup);
            admitted_new |= admission != Admission::Known;
            admission.admitted()
        };
        let moved = self.vram.set_held(vram, admit);
        self.changed |= moved || admitted_new;
    }

    /// The running containers that requested a GPU, each with whether it
    /// is past the timeout without a successful GPU initialisation.
    pub fn set_gpu_never_initialized(&mut self, verdicts: Vec<(u64, bool)>) {
        let now = self.admitted(verdicts, |cgroup| *cgroup);
        let now =
            now.into_iter().map(|(cgroup, never)| ((cgroup, ()), if never { 1.0 } else { 0.0 })).collect();
        self.changed |= self.never_initialized.set(now);
    }

    /// Stranded VRAM per KFD gpu_id now.
    pub fn set_vram_stranded(&mut self, stranded: Vec<(u32, u64)>) {
        self.changed |= self.vram.set_stranded_now(stranded);
    }

    /// Calls in flight past the stall threshold right now.
    pub fn set_stalled(&mut self, stalled: impl IntoIterator<Item = (u64, Api, String)>) {
        let mut now = BTreeMap::new();
        for (cgroup, api, function) in stalled {
            if self.admit(cgroup) {
                *now.entry((cgroup, (api.as_str(), function))).or_default() += 1.0;
            }
        }
        self.changed |= self.gpu.set_stalled(now);
    }

    // Kernel maps and directory walks list their entries in no fixed
    // order; sorted, an unchanged snapshot renders the same bytes.

    pub fn set_gpu(&mut self, stats: Vec<(GpuStatsKey, GpuStats)>) {
        let now = self.admitted(stats, |k| k.cgroup_id);
        let (changed, initialised) = self.gpu.set_stats(now);
        for (cgroup, api) in initialised {
            self.exposure.init_called(cgroup, api);
        }
        self.changed |= changed;
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
        let now = now.into_iter().map(|(cgroup, v)| ((cgroup, ()), f64::from(v))).collect();
        self.changed |= self.gpu.set_driver_versions(now);
    }

    pub fn set_kfd(&mut self, stats: Vec<(KfdStatsKey, KfdStats)>) {
        let now = self.admitted(stats, |k| k.cgroup_id);
        self.changed |= self.kfd.set_stats(now);
    }

    pub fn set_runq(&mut self, runq: Vec<(u64, RunqHistogram)>) {
        let now = self.admitted(runq, |c| *c);
        self.changed |= self.cpu.set_runq(now);
    }

    pub fn set_mem_limits(&mut self, refusals: Vec<(MemLimitKey, u64)>) {
        let now = self.admitted(refusals, |k| k.cgroup_id);
        self.changed |= self.oom.set_refusals(now);
    }

    pub fn set_cpu(&mut self, cpu: Vec<(u64, CpuSnapshot)>) {
        let cpu = cpu.into_iter().filter(|(c, _)| *c != 0).collect();
        let now = self.admitted(cpu, |c| *c);
        self.changed |= self.cpu.set_snapshots(now);
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
        let now = NodeState { probes, hot, gate: self.node.gate, events_lost, decode_errors, records };
        self.changed |= now != self.node;
        self.node = now;
    }

    /// TCP segments of pods the kernel had no ring room for.
    pub fn set_http_segments_lost(&mut self, lost: u64) {
        self.changed |= lost != self.http.segments_lost;
        self.http.segments_lost = lost;
    }

    /// The readiness gate's numbers (`None`: the gate is off).
    pub fn set_gate(&mut self, gate: Option<crate::gate::patcher::Summary>) {
        self.changed |= gate != self.node.gate;
        self.node.gate = gate;
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

    /// Binds every tracked cgroup's labels anew (gone ones too: see
    /// `series`); series of cgroups gone longer than `grace` are folded into
    /// their label sets' totals and returned, so their kernel map entries
    /// can go too. `listed`: (namespace, pod) of the pods the API lists on
    /// this node, whose purged cgroups' counts stay in their series.
    pub fn refresh_labels(
        &mut self,
        grace: Duration,
        listed: &HashSet<(String, String)>,
        mut resolve: impl FnMut(u64) -> Resolved,
    ) -> Purged {
        let now = Instant::now();
        let mut purged = Vec::new();
        let mut relabelled = false;
        for cgroup in self.series.cgroups() {
            let rebound = self.series.rebind(cgroup, resolve(cgroup), now);
            relabelled |= rebound.relabelled;
            if rebound.gone_for.is_some_and(|gone| gone >= grace) {
                purged.push(cgroup);
            }
        }
        // A provisional label set may be shown, or moved, at any refresh.
        self.changed |= relabelled || !purged.is_empty() || self.series.any_provisional();
        let live = self.series.iter().filter(|(_, t)| t.gone_since.is_none());
        self.changed |= self.exposure.account(now, live.map(|(c, t)| (*c, &t.labels)));
        for cgroup in &purged {
            self.retire(*cgroup);
        }
        if !purged.is_empty() {
            let on_node = OnNode { tracked: self.series.pods(), listed };
            self.gpu.keep_pods(&on_node);
            self.exits.keep_pods(&on_node);
            self.oom.keep_pods(&on_node);
            self.library_loads.keep_pods(&on_node);
            self.kfd.keep_pods(&on_node);
            self.hardware.keep_pods(&on_node);
            self.cpu.keep_pods(&on_node);
            self.http.keep_pods(&on_node);
            self.kills.keep_pods(&on_node);
            let live: HashSet<RevisionKey> =
                self.series.iter().map(|(_, t)| revision_key(&t.labels)).collect();
            self.retired.keep_only(&live);
            self.exposure.keep_only(&live);
            self.vram.keep_revisions(&live);
            self.http.keep_revisions(&live);
            self.runs.keep_revisions(&live);
        }
        purged
    }

    /// Hands a purged cgroup's totals to its label set and its revision.
    fn retire(&mut self, cgroup: u64) {
        let Some(tracked) = self.series.remove(cgroup) else { return };
        let labels = &tracked.labels;
        self.gpu.retire(cgroup, labels, &mut self.retired);
        self.exits.retire(cgroup, labels);
        self.oom.retire(cgroup, labels);
        self.library_loads.retire(cgroup, labels);
        self.never_initialized.retire(cgroup);
        self.kfd.retire(cgroup, labels, &mut self.retired);
        self.hardware.retire(cgroup, labels);
        self.cpu.retire(cgroup, labels, &mut self.retired);
        self.http.retire(cgroup, labels);
        self.runs.retire(cgroup, labels);
        self.kills.retire(cgroup, labels);
        self.vram.retire(cgroup);
        self.exposure.forget(cgroup);
    }

    /// Whether the cgroup has series (admitted under the cap).
    pub fn is_tracked(&self, cgroup: u64) -> bool {
        self.series.contains(cgroup)
    }

    #[cfg(test)]
    pub fn tracked_cgroups(&self) -> usize {
        self.series.len()
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

    #[cfg(test)]
    fn families(&self, view: View) -> Vec<prometheus::proto::MetricFamily> {
        let mut all = Vec::new();
        self.families_into(view, RENDER_CHUNK, &mut families::collect_into(&mut all));
        all
    }

    /// Every family in catalog order, passed to `sink` in parts of at most
    /// `chunk` series (see `FamilySet`).
    fn families_into<'s>(&self, view: View, chunk: usize, sink: &'s mut families::Sink<'s>) {
        let mut fams = FamilySet::new(CATALOG, view, chunk, sink);
        let r = Render::new(&self.series, &self.retired, view);
        self.gpu.render_calls(&mut fams, &r);
        self.gpu.render_pod_state(&mut fams, &r);
        self.library_loads.render(&mut fams, &r);
        self.never_initialized.render(&mut fams, &r);
        self.exits.render_crashes(&mut fams, &r);
        self.oom.render_kills(&mut fams, &r);
        self.exits.render_exits(&mut fams, &r);
        self.kills.render(&mut fams, &r);
        self.exposure_families(&mut fams, view);
        self.kfd.render(&mut fams, &r);
        self.hardware.render(&mut fams, &r);
        self.vram.render(&mut fams, &r);
        self.oom.render_refusals(&mut fams, &r);
        self.cpu.render(&mut fams, &r);
        self.http.render(&mut fams, &r);
        self.runs.render(&mut fams, &r);
        self.node.render(&mut fams, &self.series);
        fams.finish();
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
}

#[cfg(test)]
mod tests;

/// The API layer a failed library load counts under for the judge: AMD's
/// libraries under HIP, the others under the CUDA runtime, which a
/// framework's start-up calls first.
fn gpu_library_api(gpu_library: &str) -> observer_common::gpu::Api {
    use observer_common::gpu::Api;
    const AMD: [&str; 7] =
        ["libamdhip64", "libhip", "librocm", "librocblas", "libMIOpen", "librccl", "libhsa"];
    if AMD.iter().any(|p| gpu_library.starts_with(p)) {
        Api::Hip
    } else {
        Api::Cudart
    }
}
