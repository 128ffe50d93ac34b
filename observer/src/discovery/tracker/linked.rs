//! A CUDA runtime linked into the executable (`nvcc -cudart static`, its
//! default): the process reaches a CUDA driver library and no runtime file,
//! and its runtime calls are in the executable's own code. That file is
//! read for its symbol table once per inode, only for such processes, and
//! probed like a runtime file: at exec when the executable carries the
//! runtime's mark (found in the read `ahead` makes anyway), or after a scan
//! finds it mapping a driver library and no runtime file.
//!
//! A runtime linked into a shared object (CuPy's extension modules) is
//! found the same way, in the other code a process maps once it maps a
//! CUDA driver library: the static runtime loads the driver library itself
//! on its first call, and the kernel side reports each mapping of a driver
//! library (held, with the hold), so the scan runs before the calls that
//! follow. Each file's symbol table is read once per inode.
use std::{collections::BTreeSet, os::fd::AsRawFd, os::unix::fs::MetadataExt, path::PathBuf};

use log::{debug, info};
use observer_common::{comm_str, gpu::Api, EventHeader};

use super::{Announcement, LibraryTracker, MAX_REJECTED};
use crate::discovery::{ahead::Candidate, scan::process_code_objects};
use crate::{
    gpu_library::{
        candidate_api,
        linked_runtime::{inspect_executable, inspect_shared_object, LinkedRuntime},
        FileId, Flavor, STRIPPED_RUNTIME,
    },
    probes::Loaded,
};

impl LibraryTracker {
    /// At exec: the executable carries the runtime's mark and its loader
    /// can reach a CUDA driver library (`candidates`), so the runtime is
    /// probed in it before it runs, and its first call is seen.
    pub(super) fn linked_runtime_at_exec(
        &mut self,
        kernel: &mut Loaded,
        header: &EventHeader,
        candidates: &[Candidate],
    ) {
        let driver = candidates
            .iter()
            .any(|c| candidate_api(c.display.rsplit('/').next().unwrap_or_default()) == Some(Api::Cuda));
        if driver && self.ahead.carries_runtime(header.pid) {
            self.probe_executable(kernel, header.pid, Some(header));
        }
    }

    /// After a scan: the probed files `pid` maps (`mapped`) include a CUDA
    /// driver library but no runtime file, so the runtime may be linked into
    /// its executable (a process found running at start, or one whose exec
    /// was not seen). Returns the executable's id when it carries probes.
    pub(super) fn consider_linked_runtime(
        &mut self,
        kernel: &mut Loaded,
        pid: u32,
        mapped: &BTreeSet<FileId>,
        origin: Option<&EventHeader>,
    ) -> Option<FileId> {
        let flavors: Vec<Flavor> = mapped.iter().filter_map(|id| self.probes.flavor_of(id)).collect();
        if !flavors.iter().any(|f| f.api() == Api::Cuda) || flavors.contains(&Flavor::Cudart) {
            return None;
        }
        self.probe_executable(kernel, pid, origin)
    }

    /// After a scan: the probed files `pid` maps (`mapped`) include a CUDA
    /// driver library, so a runtime may be linked into one of the shared
    /// objects it maps. Returns those that carry probes.
    pub(super) fn consider_linked_objects(
        &mut self,
        kernel: &mut Loaded,
        pid: u32,
        maps: &str,
        mapped: &BTreeSet<FileId>,
        origin: Option<&EventHeader>,
    ) -> Vec<FileId> {
        if !mapped.iter().any(|id| self.probes.flavor_of(id).is_some_and(|f| f.api() == Api::Cuda)) {
            return Vec::new();
        }
        let who =
            origin.map(|h| format!("{}[{pid}]", comm_str(&h.comm))).unwrap_or_else(|| format!("pid {pid}"));
        let mut probed = Vec::new();
        for (path, display) in process_code_objects(pid, maps) {
            if let Some(id) = self.probe_object(kernel, path, display, &who, origin) {
                probed.push(id);
            }
        }
        probed
    }

    /// The id of `file` when it is to be read for a linked runtime now:
    /// each inode is read once (the set forgotten past [`MAX_REJECTED`]).
    /// Otherwise, what its caller answers: the id of a file already probed,
    /// or nothing for one read before or unreadable.
    fn first_read(&mut self, file: &std::fs::File) -> Result<FileId, Option<FileId>> {
        let meta = file.metadata().map_err(|_| None)?;
        let id = FileId { dev: meta.dev(), ino: meta.ino() };
        if self.probes.is_attached(&id) {
            return Err(self.probes.is_probed(&id).then_some(id));
        }
        if !self.executables_read.insert(id) {
            return Err(None);
        }
        if self.executables_read.len() > MAX_REJECTED {
            self.executables_read.clear();
        }
        Ok(id)
    }

