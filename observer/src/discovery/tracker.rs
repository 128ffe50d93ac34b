//! The GPU library tracker: which runtime files are probed, found at start,
//! at exec, at the mapping of an unknown file and in the maps of processes
//! that map code; retiring the probes of files that were deleted; resuming
//! processes the hold stopped. Each newly probed file becomes an
//! [`Announcement`], data that the pipeline turns into an event.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    path::PathBuf,
    time::{Duration, Instant},
};

use log::{debug, warn};
use observer_common::{
    comm_str,
    discovery::{is_gpu_library_name, GpuFileKey, GpuMapEvent},
    EventHeader,
};

use super::{
    ahead::{self, AheadOfTime},
    hold::Hold,
    hot::{process_cgroup, Candidate, ExitWatch, HotCounts, KernelScope, Policy, Reason, Selection},
    scan::{process_libraries, read_maps},
};
use crate::{
    gpu_library::{self, FileId, Flavor, GpuLibrary},
    probes::{
        gpu::{self, GpuAttachError, GpuProbes, HotPlacement},
        Loaded,
    },
};

mod hot_scopes;
mod linked;
mod loaders;
mod pending;

/// How often probed library files are checked for deletion.
const RETIRE_CHECK_EVERY: Duration = Duration::from_secs(5);
/// Files found not to be GPU runtimes are remembered up to this many.
const MAX_REJECTED: usize = 65536;
/// How often hot-call selection is re-evaluated when nothing asked for it
/// sooner (canary pods promoted, windows passed, processes gone).
const RESELECT_EVERY: Duration = Duration::from_millis(500);
/// A process selected at exec has this long to map a GPU runtime while the
/// kernel side reports its mappings; later ones are found by the map scan.
const EXEC_SCOPE_LIFETIME: Duration = Duration::from_secs(60);

/// A process that maps at least one probed GPU runtime file.
struct GpuProcess {
    comm: String,
    cgroup_id: u64,
    cgroup_path: Option<String>,
    libraries: BTreeSet<FileId>,
    exit: ExitWatch,
    /// Why it carries hot-call probes, when it does.
    reason: Option<Reason>,
}

