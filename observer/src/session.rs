//! One observing session: the loaded eBPF object, attached probe families,
//! the ring buffer and the resolvers that turn raw records into events.
//! `trace` prints what a session sees; `run` counts it for Prometheus.
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuHashMap, RingBuf},
    Ebpf,
};
use log::{debug, warn};
use observer_common::{
    comm_str,
    discovery::{GpuFileKey, GpuMapEvent, MAP_SCAN_DELAY_MS},
    gpu::{Api, GpuStats, GpuStatsKey, InflightKey, InflightStack, INFLIGHT_MAP, MAX_NESTING},
    kfd::{KfdStats, KfdStatsKey},
    sched::RunqHistogram,
    task::{
        core_dumped, exit_signal, exit_status, is_abnormal_exit, CrashInfo, ExitEvent, EXIT_FLAG_CRASH,
        EXIT_FLAG_OOM_VICTIM,
    },
    EventHeader,
};

use crate::{
    attribution::CgroupResolver,
    clock::BootClock,
    cpu::{CpuFinding, CpuMonitor},
    discovery::{self, ahead::AheadOfTime, hold::Hold},
    events::{self, Detail, Event, Raw},
    oom,
    probes::{self, gpu, Families, KernelSettings, LoadError, ProbeStatus},
};

/// How often probed library files are checked for deletion.
const RETIRE_CHECK_EVERY: Duration = Duration::from_secs(5);

pub struct SessionOptions {
    pub settings: KernelSettings,
    /// Libraries named by the user; failing to probe one of them is an error.
    pub explicit_libs: Vec<PathBuf>,
    pub stall_threshold_ns: u64,
    pub families: Families,
    /// How long a cgroup must stay oversubscribed before it is reported.
    pub oversubscribed_after: Duration,
    /// Stop a process that maps an unknown GPU runtime file until its
    /// probes exist (`--hold`).
    pub hold: bool,
}

pub struct Session {
    pub ebpf: Ebpf,
    pub events: RingBuf<MapData>,
    pub gpu: gpu::GpuProbes,
    pub cgroups: CgroupResolver,
    pub clock: BootClock,
    stall_threshold_ns: u64,
    /// Stalls already reported, by (tid, api, entry timestamp).
    reported_stalls: HashSet<(u32, u32, u64)>,
    pub decode_errors: u64,
    /// Tracepoint families and whether each attached.
    pub probe_status: Vec<ProbeStatus>,
    pending_scans: Vec<(Instant, u32)>,
    /// When probed library files were last checked for deletion.
    last_retire_check: Instant,
    oom_scopes: HashMap<u32, &'static str>,
    pub cpu: Option<CpuMonitor>,
    /// Calls past the stall threshold at the last scan: (cgroup, api, function).
    pub stalled_now: Vec<(u64, Api, String)>,
    /// Ring-buffer records received, by kind.
    pub records: std::collections::BTreeMap<&'static str, u64>,
    /// What each exec's loader could find, resolved before it runs.
    ahead: AheadOfTime,
    /// Files inspected and found not to be GPU runtimes.
    rejected: HashSet<gpu::FileId>,
    /// Libraries newly probed, announced with the reason they were chosen.
    announcements: Vec<Event>,
    /// Declared after `ebpf`, so it is dropped after the programs detach.
    hold: Option<Hold>,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("--lib {0}")]
    Library(String),
    #[error("--hold: {0}")]
    Hold(#[from] discovery::hold::HoldError),
}

impl SessionError {
    /// A library the user named is their mistake to fix (exit 2); the
    /// kernel or the machine refusing is not (exit 1).
    pub fn into_cli(self) -> crate::cli_error::CliError {
        use crate::cli_error::CliError;
        match self {
            Self::Library(msg) => CliError::usage(msg),
            Self::Load(e) => CliError::runtime(e.to_string()),
            Self::Hold(e) => CliError::runtime(format!("--hold: {e}")),
        }
    }
}

