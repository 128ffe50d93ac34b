//! Which cgroups pay for run-queue accounting: the pods under the kubepods
//! hierarchy and the cgroups under `run --cgroup` prefixes. Every other task
//! of the node (system services, shells, the kubelet) costs the scheduler
//! programs one cgroup-id read and a failed lookup, nothing more.
//!
//! The kernel keeps the set current as cgroups are created and removed
//! (the `cgroup_mkdir`/`cgroup_rmdir` programs), so a new pod's first tasks
//! are counted. Userspace seeds it: each root and everything below it,
//! when the root first exists, and again if it was removed and recreated.
//! Without those programs it walks the roots on every refresh instead.
use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::probes::loaded::Loaded;

/// Where kubelet puts pods: the systemd cgroup driver's slice and the
/// cgroupfs driver's directory. A kubelet with its own `--cgroup-root`,
/// or pods nested deeper (Kubernetes in containers), need `--cgroup`.
pub const KUBEPODS_ROOTS: [&str; 2] = ["/kubepods.slice", "/kubepods"];

/// Deep enough for pod/container cgroups and the slices above them, and a
/// bound on a walk of a tree that is changing under it.
const MAX_DEPTH: usize = 8;

pub struct RunqScope {
    /// Cgroup paths relative to the cgroup2 mount, `/`-prefixed.
    roots: Vec<String>,
    /// Whether the kernel follows cgroup creation and removal.
    kernel_follows: bool,
}

impl RunqScope {
    /// The roots are also named to the kernel, so that one created later
    /// is reported as it is created.
    pub fn start(prefixes: &[String], kernel_follows: bool, kernel: &mut Loaded) -> Self {
        let scope = Self::new(prefixes, kernel_follows);
        for root in &scope.roots {
            if kernel_follows && !kernel.report_runq_root(root) {
                log::warn!("{root}: path too long for the kernel to see it created; reported once it exists");
            }
        }
        scope
    }

    fn new(prefixes: &[String], kernel_follows: bool) -> Self {
        let mut roots: Vec<String> = KUBEPODS_ROOTS.iter().map(|r| r.to_string()).collect();
        for p in prefixes {
            let p = normalize(p);
            if !roots.contains(&p) {
                roots.push(p);
            }
        }
        Self { roots, kernel_follows }
    }

    pub fn roots(&self) -> &[String] {
        &self.roots
    }

    /// Puts every root that exists, and what lies below it, into the
    /// kernel's set where the kernel does not already have it. Returns how
    /// many cgroups were added.
    pub fn refresh(&self, cgroup2: &Path, kernel: &mut Loaded) -> usize {
        let mut added = 0;
        for root in &self.roots {
            let dir = cgroup2.join(root.trim_start_matches('/'));
            let Ok(meta) = fs::metadata(&dir) else { continue };
            if self.kernel_follows && kernel.runq_cgroup_reported(meta.ino()) {
                continue;
            }
            added += seed(&dir, 0, kernel);
        }
        added
    }
}

/// `/a/b/`, `a/b` and `/a//b` all name `/a/b`; `/` is the whole hierarchy.
pub fn normalize(prefix: &str) -> String {
    let parts: Vec<&str> = prefix.split('/').filter(|s| !s.is_empty()).collect();
    format!("/{}", parts.join("/"))
}

fn seed(dir: &PathBuf, depth: usize, kernel: &mut Loaded) -> usize {
    // A directory gone since it was listed is simply not reported.
    let Ok(meta) = fs::metadata(dir) else { return 0 };
    let mut added = usize::from(kernel.report_runq_cgroup(meta.ino()));
    if depth >= MAX_DEPTH {
        return added;
    }
    let Ok(entries) = fs::read_dir(dir) else { return added };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            added += seed(&e.path(), depth + 1, kernel);
        }
    }
    added
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_normalized_and_kubepods_always_included() {
        assert_eq!(normalize("solver.slice//job/"), "/solver.slice/job");
        assert_eq!(normalize("/"), "/");
        let s = RunqScope::new(&["/kubepods".into(), "x".into()], true);
        assert_eq!(s.roots(), ["/kubepods.slice", "/kubepods", "/x"]);
    }
}
