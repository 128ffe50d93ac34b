//! GPU runtime libraries: finding them (host paths, running processes and
//! their container roots, `--lib`), telling HIP from a CUDA driver library
//! and ZLUDA from NVIDIA, and attaching the shared entry/return programs to
//! each probed function with a cookie naming it.
use std::{
    collections::{BTreeMap, HashMap},
    fs,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
        UProbe,
    },
    Ebpf,
};
use log::{debug, info};
use object::{Object, ObjectSection, ObjectSymbol};

use super::{
    gpu_slots::Slots,
    releaser::Link,
    uprobe_multi::{self, Fires, MultiPrograms},
    AttachError,
};
use crate::{clock::BootClock, config::HotDetail};
use observer_common::gpu::{cookie, Api, GpuFunction, Tier, COUNT_PROGRAM};

pub const ENTER_PROGRAM: &str = "gpu_enter";
pub const EXIT_PROGRAM: &str = "gpu_exit";

/// What kind of GPU runtime a library file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Flavor {
    /// AMD's HIP runtime, `libamdhip64.so*`.
    Hip,
    /// A CUDA driver API library built on HIP: ZLUDA's `libcuda.so`/`libnvcuda.so`.
    Zluda,
    /// NVIDIA's own driver library.
    Nvidia,
    /// NVIDIA's CUDA runtime, `libcudart.so*`, as frameworks' wheels ship
    /// it; it calls whichever driver library is there (NVIDIA's or ZLUDA's).
    Cudart,
}

impl Flavor {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hip => "hip",
            Self::Zluda => "zluda",
            Self::Nvidia => "nvidia",
            Self::Cudart => "cudart",
        }
    }

    pub fn api(self) -> Api {
        match self {
            Self::Hip => Api::Hip,
            Self::Zluda | Self::Nvidia => Api::Cuda,
            Self::Cudart => Api::Cudart,
        }
    }
}

/// Whether a file name looks like a GPU runtime library we probe.
pub fn candidate_api(file_name: &str) -> Option<Api> {
    if file_name.starts_with("libamdhip64.so") {
        Some(Api::Hip)
    } else if file_name.starts_with("libcuda.so") || file_name.starts_with("libnvcuda.so") {
        Some(Api::Cuda)
    } else if file_name.starts_with("libcudart") && file_name.contains(".so") {
        // Also as wheel repair tools rename it: libcudart-1a2b3c4d.so.12.
        Some(Api::Cudart)
    } else {
        None
    }
}

/// Identity of a library file: uprobes live on inodes, so two paths to the
/// same file (symlinks, a container root that bind-mounts the host's) are
/// one library and get one set of probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

#[derive(Clone, Debug)]
pub struct GpuLibrary {
    /// A path through which the file can be opened now (may go via /proc/PID/root).
    pub path: PathBuf,
    /// The path as the workload sees it (inside its container).
    pub display_path: String,
    pub id: FileId,
    pub flavor: Flavor,
    /// Function name -> file offset of its entry point.
    pub functions: BTreeMap<&'static str, u64>,
    /// Exported names at an entry point already probed under another name
    /// (alias -> probed name): one address takes one probe.
    pub aliases: Vec<(&'static str, &'static str)>,
}

#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: not an ELF shared object ({reason})")]
    NotElf { path: String, reason: String },
    #[error("{path}: not a GPU runtime library (expected libamdhip64.so*, libcuda.so*, libnvcuda.so* or libcudart*.so*)")]
    NotGpuLibrary { path: String },
    #[error("{path}: exports none of the probed {api} functions")]
    NoFunctions { path: String, api: &'static str },
}

