//! One observing session: the loaded eBPF object, attached probe families,
//! the ring buffer and the resolvers that turn raw records into events.
//! `trace` prints what a session sees; `run` counts it for Prometheus.
use std::{collections::HashSet, path::PathBuf};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, RingBuf},
    Ebpf,
};
use log::{debug, warn};
use observer_common::gpu::{Api, InflightKey, InflightStack, INFLIGHT_MAP, MAX_NESTING};

use crate::{
    attribution::CgroupResolver,
    clock::BootClock,
    events::{self, Detail, Event, Raw},
    probes::{self, gpu, KernelSettings, LoadError},
};

pub struct SessionOptions {
    pub settings: KernelSettings,
    /// Libraries named by the user; failing to probe one of them is an error.
    pub explicit_libs: Vec<PathBuf>,
    pub stall_threshold_ns: u64,
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
        let mut ebpf = probes::load(options.settings)?;
        let events = probes::take_events(&mut ebpf)?;
        let mut session = Self {
            ebpf,
            events,
            gpu: gpu::GpuProbes::default(),
            cgroups: CgroupResolver::new(),
            clock: BootClock::new(),
            stall_threshold_ns: options.stall_threshold_ns,
            reported_stalls: HashSet::new(),
            decode_errors: 0,
        };
        for path in &options.explicit_libs {
            let display = path.display().to_string();
            let library =
                gpu::inspect(path, &display).map_err(|e| SessionError::Library(e.to_string()))?;
            session
                .gpu
                .attach(&mut session.ebpf, library)
                .map_err(SessionError::Library)?;
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
        if self.gpu.is_attached(&gpu::FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }) {
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

    /// Turns one ring-buffer record into an event with names and paths.
    pub fn resolve(&mut self, data: &[u8]) -> Option<Event> {
        let raw = match events::decode(data) {
            Ok(raw) => raw,
            Err(e) => {
                self.decode_errors += 1;
                debug!("dropping record: {e}");
                return None;
            }
        };
        match raw {
            Raw::GpuCall(ev) => {
                let api = Api::from_u32(ev.api)?;
                let mut origin = events::origin_of(&ev.header, self.clock);
                origin.cgroup = self.cgroups.path(origin.cgroup_id);
                Some(Event {
                    origin,
                    detail: Detail::GpuCall {
                        api,
                        library: self.gpu.library_path(ev.library).to_string(),
                        function: events::function_name(api, ev.function),
                        result: ev.result,
                        duration_ns: ev.duration_ns,
                    },
                })
            }
        }
    }

    /// Drains every pending record.
    pub fn drain(&mut self, mut sink: impl FnMut(Event)) {
        let mut records = Vec::new();
        while let Some(item) = self.events.next() {
            records.push(item.to_vec());
        }
        for record in records {
            if let Some(event) = self.resolve(&record) {
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
