//! Why a library failed to load, told from the failing process's own view:
//! its mount namespace (through `/proc/PID/root`), its `LD_LIBRARY_PATH`,
//! each object's `RUNPATH`/`RPATH` (`$ORIGIN` expanded, as `ahead` does for
//! executables), the root's `ld.so.cache` and the default directories, in
//! the loader's order. Objects the process has mapped already count as
//! found, as the loader matches them by name first. Only the ELF headers
//! and dynamic sections are read.
use std::{collections::HashSet, fs, path::Path};

use object::ReadCache;

use super::{ahead::environ_var, ldcache};
use crate::{gpu_library::dynamic_strings, procfs::file_mappings};

/// The label value of `missing` when every file was found (the load failed
/// for another reason: a missing symbol, a wrong ELF class).
pub const UNKNOWN: &str = "unknown";
/// Objects read per failed load, at most: a framework's closure is a few
/// dozen.
const MAX_OBJECTS: usize = 64;
/// The loader's default directories after the cache (x86-64 Debian, Red
/// Hat and plain layouts).
const DEFAULT_DIRS: [&str; 6] =
    ["/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"];

/// Libraries that are a GPU's, by name: the runtimes and drivers, their
/// math, communication and compiler libraries, and frameworks' GPU
/// providers.
const GPU_NAME_PREFIXES: &[&str] = &[
    "libcuda.so",
    "libnvcuda",
    "libcudart",
    "libcublas",
    "libcudnn",
    "libcufft",
    "libcurand",
    "libcusparse",
    "libcusolver",
    "libnvrtc",
    "libnvJitLink",
    "libnvjpeg",
    "libnccl",
    "libcutensor",
    "libcupti",
    "libnvinfer",
    "libnvidia-ml",
    "libamdhip64",
    "libhiprtc",
    "libhipblas",
    "librocblas",
    "libMIOpen",
    "librccl",
    "libhipfft",
    "librocfft",
    "libhipsparse",
    "librocsparse",
    "libhiprand",
    "librocrand",
    "libhsa-runtime64",
    "libze_loader",
    "libonnxruntime_providers_cuda",
    "libonnxruntime_providers_tensorrt",
    "libonnxruntime_providers_rocm",
    "libonnxruntime_providers_migraphx",
];

/// Whether a library's base name is a GPU library's.
pub fn is_gpu_library_name(name: &str) -> bool {
    GPU_NAME_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// A failed load that concerns a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    /// Base name of what was asked for.
    pub library: String,
    /// What was asked for, whole.
    pub requested: String,
    /// Where it was found, as the process sees it; `None` when it was not.
    pub path: Option<String>,
    /// Base name of the first file the loader could not find, or [`UNKNOWN`].
    pub missing: String,
    /// The GPU library it is, or needs (first by the loader's order).
    pub gpu_library: String,
}