/// Opens and inspects one library file.
pub fn inspect(path: &Path, display_path: &str) -> Result<GpuLibrary, LibraryError> {
    let io_err = |source| LibraryError::Io { path: display_path.to_string(), source };
    let meta = fs::metadata(path).map_err(io_err)?;
    let data = fs::read(path).map_err(io_err)?;
    let file = object::File::parse(&*data)
        .map_err(|e| LibraryError::NotElf { path: display_path.to_string(), reason: e.to_string() })?;

    let file_name = Path::new(display_path).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let api = match candidate_api(file_name) {
        Some(api) => api,
        // A renamed copy still counts if it exports the entry points.
        None if has_symbol(&file, "hipInit") => Api::Hip,
        None if has_symbol(&file, "cuInit") => Api::Cuda,
        None if has_symbol(&file, "cudaGetDeviceCount") => Api::Cudart,
        None => return Err(LibraryError::NotGpuLibrary { path: display_path.to_string() }),
    };
    let flavor = match api {
        Api::Hip => Flavor::Hip,
        // ZLUDA's CUDA library is built on HIP and links libamdhip64;
        // NVIDIA's driver library does not.
        Api::Cuda if needs_library(&file, "libamdhip64") => Flavor::Zluda,
        Api::Cuda => Flavor::Nvidia,
        Api::Cudart => Flavor::Cudart,
    };
    let (functions, aliases) = resolve_functions(&file, file.dynamic_symbols(), api.functions());
    if functions.is_empty() {
        return Err(LibraryError::NoFunctions { path: display_path.to_string(), api: api.as_str() });
    }
    Ok(GpuLibrary {
        path: path.to_path_buf(),
        display_path: display_path.to_string(),
        id: FileId { dev: meta.dev(), ino: meta.ino() },
        flavor,
        functions,
        aliases,
    })
}

fn has_symbol(file: &object::File<'_>, name: &str) -> bool {
    file.dynamic_symbols().any(|s| s.name() == Ok(name) && s.is_definition())
}

fn needs_library(file: &object::File<'_>, prefix: &str) -> bool {
    // object exposes DT_NEEDED only through the ELF-specific API; the
    // imports list carries the library of each imported symbol on ELF files
    // that use symbol versioning, so check both.
    if let Ok(imports) = file.imports() {
        if imports.iter().any(|i| String::from_utf8_lossy(i.library()).starts_with(prefix)) {
            return true;
        }
    }
    dt_needed(file).iter().any(|n| n.starts_with(prefix))
}

/// DT_NEEDED entries of an ELF64 little-endian shared object.
fn dt_needed(file: &object::File<'_>) -> Vec<String> {
    let (Some(dynamic), Some(dynstr)) = (file.section_by_name(".dynamic"), file.section_by_name(".dynstr"))
    else {
        return Vec::new();
    };
    let (Ok(dynamic), Ok(dynstr)) = (dynamic.data(), dynstr.data()) else {
        return Vec::new();
    };
    const DT_NEEDED: u64 = 1;
    dynamic
        .chunks_exact(16)
        .filter_map(|entry| {
            let tag = u64::from_le_bytes(entry[..8].try_into().ok()?);
            let val = u64::from_le_bytes(entry[8..].try_into().ok()?) as usize;
            if tag != DT_NEEDED {
                return None;
            }
            let rest = dynstr.get(val..)?;
            let end = rest.iter().position(|b| *b == 0)?;
            Some(String::from_utf8_lossy(&rest[..end]).into_owned())
        })
        .collect()
}

/// File offsets of the wanted functions. Uprobes attach at file offsets, so
/// each symbol's virtual address is translated through its section. Where
/// two wanted names share an entry point, the one listed first is probed and
/// the other is returned as its alias.
/// `symbols`: a library's exports (its dynamic symbols), or an
/// executable's own symbol table, where a statically linked runtime is.
pub(super) fn resolve_functions(
    file: &object::File<'_>,
    symbols: object::read::SymbolIterator<'_, '_>,
    wanted: &'static [GpuFunction],
) -> (BTreeMap<&'static str, u64>, Vec<(&'static str, &'static str)>) {
    let mut offsets: HashMap<&'static str, u64> = HashMap::new();
    for symbol in symbols {
        if !symbol.is_definition() || symbol.address() == 0 {
            continue;
        }
        let Ok(name) = symbol.name() else { continue };
        let Some(want) = wanted.iter().find(|w| w.name == name) else {
            continue;
        };
        let Some(section) = symbol.section_index().and_then(|i| file.section_by_index(i).ok()) else {
            continue;
        };
        let Some((section_offset, _)) = section.file_range() else {
            continue;
        };
        if let Ok(UProbeAttachLocation::AbsoluteOffset(offset)) =
            UProbeAttachLocation::from_virtual_address(symbol.address(), section.address(), section_offset)
        {
            offsets.insert(want.name, offset);
        }
    }
    let mut found = BTreeMap::new();
    let mut aliases = Vec::new();
    let mut by_offset: HashMap<u64, &'static str> = HashMap::new();
    for function in wanted {
        let Some(&offset) = offsets.get(function.name) else { continue };
        match by_offset.get(&offset) {
            Some(first) => aliases.push((function.name, *first)),
            None => {
                by_offset.insert(offset, function.name);
                found.insert(function.name, offset);
            }
        }
    }
    (found, aliases)
}

