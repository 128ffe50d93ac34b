//! What a GPU runtime file is: HIP, a CUDA driver library or the CUDA
//! runtime, ZLUDA or NVIDIA, told apart by name and exports, and where in
//! it each function to probe starts. A leaf: it reads ELF files and names
//! nothing else in the crate; finding the files is discovery's, probing
//! them is probes'.
pub mod linked_runtime;

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use aya::programs::uprobe::UProbeAttachLocation;
use object::{Object, ObjectSection, ObjectSymbol};

use observer_common::gpu::{Api, GpuFunction};

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
    #[error("{path}: {STRIPPED_RUNTIME}")]
    StrippedRuntime { path: String },
    #[error("{path}: exports none of the probed {api} functions")]
    NoFunctions { path: String, api: &'static str },
}

/// Why a file that carries the CUDA runtime linked in is not probed.
pub const STRIPPED_RUNTIME: &str =
    "CUDA runtime linked in, but the file is stripped of its symbol table: its \
                                    runtime calls are not probed (the driver library's are)";

/// Opens and inspects one library file.
pub fn inspect(path: &Path, display_path: &str) -> Result<GpuLibrary, LibraryError> {
    let io_err = |source| LibraryError::Io { path: display_path.to_string(), source };
    // Only what is parsed is read (headers, the dynamic symbols and
    // strings, the dynamic section): a driver library is tens of
    // megabytes, and the daemon's peak memory must not follow it.
    let handle = fs::File::open(path).map_err(io_err)?;
    let meta = handle.metadata().map_err(io_err)?;
    let cache = object::ReadCache::new(handle);
    let file = object::File::parse(&cache)
        .map_err(|e| LibraryError::NotElf { path: display_path.to_string(), reason: e.to_string() })?;

    let file_name = Path::new(display_path).file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let api = match candidate_api(file_name) {
        Some(api) => api,
        // A renamed copy still counts if it exports the entry points.
        None if has_symbol(&file, "hipInit") => Api::Hip,
        None if has_symbol(&file, "cuInit") => Api::Cuda,
        None if has_symbol(&file, "cudaGetDeviceCount") => Api::Cudart,
        // A file that carries a runtime linked in (`--lib` of a CuPy module).
        None => {
            return match linked_runtime::inspect_shared_object(path, display_path)? {
                linked_runtime::LinkedRuntime::Probe(library) => Ok(library),
                linked_runtime::LinkedRuntime::Stripped => {
                    Err(LibraryError::StrippedRuntime { path: display_path.to_string() })
                }
                linked_runtime::LinkedRuntime::Absent => {
                    Err(LibraryError::NotGpuLibrary { path: display_path.to_string() })
                }
            }
        }
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
        // Named like a runtime, exporting none of it: it may carry one
        // linked in (a wheel's own build of a runtime module).
        if let Ok(linked_runtime::LinkedRuntime::Probe(library)) =
            linked_runtime::inspect_shared_object(path, display_path)
        {
            return Ok(library);
        }
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

fn has_symbol<'data, R: object::ReadRef<'data>>(file: &object::File<'data, R>, name: &str) -> bool {
    file.dynamic_symbols().any(|s| s.name() == Ok(name) && s.is_definition())
}

fn needs_library<'data, R: object::ReadRef<'data>>(file: &object::File<'data, R>, prefix: &str) -> bool {
    // object exposes DT_NEEDED only through the ELF-specific API; the
    // imports list carries the library of each imported symbol on ELF files
    // that use symbol versioning, so check both.
    if let Ok(imports) = file.imports() {
        if imports.iter().any(|i| String::from_utf8_lossy(i.library()).starts_with(prefix)) {
            return true;
        }
    }
    dynamic_strings(file, &[object::elf::DT_NEEDED]).iter().any(|n| n.starts_with(prefix))
}

/// The string entries of an ELF file's dynamic section whose tag is one of
/// `tags` (`DT_NEEDED`, `DT_RUNPATH`, ...), in order; none for a file of
/// another format or without a dynamic section.
pub fn dynamic_strings<'data, R: object::ReadRef<'data>>(
    file: &object::File<'data, R>,
    tags: &[u32],
) -> Vec<String> {
    use object::read::elf::Dyn;
    let object::File::Elf64(elf) = file else { return Vec::new() };
    let (endian, sections) = (elf.endian(), elf.elf_section_table());
    let Ok(Some((entries, strings_index))) = sections.dynamic(endian, elf.data()) else {
        return Vec::new();
    };
    let Ok(strings) = sections.strings(endian, elf.data(), strings_index) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter(|entry| entry.tag32(endian).is_some_and(|tag| tags.contains(&tag)))
        .filter_map(|entry| u32::try_from(Into::<u64>::into(entry.d_val(endian))).ok())
        .filter_map(|offset| strings.get(offset).ok())
        .map(|value| String::from_utf8_lossy(value).into_owned())
        .collect()
}

/// File offsets of the wanted functions. Uprobes attach at file offsets, so
/// each symbol's virtual address is translated through its section. Where
/// two wanted names share an entry point, the one listed first is probed and
/// the other is returned as its alias.
/// `symbols`: a library's exports (its dynamic symbols), or an
/// executable's own symbol table, where a statically linked runtime is.
pub fn resolve_functions<'data, 'file, R: object::ReadRef<'data>>(
    file: &'file object::File<'data, R>,
    symbols: object::read::SymbolIterator<'data, 'file, R>,
    wanted: &'static [GpuFunction],
) -> (BTreeMap<&'static str, u64>, Vec<(&'static str, &'static str)>) {
    let mut offsets: HashMap<&'static str, u64> = HashMap::new();
    for symbol in symbols {
        if !symbol.is_definition() || symbol.address() == 0 {
            continue;
        }
        // A symbol table keeps a versioned definition's version in its name.
        let Ok(name) = symbol.name().map(|n| n.split_once('@').map_or(n, |(plain, _)| plain)) else {
            continue;
        };
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
