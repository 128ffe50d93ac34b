//! Probing ahead of the first call: when a process execs, before its
//! dynamic loader has mapped anything, list every GPU runtime file that
//! loader could find by name, as seen from that process's root:
//! - the directories of `LD_LIBRARY_PATH` in its environment;
//! - the executable's `DT_RUNPATH`/`DT_RPATH` (`$ORIGIN` expanded);
//! - the root's `/etc/ld.so.cache`;
//! - the standard library directories and the usual ROCm and ZLUDA ones.
//!
//! Uprobes live on inodes, so a file probed now is ready whenever a process
//! maps it later. What this cannot foresee is a `dlopen` of a path outside
//! all of these; that is what the mapping events (and the hold) are for.
use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::PathBuf,
    time::{Duration, SystemTime},
};

use super::ldcache;
use crate::gpu_library::{candidate_api, dynamic_strings, linked_runtime::file_carries_runtime_mark};

/// Directories a loader or a ROCm/ZLUDA install puts these libraries in.
pub const STANDARD_DIRS: &[&str] = &[
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/local/lib",
    "/usr/local/lib64",
    "/opt/rocm/lib",
    "/opt/rocm/lib64",
    "/opt/zluda",
    "/opt/zluda/lib",
    "/usr/lib/zluda",
    "/usr/local/zluda",
];

/// An executable larger than this is not read for its run path.
const MAX_EXE_BYTES: u64 = 512 << 20;
/// What was read of a file or directory this soon after it changed is not
/// trusted (see [`settled`]).
const SETTLED: Duration = Duration::from_secs(2);

/// A file to probe, and why it was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Where this process can open it (through /proc/PID/root).
    pub open_path: PathBuf,
    /// The path as the process sees it.
    pub display: String,
    pub reason: String,
}

/// What a file or directory looked like when it was last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mtime_ns: i128,
    /// Whether the listing was taken long enough after the last change.
    settled: bool,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        Self { dev: meta.dev(), ino: meta.ino(), mtime_ns: mtime_ns(meta), settled: settled(meta) }
    }

    fn still(&self, now: &Self) -> bool {
        self.settled && (self.dev, self.ino, self.mtime_ns) == (now.dev, now.ino, now.mtime_ns)
    }
}

/// Caches keyed by mount namespace, so that an exec costs a few `stat`s
/// unless something changed.
#[derive(Default)]
pub struct AheadOfTime {
    /// (mount namespace, directory) -> GPU runtime file names in it.
    dirs: HashMap<(u64, String), (Stamp, Vec<String>)>,
    /// Mount namespace -> GPU runtime paths its ld.so.cache names.
    caches: HashMap<u64, (Stamp, Vec<String>)>,
    /// Executable (dev, ino) -> its run-path entries, unexpanded.
    runpaths: HashMap<(u64, u64), Vec<String>>,
    /// Executables (dev, ino) read for their run path that carry the CUDA
    /// runtime's mark (see `gpu_library::linked_runtime`): a byte search of the
    /// file already in memory, so an exec costs no second read.
    runtime_marked: std::collections::HashSet<(u64, u64)>,
}