impl Session {
    pub fn start(options: SessionOptions) -> Result<Self, SessionError> {
        let env = probes::environment();
        let mut ebpf = probes::load(&options.settings, &env)?;
        let events = probes::take_events(&mut ebpf)?;
        // The watchdog exists before any program that could hold a process.
        let hold = if options.hold && options.families.gpu { Some(Hold::start(&mut ebpf)?) } else { None };
        let probe_status = probes::attach_families(&mut ebpf, &env, options.families);
        let mut session = Self {
            ebpf,
            events,
            gpu: gpu::GpuProbes::default(),
            cgroups: CgroupResolver::new(),
            clock: BootClock::new(),
            stall_threshold_ns: options.stall_threshold_ns,
            reported_stalls: HashSet::new(),
            decode_errors: 0,
            probe_status,
            pending_scans: Vec::new(),
            last_retire_check: Instant::now(),
            oom_scopes: HashMap::new(),
            cpu: None,
            stalled_now: Vec::new(),
            records: Default::default(),
            ahead: AheadOfTime::default(),
            rejected: HashSet::new(),
            announcements: Vec::new(),
            hold,
        };
        if options.families.sched {
            let monitor = CpuMonitor::new(session.cgroups.root(), options.oversubscribed_after);
            session.probe_status.push(ProbeStatus {
                probe: "throttle",
                target: "cpu.stat".into(),
                attached: monitor.hierarchy.is_some(),
                detail: monitor.hierarchy.as_ref().map(|h| h.describe()).unwrap_or_else(|| {
                    "no cgroup cpu controller found (kprobes on throttle_cfs_rq are unavailable here)".into()
                }),
            });
            session.cpu = Some(monitor);
        }
        if !options.families.gpu {
            return Ok(session);
        }
        for path in &options.explicit_libs {
            let display = path.display().to_string();
            let library = gpu::inspect(path, &display).map_err(|e| SessionError::Library(e.to_string()))?;
            let key = GpuFileKey::from_stat(library.id.dev, library.id.ino);
            session.gpu.attach(&mut session.ebpf, library).map_err(SessionError::Library)?;
            discovery::mark_known(&mut session.ebpf, key);
        }
        // What this host's own loader could find, then what running
        // processes (and their containers) already map.
        for c in session.ahead.for_process(std::process::id(), "the host") {
            session.consider(c.open_path, c.display, &c.reason, None);
        }
        for pid in gpu::all_pids() {
            session.scan_process(pid, None);
        }
        Ok(session)
    }

    /// Probe the GPU libraries a process maps (containers' own copies included).
    pub fn scan_process(&mut self, pid: u32, origin: Option<&EventHeader>) {
        debug!("scanning the mappings of pid {pid}");
        let reason = match origin {
            Some(h) => format!("mapped by {}[{pid}]", comm_str(&h.comm)),
            None => "mapped by a running process".to_string(),
        };
        for (path, display) in gpu::process_libraries(pid) {
            self.consider(path, display, &reason, origin);
        }
    }

