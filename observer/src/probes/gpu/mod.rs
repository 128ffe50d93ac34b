//! GPU runtime libraries as the probes hold them: which files carry
//! probes, on which functions and tiers, under which cookie index, and
//! when they are retired. Finding and telling the files apart is in
//! `library`; making and dropping the links is in `links`.
mod links;

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use aya::{programs::uprobe::UProbeScope, Ebpf};
use log::{debug, info};

use links::{attach_functions, detach_links, AttachOutcome, Links};

use super::{gpu_slots::Slots, uprobe_multi::MultiPrograms};
use crate::{
    clock::BootClock,
    config::HotDetail,
    gpu_library::{FileId, Flavor, GpuLibrary},
    procfs::{all_pids, file_mappings},
};
use observer_common::gpu::{Api, GpuFunction, Tier};

pub const ENTER_PROGRAM: &str = "gpu_enter";
pub const EXIT_PROGRAM: &str = "gpu_exit";

/// Where the hot tier goes (see `config::HotCalls`), as the probes see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotPlacement {
    /// Per process, on request ([`GpuProbes::attach_hot`]).
    PerProcess,
    /// With the cold tier, in every process.
    Everywhere,
    /// Not at all.
    Nowhere,
}

/// The attached state: which files carry probes and on which functions.
pub struct GpuProbes {
    hot: HotPlacement,
    /// What the hot tier's probes record.
    hot_detail: HotDetail,
    attached: HashMap<FileId, AttachedLibrary>,
    /// Files that failed to attach (display path, reason), so they are not
    /// retried on every event.
    failed: HashMap<FileId, (String, String)>,
    /// Library paths by the index carried in attach cookies.
    table: Vec<String>,
    /// On a kernel without attach cookies: which function has which slot.
    slots: Option<Slots>,
    /// On a kernel with `uprobe_multi` links: the programs loaded for them.
    multi: Option<MultiPrograms>,
}

impl Default for GpuProbes {
    fn default() -> Self {
        Self::new(HotPlacement::Everywhere, HotDetail::Timed)
    }
}

pub struct AttachedLibrary {
    library: GpuLibrary,
    /// Index carried in this file's attach cookies.
    index: u32,
    /// Functions probed in every process.
    functions: usize,
    links: Links,
    /// Hot-tier probes scoped to one process each, by pid.
    hot: HashMap<u32, Links>,
    /// An O_PATH handle on the probed file. It tells whether the file was
    /// deleted (no links left) whatever mount namespace its path was in,
    /// even after the process whose /proc/PID/root led to it is gone, and
    /// it is the path per-process probes attach through later.
    handle: Option<fs::File>,
    probed_at: ProbedAt,
}

impl AttachedLibrary {
    pub fn library(&self) -> &GpuLibrary {
        &self.library
    }

    /// How many functions carry probes in every process.
    pub fn functions(&self) -> usize {
        self.functions
    }

    /// Hot-tier functions this file exports (probed per selected process).
    pub fn hot_functions(&self) -> usize {
        self.library.functions.keys().filter(|f| tier(self.library.flavor.api(), f) == Tier::Hot).count()
    }

    fn deleted(&self) -> bool {
        self.handle.as_ref().and_then(|h| h.metadata().ok()).is_some_and(|m| m.nlink() == 0)
    }

    /// A path that reaches the file for as long as it is probed.
    fn attach_path(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        match &self.handle {
            Some(h) => PathBuf::from(format!("/proc/self/fd/{}", h.as_raw_fd())),
            None => self.library.path.clone(),
        }
    }
}

fn tier(api: Api, name: &str) -> Tier {
    api.functions().iter().find(|f| f.name == name).map(|f| f.tier).unwrap_or(Tier::Cold)
}

/// Why a library file got no probes.
#[derive(Debug, thiserror::Error)]
pub enum GpuAttachError {
    #[error("{0}: gone while attaching (the process exited)")]
    Gone(String),
    #[error("{library}: {reason}")]
    Failed { library: String, reason: String },
}

