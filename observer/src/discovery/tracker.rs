//! The GPU library tracker: which runtime files are probed, found at start,
//! at exec, at the mapping of an unknown file and in the maps of processes
//! that map code; retiring the probes of files that were deleted; resuming
//! processes the hold stopped. Each newly probed file becomes an
//! [`Announcement`], data that the pipeline turns into an event.
use std::{
    collections::HashSet,
    path::PathBuf,
    time::{Duration, Instant},
};

use log::{debug, warn};
use observer_common::{
    comm_str,
    discovery::{is_gpu_library_name, GpuFileKey, GpuMapEvent, MAP_SCAN_DELAY_MS},
    EventHeader,
};

use super::{ahead::AheadOfTime, hold::Hold};
use crate::probes::{
    gpu::{self, Flavor, GpuProbes},
    Loaded,
};

/// How often probed library files are checked for deletion.
const RETIRE_CHECK_EVERY: Duration = Duration::from_secs(5);
/// Files found not to be GPU runtimes are remembered up to this many.
const MAX_REJECTED: usize = 65536;

/// A library newly probed, and why it was chosen.
#[derive(Clone, Debug)]
pub struct Announcement {
    pub library: String,
    pub flavor: Flavor,
    pub functions: usize,
    pub reason: String,
    /// How long the process that revealed it was held, with `--hold`.
    pub held_ns: Option<u64>,
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
    /// Files inspected and found not to be GPU runtimes.
    rejected: HashSet<gpu::FileId>,
    /// Processes whose maps are read once their loader is likely done.
    pending_scans: Vec<(Instant, u32)>,
    last_retire_check: Instant,
    announcements: Vec<Announcement>,
    hold: Option<Hold>,
}

impl LibraryTracker {
    pub fn new(hold: Option<Hold>) -> Self {
        Self {
            probes: GpuProbes::default(),
            ahead: AheadOfTime::default(),
            rejected: HashSet::new(),
            pending_scans: Vec::new(),
            last_retire_check: Instant::now(),
            announcements: Vec::new(),
            hold,
        }
    }

    pub fn probes(&self) -> &GpuProbes {
        &self.probes
    }

    /// The hold watchdog's pid, when `--hold` is on.
    pub fn hold_watchdog(&self) -> Option<u32> {
        self.hold.as_ref().map(Hold::watchdog_pid)
    }

    /// Probes what the user named; each must be a GPU runtime that attaches.
    pub fn probe_explicit(
        &mut self,
        kernel: &mut Loaded,
        paths: &[PathBuf],
    ) -> Result<(), ExplicitLibraryError> {
        for path in paths {
            let display = path.display().to_string();
            let library = gpu::inspect(path, &display).map_err(|e| ExplicitLibraryError(e.to_string()))?;
            let key = GpuFileKey::from_stat(library.id.dev, library.id.ino);
            self.probes
                .attach(kernel.object_mut(), library)
                .map_err(|e| ExplicitLibraryError(e.to_string()))?;
            kernel.mark_known(key);
        }
        Ok(())
    }

    /// What the observer's own root (the node's, in a DaemonSet) could
    /// load, then what running processes (and their containers) already map.
    pub fn probe_present(&mut self, kernel: &mut Loaded) {
        for c in self.ahead.for_process(std::process::id(), "the host") {
            self.consider(kernel, c.open_path, c.display, &c.reason, None);
        }
        for pid in gpu::all_pids() {
            self.scan_process(kernel, pid, None);
        }
    }

    /// A process mapped code: read its maps a little later, as the loader
    /// is usually mid-way through mapping a burst of libraries.
    pub fn code_mapped(&mut self, pid: u32) {
        if !self.pending_scans.iter().any(|(_, p)| *p == pid) {
            let due = Instant::now() + Duration::from_millis(MAP_SCAN_DELAY_MS);
            self.pending_scans.push((due, pid));
        }
    }

