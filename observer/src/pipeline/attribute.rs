//! Decoding plus attribution: a ring-buffer record becomes an event with
//! names, wall-clock time and a cgroup path. Also correlates the OOM
//! killer's victim mark with the victim's exit, which arrive as two records.
use std::collections::{BTreeMap, HashMap};

use log::debug;
use observer_common::{
    comm_str,
    crash::{in_call_api, CrashInfo, IpMapping, PAGE_SIZE},
    exit::{
        core_dumped, exit_signal, exit_status, is_abnormal_exit, ExitEvent, SignalOrigin, EXIT_FLAG_CRASH,
        EXIT_FLAG_OOM_VICTIM,
    },
    gpu::Api,
    kfd::KfdSource,
    memlimit::{MemLimit, MemSyscall},
    EventHeader,
};

use crate::{
    attribution::{
        vram_procs::{KfdProcess, KfdProcesses},
        CgroupResolver,
    },
    clock::BootClock,
    discovery::code_ranges::CodeRanges,
    events::{self, Detail, Event, HwCulprit, Origin, Raw},
    exit_cause::{self, Cause, Sender},
    oom,
    probes::gpu::GpuProbes,
};

use super::{
    oom_groups::OomGroups,
    vram::{Stranding, VramWatch},
};

/// Victims marked but never seen exiting (e.g. started mid-kill) are
/// forgotten past this many.
const MAX_OOM_VICTIMS: usize = 1024;

pub struct Attributor {
    cgroups: CgroupResolver,
    clock: BootClock,
    /// Where each marked OOM victim's memory is accounted, until it exits.
    oom_scopes: HashMap<u32, &'static str>,
    /// Victims of one group OOM kill, until all have exited.
    oom_groups: OomGroups,
    /// Ring-buffer records received, by kind.
    records: BTreeMap<&'static str, u64>,
    /// Records that could not be decoded (a layout mismatch between the two sides).
    decode_errors: u64,
    /// KFD's processes by pasid, for attributing GPU hardware events, and
    /// what each holds per GPU.
    kfd: KfdProcesses,
    /// VRAM per pod and what dead processes leave behind.
    vram: VramWatch,
    /// Strandings found, as events, until the pipeline hands them out.
    stranded: Vec<Event>,
}

impl Default for Attributor {
    fn default() -> Self {
        Self::new()
    }
}

impl Attributor {
    pub fn new() -> Self {
        Self {
            cgroups: CgroupResolver::new(),
            clock: BootClock::new(),
            oom_scopes: HashMap::new(),
            oom_groups: OomGroups::default(),
            records: BTreeMap::new(),
            decode_errors: 0,
            kfd: KfdProcesses::default(),
            vram: VramWatch::new(crate::attribution::vram_gpus::KfdPaths::default()),
            stranded: Vec::new(),
        }
    }

    pub fn cgroups(&self) -> &CgroupResolver {
        &self.cgroups
    }

    pub fn cgroups_mut(&mut self) -> &mut CgroupResolver {
        &mut self.cgroups
    }