    /// Probes one file unless it is probed already or known not to be a
    /// GPU runtime; a newly probed file is announced with `reason`.
    fn consider(&mut self, path: PathBuf, display: String, reason: &str, origin: Option<&EventHeader>) {
        use std::os::{fd::AsRawFd, unix::fs::MetadataExt};
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) => {
                debug!("{display} (via {}): {e}", path.display());
                return;
            }
        };
        let id = gpu::FileId { dev: meta.dev(), ino: meta.ino() };
        if self.gpu.is_attached(&id) || self.rejected.contains(&id) {
            return;
        }
        // A path through /proc/PID/root lasts only as long as that process,
        // which may exit mid-attach. An open descriptor keeps the file
        // reachable (as /proc/self/fd/N) until the probes are in place.
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) => {
                debug!("{display} (via {}): {e}", path.display());
                return;
            }
        };
        let held_open = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let t0 = Instant::now();
        match gpu::inspect(&held_open, &display) {
            Ok(library) => {
                debug!("inspected {display} in {:?}", t0.elapsed());
                let flavor = library.flavor;
                match self.gpu.attach(&mut self.ebpf, library) {
                    Ok(functions) => self.announce(display, flavor, functions, reason, origin),
                    Err(e) => warn!("cannot probe {e}"),
                }
            }
            Err(e) => {
                debug!("skipping {display}: {e}");
                if self.rejected.len() > 65536 {
                    self.rejected.clear();
                }
                self.rejected.insert(id);
            }
        }
        drop(file);
        // Probed, failed or not a runtime: mapping it again is no news.
        discovery::mark_known(&mut self.ebpf, GpuFileKey::from_stat(id.dev, id.ino));
    }

    fn announce(
        &mut self,
        library: String,
        flavor: gpu::Flavor,
        functions: usize,
        reason: &str,
        origin: Option<&EventHeader>,
    ) {
        log::info!("probing {library} ({flavor:?}, {functions} functions): {reason}");
        let mut event_origin = match origin {
            Some(h) => events::origin_of(h, self.clock),
            None => events::Origin {
                ts_ns: self.clock.to_unix_ns(BootClock::boot_now_ns()),
                ..Default::default()
            },
        };
        if origin.is_some() {
            event_origin.cgroup = self.cgroups.path(event_origin.cgroup_id);
        }
        self.announcements.push(Event {
            origin: event_origin,
            detail: Detail::LibraryProbed {
                library,
                flavor: flavor.as_str(),
                functions,
                reason: reason.to_string(),
                held_ns: None,
            },
        });
    }

    /// A process mapped a GPU runtime file not yet known: probe what it
    /// maps now, then resume it if it was held.
    fn gpu_file_mapped(&mut self, ev: &GpuMapEvent) {
        let pid = ev.header.pid;
        let first_new = self.announcements.len();
        self.scan_process(pid, Some(&ev.header));
        // Its maps may not name the file by a usable path (a deleted or
        // renamed file): the descriptor it was mapped from is still open
        // while the process is held.
        if self.announcements.len() == first_new && ev.fd >= 0 {
            let via_fd = PathBuf::from(format!("/proc/{pid}/fd/{}", ev.fd));
            let name = comm_str(&ev.name).to_string();
            let display = std::fs::read_link(&via_fd).map(|p| p.display().to_string()).unwrap_or(name);
            if observer_common::discovery::is_gpu_library_name(
                display.rsplit('/').next().unwrap_or_default().as_bytes(),
            ) {
                let reason = format!("mapped by {}[{pid}]", comm_str(&ev.header.comm));
                self.consider(via_fd, display, &reason, Some(&ev.header));
            }
        }
        discovery::mark_known(&mut self.ebpf, ev.key);
        if ev.held == 0 {
            return;
        }
        let held_ns = self.hold.as_mut().and_then(|h| h.resume(pid));
        for event in &mut self.announcements[first_new..] {
            if let Detail::LibraryProbed { held_ns: slot, reason, .. } = &mut event.detail {
                *slot = held_ns;
                reason.push_str(", held until probed");
            }
        }
    }

    /// Turns one ring-buffer record into events with names and paths.
    pub fn resolve(&mut self, data: &[u8]) -> Vec<Event> {
        let raw = match events::decode(data) {
            Ok(raw) => raw,
            Err(e) => {
                self.decode_errors += 1;
                debug!("dropping record: {e}");
                return Vec::new();
            }
        };
        let kind = match &raw {
            Raw::GpuCall(_) => "gpu_call",
            Raw::LibraryMap(_) => "library_map",
            Raw::OomVictim(_) => "oom_victim",
            Raw::Exit(_) => "exit",
            Raw::KfdIoctl(_) => "kfd_ioctl",
            Raw::GpuHardware(_) => "gpu_hardware",
            Raw::Exec(_) => "exec",
            Raw::GpuMap(_) => "gpu_map",
        };
        *self.records.entry(kind).or_default() += 1;
        match raw {
            Raw::GpuCall(ev) => {
                let Some(api) = Api::from_u32(ev.api) else { return Vec::new() };
                let mut origin = events::origin_of(&ev.header, self.clock);
                origin.cgroup = self.cgroups.path(origin.cgroup_id);
                vec![Event {
                    origin,
                    detail: Detail::GpuCall {
                        api,
                        library: self.gpu.library_path(ev.library).to_string(),
                        function: events::function_name(api, ev.function),
                        result: ev.result,
                        duration_ns: ev.duration_ns,
                    },
                }]
            }
            Raw::LibraryMap(ev) => {
                // Scan a little later: the loader is usually mid-way through
                // mapping a burst of libraries when the first one is seen.
                let due = Instant::now() + Duration::from_millis(MAP_SCAN_DELAY_MS);
                if !self.pending_scans.iter().any(|(_, pid)| *pid == ev.header.pid) {
                    self.pending_scans.push((due, ev.header.pid));
                }
                Vec::new()
            }
            Raw::Exec(ev) => {
                let pid = ev.header.pid;
                let started = Instant::now();
                let waited_ns = BootClock::boot_now_ns().saturating_sub(ev.header.ts_boot_ns);
                let who = format!("{}[{pid}]", comm_str(&ev.header.comm));
                for c in self.ahead.for_process(pid, &who) {
                    self.consider(c.open_path, c.display, &c.reason, Some(&ev.header));
                }
                debug!(
                    "exec of pid {pid}: read {waited_ns} ns after it, resolved in {:?}",
                    started.elapsed()
                );
                self.announcements.drain(..).collect()
            }
            Raw::GpuMap(ev) => {
                self.gpu_file_mapped(&ev);
                self.announcements.drain(..).collect()
            }
            Raw::OomVictim(ev) => {
                // The victim is still alive here: note where its memory is
                // accounted, for telling a cgroup limit from a global OOM.
                let scope = oom::victim_scope(ev.victim_pid);
                self.oom_scopes.insert(ev.victim_pid, scope);
                Vec::new()
            }
            Raw::Exit(ev) => self.exit_events(&ev),
            Raw::KfdIoctl(ev) => {
                let mut origin = events::origin_of(&ev.header, self.clock);
                origin.cgroup = self.cgroups.path(origin.cgroup_id);
                let via = if ev.source == 1 { "kprobe" } else { "syscall" };
                vec![Event {
                    origin,
                    detail: Detail::KfdIoctl {
                        nr: ev.cmd & 0xff,
                        cmd: ev.cmd,
                        result: ev.result,
                        duration_ns: ev.duration_ns,
                        via,
                    },
                }]
            }
            Raw::GpuHardware(ev) => {
                let mut origin = events::origin_of(&ev.header, self.clock);
                origin.cgroup = self.cgroups.path(origin.cgroup_id);
                let (kind, function, detail) = events::hw_detail(&ev);
                vec![Event { origin, detail: Detail::GpuHardware { kind, function, detail } }]
            }
        }
    }

    fn exit_events(&mut self, ev: &ExitEvent) -> Vec<Event> {
        let mut origin = events::origin_of(&ev.header, self.clock);
        origin.cgroup = self.cgroups.path(origin.cgroup_id);
        let signal = exit_signal(ev.exit_code) as i32;
        let mut out = Vec::new();
        if ev.flags & EXIT_FLAG_CRASH != 0 {
            let c = &ev.crash;
            let (library, library_offset) = self.crash_library(c);
            let in_call = (c.in_call_api != 0).then(|| {
                let api = Api::from_u32(c.in_call_api - 1).unwrap_or(Api::Hip);
                events::function_name(api, c.in_call_function)
            });
            out.push(Event {
                origin: origin.clone(),
                detail: Detail::Crash {
                    signal: c.signal,
                    si_code: c.si_code,
                    addr: c.addr,
                    ip: c.ip,
                    library,
                    library_offset,
                    in_call,
                    crash_tid: c.tid,
                },
            });
        }
        if ev.flags & EXIT_FLAG_OOM_VICTIM != 0 {
            let scope = self
                .oom_scopes
                .remove(&ev.header.pid)
                .or_else(|| self.oom_scopes.remove(&ev.header.tid))
                .unwrap_or_else(|| oom::scope_of_cgroup(self.cgroups.root(), origin.cgroup.as_deref()));
            out.push(Event {
                origin: origin.clone(),
                detail: Detail::OomKill {
                    scope,
                    anon_rss_bytes: (ev.oom_anon_rss_kb != 0).then_some(ev.oom_anon_rss_kb * 1024),
                },
            });
        }
        if is_abnormal_exit(ev.exit_code) {
            out.push(Event {
                origin,
                detail: Detail::Exit {
                    signal,
                    exit_code: exit_status(ev.exit_code) as i32,
                    core_dumped: core_dumped(ev.exit_code),
                },
            });
        }
        out
    }

    /// The faulting object: the full path when it is a probed GPU library
    /// (matched by inode), else the file name the kernel recorded.
    fn crash_library(&self, c: &CrashInfo) -> (Option<String>, Option<u64>) {
        if c.ip_mapping != observer_common::task::IpMapping::File as u32 {
            return (None, None);
        }
        let offset = c.ip.checked_sub(c.vma_start).map(|d| d + c.vma_pgoff * 4096);
        let known = self
            .gpu
            .libraries()
            .find(|l| l.library.id.ino == c.file_ino)
            .map(|l| l.library.display_path.clone());
        let name = comm_str(&c.file_name).to_string();
        (known.or((!name.is_empty()).then_some(name)), offset)
    }

    /// Scans processes whose library-map events are due.
    pub fn run_pending_scans(&mut self) {
        let now = Instant::now();
        let due: Vec<u32> = self.pending_scans.iter().filter(|(t, _)| *t <= now).map(|(_, p)| *p).collect();
        self.pending_scans.retain(|(t, _)| *t > now);
        for pid in due {
            self.scan_process(pid, None);
        }
        if let Some(hold) = self.hold.as_mut() {
            for pid in hold.resume_expired() {
                warn!(
                    "resumed pid {pid}: held past {:?} without its library being probed",
                    discovery::hold::HOLD_DEADLINE
                );
            }
        }
        // One fstat per probed library every few seconds; the processes'
        // maps are read only when one of those files was deleted.
        if self.last_retire_check.elapsed() >= RETIRE_CHECK_EVERY {
            self.last_retire_check = Instant::now();
            for (_, id) in self.gpu.retire_deleted(&mut self.ebpf) {
                discovery::forget_known(&mut self.ebpf, GpuFileKey::from_stat(id.dev, id.ino));
            }
            self.ahead.trim();
        }
        // Victims that never exited through us (e.g. we started mid-kill).
        if self.oom_scopes.len() > 1024 {
            self.oom_scopes.clear();
        }
    }

    /// Samples CPU limits of cgroups; findings become events.
    pub fn sample_cpu(&mut self) -> Vec<Event> {
        let Some(monitor) = self.cpu.as_mut() else { return Vec::new() };
        let findings = monitor.sample();
        let now = self.clock.to_unix_ns(BootClock::boot_now_ns());
        findings
            .into_iter()
            .map(|f| {
                let (rel, detail) = match f {
                    CpuFinding::Throttled { rel, periods, total, throttled_ns } => {
                        (rel, Detail::CpuThrottle { throttled_ns, periods, total_periods: total })
                    }
                    CpuFinding::Oversubscribed { rel, runnable, quota_cores } => {
                        (rel, Detail::CpuOversubscribed { runnable_threads: runnable, quota_cores })
                    }
                };
                let cgroup_id = self.cgroups.id_of(&rel).unwrap_or(0);
                Event {
                    origin: events::Origin {
                        ts_ns: now,
                        pid: 0,
                        tid: 0,
                        comm: String::new(),
                        cgroup_id,
                        cgroup: Some(rel),
                    },
                    detail,
                }
            })
            .collect()
    }

    /// Drains every pending record.
    pub fn drain(&mut self, mut sink: impl FnMut(Event)) {
        let mut records = Vec::new();
        while let Some(item) = self.events.next() {
            records.push(item.to_vec());
        }
        for event in self.announcements.drain(..).collect::<Vec<_>>() {
            sink(event);
        }
        for record in records {
            for event in self.resolve(&record) {
                sink(event);
            }
        }
    }

    /// Calls in flight for longer than the threshold, each reported once.
    /// The kernel keeps a thread's entry between calls (depth 0); entries
    /// of threads that exited are removed here.
    pub fn scan_stalls(&mut self) -> Vec<Event> {
        let now = BootClock::boot_now_ns();
        let Some(map) = self.ebpf.map_mut(INFLIGHT_MAP) else {
            return Vec::new();
        };
        let Ok(mut inflight) = BpfHashMap::<_, InflightKey, InflightStack>::try_from(map) else {
            return Vec::new();
        };
        let mut stalls = Vec::new();
        let mut dead = Vec::new();
        self.stalled_now.clear();
        let mut live = HashSet::new();
        for (key, stack) in inflight.iter().flatten() {
            if !std::path::Path::new(&format!("/proc/{}/task/{}", stack.pid, key.tid)).exists() {
                dead.push(key);
                continue;
            }
            let Some(api) = Api::from_u32(key.api) else {
                continue;
            };
            let depth = (stack.depth as usize).min(MAX_NESTING);
            for frame in &stack.frames[..depth] {
                let tag = (key.tid, key.api, frame.start_ns);
                live.insert(tag);
                let elapsed = now.saturating_sub(frame.start_ns);
                if elapsed < self.stall_threshold_ns {
                    continue;
                }
                self.stalled_now.push((stack.cgroup_id, api, events::function_name(api, frame.function)));
                if self.reported_stalls.contains(&tag) {
                    continue;
                }
                self.reported_stalls.insert(tag);
                stalls.push((key, stack, api, *frame, elapsed));
            }
        }
        for key in dead {
            let _ = inflight.remove(&key);
        }
        self.reported_stalls.retain(|t| live.contains(t));
        stalls
            .into_iter()
            .map(|(key, stack, api, frame, elapsed)| {
                let comm = read_comm(stack.pid, key.tid);
                Event {
                    origin: events::Origin {
                        ts_ns: self.clock.to_unix_ns(now),
                        pid: stack.pid,
                        tid: key.tid,
                        comm,
                        cgroup_id: stack.cgroup_id,
                        cgroup: self.cgroups.path(stack.cgroup_id),
                    },
                    detail: Detail::GpuStall {
                        api,
                        library: self.gpu.library_path(frame.library).to_string(),
                        function: events::function_name(api, frame.function),
                        elapsed_ns: elapsed,
                    },
                }
            })
            .collect()
    }

    /// Kernel GPU aggregates, summed over CPUs.
    pub fn gpu_stats(&self) -> Vec<(GpuStatsKey, GpuStats)> {
        sum_per_cpu(&self.ebpf, observer_common::gpu::STATS_MAP)
    }

    /// KFD ioctl aggregates, summed over CPUs.
    pub fn kfd_stats(&self) -> Vec<(KfdStatsKey, KfdStats)> {
        sum_per_cpu(&self.ebpf, observer_common::kfd::KFD_STATS_MAP)
    }

    /// Run-queue latency histograms per cgroup, summed over CPUs.
    pub fn runq_stats(&self) -> Vec<(u64, RunqHistogram)> {
        sum_per_cpu(&self.ebpf, observer_common::sched::RUNQ_MAP)
    }

    /// Removes kernel aggregates of cgroups that are gone, so maps return to
    /// their baseline under pod churn.
    pub fn purge_cgroups(&mut self, cgroups: &[u64]) {
        if cgroups.is_empty() {
            return;
        }
        let doomed = |cgroup: u64| cgroups.contains(&cgroup);
        remove_keys::<GpuStatsKey, GpuStats>(&mut self.ebpf, observer_common::gpu::STATS_MAP, |k| {
            doomed(k.cgroup_id)
        });
        remove_keys::<KfdStatsKey, KfdStats>(&mut self.ebpf, observer_common::kfd::KFD_STATS_MAP, |k| {
            doomed(k.cgroup_id)
        });
        remove_keys::<u64, RunqHistogram>(&mut self.ebpf, observer_common::sched::RUNQ_MAP, |k| doomed(*k));
        for c in cgroups {
            self.cgroups.forget(*c);
        }
    }

    /// The hold watchdog's pid, when `--hold` is on.
    pub fn hold_watchdog(&self) -> Option<u32> {
        self.hold.as_ref().map(Hold::watchdog_pid)
    }

    pub fn events_lost(&self) -> u64 {
        probes::events_lost(&self.ebpf)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Stop holding first and resume what is held: releasing every
        // uprobe link afterwards takes the kernel a grace period each.
        if let Some(hold) = self.hold.as_mut() {
            if let Some(program) = self.ebpf.program_mut(probes::HOLDING_PROGRAM) {
                if let Ok(program) = <&mut aya::programs::TracePoint>::try_from(program) {
                    let _ = program.unload();
                }
            }
            hold.resume_all();
        }
    }
}

