//! Scans for GPU runtime files already on the node: the host's standard
//! directories (once, at start) and what a running process has mapped
//! (processes that were there before the daemon, and each process an event
//! names).
use std::{
    fs,
    path::{Path, PathBuf},
};

use super::ahead::STANDARD_DIRS;
use crate::{gpu_library::candidate_api, procfs::file_mappings};

/// Libraries in the host's standard directories.
pub fn host_libraries() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in STANDARD_DIRS {
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

/// A process's maps, as text; empty once it has exited. Any file name may
/// be mapped, UTF-8 or not; the libraries looked for have ASCII names, so a
/// lossy view loses none of them.
pub fn read_maps(pid: u32) -> String {
    match fs::read(format!("/proc/{pid}/maps")) {
        Ok(maps) => {
            String::from_utf8(maps).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
        }
        Err(_) => String::new(),
    }
}

/// GPU libraries mapped by one process (`maps`, from [`read_maps`]), as
/// (path to open, path it sees).
///
/// The file is reached through /proc/PID/root, so a container's own copy is
/// found with the path the container uses. When that path no longer leads
/// to the mapped file (unlinked or replaced since it was mapped), the
/// mapping itself is opened through /proc/PID/map_files, which needs
/// CAP_SYS_ADMIN; without it such a library is skipped.
pub fn process_libraries(pid: u32, maps: &str) -> Vec<(PathBuf, String)> {
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    for mapping in file_mappings(maps) {
        let path = mapping.file_path();
        let name = Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if candidate_api(name).is_none() || out.iter().any(|(_, p)| p == path) {
            continue;
        }
        out.push((mapping.open_path(pid), path.to_string()));
    }
    out
}

/// The other code a process maps: every file with an executable mapping
/// that is neither named like a GPU runtime (those are [`process_libraries`])
/// nor the process's executable, as (path to open, path it sees), each
/// once. A runtime linked into one of them is found by its symbol table.
pub fn process_code_objects(pid: u32, maps: &str) -> Vec<(PathBuf, String)> {
    use std::os::unix::fs::MetadataExt;
    let exe = fs::metadata(format!("/proc/{pid}/exe")).map(|m| m.ino()).ok();
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for mapping in maps.lines().filter_map(crate::procfs::parse_line) {
        let path = mapping.file_path();
        let name = Path::new(path).file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !mapping.executable
            || mapping.inode == 0
            || !path.starts_with('/')
            || Some(mapping.inode) == exe
            || candidate_api(name).is_some()
            || !seen.insert(path.to_string())
        {
            continue;
        }
        out.push((mapping.open_path(pid), path.to_string()));
    }
    out
}