    /// A program was exec'd: probe what its loader could find before it runs.
    pub fn exec(&mut self, kernel: &mut Loaded, header: &EventHeader) {
        let pid = header.pid;
        let started = Instant::now();
        let who = format!("{}[{pid}]", comm_str(&header.comm));
        for c in self.ahead.for_process(pid, &who) {
            self.consider(kernel, c.open_path, c.display, &c.reason, Some(header));
        }
        debug!("exec of pid {pid}: resolved in {:?}", started.elapsed());
    }

    /// A process mapped a GPU runtime file not yet known: probe what it
    /// maps now, then resume it if it was held.
    pub fn gpu_file_mapped(&mut self, kernel: &mut Loaded, ev: &GpuMapEvent) {
        let pid = ev.header.pid;
        let first_new = self.announcements.len();
        self.scan_process(kernel, pid, Some(&ev.header));
        // Its maps may not name the file by a usable path (a deleted or
        // renamed file): the descriptor it was mapped from is still open
        // while the process is held.
        if self.announcements.len() == first_new && ev.fd >= 0 {
            let via_fd = PathBuf::from(format!("/proc/{pid}/fd/{}", ev.fd));
            let name = comm_str(&ev.name).to_string();
            let display = std::fs::read_link(&via_fd).map(|p| p.display().to_string()).unwrap_or(name);
            if is_gpu_library_name(display.rsplit('/').next().unwrap_or_default().as_bytes()) {
                let reason = format!("mapped by {}[{pid}]", comm_str(&ev.header.comm));
                self.consider(kernel, via_fd, display, &reason, Some(&ev.header));
            }
        }
        kernel.mark_known(ev.key);
        if ev.held == 0 {
            return;
        }
        let held_ns = self.hold.as_mut().and_then(|h| h.resume(pid));
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
        let now = Instant::now();
        let due: Vec<u32> = self.pending_scans.iter().filter(|(t, _)| *t <= now).map(|(_, p)| *p).collect();
        self.pending_scans.retain(|(t, _)| *t > now);
        for pid in due {
            self.scan_process(kernel, pid, None);
        }
        if let Some(hold) = self.hold.as_mut() {
            for pid in hold.resume_expired() {
                warn!(
                    "resumed pid {pid}: held past {:?} without its library being probed",
                    super::hold::HOLD_DEADLINE
                );
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
    fn scan_process(&mut self, kernel: &mut Loaded, pid: u32, origin: Option<&EventHeader>) {
        debug!("scanning the mappings of pid {pid}");
        let reason = match origin {
            Some(h) => format!("mapped by {}[{pid}]", comm_str(&h.comm)),
            None => "mapped by a running process".to_string(),
        };
        for (path, display) in gpu::process_libraries(pid) {
            self.consider(kernel, path, display, &reason, origin);
        }
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
    ) {
        use std::os::{fd::AsRawFd, unix::fs::MetadataExt};
        let meta = match std::fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) => {
                debug!("{display} (via {}): {e}", path.display());
                return;
            }
        };
        let id = gpu::FileId { dev: meta.dev(), ino: meta.ino() };
        if self.probes.is_attached(&id) || self.rejected.contains(&id) {
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
                match self.probes.attach(kernel.object_mut(), library) {
                    Ok(functions) => {
                        log::info!("probing {display} ({flavor:?}, {functions} functions): {reason}");
                        self.announcements.push(Announcement {
                            library: display,
                            flavor,
                            functions,
                            reason: reason.to_string(),
                            held_ns: None,
                            origin: origin.copied(),
                        });
                    }
                    Err(e) => warn!("cannot probe {e}"),
                }
            }
            Err(e) => {
                debug!("skipping {display}: {e}");
                if self.rejected.len() > MAX_REJECTED {
                    self.rejected.clear();
                }
                self.rejected.insert(id);
            }
        }
        drop(file);
        // Probed, failed or not a runtime: mapping it again is no news.
        kernel.mark_known(GpuFileKey::from_stat(id.dev, id.ino));
    }
}