/// Removes the entries of a per-CPU aggregate map whose key matches.
fn remove_keys<K: aya::Pod, V: aya::Pod>(ebpf: &mut Ebpf, name: &str, matches: impl Fn(&K) -> bool) {
    let Some(map) = ebpf.map_mut(name) else { return };
    let Ok(mut map) = PerCpuHashMap::<_, K, V>::try_from(map) else { return };
    let doomed: Vec<K> = map.keys().flatten().filter(|k| matches(k)).collect();
    for key in doomed {
        let _ = map.remove(&key);
    }
}

/// Kernel aggregates that add up across CPUs.
pub trait PerCpuSum: aya::Pod + Default {
    fn add(&mut self, other: &Self);
}

impl PerCpuSum for observer_common::LatencyHistogram {
    fn add(&mut self, other: &Self) {
        observer_common::LatencyHistogram::add(self, other);
    }
}

fn sum_per_cpu<K: aya::Pod, V: PerCpuSum>(ebpf: &Ebpf, name: &str) -> Vec<(K, V)> {
    let Some(map) = ebpf.map(name) else { return Vec::new() };
    let Ok(stats) = PerCpuHashMap::<_, K, V>::try_from(map) else { return Vec::new() };
    stats
        .iter()
        .flatten()
        .map(|(k, per_cpu)| {
            let mut total = V::default();
            for v in per_cpu.iter() {
                total.add(v);
            }
            (k, total)
        })
        .collect()
}

fn read_comm(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}