    pub fn records(&self) -> &BTreeMap<&'static str, u64> {
        &self.records
    }

    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
    }

    /// Decodes one record, counting it by kind (or as a decode error).
    pub fn decode(&mut self, data: &[u8]) -> Option<Raw> {
        match events::decode(data) {
            Ok(raw) => {
                *self.records.entry(raw.name()).or_default() += 1;
                Some(raw)
            }
            Err(e) => {
                self.decode_errors += 1;
                debug!("dropping record: {e}");
                None
            }
        }
    }

    /// Where a record happened, with its cgroup path.
    pub fn origin(&mut self, header: &EventHeader) -> Origin {
        let mut origin = events::origin_of(header, self.clock);
        origin.cgroup = self.cgroups.path(origin.cgroup_id);
        origin
    }

    /// The origin of a hardware event that belongs to `process`: its pid
    /// and cgroup, at the time the driver reported it.
    fn origin_of_process(&mut self, header: &EventHeader, process: &KfdProcess) -> Origin {
        let comm = events::thread_comm(process.pid, process.pid);
        let cgroup_id = process.cgroup.as_deref().and_then(|c| self.cgroups.id_of(c)).unwrap_or(0);
        Origin {
            ts_ns: self.clock.to_unix_ns(header.ts_boot_ns),
            pid: process.pid,
            tid: process.pid,
            comm,
            cgroup_id,
            cgroup: process.cgroup.clone(),
        }
    }

    /// Notes which processes have KFD open now, so a fault reported after
    /// its process died is still attributed; reads their VRAM and the
    /// GPUs' used memory.
    pub fn refresh_kfd_processes(&mut self) {
        self.kfd.refresh();
        self.vram.sample(&self.kfd.listed(), std::time::Instant::now());
        for stranding in self.vram.take_strandings() {
            let event = self.stranding_event(stranding);
            self.stranded.push(event);
        }
    }

    /// VRAM found left behind since the last call.
    pub fn due_vram_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.stranded)
    }

    /// VRAM per (cgroup id, GPU) of the live processes; cgroups that are
    /// gone already are left out.
    pub fn vram_by_cgroup(&self) -> Vec<(u64, u32, u64)> {
        let mut ids: HashMap<&str, Option<u64>> = HashMap::new();
        let mut out = Vec::new();
        for (cgroup, gpu, bytes) in self.vram.by_cgroup() {
            let id = *ids.entry(cgroup).or_insert_with(|| self.cgroups.id_of(cgroup));
            if let Some(id) = id {
                out.push((id, gpu, bytes));
            }
        }
        out
    }

    /// Stranded VRAM per GPU whose used memory is read.
    pub fn vram_stranded(&self) -> Vec<(u32, u64)> {
        self.vram.stranded()
    }

    /// A stranding as the event `trace` prints and the metrics count: the
    /// dead process's origin, as its exit event named it.
    fn stranding_event(&mut self, s: Stranding) -> Event {
        let ts_ns = self.wall_now_ns();
        let (cause, origin) = match s.death {
            Some((cause, origin)) => (Some(cause), Origin { ts_ns, ..origin }),
            None => {
                let cgroup_id = s.cgroup.as_deref().and_then(|c| self.cgroups.id_of(c)).unwrap_or(0);
                let origin = Origin {
                    ts_ns,
                    pid: s.pid,
                    tid: s.pid,
                    comm: String::new(),
                    cgroup_id,
                    cgroup: s.cgroup,
                };
                (None, origin)
            }
        };
        let attributed = cause.is_some() && origin.cgroup_id != 0;
        let detail =
            Detail::GpuVramStranded { gpu: s.gpu, bytes: s.bytes, held_bytes: s.held, cause, attributed };
        Event { origin, detail }
    }

    /// An origin at this moment, for what no record caused.
    pub fn now(&self) -> Origin {
        Origin { ts_ns: self.wall_now_ns(), ..Default::default() }
    }

    /// Group OOM kills complete by waiting (see [`OomGroups`]).
    pub fn due_oom_kills(&mut self) -> Vec<Event> {
        self.oom_groups.due(std::time::Instant::now())
    }

    /// Follows a step of the wall clock (see `clock`).
    pub fn retake_clock(&mut self) {
        self.clock.retake();
    }

    pub fn wall_now_ns(&self) -> u64 {
        self.clock.to_unix_ns(BootClock::boot_now_ns())
    }

    /// The events of a record that is not about library discovery.
    pub fn events(&mut self, raw: Raw, gpu: &GpuProbes, code: &CodeRanges) -> Vec<Event> {
        match raw {
            Raw::GpuCall(ev) => {
                let Some(api) = Api::from_u32(ev.api) else { return Vec::new() };
                vec![Event {
                    origin: self.origin(&ev.header),
                    detail: Detail::GpuCall {
                        api,
                        library: gpu.library_path(ev.library).to_string(),
                        function: events::function_name(api, ev.function),
                        result: ev.result,
                        duration_ns: (ev.duration_ns != observer_common::gpu::UNTIMED_NS)
                            .then_some(ev.duration_ns),
                        // The pipeline fills it from the kernel's map.
                        driver_version: None,
                    },
                }]
            }
            Raw::OomVictim(ev) => {
                // The victim is still alive here: note where its memory is
                // accounted, for telling a cgroup limit from a global OOM.
                if let Some(scope) = oom::victim_scope(ev.victim_pid, self.cgroups.root()) {
                    if self.oom_scopes.len() >= MAX_OOM_VICTIMS {
                        self.oom_scopes.clear();
                    }
                    self.oom_scopes.insert(ev.victim_pid, scope);
                }
                self.oom_groups.mark(
                    ev.header.tid,
                    ev.header.ts_boot_ns,
                    ev.victim_pid,
                    std::time::Instant::now(),
                );
                Vec::new()
            }
            Raw::Exit(ev) => self.exit_events(&ev, gpu, code),
            Raw::MemoryLimitRefusal(ev) => {
                let (Some(limit), Some(syscall)) =
                    (MemLimit::from_u32(ev.limit), MemSyscall::from_u32(ev.syscall))
                else {
                    return Vec::new();
                };
                vec![Event {
                    origin: self.origin(&ev.header),
                    detail: Detail::MemoryLimitRefusal {
                        limit,
                        syscall,
                        requested_bytes: ev.requested_bytes,
                        limit_bytes: ev.limit_bytes,
                    },
                }]
            }
            Raw::KfdIoctl(ev) => {
                let via = KfdSource::from_u32(ev.source).map(KfdSource::as_str).unwrap_or("syscall");
                vec![Event {
                    origin: self.origin(&ev.header),
                    detail: Detail::KfdIoctl {
                        nr: observer_common::kfd::ioc_nr(ev.cmd),
                        cmd: ev.cmd,
                        result: ev.result,
                        duration_ns: ev.duration_ns,
                        via,
                    },
                }]
            }
            Raw::GpuHardware(ev) => {
                let (kind, function, detail) = events::hw_detail(&ev);
                let culprit = match events::hw_culprit(&ev) {
                    Some(HwCulprit::Pasid(pasid)) => self.kfd.by_pasid(pasid),
                    Some(HwCulprit::Pid(pid)) => self.kfd.by_pid(pid),
                    None => None,
                };
                let origin = match &culprit {
                    Some(process) => self.origin_of_process(&ev.header, process),
                    // The driver's own context: a kernel worker, not a workload.
                    None => self.origin(&ev.header),
                };
                let attributed = culprit.is_some();
                vec![Event { origin, detail: Detail::GpuHardware { kind, function, detail, attributed } }]
            }
            // Discovery records are the library tracker's, runs' the pipeline's.
            Raw::LibraryMap(_) | Raw::Exec(_) | Raw::GpuMap(_) => Vec::new(),
            Raw::LibraryLoadFailed(_) | Raw::RunExec(_) => Vec::new(),
        }
    }

    fn exit_events(&mut self, ev: &ExitEvent, gpu: &GpuProbes, code: &CodeRanges) -> Vec<Event> {
        let origin = self.origin(&ev.header);
        let mut out = Vec::new();
        if ev.flags & EXIT_FLAG_CRASH != 0 {
            let c = &ev.crash;
            let (library, library_offset) = match crash_library(c, gpu) {
                // The kernel could not look the address up (see CodeRanges).
                (None, _) if c.ip != 0 => {
                    code.at(ev.header.pid, c.ip).map_or((None, None), |(l, o)| (Some(l), Some(o)))
                }
                found => found,
            };
            let in_call = (c.in_call_api != 0).then(|| {
                let api = in_call_api(c.in_call_api).unwrap_or(Api::Hip);
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
            let kill = Event {
                origin: origin.clone(),
                detail: Detail::OomKill {
                    scope,
                    anon_rss_bytes: (ev.oom_anon_rss_kb != 0).then_some(ev.oom_anon_rss_kb * 1024),
                    victims: 1,
                },
            };
            let in_group = oom::in_oom_group(self.cgroups.root(), origin.cgroup.as_deref());
            out.extend(self.oom_groups.exit(ev.header.pid, ev.header.tid, kill, in_group));
        }
        if is_abnormal_exit(ev.exit_code) {
            let cause = exit_cause::cause(ev);
            let sender = match (cause, exit_cause::origin(ev)) {
                (Cause::Sent, Some(o)) => Some(self.sender(&origin, o)),
                _ => None,
            };
            // What it held on GPUs, read before KFD removes its directory.
            let vram = self.kfd.vram_at_exit(ev.header.pid);
            if let Some(vram) = &vram {
                self.vram.note_death(ev.header.pid, vram, cause, origin.clone(), std::time::Instant::now());
            }
            out.push(Event {
                origin,
                detail: Detail::Exit {
                    signal: exit_signal(ev.exit_code) as i32,
                    exit_code: exit_status(ev.exit_code) as i32,
                    core_dumped: core_dumped(ev.exit_code),
                    cause,
                    sender,
                    // Needs the pod's state: `kill_reasons` fills it in.
                    kill_reason: None,
                    vram,
                },
            });
        }
        out
    }
}

impl Attributor {
    /// The sender of a fatal signal to `target`, with its cgroup path and
    /// its place relative to the target.
    fn sender(&mut self, target: &Origin, o: &SignalOrigin) -> Sender {
        let cgroup = self.cgroups.path(o.sender_cgroup_id);
        let scope = exit_cause::sender_scope(
            target.pid,
            (target.cgroup_id, target.cgroup.as_deref()),
            o.sender_tgid,
            (o.sender_cgroup_id, cgroup.as_deref()),
        );
        Sender {
            pid: o.sender_tgid,
            comm: comm_str(&o.sender_comm).to_string(),
            cgroup_id: o.sender_cgroup_id,
            cgroup,
            scope,
        }
    }
}

/// The faulting object: the full path when it is a probed GPU library
/// (matched by inode), else the file name the kernel recorded.
fn crash_library(c: &CrashInfo, gpu: &GpuProbes) -> (Option<String>, Option<u64>) {
    if IpMapping::from_u32(c.ip_mapping) != Some(IpMapping::File) {
        return (None, None);
    }
    let offset = c.ip.checked_sub(c.vma_start).map(|d| d + c.vma_pgoff * PAGE_SIZE);
    let known =
        gpu.libraries().find(|l| l.library().id.ino == c.file_ino).map(|l| l.library().display_path.clone());
    let name = comm_str(&c.file_name).to_string();
    (known.or((!name.is_empty()).then_some(name)), offset)
}