/// Why a process's maps are read.
#[derive(Clone, Copy)]
enum Scan<'a> {
    /// At start: what running processes already map.
    AtStart,
    /// A while after the process mapped code (coalesced per process);
    /// `second_look` once files were left to the kernel's own report.
    CodeMapped { header: &'a EventHeader, second_look: bool },
    /// The kernel reported its mapping of a runtime file.
    GpuMapped(&'a EventHeader),
}

/// Whether a scan leaves a runtime file it found to the kernel's report of
/// its mapping instead of probing it now. The kernel reports a runtime file
/// it does not know at `mmap` return, just after the mapping appears in the
/// process's maps, so a scan made because of an earlier mapping of the same
/// process can read it in between; probing it then would announce it
/// without the mapping that revealed it (and race the hold). A file left so
/// is looked at again one scan delay later, in case the report was lost to
/// a full ring buffer; where the kernel cannot name mapped files, scans are
/// all there is.
fn leave_to_kernel_report(scan: Scan<'_>, kernel_names_mappings: bool, known: bool) -> bool {
    kernel_names_mappings && !known && matches!(scan, Scan::CodeMapped { second_look: false, .. })
}

/// A library newly probed, and why it was chosen.
#[derive(Clone, Debug)]
pub struct Announcement {
    pub library: String,
    pub flavor: Flavor,
    pub functions: usize,
    pub reason: String,
    /// How long the process that revealed it was held, with `--hold`.
    pub held_ns: Option<u64>,
    /// When its probes came to exist.
    pub probed_at: Option<gpu::ProbedAt>,
    /// The record that revealed it; `None` for what was found at start.
    pub origin: Option<EventHeader>,
}

#[derive(Debug, thiserror::Error)]
#[error("--lib {0}")]
pub struct ExplicitLibraryError(String);

pub struct LibraryTracker {
    probes: GpuProbes,
    /// What each exec's loader could find, resolved before it runs.
    ahead: AheadOfTime,
    /// Files inspected and found not to be GPU runtimes, with the change
    /// time they had then: a file rewritten in place is looked at again.
    rejected: HashMap<FileId, i128>,
    /// Executables and shared objects read for a runtime linked into them
    /// ([`linked`]).
    executables_read: HashSet<FileId>,
    /// Processes whose maps are read once their loader is likely done.
    pending_scans: pending::PendingScans,
    /// The loader libraries probed at `dlopen` ([`loaders`]).
    loaders: crate::probes::library_load::LoaderProbes,
    /// The kernel side reports mappings of runtime files by name (see
    /// [`leave_to_kernel_report`]).
    kernel_names_mappings: bool,
    last_retire_check: Instant,
    announcements: Vec<Announcement>,
    hold: Option<Hold>,
    selection: Selection,
    processes: HashMap<u32, GpuProcess>,
    /// Where they have GPU runtime code, for crash reports.
    code: super::code_ranges::CodeRanges,
    /// What the kernel side reports mappings for (see `set_hot_cgroup`).
    scopes: HashSet<KernelScope>,
    /// Scopes added at exec, until when they stay without a GPU process.
    exec_scopes: HashMap<KernelScope, Instant>,
    cgroup_root: Option<PathBuf>,
    last_reselect: Instant,
    reselect_now: bool,
}

impl LibraryTracker {
    pub fn new(
        hold: Option<Hold>,
        policy: Policy,
        detail: crate::config::HotDetail,
        cgroup_root: Option<PathBuf>,
    ) -> Self {
        let placement = match policy {
            Policy::Everyone => HotPlacement::Everywhere,
            Policy::Nobody => HotPlacement::Nowhere,
            Policy::Filter { .. } | Policy::Daemon { .. } => HotPlacement::PerProcess,
        };
        Self {
            selection: Selection::new(policy),
            processes: HashMap::new(),
            code: Default::default(),
            scopes: HashSet::new(),
            exec_scopes: HashMap::new(),
            cgroup_root,
            last_reselect: Instant::now(),
            reselect_now: false,
            probes: GpuProbes::new(placement, detail),
            ahead: AheadOfTime::default(),
            rejected: HashMap::new(),
            executables_read: HashSet::new(),
            pending_scans: Default::default(),
            loaders: Default::default(),
            kernel_names_mappings: false,
            last_retire_check: Instant::now(),
            announcements: Vec::new(),
            hold,
        }
    }

    /// Tells whether the kernel side's mapping reports are live.
    pub fn set_kernel_names_mappings(&mut self, live: bool) {
        self.kernel_names_mappings = live;
    }

    pub fn probes(&self) -> &GpuProbes {
        &self.probes
    }

    /// Where GPU processes (also recently exited ones) have GPU code.
    pub fn code_ranges(&self) -> &super::code_ranges::CodeRanges {
        &self.code
    }

    /// The hold watchdog's pid, when `--hold` is on.
    pub fn hold_watchdog(&self) -> Option<u32> {
        self.hold.as_ref().map(Hold::watchdog_pid)
    }

    /// Probes a library file in the shape this kernel allows: through the
    /// shared programs, through slot programs where there are no attach
    /// cookies, or not at all, with the reason kept for `check`.
    fn attach_library(&mut self, kernel: &mut Loaded, library: GpuLibrary) -> Result<usize, GpuAttachError> {
        if kernel.gpu_slots() {
            self.probes.use_slots();
        }
        if let Some(programs) = kernel.take_multi_programs() {
            self.probes.use_multi(programs);
        }
        match kernel.gpu_unavailable() {
            Some(why) => self.probes.refuse(library, why),
            None => self.probes.attach(kernel.object_mut(), library),
        }
    }

    /// Probes what the user named; each must be a GPU runtime that attaches.
    pub fn probe_explicit(
        &mut self,
        kernel: &mut Loaded,
        paths: &[PathBuf],
    ) -> Result<(), ExplicitLibraryError> {
        for path in paths {
            let display = path.display().to_string();
            let library =
                gpu_library::inspect(path, &display).map_err(|e| ExplicitLibraryError(e.to_string()))?;
            let key = GpuFileKey::from_stat(library.id.dev, library.id.ino);
            self.attach_library(kernel, library).map_err(|e| ExplicitLibraryError(e.to_string()))?;
            kernel.mark_known(key);
        }
        Ok(())
    }

    /// What the observer's own root (the node's, in a DaemonSet) could
    /// load, then what running processes (and their containers) already map.
    pub fn probe_present(&mut self, kernel: &mut Loaded) {
        for pid in self.selection.initial_pids().to_vec() {
            self.add_scope(kernel, KernelScope::Process(pid));
        }
        for c in self.ahead.for_process(std::process::id(), "the host") {
            self.consider(kernel, c.open_path, c.display, &c.reason, None);
        }
        for pid in crate::procfs::all_pids() {
            self.scan_process(kernel, pid, Scan::AtStart);
        }
    }

    /// Lets `run` tell canary pods by their cgroup path.
    pub fn set_canary_judge(&mut self, judge: super::hot::CanaryJudge) {
        self.selection.set_canary_judge(judge);
        self.reselect_now = true;
    }

    /// A GPU failure, stall or crash in a cgroup: with the daemon's policy
    /// its processes get hot-call probes for the window from now.
    pub fn note_trouble(&mut self, kernel: &mut Loaded, cgroup_id: u64) {
        if self.selection.note_trouble(cgroup_id, Instant::now()) {
            debug!("cgroup {cgroup_id} had GPU trouble: selecting its processes for hot-call probes");
            self.add_scope(kernel, KernelScope::Cgroup(cgroup_id));
            self.reselect_now = true;
        }
    }

    /// GPU processes with hot-call probes, by reason.
    pub fn hot_counts(&self) -> HotCounts {
        let mut counts = HotCounts::new();
        for reason in self.processes.values().filter_map(|p| p.reason) {
            *counts.entry(reason).or_default() += 1;
        }
        counts
    }

    /// A process mapped code: read its maps a little later, as the loader
    /// is usually mid-way through mapping a burst of libraries.
    pub fn code_mapped(&mut self, header: &EventHeader) {
        self.scan_later(*header, false);
    }

    /// Folds into the process's pending read of that kind ([`pending`]).
    fn scan_later(&mut self, header: EventHeader, second_look: bool) {
        self.pending_scans.note(header, second_look, Instant::now());
    }

    /// A program was exec'd: probe what its loader could find before it runs.
    pub fn exec(&mut self, kernel: &mut Loaded, header: &EventHeader, cgroup_path: Option<&str>) {
        let pid = header.pid;
        let started = Instant::now();
        // A selected process's mappings of runtime files it has not mapped
        // yet are reported by the kernel side from now on (and held, with
        // the hold), so its hot-call probes exist before its first launch.
        if self.selection.per_process() {
            let candidate =
                Candidate { pid, comm: comm_str(&header.comm), cgroup_id: header.cgroup_id, cgroup_path };
            if self.selection.reason(&candidate, started).is_some() {
                if let Some(scope) = self.selection.kernel_scope(&candidate) {
                    self.add_scope(kernel, scope);
                    self.exec_scopes.insert(scope, started + EXEC_SCOPE_LIFETIME);
                }
            }
        }
        let who = format!("{}[{pid}]", comm_str(&header.comm));
        let candidates = self.ahead.for_process(pid, &who);
        for c in &candidates {
            self.consider(kernel, c.open_path.clone(), c.display.clone(), &c.reason, Some(header));
        }
        self.linked_runtime_at_exec(kernel, header, &candidates);
        debug!("exec of pid {pid}: resolved in {:?}", started.elapsed());
    }

    /// A process mapped a GPU runtime file not yet known: probe what it
    /// maps now, then resume it if it was held.
    pub fn gpu_file_mapped(&mut self, kernel: &mut Loaded, ev: &GpuMapEvent) {
        let pid = ev.header.pid;
        let received = Instant::now();
        if ev.held != 0 {
            if let Some(hold) = self.hold.as_mut() {
                hold.take_up(pid, ev.held_at_ns);
            }
        }
        let first_new = self.announcements.len();
        self.scan_process(kernel, pid, Scan::GpuMapped(&ev.header));
        // Its maps may not name the file by a usable path (a deleted or
        // renamed file): the descriptor it was mapped from is still open
        // while the process is held.
        // (A file reported only because the process is selected is known
        // and was found through its maps already.) Whatever `consider`
        // reaches it marks known; a file it cannot reach (the process gone
        // before its report was read) stays news, so the next mapping of it
        // is reported, and held, again.
        if self.announcements.len() == first_new && ev.fd >= 0 && ev.known == 0 {
            let via_fd = PathBuf::from(format!("/proc/{pid}/fd/{}", ev.fd));
            let name = comm_str(&ev.name).to_string();
            let display = std::fs::read_link(&via_fd).map(|p| p.display().to_string()).unwrap_or(name);
            if is_gpu_library_name(display.rsplit('/').next().unwrap_or_default().as_bytes()) {
                let reason = format!("mapped by {}[{pid}]", comm_str(&ev.header.comm));
                if let Some(id) = self.consider(kernel, via_fd, display, &reason, Some(&ev.header)) {
                    self.register(pid, BTreeSet::from([id]));
                }
            } else {
                // Named like a runtime only in the kernel's view of it.
                kernel.mark_known(ev.key);
            }
        }
        // Its hot-call probes too, before it runs again.
        self.apply(kernel, pid, Instant::now());
        if ev.held == 0 {
            return;
        }
        let held_ns = self.hold.as_mut().and_then(|h| h.resume(pid, ev.held_at_ns));
        if held_ns.is_none() {
            // The hold's deadline ran out first: the watchdog resumed the
            // process before its probes were in place.
            let since_mapping = crate::clock::BootClock::boot_now_ns().saturating_sub(ev.header.ts_boot_ns);
            warn!(
                "pid {pid} was resumed by the hold's deadline before its GPU runtime file was probed (the \
                 mapping was read {:?} after it happened, and probing took {:?}): its first calls may be unseen",
                Duration::from_nanos(since_mapping).saturating_sub(received.elapsed()),
                received.elapsed()
            );
        }
        for announcement in &mut self.announcements[first_new..] {
            announcement.held_ns = held_ns;
            announcement.reason.push_str(", held until probed");
        }
    }

    /// Libraries probed since the last call.
    pub fn take_announcements(&mut self) -> Vec<Announcement> {
        std::mem::take(&mut self.announcements)
    }

    /// Due map scans, expired holds, and every few seconds the retirement
    /// of deleted library files.
    pub fn housekeeping(&mut self, kernel: &mut Loaded) {
        for pending in self.pending_scans.take_due(Instant::now()) {
            let scan = Scan::CodeMapped { header: &pending.header, second_look: pending.second_look };
            self.scan_process(kernel, pending.header.pid, scan);
        }
        if self.reselect_now || self.last_reselect.elapsed() >= RESELECT_EVERY {
            self.reselect(kernel);
        }
        if let Some(hold) = self.hold.as_mut() {
            for pid in hold.resume_expired() {
                warn!("resumed pid {pid}: held past its deadline without its library being probed");
            }
        }
        // One fstat per probed library every few seconds; the processes'
        // maps are read only when one of those files was deleted.
        if self.last_retire_check.elapsed() >= RETIRE_CHECK_EVERY {
            self.last_retire_check = Instant::now();
            for (_, id) in self.probes.retire_deleted(kernel.object_mut()) {
                kernel.forget_known(GpuFileKey::from_stat(id.dev, id.ino));
            }
            self.ahead.trim();
        }
    }

    /// Stops holding and resumes what is held; called before the probes are
    /// released, since releasing every uprobe link takes a grace period each.
    pub fn stop_holding(&mut self, kernel: &mut Loaded) {
        if let Some(hold) = self.hold.as_mut() {
            if let Some(program) = kernel.object_mut().program_mut(crate::probes::HOLDING_PROGRAM) {
                if let Ok(program) = <&mut aya::programs::TracePoint>::try_from(program) {
                    let _ = program.unload();
                }
            }
            hold.resume_all();
        }
    }

    /// Probes the GPU libraries a process maps (containers' own copies included).
    fn scan_process(&mut self, kernel: &mut Loaded, pid: u32, scan: Scan<'_>) {
        debug!("scanning the mappings of pid {pid}");
        let (reason, origin) = match scan {
            Scan::AtStart => ("mapped by a running process".to_string(), None),
            Scan::CodeMapped { header, .. } => {
                (format!("found in the maps of {}[{pid}]", comm_str(&header.comm)), Some(header))
            }
            Scan::GpuMapped(header) => (format!("mapped by {}[{pid}]", comm_str(&header.comm)), Some(header)),
        };
        // Read once for every look below: a process that maps hundreds of
        // objects has thousands of lines, and each read holds its mapping
        // lock against its own mmap calls.
        let maps = read_maps(pid);
        let mut probed = BTreeSet::new();
        let mut left = false;
        for (path, display) in process_libraries(pid, &maps) {
            if leave_to_kernel_report(scan, self.kernel_names_mappings, self.is_known(&path)) {
                debug!("{display}: left to the kernel's report of its mapping by pid {pid}");
                left = true;
                continue;
            }
            if let Some(id) = self.consider(kernel, path, display, &reason, origin) {
                probed.insert(id);
            }
        }
        if let (true, Some(header)) = (left, origin) {
            self.scan_later(*header, true);
        }
        if let Some(executable) = self.consider_linked_runtime(kernel, pid, &probed, origin) {
            probed.insert(executable);
        }
        let linked = self.consider_linked_objects(kernel, pid, &maps, &probed, origin);
        probed.extend(linked);
        self.watch_loaders(kernel, pid, &maps);
        if !probed.is_empty() {
            self.register(pid, probed);
            self.apply(kernel, pid, Instant::now());
        }
    }

    /// Whether a file was handled already: probed, or found not to be a
    /// runtime (the kernel side reports neither again).
    fn is_known(&self, path: &std::path::Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        // A file that cannot be read now is no news to wait for.
        let Ok(meta) = std::fs::metadata(path) else { return true };
        let id = FileId { dev: meta.dev(), ino: meta.ino() };
        self.probes.is_attached(&id) || self.rejected_as_it_is(&id, &meta)
    }

    /// Whether the file was found not to be a runtime, and has not changed since.
    fn rejected_as_it_is(&self, id: &FileId, meta: &std::fs::Metadata) -> bool {
        self.rejected.get(id) == Some(&ahead::mtime_ns(meta))
    }

    /// Records that `pid` maps these probed files.
    fn register(&mut self, pid: u32, libraries: BTreeSet<FileId>) {
        // Before its hot-call probes are attached, which hold its address
        // space and can make the kernel's own lookup at a crash give up.
        self.code.note(pid);
        if let Some(known) = self.processes.get_mut(&pid) {
            known.libraries.extend(libraries);
            return;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let (cgroup_id, cgroup_path) = match process_cgroup(pid, self.cgroup_root.as_deref()) {
            Some((id, path)) => (id, Some(path)),
            None => (0, None),
        };
        let process = GpuProcess {
            comm: comm.trim_end().to_string(),
            cgroup_id,
            cgroup_path,
            libraries,
            exit: ExitWatch::open(pid),
            reason: None,
        };
        self.processes.insert(pid, process);
    }

    /// Probes one file unless it is probed already or known not to be a
    /// GPU runtime; a newly probed file is announced with `reason`.
    fn consider(
        &mut self,
        kernel: &mut Loaded,
        path: PathBuf,
        display: String,
        reason: &str,
        origin: Option<&EventHeader>,
    ) -> Option<FileId> {
        use std::os::{fd::AsRawFd, unix::fs::MetadataExt};
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) => {
                debug!("{display} (via {}): {e}", path.display());
                return None;
            }
        };
        let id = FileId { dev: meta.dev(), ino: meta.ino() };
        if self.probes.is_attached(&id) || self.rejected_as_it_is(&id, &meta) {
            return self.probes.is_probed(&id).then_some(id);
        }
        // A path through /proc/PID/root lasts only as long as that process,
        // which may exit mid-attach. An open descriptor keeps the file
        // reachable (as /proc/self/fd/N) until the probes are in place.
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) => {
                debug!("{display} (via {}): {e}", path.display());
                return None;
            }
        };
        let held_open = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let t0 = Instant::now();
        match gpu_library::inspect(&held_open, &display) {
            Ok(library) => {
                debug!("inspected {display} in {:?}", t0.elapsed());
                let flavor = library.flavor;
                match self.attach_library(kernel, library) {
                    Ok(functions) => {
                        log::info!("probing {display} ({flavor:?}, {functions} functions): {reason}");
                        self.announcements.push(Announcement {
                            library: display,
                            flavor,
                            functions,
                            reason: reason.to_string(),
                            held_ns: None,
                            probed_at: self.probes.probed_at(&id),
                            origin: origin.copied(),
                        });
                    }
                    Err(e) => warn!("cannot probe {e}"),
                }
            }
            Err(e) if !ahead::settled(&meta) => {
                // Cut short, most likely, by a writer still at it: neither
                // remembered nor hidden from the kernel's mapping reports,
                // so the next exec or mapping looks at it whole.
                debug!(
                    "{display} changed a moment ago and is not yet a runtime ({e}): looked at again later"
                );
                return None;
            }
            Err(e) => {
                debug!("skipping {display}: {e}");
                if self.rejected.len() > MAX_REJECTED {
                    self.rejected.clear();
                }
                self.rejected.insert(id, ahead::mtime_ns(&meta));
            }
        }
        drop(file);
        // Probed, failed or not a runtime: mapping it again is no news,
        // but for a driver library's (see `linked`).
        let key = GpuFileKey::from_stat(id.dev, id.ino);
        if self.probes.flavor_of(&id).is_some_and(|f| f.api() == observer_common::gpu::Api::Cuda) {
            kernel.mark_known_driver(key);
        } else {
            kernel.mark_known(key);
        }
        self.probes.is_probed(&id).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_first_scan_after_a_mapping_leaves_unknown_files_to_the_kernel() {
        let header = EventHeader::default();
        let first = Scan::CodeMapped { header: &header, second_look: false };
        let second = Scan::CodeMapped { header: &header, second_look: true };
        assert!(leave_to_kernel_report(first, true, false));
        // Known files, kernels that cannot name mappings, second looks, the
        // scan at start and the kernel's own report: probed at once.
        assert!(!leave_to_kernel_report(first, true, true));
        assert!(!leave_to_kernel_report(first, false, false));
        assert!(!leave_to_kernel_report(second, true, false));
        assert!(!leave_to_kernel_report(Scan::AtStart, true, false));
        assert!(!leave_to_kernel_report(Scan::GpuMapped(&header), true, false));
    }
}
