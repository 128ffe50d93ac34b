//! The cgroups the cases create: a memory-limited one to cause OOM kills,
//! many small ones the daemon has to track, and one of its own for the
//! launch-bound loop.
//!
//! They are removed on every way out, and leftovers of an interrupted run
//! are removed before the next, so stray processes and cgroups never add
//! to what a later run measures.
use std::{
    fs,
    path::{Path, PathBuf},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};

use super::process::{kill, SIGKILL};

fn mounts() -> Vec<(PathBuf, String, String)> {
    fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 4).then(|| (PathBuf::from(f[1]), f[2].to_string(), f[3].to_string()))
        })
        .collect()
}

pub(super) fn cgroup2_root() -> Option<PathBuf> {
    mounts().into_iter().find(|(_, t, _)| t == "cgroup2").map(|(p, _, _)| p)
}

fn v1_memory_root() -> Option<PathBuf> {
    mounts()
        .into_iter()
        .find(|(_, t, o)| t == "cgroup" && o.split(',').any(|x| x == "memory"))
        .map(|(p, _, _)| p)
}

pub(super) const BENCH_CGROUP: &str = "canaryscope-bench";
pub(super) const LAUNCH_CGROUP: &str = "canaryscope-bench-launch";
/// The flood a daemon is stopped under (stop.rs).
pub(super) const STOP_FLOOD_CGROUP: &str = "canaryscope-bench-stop-flood";
/// The scheduler case's two placements: one reported (as a pod's cgroup
/// is, given to the daemon with `--cgroup`), one not (a system service's).
pub(super) const SCHED_POD_CGROUP: &str = "canaryscope-bench-sched-pod";
pub(super) const SCHED_SYSTEM_CGROUP: &str = "canaryscope-bench-sched-system";
/// The HTTP bench's two placements: followed as a pod's, and not.
pub(super) const HTTP_POD_CGROUP: &str = "canaryscope-bench-http-pod";
pub(super) const HTTP_SYSTEM_CGROUP: &str = "canaryscope-bench-http-system";

/// Removes a cgroup directory tree (children first), killing stray
/// processes left in it and retrying while exiting ones still hold it.
fn remove_cgroup_tree(dir: &Path) {
    if !dir.is_dir() {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for file in ["cgroup.procs", "tasks"] {
            for pid in fs::read_to_string(dir.join(file)).unwrap_or_default().lines() {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    // SAFETY: plain integers; these are processes the bench put there.
                    unsafe { kill(pid, SIGKILL) };
                }
            }
        }
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if Instant::now() >= deadline => {
                eprintln!("    warning: cannot remove cgroup {}: {e}", dir.display());
                return;
            }
            Err(_) => sleep(Duration::from_millis(50)),
        }
    }
}

pub(super) fn cleanup_stale_cgroups() {
    for base in [cgroup2_root(), v1_memory_root()].into_iter().flatten() {
        let names = [
            BENCH_CGROUP.to_string(),
            format!("{BENCH_CGROUP}-oom"),
            LAUNCH_CGROUP.to_string(),
            STOP_FLOOD_CGROUP.to_string(),
            SCHED_POD_CGROUP.to_string(),
            SCHED_SYSTEM_CGROUP.to_string(),
            HTTP_POD_CGROUP.to_string(),
            HTTP_SYSTEM_CGROUP.to_string(),
        ];
        for name in names {
            let dir = base.join(name);
            if dir.exists() {
                eprintln!("    removing leftover cgroup {}", dir.display());
                remove_cgroup_tree(&dir);
            }
        }
    }
}

/// A cgroup tree removed on drop.
pub(super) struct CgroupTree {
    pub(super) dir: PathBuf,
}

impl Drop for CgroupTree {
    fn drop(&mut self) {
        remove_cgroup_tree(&self.dir);
    }
}

/// A memory cgroup limited to 50 MiB: (tree guard, file to write a pid into).
pub(super) fn oom_cgroup() -> Result<(CgroupTree, PathBuf, String)> {
    if let Some(v1) = v1_memory_root() {
        let dir = v1.join(BENCH_CGROUP);
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let tree = CgroupTree { dir: dir.clone() };
        fs::write(dir.join("memory.limit_in_bytes"), "50M").context("cannot set memory.limit_in_bytes")?;
        return Ok((tree, dir.join("tasks"), format!("cgroup v1 {}", dir.display())));
    }
    let v2 = cgroup2_root().ok_or_else(|| anyhow!("no cgroup v1 memory controller and no cgroup2 mount"))?;
    let controllers = fs::read_to_string(v2.join("cgroup.controllers")).unwrap_or_default();
    if !controllers.split_whitespace().any(|c| c == "memory") {
        bail!("{} offers no memory controller", v2.display());
    }
    let _ = fs::write(v2.join("cgroup.subtree_control"), "+memory");
    let dir = v2.join(format!("{BENCH_CGROUP}-oom"));
    fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tree = CgroupTree { dir: dir.clone() };
    fs::write(dir.join("memory.max"), "50M").context("cannot set memory.max")?;
    let _ = fs::write(dir.join("memory.swap.max"), "0");
    Ok((tree, dir.join("cgroup.procs"), format!("cgroup2 {}", dir.display())))
}

/// An empty cgroup2 cgroup for one case's processes: (tree guard, its
/// `cgroup.procs`, its path as the daemon names it). GPU failures select a
/// whole cgroup for hot-call probes, so a process that must stay unselected
/// cannot share one with processes that fail (on a host where everything
/// runs in the root cgroup, any other GPU test would select it).
pub(super) fn own_cgroup(name: &str) -> Result<(CgroupTree, PathBuf, String)> {
    let v2 = cgroup2_root().ok_or_else(|| anyhow!("no cgroup2 mount"))?;
    let dir = v2.join(name);
    remove_cgroup_tree(&dir);
    fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok((CgroupTree { dir: dir.clone() }, dir.join("cgroup.procs"), format!("/{name}")))
}
