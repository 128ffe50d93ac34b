//! One observing pipeline. Records flow one way: the [`reader`] hands raw
//! ring-buffer records to [`Pipeline::handle`], which decodes and attributes
//! them ([`attribute`]) or passes discovery records to the library tracker;
//! out come events. Stall scans and CPU samples return data that each
//! consumer turns into what it needs.
pub mod attribute;
pub mod http;
pub mod kill_reasons;
pub mod never_initialized;
mod oom_groups;
mod ran_since;
pub mod reader;
pub mod runq_scope;
mod runs;
pub mod stalls;
pub mod vram;

use std::{collections::HashMap, path::PathBuf};

use crate::{
    attribution::{kube::PodCache, CgroupResolver},
    config,
    config::Families,
    cpu::{CpuFinding, CpuMonitor, CpuSnapshot, RunActivity},
    discovery::hold_scope::{PodChoice, PodHold},
    discovery::{
        hold::{Hold, HoldError},
        hot::{CanaryJudge, HotCounts, Policy},
        tracker::{Announcement, ExplicitLibraryError, LibraryTracker},
    },
    events::{Detail, Event, Origin, Raw},
    exit_cause::{Cause, SenderScope},
    probes::{self, gpu::GpuProbes, table, KernelSettings, LoadError, Loaded, ProbeStatus},
};
use attribute::Attributor;
use observer_common::{
    exit::{ExitEvent, EXIT_FLAG_RUN},
    gpu::Api,
};
use reader::Ring;
use stalls::{Stall, StallDetector};

/// How often KFD's process table is read (a process that faults and dies
/// within this after opening /dev/kfd is attributed only if still listed).
const KFD_REFRESH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Options {
    pub settings: KernelSettings,
    /// Libraries named by the user; failing to probe one of them is an error.
    pub explicit_libs: Vec<PathBuf>,
    pub stall_threshold_ns: u64,
    pub families: Families,
    /// Stop a process that maps an unknown GPU runtime file until its
    /// probes exist (`--hold`).
    pub hold: bool,
    /// Hold only the processes of cgroups named later (canary and gated pods', see
    /// `discovery::hold_scope`); the watchdog is started as for `hold`.
    pub hold_scoped: bool,
    /// See KFD ioctls through the syscall fallback even where the
    /// `kfd_ioctl` kprobe would work (tests of the fallback).
    pub kfd_syscall_fallback: bool,
    /// Probe GPU functions with a perf-event link each even where the
    /// kernel has `uprobe_multi` (the bench's baseline).
    pub per_function_uprobes: bool,
    /// Which processes get the hot tier of GPU functions.
    pub hot_policy: Policy,
    /// What the hot tier's probes record in a selected process.
    pub hot_detail: crate::config::HotDetail,
    /// Cgroup prefixes whose tasks get run-queue histograms besides the
    /// kubepods hierarchy; `None` when nobody reads them (`trace`).
    pub runq_prefixes: Option<Vec<String>>,
}

impl Options {
    /// What every command starts from: the `families` to attach, calls in
    /// flight past `stall_threshold_ns` are stalls (and the kernel's "slow"
    /// mark), hot calls go where `hot_policy` says and are counted. Nothing
    /// is held, no library is named and nobody reads run-queue histograms
    /// until a command says otherwise.
    pub fn new(families: Families, stall_threshold_ns: u64, hot_policy: Policy) -> Self {
        Self {
            settings: KernelSettings {
                gpu_emit_all: false,
                gpu_slow_ns: stall_threshold_ns,
                kfd_device: None,
                hold: false,
            },
            explicit_libs: Vec::new(),
            stall_threshold_ns,
            families,
            hold: false,
            hold_scoped: false,
            kfd_syscall_fallback: false,
            per_function_uprobes: false,
            hot_policy,
            hot_detail: crate::config::HotDetail::Counts,
            runq_prefixes: None,
        }
    }

    /// Libraries the user named (`--lib`).
    pub fn libs(mut self, libs: Vec<PathBuf>) -> Self {
        self.explicit_libs = libs;
        self
    }

    /// `--hold`: the kernel holds, and the pipeline resumes.
    pub fn hold(mut self, hold: bool) -> Self {
        self.hold = hold;
        self.settings.hold = hold;
        self
    }

    pub fn hot_detail(mut self, detail: crate::config::HotDetail) -> Self {
        self.hot_detail = detail;
        self
    }