impl AheadOfTime {
    /// Everything the loader of `pid` could load by name, each with a
    /// reason naming `who` (e.g. `python3[4242]`). Empty when the process
    /// is already gone.
    pub fn for_process(&mut self, pid: u32, who: &str) -> Vec<Candidate> {
        let Ok(ns) = fs::metadata(format!("/proc/{pid}/ns/mnt")).map(|m| m.ino()) else {
            return Vec::new();
        };
        let root = format!("/proc/{pid}/root");
        let mut out = Vec::new();
        if let Some(paths) = environ_var(pid, b"LD_LIBRARY_PATH") {
            for dir in paths.split(':').filter(|d| d.starts_with('/')) {
                self.scan_dir(ns, &root, dir, &format!("LD_LIBRARY_PATH of {who}"), &mut out);
            }
        }
        if let Some((exe, dirs)) = self.runpath_of(pid) {
            let origin = exe.rsplit_once('/').map(|(d, _)| d).unwrap_or("/").to_string();
            for dir in dirs {
                let dir = dir.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin);
                if dir.starts_with('/') {
                    self.scan_dir(ns, &root, &dir, &format!("run path of {exe}"), &mut out);
                }
            }
        }
        for path in self.cache_paths(ns, &root) {
            out.push(Candidate {
                open_path: PathBuf::from(format!("{root}{path}")),
                display: path,
                reason: format!("ld.so.cache of {who}"),
            });
        }
        for dir in standard_dirs(&root) {
            self.scan_dir(ns, &root, &dir, &format!("standard library directory of {who}"), &mut out);
        }
        // The first reason found for a path is the most specific one.
        let mut seen = std::collections::HashSet::new();
        out.retain(|c| seen.insert(c.display.clone()));
        out
    }

    fn scan_dir(&mut self, ns: u64, root: &str, dir: &str, reason: &str, out: &mut Vec<Candidate>) {
        let dir = dir.trim_end_matches('/');
        let dir = if dir.is_empty() { "/" } else { dir };
        let full = format!("{root}{dir}");
        let Ok(meta) = fs::metadata(&full) else { return };
        let stamp = Stamp::of(&meta);
        let key = (ns, dir.to_string());
        let names = match self.dirs.get(&key) {
            Some((old, names)) if old.still(&stamp) => names.clone(),
            _ => {
                let names = gpu_file_names(&full);
                self.dirs.insert(key, (stamp, names.clone()));
                names
            }
        };
        let sep = if dir == "/" { "" } else { "/" };
        for name in names {
            let display = format!("{dir}{sep}{name}");
            out.push(Candidate {
                open_path: PathBuf::from(format!("{root}{display}")),
                display,
                reason: reason.to_string(),
            });
        }
    }

    fn cache_paths(&mut self, ns: u64, root: &str) -> Vec<String> {
        let path = format!("{root}/etc/ld.so.cache");
        let Ok(meta) = fs::metadata(&path) else { return Vec::new() };
        let stamp = Stamp::of(&meta);
        if let Some((old, paths)) = self.caches.get(&ns) {
            if old.still(&stamp) {
                return paths.clone();
            }
        }
        let paths = if meta.len() <= ldcache::MAX_CACHE_BYTES {
            fs::read(&path).map(|b| ldcache::gpu_paths(&b)).unwrap_or_default()
        } else {
            Vec::new()
        };
        self.caches.insert(ns, (stamp, paths.clone()));
        paths
    }

    /// The executable's path (as the process sees it) and its run path.
    fn runpath_of(&mut self, pid: u32) -> Option<(String, Vec<String>)> {
        let exe_link = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let exe = exe_link.to_string_lossy().trim_end_matches(" (deleted)").to_string();
        let meta = fs::metadata(format!("/proc/{pid}/exe")).ok()?;
        let key = (meta.dev(), meta.ino());
        if let Some(dirs) = self.runpaths.get(&key) {
            return Some((exe, dirs.clone()));
        }
        // The run path comes from the dynamic section alone; the mark is
        // searched a chunk at a time. Neither holds the file in memory.
        let exe_file = || fs::File::open(format!("/proc/{pid}/exe")).ok();
        let small_enough = meta.len() <= MAX_EXE_BYTES;
        let dirs = exe_file().filter(|_| small_enough).map(run_path_of_file).unwrap_or_default();
        if self.runpaths.len() > 4096 {
            self.runpaths.clear();
            self.runtime_marked.clear();
        }
        let marked = exe_file()
            .filter(|_| small_enough)
            .is_some_and(|mut file| file_carries_runtime_mark(&mut file).unwrap_or(false));
        if marked {
            self.runtime_marked.insert(key);
        }
        self.runpaths.insert(key, dirs.clone());
        Some((exe, dirs))
    }

    /// Whether the executable of `pid`, read at its exec, carries the CUDA
    /// runtime's mark: a candidate for a runtime linked into it.
    pub fn carries_runtime(&self, pid: u32) -> bool {
        let Ok(meta) = fs::metadata(format!("/proc/{pid}/exe")) else { return false };
        self.runtime_marked.contains(&(meta.dev(), meta.ino()))
    }

    /// Forgets a mount namespace's entries (its last process is gone).
    pub fn trim(&mut self) {
        if self.dirs.len() > 16384 {
            self.dirs.clear();
        }
        if self.caches.len() > 4096 {
            self.caches.clear();
        }
    }
}