impl GpuProbes {
    pub fn new(hot: HotPlacement, hot_detail: HotDetail) -> Self {
        Self {
            hot,
            hot_detail,
            attached: HashMap::new(),
            failed: HashMap::new(),
            table: Vec::new(),
            slots: None,
            multi: None,
        }
    }

    /// What a hot call's probes record here: counted at return only where
    /// asked and where attach cookies exist (the slot programs of older
    /// kernels come in pairs).
    pub fn hot_detail(&self) -> HotDetail {
        match self.slots {
            Some(_) => HotDetail::Timed,
            None => self.hot_detail,
        }
    }

    /// Probes functions through slot programs from now on: the kernel has
    /// no attach cookies (gpu_slots.rs).
    pub fn use_slots(&mut self) {
        self.slots.get_or_insert_with(Slots::default);
    }

    /// Probes each file through one `uprobe_multi` link per program from
    /// now on.
    pub fn use_multi(&mut self, programs: MultiPrograms) {
        self.multi = Some(programs);
    }

    /// How functions get their probes here, for `check`.
    fn link_kind(&self) -> &'static str {
        match (&self.slots, &self.multi) {
            (Some(_), _) => "fallback before Linux 5.15 (no attach cookies): a program pair per function",
            (None, Some(_)) => "one uprobe_multi link per program",
            (None, None) => "a perf-event link per function and program",
        }
    }

    pub fn hot_placement(&self) -> HotPlacement {
        self.hot
    }

    pub fn is_attached(&self, id: &FileId) -> bool {
        self.attached.contains_key(id) || self.failed.contains_key(id)
    }

    /// Whether a file carries probes (not merely failed).
    /// When file `id`'s probes came to exist, if it is attached.
    pub fn probed_at(&self, id: &FileId) -> Option<ProbedAt> {
        self.attached.get(id).map(|a| a.probed_at)
    }

    pub fn is_probed(&self, id: &FileId) -> bool {
        self.attached.contains_key(id)
    }

    /// One line per library file: probed, or why not.
    pub fn status(&self) -> Vec<crate::probes::ProbeStatus> {
        let detail = match self.hot_detail() {
            HotDetail::Counts => "counted at return",
            HotDetail::Timed => "timed",
        };
        let attached = self.attached.values().map(|l| {
            let hot = match self.hot {
                HotPlacement::Everywhere => format!(" (hot tier included, {detail})"),
                HotPlacement::Nowhere => format!(", {} hot not probed", l.hot_functions()),
                HotPlacement::PerProcess => {
                    format!(", {} hot in {} selected processes, {detail}", l.hot_functions(), l.hot.len())
                }
            };
            let hot = format!("{hot}; {}", self.link_kind());
            crate::probes::ProbeStatus {
                probe: "gpu",
                target: l.library.display_path.clone(),
                attached: true,
                detail: format!("{:?}: {} functions{hot}", l.library.flavor, l.functions),
            }
        });
        let failed = self.failed.values().map(|(path, reason)| crate::probes::ProbeStatus {
            probe: "gpu",
            target: path.clone(),
            attached: false,
            detail: reason.clone(),
        });
        let mut all: Vec<_> = attached.chain(failed).collect();
        all.sort_by(|a, b| a.target.cmp(&b.target));
        all
    }

    /// The library path for the index found in an event's cookie.
    pub fn library_path(&self, index: u32) -> &str {
        self.table.get(index as usize).map(String::as_str).unwrap_or("?")
    }

    pub fn libraries(&self) -> impl Iterator<Item = &AttachedLibrary> {
        self.attached.values()
    }

    /// The flavor of a probed file.
    pub fn flavor_of(&self, id: &FileId) -> Option<Flavor> {
        self.attached.get(id).map(|l| l.library.flavor)
    }

    /// Records a file that carries a runtime but cannot be probed (an
    /// executable stripped of its symbol table), so that `check` and the
    /// probe metric say so.
    pub fn refuse_file(&mut self, id: FileId, display: String, why: String) {
        self.failed.insert(id, (display, why));
    }

    /// Records `library` as unprobed for `why` (the programs could not be
    /// loaded on this kernel), so that `check` and the probe metric say so.
    pub fn refuse(&mut self, library: GpuLibrary, why: &str) -> Result<usize, GpuAttachError> {
        self.failed.insert(library.id, (library.display_path.clone(), why.to_string()));
        Err(GpuAttachError::Failed { library: library.display_path, reason: why.to_string() })
    }

    /// Attaches entry and return probes to every resolved function of
    /// `library` in its tier: cold ones for every process, hot ones too
    /// when they go everywhere.
    pub fn attach(&mut self, ebpf: &mut Ebpf, library: GpuLibrary) -> Result<usize, GpuAttachError> {
        if self.is_attached(&library.id) {
            return Ok(0);
        }
        let api = library.flavor.api();
        let library_index = self.table.len() as u32;
        let everywhere = self.hot == HotPlacement::Everywhere;
        let wanted = |f: &GpuFunction| f.tier == Tier::Cold || everywhere;
        let started = std::time::Instant::now();
        let count_hot = self.hot_detail() == HotDetail::Counts;
        let attached = attach_functions(
            ebpf,
            self.slots.as_mut(),
            self.multi.as_ref(),
            &library.path,
            &library,
            library_index,
            wanted,
            count_hot,
            UProbeScope::AllProcesses,
        );
        debug!("attached {} in {:?}", library.display_path, started.elapsed());
        let probed_at = ProbedAt { init_ns: attached.init_ready_ns, all_ns: BootClock::boot_now_ns() };
        let AttachOutcome { links, count, first_error, .. } = attached;
        // The path went away while attaching (usually through
        // /proc/PID/root of a process that just exited): undo, and do not
        // remember the file as failed, so the next process that maps it
        // gets every probe.
        if first_error.is_some() && !library.path.exists() {
            detach_links(ebpf, links);
            return Err(GpuAttachError::Gone(library.display_path));
        }
        let hot_only = count == 0
            && first_error.is_none()
            && library.functions.keys().any(|f| tier(api, f) == Tier::Hot);
        if count == 0 && !hot_only {
            let reason =
                first_error.map(|e| e.to_string()).unwrap_or_else(|| "no probed function found".into());
            self.failed.insert(library.id, (library.display_path.clone(), reason.clone()));
            return Err(GpuAttachError::Failed { library: library.display_path, reason });
        }
        for (alias, probed) in &library.aliases {
            debug!("{}: {alias} is {probed}, probed once", library.display_path);
        }
        info!("probing {} ({:?}): {count} functions", library.display_path, library.flavor);
        self.table.push(library.display_path.clone());
        let handle = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
            .open(&library.path)
            .ok();
        let id = library.id;
        self.attached.insert(
            id,
            AttachedLibrary {
                library,
                index: library_index,
                functions: count,
                links,
                hot: HashMap::new(),
                handle,
                probed_at,
            },
        );
        Ok(count)
    }

    /// Attaches the hot tier of file `id` for process `pid` alone: the
    /// kernel plants its breakpoints in that process's memory only. Returns
    /// how many functions were probed (0 when they already were, or when
    /// the hot tier is not placed per process).
    pub fn attach_hot(&mut self, ebpf: &mut Ebpf, id: &FileId, pid: u32) -> Result<usize, GpuAttachError> {
        if self.hot != HotPlacement::PerProcess {
            return Ok(0);
        }
        let Some(scope_pid) = std::num::NonZeroU32::new(pid) else { return Ok(0) };
        let count_hot = self.hot_detail() == HotDetail::Counts;
        let Some(library) = self.attached.get_mut(id) else { return Ok(0) };
        if library.hot.contains_key(&pid) {
            return Ok(0);
        }
        let path = library.attach_path();
        let outcome = attach_functions(
            ebpf,
            self.slots.as_mut(),
            self.multi.as_ref(),
            &path,
            &library.library,
            library.index,
            |f| f.tier == Tier::Hot,
            count_hot,
            UProbeScope::OneProcess(scope_pid),
        );
        let AttachOutcome { links, count, first_error, .. } = outcome;
        if let Some(e) = first_error {
            // A process that exited meanwhile is no failure of the file.
            let gone = !Path::new(&format!("/proc/{pid}")).exists();
            detach_links(ebpf, links);
            let display = library.library.display_path.clone();
            return Err(match gone {
                true => GpuAttachError::Gone(format!("{display} in pid {pid}")),
                false => GpuAttachError::Failed {
                    library: format!("{display} in pid {pid}"),
                    reason: e.to_string(),
                },
            });
        }
        library.hot.insert(pid, links);
        Ok(count)
    }

    /// Removes every hot-tier probe of `pid`; returns whether it had any.
    pub fn release_hot(&mut self, ebpf: &mut Ebpf, pid: u32) -> bool {
        let mut links = Vec::new();
        for library in self.attached.values_mut() {
            if let Some(l) = library.hot.remove(&pid) {
                links.extend(l);
            }
        }
        let had = !links.is_empty();
        detach_links(ebpf, links);
        had
    }

    /// Removes the probes of library files that were deleted (or replaced
    /// by a rename) and that no process maps any more: each new image
    /// version of a runtime brings a new file, and without this their
    /// probes would pile up for as long as the observer runs. Returns the
    /// paths and identities of the libraries let go.
    pub fn retire_deleted(&mut self, ebpf: &mut Ebpf) -> Vec<(String, FileId)> {
        let deleted: Vec<FileId> =
            self.attached.iter().filter(|(_, l)| l.deleted()).map(|(id, _)| *id).collect();
        if deleted.is_empty() {
            return Vec::new();
        }
        // Only now is every process's map list read. Matched by path: the
        // inode in /proc/PID/maps is the underlying file's, which differs
        // from the one stat(2) gives on overlayfs.
        let still_mapped = deleted_files_mapped();
        let mut retired = Vec::new();
        for id in deleted {
            let Some(path) = self.attached.get(&id).map(|l| l.library.display_path.clone()) else {
                continue;
            };
            if still_mapped.contains(&path) {
                continue;
            }
            if let Some(library) = self.attached.remove(&id) {
                let mut links = library.links;
                links.extend(library.hot.into_values().flatten());
                detach_links(ebpf, links);
                if let Some(slots) = self.slots.as_mut() {
                    slots.release_library(library.index);
                }
                info!("no longer probing {path}: deleted, and no process maps it any more");
                retired.push((path, id));
            }
        }
        retired
    }
}

/// Paths of deleted files that some process still maps (as the kernel
/// names them in /proc/PID/maps, without the " (deleted)" note).
fn deleted_files_mapped() -> std::collections::HashSet<String> {
    let mut out = std::collections::HashSet::new();
    for pid in all_pids() {
        let Ok(maps) = fs::read(format!("/proc/{pid}/maps")) else { continue };
        let maps = String::from_utf8_lossy(&maps);
        for mapping in file_mappings(&maps) {
            if mapping.deleted() {
                out.insert(mapping.file_path().to_string());
            }
        }
    }
    out
}

/// When a file's probes came to exist, on the boot clock that stamps the
/// kernel's records, so that they compare with the record that revealed
/// the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbedAt {
    /// Its init functions' probes: the first calls a process makes.
    pub init_ns: u64,
    /// Every probe of its tier.
    pub all_ns: u64,
}
