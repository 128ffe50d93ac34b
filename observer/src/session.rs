//! One observing session: the loaded eBPF object, attached probe families,
//! the ring buffer and the resolvers that turn raw records into events.
//! `trace` prints what a session sees; `run` counts it for Prometheus.
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, RingBuf},
    Ebpf,
};
use log::{debug, warn};
use observer_common::{
    comm_str,
    gpu::{Api, InflightKey, InflightStack, INFLIGHT_MAP, MAX_NESTING},
    task::{
        core_dumped, exit_signal, exit_status, is_abnormal_exit, CrashInfo, ExitEvent, EXIT_FLAG_CRASH,
        EXIT_FLAG_OOM_VICTIM,
    },
};

use crate::{
    attribution::CgroupResolver,
    clock::BootClock,
    events::{self, Detail, Event, Raw},
    oom,
    probes::{self, gpu, Families, KernelSettings, LoadError, ProbeStatus},
};

pub struct SessionOptions {
    pub settings: KernelSettings,
    /// Libraries named by the user; failing to probe one of them is an error.
    pub explicit_libs: Vec<PathBuf>,
    pub stall_threshold_ns: u64,
    pub families: Families,
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
    oom_scopes: HashMap<u32, &'static str>,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("--lib {0}")]
    Library(String),
}

impl Session {
    pub fn start(options: SessionOptions) -> Result<Self, SessionError> {
        let env = probes::environment();
        let mut ebpf = probes::load(options.settings, &env)?;
        let events = probes::take_events(&mut ebpf)?;
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
            oom_scopes: HashMap::new(),
        };
        for path in &options.explicit_libs {
            let display = path.display().to_string();
            let library = gpu::inspect(path, &display).map_err(|e| SessionError::Library(e.to_string()))?;
            session.gpu.attach(&mut session.ebpf, library).map_err(SessionError::Library)?;
        }
        for path in gpu::host_libraries() {
            session.consider(path.clone(), path.display().to_string());
        }
        for pid in gpu::all_pids() {
            session.scan_process(pid);
        }
        Ok(session)
    }

    /// Probe the GPU libraries a process maps (containers' own copies included).
    pub fn scan_process(&mut self, pid: u32) {
        for (path, display) in gpu::process_libraries(pid) {
            self.consider(path, display);
        }
    }

    fn consider(&mut self, path: PathBuf, display: String) {
        let Ok(meta) = std::fs::metadata(&path) else {
            return;
        };
        use std::os::unix::fs::MetadataExt;
        if self.gpu.is_attached(&gpu::FileId { dev: meta.dev(), ino: meta.ino() }) {
            return;
        }
        match gpu::inspect(&path, &display) {
            Ok(library) => {
                if let Err(e) = self.gpu.attach(&mut self.ebpf, library) {
                    warn!("cannot probe {e}");
                }
            }
            Err(e) => debug!("skipping {display}: {e}"),
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
                let due = Instant::now() + Duration::from_millis(100);
                if !self.pending_scans.iter().any(|(_, pid)| *pid == ev.header.pid) {
                    self.pending_scans.push((due, ev.header.pid));
                }
                Vec::new()
            }
            Raw::OomVictim(ev) => {
                // The victim is still alive here: note where its memory is
                // accounted, for telling a cgroup limit from a global OOM.
                let scope = oom::victim_scope(ev.victim_pid);
                self.oom_scopes.insert(ev.victim_pid, scope);
                Vec::new()
            }
            Raw::Exit(ev) => self.exit_events(&ev),
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
        if c.have_vma != 2 {
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
            self.scan_process(pid);
        }
        // Victims that never exited through us (e.g. we started mid-kill).
        if self.oom_scopes.len() > 1024 {
            self.oom_scopes.clear();
        }
    }

    /// Drains every pending record.
    pub fn drain(&mut self, mut sink: impl FnMut(Event)) {
        let mut records = Vec::new();
        while let Some(item) = self.events.next() {
            records.push(item.to_vec());
        }
        for record in records {
            for event in self.resolve(&record) {
                sink(event);
            }
        }
    }

    /// Calls in flight for longer than the threshold, each reported once;
    /// entries of threads that died mid-call are removed.
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
                if elapsed < self.stall_threshold_ns || self.reported_stalls.contains(&tag) {
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

    pub fn events_lost(&self) -> u64 {
        probes::events_lost(&self.ebpf)
    }
}

fn read_comm(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}