    /// Run-queue histograms for kubepods and these cgroup prefixes.
    pub fn runq_prefixes(mut self, prefixes: Vec<String>) -> Self {
        self.runq_prefixes = Some(prefixes);
        self
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Library(#[from] ExplicitLibraryError),
    #[error("--hold: {0}")]
    Hold(#[from] HoldError),
}

/// Counters about the pipeline itself, for the exporter.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub records: std::collections::BTreeMap<&'static str, u64>,
    pub decode_errors: u64,
    pub events_lost: u64,
}

pub struct Pipeline {
    tracker: LibraryTracker,
    attribution: Attributor,
    stalls: StallDetector,
    cpu: Option<CpuMonitor>,
    /// Table-driven probes and the CPU monitor: attached or why not.
    statuses: Vec<ProbeStatus>,
    last_kfd_refresh: std::time::Instant,
    runq_scope: Option<runq_scope::RunqScope>,
    /// Cgroups whose tasks ran since the last CPU sample.
    ran_since: ran_since::RanSince,
    /// Programs started (exec records) per cgroup since the last
    /// [`Pipeline::take_process_starts`]: the judge's exposure.
    process_starts: std::collections::HashMap<u64, u64>,
    /// Host kills of pods' containers waiting for their pod's state.
    kill_reasons: kill_reasons::KillReasons,
    /// Pods' HTTP requests (the `http` family), when selected and loaded.
    http: Option<http::HttpStage>,
    /// Runs of programs pods start, from their exec to their exit.
    runs: runs::Runs,
    /// Dropped last, releasing every probe; by then the holding program is
    /// unloaded (see `Drop`) and the hold has resumed what it held.
    kernel: Loaded,
}

impl Pipeline {
    /// Loads, attaches and probes what is already there; returns the
    /// pipeline and its ring buffer, for the event loop to read.
    pub fn start(options: Options) -> Result<(Self, Ring), StartError> {
        let mut env = probes::environment();
        if options.kfd_syscall_fallback {
            env.kernel.hide(table::KFD_IOCTL);
        }
        if options.per_function_uprobes {
            env.kernel.hide(probes::uprobe_multi::KERNEL_FUNCTION);
        }
        let mut kernel = probes::load(&options.settings, &env)?;
        let ring = kernel.take_ring().ok_or(LoadError::MissingMap(observer_common::EVENTS_MAP))?;
        // The watchdog exists before any program that could hold a process.
        // Without the hold the map stays with the object: a program loads
        // only while every map it uses is still open.
        let hold = match (options.hold || options.hold_scoped) && options.families.gpu {
            true => kernel.take_held_map().map(Hold::start).transpose()?,
            false => None,
        };
        let mut statuses = table::attach_all(kernel.object_mut(), &env, options.families);
        let attribution = Attributor::new();
        let cgroup_root = attribution.cgroups().root().map(std::path::Path::to_path_buf);
        let cpu = options.families.sched.then(|| {
            let monitor = CpuMonitor::new(attribution.cgroups().root(), config::OVERSUBSCRIBED_AFTER);
            statuses.push(ProbeStatus {
                probe: "throttle",
                target: "cpu.stat".into(),
                attached: monitor.hierarchy().is_some(),
                detail: monitor.hierarchy().map(|h| h.describe()).unwrap_or_else(|| {
                    "no cgroup cpu controller found (kprobes on throttle_cfs_rq are unavailable here)".into()
                }),
            });
            monitor
        });
        let runq_scope =
            options.runq_prefixes.as_deref().filter(|_| options.families.sched).map(|prefixes| {
                let follows = |t: &str| statuses.iter().any(|s| s.attached && s.target == t);
                let follows = follows("cgroup_mkdir") && follows("cgroup_rmdir");
                runq_scope::RunqScope::start(prefixes, follows, &mut kernel)
            });
        let mut pipeline = Self {
            tracker: LibraryTracker::new(hold, options.hot_policy, options.hot_detail, cgroup_root),
            attribution,
            stalls: StallDetector::new(options.stall_threshold_ns),
            cpu,
            statuses,
            last_kfd_refresh: std::time::Instant::now(),
            runq_scope,
            ran_since: Default::default(),
            process_starts: Default::default(),
            kill_reasons: Default::default(),
            http: None,
            runs: Default::default(),
            kernel,
        };
        if options.families.http {
            let cgroup2 = pipeline.attribution.cgroups().root().map(std::path::Path::to_path_buf);
            let prefixes = options.runq_prefixes.clone().unwrap_or_default();
            pipeline.http = probes::http::HttpProbes::load(pipeline.kernel.object_mut())
                .map(|probes| http::HttpStage::new(probes, cgroup2, &prefixes));
            if let Some(stage) = &mut pipeline.http {
                stage.housekeeping(pipeline.kernel.object_mut());
            }
        }
        // After the programs that follow new cgroups are attached, so that
        // a cgroup is either walked here or added by the kernel.
        pipeline.refresh_runq_scope();
        // Before anything is scanned: scans leave unknown runtime files to
        // the kernel's reports only where those reports are live.
        let reported = |target: &str| {
            pipeline.statuses.iter().any(|s| s.probe == "discovery" && s.attached && s.target == target)
        };
        let names_mappings = env.offsets.have_vma != 0
            && env.offsets.have_fd_lookup != 0
            && reported("syscalls:sys_enter_mmap")
            && reported("syscalls:sys_exit_mmap");
        pipeline.tracker.set_kernel_names_mappings(names_mappings);
        if options.families.gpu {
            pipeline.tracker.probe_explicit(&mut pipeline.kernel, &options.explicit_libs)?;
            pipeline.tracker.probe_present(&mut pipeline.kernel);
        }
        Ok((pipeline, ring))
    }

    /// Turns records into events; libraries probed since the last call
    /// come first.
    pub fn handle(&mut self, records: &[Vec<u8>]) -> Vec<Event> {
        let mut out = Vec::new();
        for record in records {
            let Some(raw) = self.attribution.decode(record) else { continue };
            match raw {
                Raw::LibraryMap(ev) => self.tracker.code_mapped(&ev.header),
                Raw::Exec(ev) => {
                    *self.process_starts.entry(ev.header.cgroup_id).or_default() += 1;
                    let cgroup = self.attribution.cgroups_mut().path(ev.header.cgroup_id);
                    self.tracker.exec(&mut self.kernel, &ev.header, cgroup.as_deref())
                }
                Raw::GpuMap(ev) => self.tracker.gpu_file_mapped(&mut self.kernel, &ev),
                Raw::LibraryLoadFailed(ev) => {
                    self.announce(&mut out);
                    out.extend(self.load_failed(&ev));
                }
                Raw::RunExec(ev) => self.runs.exec(&ev),
                other => {
                    self.announce(&mut out);
                    let first = out.len();
                    let run_exit = match &other {
                        Raw::Exit(ev) if ev.flags & EXIT_FLAG_RUN != 0 => Some(ev.clone()),
                        _ => None,
                    };
                    out.extend(self.attribution.events(
                        other,
                        self.tracker.probes(),
                        self.tracker.code_ranges(),
                    ));
                    for event in &mut out[first..] {
                        self.add_driver_version(event);
                        if is_gpu_trouble(event) {
                            self.tracker.note_trouble(&mut self.kernel, event.origin.cgroup_id);
                        }
                        if let Detail::MemoryLimitRefusal { .. } = event.detail {
                            self.runs.refused(event.origin.pid);
                        }
                    }
                    let run = run_exit.and_then(|ev| {
                        let detail = self.runs.ended(&ev, run_death(&ev, &out[first..]))?;
                        Some(Event { origin: self.attribution.origin(&ev.header), detail })
                    });
                    let now = std::time::Instant::now();
                    let attributed: Vec<Event> = out.drain(first..).collect();
                    out.extend(attributed.into_iter().filter_map(|e| self.kill_reasons.settle(e, now)));
                    out.extend(run);
                }
            }
        }
        self.announce(&mut out);
        // handle() runs on every tick, so a group kill waiting on a
        // straggler is sent within a tick of its wait ending, and VRAM found
        // left behind within a tick of the reading that found it.
        out.extend(self.attribution.due_oom_kills());
        out.extend(self.attribution.due_vram_events());
        out.extend(self.kill_reasons.due(std::time::Instant::now()));
        if let Some(stage) = &mut self.http {
            let now = self.attribution.now();
            let attribution = &mut self.attribution;
            let origin = |cgroup_id| {
                let cgroup = attribution.cgroups_mut().path(cgroup_id);
                Origin { cgroup_id, cgroup, ..now.clone() }
            };
            stage.drain(origin, &mut out);
        }
        out
    }

    /// A descriptor of the HTTP ring to wait on, when the family runs: the
    /// programs wake it when the ring fills faster than the tick drains.
    pub fn http_ring_fd(&self) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
        self.http.as_ref().map(http::HttpStage::ring_fd)
    }

    /// TCP segments of pods the kernel had no ring room for.
    pub fn http_segments_lost(&self) -> u64 {
        self.http.as_ref().map_or(0, http::HttpStage::segments_lost)
    }

    /// A failed `dlopen`: an event when the library is a GPU library or
    /// needs one, with the file the process's loader could not find.
    fn load_failed(&mut self, ev: &observer_common::library_load::LoadFailedEvent) -> Option<Event> {
        let requested = observer_common::comm_str(&ev.name);
        let Some(failure) = crate::discovery::load_failure::explain(ev.header.pid, requested) else {
            log::debug!("pid {}: dlopen of {requested} failed (no GPU library)", ev.header.pid);
            return None;
        };
        let event = Event {
            origin: self.attribution.origin(&ev.header),
            detail: Detail::LibraryLoadFailed {
                library: failure.library,
                missing: failure.missing,
                requested: failure.requested,
                path: failure.path,
                gpu_library: failure.gpu_library,
            },
        };
        self.tracker.note_trouble(&mut self.kernel, event.origin.cgroup_id);
        Some(event)
    }

    /// The node's pods, which say why the host killed a pod's container
    /// (see `kill_reasons`).
    pub fn set_pods(&mut self, pods: PodCache) {
        self.kill_reasons.set_pods(pods);
    }

    /// A CUDA call's event gets the driver version its process was last
    /// told, which the kernel keeps per process (successful version calls
    /// are not events).
    fn add_driver_version(&self, event: &mut Event) {
        if let Detail::GpuCall { api: Api::Cuda | Api::Cudart, driver_version, .. } = &mut event.detail {
            *driver_version = self.kernel.driver_version(event.origin.pid).map(|v| v.version);
        }
    }

    /// The driver version each cgroup's processes were last told: the
    /// highest, so a node whose driver was upgraded under a running pod
    /// shows the newer one.
    pub fn driver_versions(&self) -> Vec<(u64, i32)> {
        let mut by_cgroup: std::collections::BTreeMap<u64, i32> = Default::default();
        for (_, v) in self.kernel.driver_versions() {
            let entry = by_cgroup.entry(v.cgroup_id).or_insert(v.version);
            *entry = (*entry).max(v.version);
        }
        by_cgroup.into_iter().collect()
    }

    /// VRAM per (cgroup id, KFD gpu_id) of live processes, read each second.
    pub fn vram_by_cgroup(&self) -> Vec<(u64, u32, u64)> {
        self.attribution.vram_by_cgroup()
    }

    /// Stranded VRAM per KFD gpu_id (see `vram`).
    pub fn vram_stranded(&self) -> Vec<(u32, u64)> {
        self.attribution.vram_stranded()
    }

    /// Programs started per cgroup since the last call.
    pub fn take_process_starts(&mut self) -> std::collections::HashMap<u64, u64> {
        std::mem::take(&mut self.process_starts)
    }

    /// Lets `run` tell canary pods (hot-call selection) by cgroup path.
    pub fn set_canary_judge(&mut self, judge: CanaryJudge) {
        self.tracker.set_canary_judge(judge);
    }

    /// GPU processes with hot-call probes, by reason.
    pub fn hot_counts(&self) -> HotCounts {
        self.tracker.hot_counts()
    }

    fn announce(&mut self, out: &mut Vec<Event>) {
        for a in self.tracker.take_announcements() {
            let Announcement { library, flavor, functions, reason, held_ns, probed_at, origin } = a;
            let probes_after =
                origin.as_ref().zip(probed_at).map(|(header, at)| crate::events::ProbesAfter {
                    init_ns: at.init_ns.saturating_sub(header.ts_boot_ns),
                    all_ns: at.all_ns.saturating_sub(header.ts_boot_ns),
                });
            let origin = match &origin {
                Some(header) => self.attribution.origin(header),
                None => self.attribution.now(),
            };
            out.push(Event {
                origin,
                detail: Detail::LibraryProbed {
                    library,
                    flavor: flavor.as_str(),
                    functions,
                    reason,
                    held_ns,
                    probes_after,
                },
            });
        }
    }

    /// The wall clock's offset, due map scans, expired holds, retired
    /// library files, and KFD's current processes.
    pub fn housekeeping(&mut self) {
        self.attribution.retake_clock();
        if let Some(stage) = &mut self.http {
            stage.housekeeping(self.kernel.object_mut());
        }
        self.tracker.housekeeping(&mut self.kernel);
        if self.last_kfd_refresh.elapsed() >= KFD_REFRESH_EVERY {
            self.last_kfd_refresh = std::time::Instant::now();
            self.attribution.refresh_kfd_processes();
        }
    }

    /// Every GPU call stalled now. A stall is trouble: its cgroup's
    /// processes are selected for hot-call probes.
    pub fn stalls(&mut self) -> Vec<Stall> {
        let stalls = self.stalls.scan(&mut self.kernel);
        for stall in &stalls {
            self.tracker.note_trouble(&mut self.kernel, stall.cgroup_id);
        }
        stalls
    }

    /// A newly stalled call as an event (reads the thread's name).
    pub fn stall_event(&mut self, stall: &Stall) -> Event {
        let comm = crate::events::thread_comm(stall.pid, stall.tid);
        Event {
            origin: Origin {
                ts_ns: self.attribution.wall_now_ns(),
                pid: stall.pid,
                tid: stall.tid,
                comm,
                cgroup_id: stall.cgroup_id,
                cgroup: self.attribution.cgroups_mut().path(stall.cgroup_id),
            },
            detail: Detail::GpuStall {
                api: stall.api,
                library: self.tracker.probes().library_path(stall.library).to_string(),
                function: stall.function.clone(),
                elapsed_ns: stall.elapsed_ns,
            },
        }
    }

    /// Notes a read of the run-queue histograms, for the next CPU sample.
    pub fn note_run_queue(&mut self, runq: &[(u64, observer_common::sched::RunqHistogram)]) {
        self.ran_since.note(runq);
    }

    /// Samples the CPU limits of cgroups; returns what a person should hear.
    /// Where the scheduler probe counts the tasks below its roots, limited
    /// cgroups there whose tasks did not run are not read.
    pub fn sample_cpu(&mut self) -> Vec<CpuFinding> {
        let Some(cpu) = self.cpu.as_mut() else { return Vec::new() };
        let ran_ids = self.ran_since.take();
        let counting = self.statuses.iter().any(|s| s.attached && s.target == "sched_switch");
        let Some(scope) = self.runq_scope.as_ref().filter(|_| counting) else { return cpu.sample(None) };
        let mut ran = std::collections::HashSet::new();
        for id in ran_ids {
            // A cgroup gone since has nothing left to read.
            if let Some(path) = self.attribution.cgroups_mut().path(id) {
                crate::cpu::with_ancestors(&path, &mut ran);
            }
        }
        cpu.sample(Some(&RunActivity { roots: scope.roots(), ran: &ran }))
    }

    /// A CPU finding as an event.
    pub fn cpu_event(&self, finding: CpuFinding) -> Event {
        let (rel, detail) = match finding {
            CpuFinding::Throttled { rel, periods, total, throttled_ns } => {
                (rel, Detail::CpuThrottle { throttled_ns, periods, total_periods: total })
            }
            CpuFinding::Oversubscribed { rel, runnable, quota_cores } => {
                (rel, Detail::CpuOversubscribed { runnable_threads: runnable, quota_cores })
            }
        };
        let cgroup_id = self.attribution.cgroups().id_of(&rel).unwrap_or(0);
        Event { origin: Origin { cgroup_id, cgroup: Some(rel), ..self.attribution.now() }, detail }
    }

    /// Limited cgroups as of the last sample, by cgroup id.
    pub fn cpu_snapshots(&self) -> Vec<(u64, CpuSnapshot)> {
        let Some(cpu) = &self.cpu else { return Vec::new() };
        cpu.cgroups()
            .map(|c| {
                let id = c.cgroup_id;
                let snapshot = CpuSnapshot {
                    periods: c.stat.nr_periods,
                    throttled_periods: c.stat.nr_throttled,
                    throttled_ns: c.stat.throttled_ns,
                    runnable: c.runnable,
                    quota_cores: c.quota_cores,
                };
                (id, snapshot)
            })
            .collect()
    }

    /// Seeds the kernel's set of cgroups with run-queue accounting with the
    /// roots that appeared since the last call (all of them, where the
    /// kernel cannot follow new cgroups itself).
    pub fn refresh_runq_scope(&mut self) {
        let (Some(scope), Some(root)) = (&self.runq_scope, self.attribution.cgroups().root()) else { return };
        let added = scope.refresh(root, &mut self.kernel);
        if added > 0 {
            log::debug!("run-queue accounting for {added} more cgroups under {:?}", scope.roots());
        }
    }

    /// The cgroup prefixes with run-queue accounting (none in `trace`).
    pub fn runq_roots(&self) -> &[String] {
        self.runq_scope.as_ref().map(runq_scope::RunqScope::roots).unwrap_or_default()
    }

    /// Keeps the chosen pods' cgroups (canary and gated) in the kernel's hold set; nothing when
    /// no hold watchdog runs (no GPU probes), since no process may be held
    /// without one.
    pub fn hold_pods(&mut self, hold: &mut PodHold, pods: &HashMap<String, PodChoice>) {
        let Some(root) = self.attribution.cgroups().root().map(std::path::Path::to_path_buf) else { return };
        if self.tracker.hold_watchdog().is_some() {
            hold.refresh(pods, &root, &mut self.kernel);
        }
    }

    /// The kernel's aggregates.
    pub fn kernel(&self) -> &Loaded {
        &self.kernel
    }

    pub fn cgroups_mut(&mut self) -> &mut CgroupResolver {
        self.attribution.cgroups_mut()
    }

    /// Drops the kernel aggregates and cached paths of cgroups that are gone.
    pub fn purge_cgroups(&mut self, cgroups: &[u64]) {
        if cgroups.is_empty() {
            return;
        }
        self.kernel.purge_cgroups(cgroups);
        for c in cgroups {
            self.attribution.cgroups_mut().forget(*c);
        }
    }

    /// Table-driven probes, then every GPU library file found so far.
    pub fn statuses(&self) -> Vec<ProbeStatus> {
        let mut all = self.statuses.clone();
        all.extend(self.http.as_ref().map(http::HttpStage::status));
        all.extend(self.tracker.probes().status());
        all
    }

    /// Probed GPU library files.
    pub fn gpu(&self) -> &GpuProbes {
        self.tracker.probes()
    }

    pub fn hold_watchdog(&self) -> Option<u32> {
        self.tracker.hold_watchdog()
    }

    pub fn counters(&self) -> Counters {
        Counters {
            records: self.attribution.records().clone(),
            decode_errors: self.attribution.decode_errors(),
            events_lost: self.kernel.events_lost(),
        }
    }

    /// Ends tracing so that this process can exit at once: nothing is held
    /// from here on, and what is held now is resumed; the kernel's release
    /// of the probes is left to a child that outlives this process (see
    /// `probes::releaser::release_after_exit`). Returns its pid.
    pub fn release_after_exit(&mut self) -> Option<u32> {
        self.tracker.stop_holding(&mut self.kernel);
        crate::probes::releaser::release_after_exit()
    }
}

/// The cause of a candidate run's death and who sent it, from the `exit`
/// event attribution made of its record (none for a normal exit). A sender
/// in the run's own cgroup is its wrapper wherever the cgroup is (a
/// `--cgroup` prefix outside pods, too).
fn run_death(ev: &ExitEvent, attributed: &[Event]) -> Option<(Cause, Option<SenderScope>)> {
    attributed.iter().find_map(|e| match &e.detail {
        Detail::Exit { cause, sender, .. } if e.origin.pid == ev.header.pid => {
            let scope = sender.as_ref().map(|s| match s.cgroup_id == ev.header.cgroup_id {
                true => SenderScope::SameContainer,
                false => s.scope,
            });
            Some((*cause, scope))
        }
        _ => None,
    })
}

/// A GPU failure, stall, crash or hardware fault: what selects a cgroup's
/// processes for hot-call probes under the daemon's policy.
fn is_gpu_trouble(event: &Event) -> bool {
    match &event.detail {
        Detail::GpuCall { result, .. } => *result != 0,
        Detail::GpuStall { .. } | Detail::Crash { .. } | Detail::GpuHardware { .. } => true,
        _ => false,
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // Stop holding and resume what is held first: releasing every
        // uprobe link afterwards takes the kernel a grace period each.
        self.tracker.stop_holding(&mut self.kernel);
    }
}