    /// Reads one shared object once per inode for a linked runtime, probes
    /// it, or records why it cannot.
    fn probe_object(
        &mut self,
        kernel: &mut Loaded,
        path: PathBuf,
        display: String,
        who: &str,
        origin: Option<&EventHeader>,
    ) -> Option<FileId> {
        // Held open: a path through /proc/PID/root lasts as long as the process.
        let file = std::fs::File::open(&path).ok()?;
        let id = match self.first_read(&file) {
            Ok(id) => id,
            Err(known) => return known,
        };
        let held_open = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let started = std::time::Instant::now();
        let found = inspect_shared_object(&held_open, &display);
        debug!("{display}: read for a linked runtime in {:?}", started.elapsed());
        let (flavor, functions, reason) = match found {
            Ok(LinkedRuntime::Probe(library)) => {
                let flavor = library.flavor;
                match self.attach_library(kernel, library) {
                    Ok(functions) => {
                        info!("probing {display} ({flavor:?} runtime linked in, {functions} functions): mapped by {who}");
                        (
                            flavor,
                            functions,
                            format!(
                                "{} runtime linked into {display}, mapped by {who}",
                                runtime_name(flavor)
                            ),
                        )
                    }
                    Err(e) => {
                        log::warn!("cannot probe {e}");
                        return None;
                    }
                }
            }
            Ok(LinkedRuntime::Stripped) => {
                log::warn!("{display}: {STRIPPED_RUNTIME}");
                self.probes.refuse_file(id, display.clone(), STRIPPED_RUNTIME.to_string());
                (Flavor::Cudart, 0, format!("{STRIPPED_RUNTIME}; mapped by {who}"))
            }
            Ok(LinkedRuntime::Absent) => return None,
            Err(e) => {
                debug!("{e}");
                return None;
            }
        };
        self.announcements.push(Announcement {
            library: display,
            flavor,
            functions,
            reason,
            held_ns: None,
            probed_at: self.probes.probed_at(&id),
            origin: origin.copied(),
        });
        drop(file);
        self.probes.is_probed(&id).then_some(id)
    }

    /// Reads the executable of `pid` once per inode for a linked runtime,
    /// probes it, or records why it cannot.
    fn probe_executable(
        &mut self,
        kernel: &mut Loaded,
        pid: u32,
        origin: Option<&EventHeader>,
    ) -> Option<FileId> {
        // The executable through the process, for as long as it lives; an
        // open descriptor keeps the file reachable while it is probed.
        let file = std::fs::File::open(format!("/proc/{pid}/exe")).ok()?;
        let id = match self.first_read(&file) {
            Ok(id) => id,
            Err(known) => return known,
        };
        let display = std::fs::read_link(format!("/proc/{pid}/exe"))
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| format!("/proc/{pid}/exe"));
        let who =
            origin.map(|h| format!("{}[{pid}]", comm_str(&h.comm))).unwrap_or_else(|| format!("pid {pid}"));
        let held_open = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        let announce = |tracker: &mut Self, functions: usize, reason: String| {
            tracker.announcements.push(Announcement {
                library: display.clone(),
                flavor: Flavor::Cudart,
                functions,
                reason,
                held_ns: None,
                probed_at: tracker.probes.probed_at(&id),
                origin: origin.copied(),
            });
        };
        match inspect_executable(&held_open, &display) {
            Ok(LinkedRuntime::Probe(library)) => match self.attach_library(kernel, library) {
                Ok(functions) => {
                    info!("probing {display} (CUDA runtime linked in, {functions} functions): run by {who}");
                    announce(self, functions, format!("CUDA runtime linked into the executable of {who}"));
                }
                Err(e) => log::warn!("cannot probe {e}"),
            },
            Ok(LinkedRuntime::Stripped) => {
                let why = "CUDA runtime linked in, but the executable is stripped of its symbol table: its \
                           runtime calls are not probed (the driver library's are)";
                log::warn!("{display}: {why}");
                self.probes.refuse_file(id, display.clone(), why.to_string());
                announce(self, 0, format!("{why}; run by {who}"));
            }
            Ok(LinkedRuntime::Absent) => debug!("{display}: no CUDA runtime linked in"),
            Err(e) => debug!("{e}"),
        }
        drop(file);
        self.probes.is_probed(&id).then_some(id)
    }
}

/// How a reason names the runtime linked in.
fn runtime_name(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Hip => "HIP",
        _ => "CUDA",
    }
}
