//! The loader libraries (`libc.so.6`, `libdl.so.2`) a process maps, probed
//! at `dlopen` once per file, so that a GPU library that fails to load is
//! seen (`load_failure` tells why). Found in the same map scans as the GPU
//! runtime files: the host's at start, a container image's own at its
//! first process's scan, well before an application imports its GPU
//! framework.
use std::{os::fd::AsRawFd, os::unix::fs::MetadataExt, path::PathBuf};

use log::{debug, info};

use super::LibraryTracker;
use crate::{
    gpu_library::FileId,
    probes::{library_load::is_loader_library, Loaded},
    procfs::file_mappings,
};

impl LibraryTracker {
    /// Probes the loader libraries `pid` maps that are not probed yet.
    pub(super) fn watch_loaders(&mut self, kernel: &mut Loaded, pid: u32, maps: &str) {
        for mapping in file_mappings(maps) {
            let path = mapping.file_path();
            if !is_loader_library(path.rsplit('/').next().unwrap_or_default()) {
                continue;
            }
            let open = if mapping.deleted() {
                PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", mapping.start, mapping.end))
            } else {
                PathBuf::from(format!("/proc/{pid}/root{path}"))
            };
            // Held open: the process may exit while the probes attach.
            let Ok(file) = std::fs::File::open(&open) else { continue };
            let Ok(meta) = file.metadata() else { continue };
            let id = FileId { dev: meta.dev(), ino: meta.ino() };
            if self.loaders.is_handled(&id) {
                continue;
            }
            let held_open = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
            match self.loaders.attach(kernel.object_mut(), id, &held_open) {
                Ok(0) => debug!("{path}: defines no dlopen (glibc 2.34+ keeps it in libc)"),
                Ok(n) => info!("probing {path} at dlopen ({n} functions): mapped by pid {pid}"),
                Err(e) => debug!("{path}: loader probes: {e}"),
            }
        }
    }
}