/// Why `pid`'s load of `requested` failed, when it is a GPU library or
/// needs one; `None` for any other library.
pub fn explain(pid: u32, requested: &str) -> Option<LoadFailure> {
    let view = View::of(pid);
    let library = base_name(requested).to_string();
    let mut names = vec![library.clone()];
    let (path, missing) = match view.find(requested, &Dirs::default()) {
        None => (None, Some(library.clone())),
        Some(path) => {
            let missing = view.first_missing(&path, &mut names);
            (Some(path), missing)
        }
    };
    let gpu_library = names.into_iter().find(|n| is_gpu_library_name(n))?;
    Some(LoadFailure {
        library,
        requested: requested.to_string(),
        path,
        missing: missing.unwrap_or_else(|| UNKNOWN.to_string()),
        gpu_library,
    })
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// An object's own search directories, `$ORIGIN` expanded.
#[derive(Default)]
struct Dirs {
    rpath: Vec<String>,
    runpath: Vec<String>,
}

/// The process's view of the file system and its loader's settings.
struct View {
    root: String,
    cwd: String,
    ld_library_path: Vec<String>,
    /// Base names of the files it maps now.
    loaded: HashSet<String>,
    /// Paths its root's ld.so.cache names.
    cache: Vec<String>,
}

impl View {
    fn of(pid: u32) -> Self {
        // A process that exited right after its failed load (Python's
        // ImportError ends a script) leaves no view to read: the node's
        // own is the next best, and names the same files where the image
        // and the node share their layout.
        let root = match fs::metadata(format!("/proc/{pid}/root/")) {
            Ok(_) => format!("/proc/{pid}/root"),
            Err(_) => {
                log::debug!("pid {pid} is gone: its failed load is resolved in the node's root");
                String::new()
            }
        };
        let cwd =
            fs::read_link(format!("/proc/{pid}/cwd")).map(|p| p.display().to_string()).unwrap_or_default();
        let ld_library_path = environ_var(pid, b"LD_LIBRARY_PATH")
            .map(|v| v.split(':').filter(|d| d.starts_with('/')).map(str::to_string).collect())
            .unwrap_or_default();
        let maps = fs::read(format!("/proc/{pid}/maps")).unwrap_or_default();
        let maps = String::from_utf8_lossy(&maps);
        let loaded = file_mappings(&maps).iter().map(|m| base_name(m.file_path()).to_string()).collect();
        let cache_file = format!("{root}/etc/ld.so.cache");
        let cache = match fs::metadata(&cache_file) {
            Ok(meta) if meta.len() <= ldcache::MAX_CACHE_BYTES => {
                fs::read(&cache_file).map(|b| ldcache::all_paths(&b)).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        Self { root, cwd, ld_library_path, loaded, cache }
    }

    fn exists(&self, path: &str) -> bool {
        fs::metadata(format!("{}{path}", self.root)).is_ok_and(|m| m.is_file())
    }

    /// Where the loader finds `name` for an object whose own directories are
    /// `dirs`, in glibc's order: a name with a slash as it is; else
    /// `DT_RPATH` (without `DT_RUNPATH`), `LD_LIBRARY_PATH`, `DT_RUNPATH`,
    /// the cache, the default directories.
    fn find(&self, name: &str, dirs: &Dirs) -> Option<String> {
        if name.contains('/') {
            let path = if name.starts_with('/') { name.to_string() } else { format!("{}/{name}", self.cwd) };
            return self.exists(&path).then_some(path);
        }
        let rpath = if dirs.runpath.is_empty() { dirs.rpath.as_slice() } else { &[] };
        let searched = rpath.iter().chain(&self.ld_library_path).chain(&dirs.runpath);
        let in_dirs =
            searched.map(|d| format!("{}/{name}", d.trim_end_matches('/'))).find(|p| self.exists(p));
        in_dirs
            .or_else(|| self.cache.iter().find(|p| base_name(p) == name && self.exists(p)).cloned())
            .or_else(|| DEFAULT_DIRS.iter().map(|d| format!("{d}/{name}")).find(|p| self.exists(p)))
    }

    /// The first dependency, breadth first as the loader goes, that cannot
    /// be found; every name met is added to `names`.
    fn first_missing(&self, start: &str, names: &mut Vec<String>) -> Option<String> {
        let mut queue = std::collections::VecDeque::from([start.to_string()]);
        let mut seen: HashSet<String> = HashSet::from([start.to_string()]);
        let mut missing = None;
        while let Some(path) = queue.pop_front() {
            let (needed, dirs) = self.dynamic_of(&path);
            for name in needed {
                names.push(name.clone());
                if self.loaded.contains(&name) {
                    continue;
                }
                match self.find(&name, &dirs) {
                    Some(found) if seen.len() < MAX_OBJECTS && seen.insert(found.clone()) => {
                        queue.push_back(found)
                    }
                    Some(_) => {}
                    None => {
                        missing.get_or_insert(name);
                    }
                }
            }
            if missing.is_some() {
                break;
            }
        }
        missing
    }

    /// An object's `DT_NEEDED` names and its own search directories.
    fn dynamic_of(&self, path: &str) -> (Vec<String>, Dirs) {
        let Ok(file) = fs::File::open(format!("{}{path}", self.root)) else { return Default::default() };
        let cache = ReadCache::new(file);
        let Ok(elf) = object::File::parse(&cache) else { return Default::default() };
        let origin = Path::new(path).parent().map(|p| p.display().to_string()).unwrap_or_default();
        let expand = |tag| -> Vec<String> {
            dynamic_strings(&elf, &[tag])
                .iter()
                .flat_map(|v| v.split(':').map(str::to_string).collect::<Vec<_>>())
                .filter(|d| !d.is_empty())
                .map(|d| d.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin))
                .filter(|d| d.starts_with('/'))
                .collect()
        };
        let dirs = Dirs { rpath: expand(object::elf::DT_RPATH), runpath: expand(object::elf::DT_RUNPATH) };
        (dynamic_strings(&elf, &[object::elf::DT_NEEDED]), dirs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_libraries_are_told_by_name() {
        for name in ["libcublasLt.so.13", "libcudnn.so.9", "libcuda.so.1", "libamdhip64.so.6", "libnccl.so.2"]
        {
            assert!(is_gpu_library_name(name), "{name}");
        }
        for name in ["libc.so.6", "libstdc++.so.6", "libcurl.so.4", "libz.so.1"] {
            assert!(!is_gpu_library_name(name), "{name}");
        }
    }

    #[test]
    fn a_library_that_needs_no_gpu_is_none_of_our_business() {
        // libz is on every machine this runs on and needs only libc.
        assert_eq!(explain(std::process::id(), "libz.so.1"), None);
        assert_eq!(explain(std::process::id(), "/nonexistent/libfoo.so"), None);
    }

    #[test]
    fn a_missing_gpu_library_is_itself_the_missing_file() {
        let failure = explain(std::process::id(), "libcublasLt.so.99").expect("a GPU library");
        assert_eq!(failure.missing, "libcublasLt.so.99");
        assert_eq!(failure.path, None);
        assert_eq!(failure.gpu_library, "libcublasLt.so.99");
    }
}