/// Libraries in the host's standard directories.
pub fn host_libraries() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in crate::discovery::ahead::STANDARD_DIRS {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if candidate_api(&name.to_string_lossy()).is_some() {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    out
}

/// GPU libraries mapped by one process, as (path to open, path it sees).
///
/// The file is reached through /proc/PID/root, so a container's own copy is
/// found with the path the container uses. When that path no longer leads
/// to the mapped file (unlinked or replaced since it was mapped), the
/// mapping itself is opened through /proc/PID/map_files, which needs
/// CAP_SYS_ADMIN; without it such a library is skipped.
pub fn process_libraries(pid: u32) -> Vec<(PathBuf, String)> {
    let Ok(maps) = fs::read(format!("/proc/{pid}/maps")) else {
        // The process exited between the event and this scan.
        return Vec::new();
    };
    // Any file name may be mapped, UTF-8 or not; the libraries we look for
    // have ASCII names, so a lossy view loses none of them.
    let maps = String::from_utf8_lossy(&maps);
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    for mapping in crate::probes::maps::file_mappings(&maps) {
        let path = mapping.file_path();
        let name = Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if candidate_api(name).is_none() || out.iter().any(|(_, p)| p == path) {
            continue;
        }
        let via_root = PathBuf::from(format!("/proc/{pid}/root{path}"));
        let open_path = if !mapping.deleted() && via_root.exists() {
            via_root
        } else {
            PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", mapping.start, mapping.end))
        };
        out.push((open_path, path.to_string()));
    }
    out
}

/// Every pid in /proc (used once at start; later processes are found
/// through exec-mapping events, not by polling).
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

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

/// A probe link as this file holds it.
enum ProbeLink {
    /// One function's perf-event link, owned by aya's program.
    PerFunction(&'static str, UProbeLinkId),
    /// A `uprobe_multi` link: one program at every function of a file.
    Multi(std::os::fd::OwnedFd),
}

type Links = Vec<ProbeLink>;

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

    /// Processes that carry hot-tier probes on at least one file.
    pub fn hot_pids(&self) -> std::collections::BTreeSet<u32> {
        self.attached.values().flat_map(|l| l.hot.keys().copied()).collect()
    }

    /// Whether `pid` carries the hot-tier probes of file `id`.
    pub fn has_hot(&self, id: &FileId, pid: u32) -> bool {
        self.attached.get(id).is_some_and(|l| l.hot.contains_key(&pid))
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
        for mapping in crate::probes::maps::file_mappings(&maps) {
            if mapping.deleted() {
                out.insert(mapping.file_path().to_string());
            }
        }
    }
    out
}

fn uprobe<'a>(ebpf: &'a mut Ebpf, program: &'static str) -> Result<&'a mut UProbe, AttachError> {
    let found = ebpf.program_mut(program).ok_or(AttachError::MissingProgram(program))?;
    found.try_into().map_err(|source| AttachError::WrongType { program, expected: "uprobe", source })
}

/// What attaching a set of functions gave.
struct AttachOutcome {
    links: Links,
    /// Functions with all their probes in place.
    count: usize,
    first_error: Option<AttachError>,
    /// When the init functions' probes (attached first) were all in place,
    /// on the boot clock.
    init_ready_ns: u64,
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

/// Attaches the entry and return programs to each resolved function of
/// `library` that `wanted` picks, through `path`, for `scope`; with
/// `count_hot`, hot functions get the counting return program alone.
#[allow(clippy::too_many_arguments)]
fn attach_functions(
    ebpf: &mut Ebpf,
    mut slots: Option<&mut Slots>,
    multi: Option<&MultiPrograms>,
    path: &Path,
    library: &GpuLibrary,
    library_index: u32,
    wanted: impl Fn(&GpuFunction) -> bool,
    count_hot: bool,
    scope: UProbeScope,
) -> AttachOutcome {
    let api = library.flavor.api();
    if let (Some(multi), None) = (multi, slots.as_deref()) {
        match attach_multi(multi, path, library, library_index, &wanted, count_hot, scope) {
            Ok(outcome) => return outcome,
            // A file the kernel refuses as a whole (an offset it will not
            // probe) still gets every function it can, one link each, and
            // the reason per function.
            Err(e) => debug!(
                "uprobe_multi on {} ({}): {e}; a link per function instead",
                library.display_path,
                path.display()
            ),
        }
    }
    let mut outcome = AttachOutcome { links: Vec::new(), count: 0, first_error: None, init_ready_ns: 0 };
    let mut init_ready_ns = None;
    for index in attach_order(api.functions()) {
        let function = &api.functions()[index];
        if init_ready_ns.is_none() && !observer_common::gpu::is_init_function(function.name) {
            init_ready_ns = Some(BootClock::boot_now_ns());
        }
        if !wanted(function) {
            continue;
        }
        let Some(&offset) = library.functions.get(function.name) else {
            continue;
        };
        let point_cookie = cookie(library_index, api, index as u32);
        // Without attach cookies the slot's programs carry the cookie.
        // The return program first: the first breakpoint at the entry
        // comes with it, and until the entry program follows a return
        // without an entry counts with no duration. The other way round, a
        // call entered in between would never pop its frame, and the
        // thread would look stuck in that call (a false stall) for good.
        let (programs, attach_cookie) = match slots.as_deref_mut() {
            None if count_hot && function.tier == Tier::Hot => (vec![COUNT_PROGRAM], Some(point_cookie)),
            None => (vec![EXIT_PROGRAM, ENTER_PROGRAM], Some(point_cookie)),
            Some(slots) => match slots.programs_for(ebpf, point_cookie) {
                Ok((enter, exit)) => (vec![exit, enter], None),
                Err(e) => {
                    debug!("no slot for {} {}: {e}", library.display_path, function.name);
                    outcome.first_error.get_or_insert(e);
                    continue;
                }
            },
        };
        let mut ok = true;
        for program_name in programs {
            match attach_point(ebpf, program_name, path, offset, attach_cookie, scope) {
                Ok(link) => outcome.links.push(ProbeLink::PerFunction(program_name, link)),
                Err(e) => {
                    debug!("attach {} {}: {e}", library.display_path, function.name);
                    outcome.first_error.get_or_insert(e);
                    ok = false;
                }
            }
        }
        if ok {
            outcome.count += 1;
        }
    }
    outcome.init_ready_ns = init_ready_ns.unwrap_or_else(BootClock::boot_now_ns);
    outcome
}

/// Attaches `library`'s wanted functions with one `uprobe_multi` link per
/// program, return programs first (see `attach_functions`), each link's
/// init functions first. On error nothing stays attached.
fn attach_multi(
    multi: &MultiPrograms,
    path: &Path,
    library: &GpuLibrary,
    library_index: u32,
    wanted: &impl Fn(&GpuFunction) -> bool,
    count_hot: bool,
    scope: UProbeScope,
) -> std::io::Result<AttachOutcome> {
    let api = library.flavor.api();
    /// One link's program, when it fires, and its (offset, cookie) points.
    type Group = (&'static str, Fires, Vec<(u64, u64)>);
    let mut groups: [Group; 3] = [
        (COUNT_PROGRAM, Fires::AtReturn, Vec::new()),
        (EXIT_PROGRAM, Fires::AtReturn, Vec::new()),
        (ENTER_PROGRAM, Fires::AtEntry, Vec::new()),
    ];
    let mut count = 0;
    for index in attach_order(api.functions()) {
        let function = &api.functions()[index];
        let Some(&offset) = library.functions.get(function.name).filter(|_| wanted(function)) else {
            continue;
        };
        let point = (offset, cookie(library_index, api, index as u32));
        if count_hot && function.tier == Tier::Hot {
            groups[0].2.push(point);
        } else {
            groups[1].2.push(point);
            groups[2].2.push(point);
        }
        count += 1;
    }
    let pid = match scope {
        UProbeScope::OneProcess(pid) => Some(pid.get()),
        UProbeScope::AllProcesses | UProbeScope::CallingProcess => None,
    };
    let mut links = Vec::new();
    for (program, fires, points) in &groups {
        if points.is_empty() {
            continue;
        }
        let created = multi
            .fd(program)
            .ok_or_else(|| std::io::Error::other(format!("{program} is not loaded for uprobe_multi")))
            .and_then(|fd| {
                super::releaser::note_attach();
                uprobe_multi::attach(fd, path, points, *fires, pid)
            });
        match created {
            Ok(link) => links.push(link),
            Err(e) => {
                super::releaser::release(links.into_iter().rev().map(Link::Multi).collect());
                return Err(e);
            }
        }
    }
    let links = links.into_iter().map(ProbeLink::Multi).collect();
    Ok(AttachOutcome { links, count, first_error: None, init_ready_ns: BootClock::boot_now_ns() })
}

/// Indices into `functions` in the order their probes are created: the
/// init functions (`cuInit`, `hipInit`, `cudaGetDeviceCount`, ...) first,
/// the rest in table order. Creating a uprobe takes milliseconds, so a
/// process that maps a runtime and calls it at once, without the hold, is
/// caught by whichever probes exist by then; its first call is one of these.
fn attach_order(functions: &[GpuFunction]) -> Vec<usize> {
    let (mut order, rest): (Vec<usize>, Vec<usize>) =
        (0..functions.len()).partition(|&i| observer_common::gpu::is_init_function(functions[i].name));
    order.extend(rest);
    order
}

fn attach_point(
    ebpf: &mut Ebpf,
    program_name: &'static str,
    path: &Path,
    offset: u64,
    point_cookie: Option<u64>,
    scope: UProbeScope,
) -> Result<UProbeLinkId, AttachError> {
    super::releaser::note_attach();
    uprobe(ebpf, program_name)?
        .attach(
            UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: point_cookie,
            },
            path,
            scope,
        )
        .map_err(AttachError::Attach)
}

/// Detaches links off the event loop (see [`super::releaser`]): releasing
/// a uprobe link waits for a grace period under a mutex that attaching takes
/// too, so a library's 30-odd links would stall event handling, and any
/// process held meanwhile, for seconds.
///
/// Links go in the reverse of their attach order, entry programs before
/// their return programs, for the reason `attach_functions` gives.
fn detach_links(ebpf: &mut Ebpf, links: Links) {
    let mut taken = Vec::with_capacity(links.len());
    for link in links.into_iter().rev() {
        match link {
            ProbeLink::Multi(fd) => taken.push(Link::Multi(fd)),
            ProbeLink::PerFunction(program_name, link) => {
                match uprobe(ebpf, program_name).and_then(|p| p.take_link(link).map_err(AttachError::Attach))
                {
                    Ok(link) => taken.push(Link::PerfEvent(link)),
                    Err(e) => debug!("detach {program_name}: {e}"),
                }
            }
        }
    }
    super::releaser::release(taken);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_select_the_api() {
        assert_eq!(candidate_api("libamdhip64.so.5"), Some(Api::Hip));
        assert_eq!(candidate_api("libamdhip64.so"), Some(Api::Hip));
        assert_eq!(candidate_api("libcuda.so.1"), Some(Api::Cuda));
        assert_eq!(candidate_api("libnvcuda.so"), Some(Api::Cuda));
        assert_eq!(candidate_api("libcudart.so.13"), Some(Api::Cudart));
        assert_eq!(candidate_api("libcudart-d0da41ae.so.11.0"), Some(Api::Cudart));
        assert_eq!(candidate_api("libcudart_static.a"), None);
        assert_eq!(candidate_api("libc.so.6"), None);
    }

    #[test]
    fn init_functions_are_attached_before_the_rest() {
        for api in Api::ALL {
            let functions = api.functions();
            let order = attach_order(functions);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..functions.len()).collect::<Vec<_>>(), "{api:?}: each function once");
            let inits = functions.iter().filter(|f| observer_common::gpu::is_init_function(f.name)).count();
            assert!(inits > 0, "{api:?} has init functions");
            let (head, tail) = order.split_at(inits);
            assert!(
                head.iter().all(|&i| observer_common::gpu::is_init_function(functions[i].name)),
                "{api:?}"
            );
            assert!(tail.windows(2).all(|w| w[0] < w[1]), "{api:?}: the rest keep table order");
        }
        // The call a process makes first is the first probe created.
        assert_eq!(Api::Cuda.functions()[attach_order(Api::Cuda.functions())[0]].name, "cuInit");
        assert_eq!(Api::Hip.functions()[attach_order(Api::Hip.functions())[0]].name, "hipInit");
    }

    #[test]
    fn a_non_gpu_library_is_refused_clearly() {
        // libc exists on every machine this runs on and exports no GPU API.
        let libc = host_like_libc();
        let err = inspect(&libc, "/renamed/libfoo.so").expect_err("libc is no GPU runtime");
        assert!(err.to_string().contains("not a GPU runtime library"), "{err}");
    }

    #[test]
    fn a_missing_file_names_the_path() {
        let err = inspect(Path::new("/nonexistent/libamdhip64.so"), "/nonexistent/libamdhip64.so")
            .expect_err("missing");
        assert!(err.to_string().starts_with("/nonexistent/libamdhip64.so: "), "{err}");
    }

    fn host_like_libc() -> PathBuf {
        ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6", "/lib64/libc.so.6"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.exists())
            .expect("a libc on this machine")
    }
}