/// The last change of a file or directory, in ns since the epoch.
pub fn mtime_ns(meta: &fs::Metadata) -> i128 {
    i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec())
}

/// Whether a file or directory has been left alone long enough that what
/// was read of it is what it is: a listing taken in the same timestamp
/// tick as a change may miss it, and a file written a moment ago may still
/// be being written (an image layer unpacked, a `cp` under way).
pub fn settled(meta: &fs::Metadata) -> bool {
    let age = meta.modified().ok().and_then(|m| SystemTime::now().duration_since(m).ok());
    age.is_some_and(|a| a >= SETTLED)
}

/// GPU runtime file names in a directory.
fn gpu_file_names(dir: &str) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| candidate_api(n).is_some())
        .collect();
    names.sort();
    names
}

/// The standard directories, plus versioned ROCm installs (`/opt/rocm-6.1.0/lib`).
fn standard_dirs(root: &str) -> Vec<String> {
    let mut dirs: Vec<String> = STANDARD_DIRS.iter().map(|d| d.to_string()).collect();
    if let Ok(entries) = fs::read_dir(format!("{root}/opt")) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("rocm-") {
                dirs.push(format!("/opt/{name}/lib"));
            }
        }
    }
    dirs
}

/// The value of one variable in /proc/PID/environ.
pub(super) fn environ_var(pid: u32, name: &[u8]) -> Option<String> {
    let environ = fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ.split(|b| *b == 0).find_map(|entry| {
        let value = entry.strip_prefix(name)?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(value).into_owned())
    })
}

/// `DT_RUNPATH` and `DT_RPATH` entries of an ELF file, in order, reading
/// only its headers and dynamic section.
pub fn run_path_of_file(file: fs::File) -> Vec<String> {
    run_path(&object::ReadCache::new(file))
}

/// `DT_RUNPATH` and `DT_RPATH` entries of an ELF file, in order.
pub fn run_path<'data, R: object::ReadRef<'data>>(data: R) -> Vec<String> {
    let Ok(file) = object::File::parse(data) else { return Vec::new() };
    let mut dirs = Vec::new();
    for value in dynamic_strings(&file, &[object::elf::DT_RUNPATH, object::elf::DT_RPATH]) {
        dirs.extend(value.split(':').filter(|d| !d.is_empty()).map(str::to_string));
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_sees_the_host_hip_runtime_with_a_reason() {
        let hip = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5");
        if !hip.exists() {
            return;
        }
        let mut ahead = AheadOfTime::default();
        let found = ahead.for_process(std::process::id(), "the test");
        let entry = found
            .iter()
            .find(|c| c.display.ends_with("/libamdhip64.so.5"))
            .unwrap_or_else(|| panic!("HIP runtime not listed: {found:?}"));
        assert!(entry.open_path.exists(), "{entry:?}");
        assert!(!entry.reason.is_empty());
        // Each path once.
        let mut paths: Vec<_> = found.iter().map(|c| &c.display).collect();
        paths.dedup();
        assert_eq!(paths.len(), found.len());
    }

    #[test]
    fn run_path_of_garbage_is_empty() {
        assert!(run_path(&b""[..]).is_empty());
        assert!(run_path(&b"\x7fELF garbage"[..]).is_empty());
    }

    #[test]
    fn a_listing_is_trusted_only_once_settled() {
        let meta = fs::metadata("/").expect("root");
        let mut stamp = Stamp::of(&meta);
        stamp.settled = false;
        assert!(!stamp.still(&stamp));
        stamp.settled = true;
        assert!(stamp.still(&stamp));
        let mut changed = stamp;
        changed.mtime_ns += 1;
        assert!(!stamp.still(&changed));
    }
}
