//! Which cgroups' processes are held at a GPU runtime file the daemon has
//! not seen, without `--hold`: canary pods and pods with the readiness gate
//! (chosen by the daemon), and pods made before the daemon could classify
//! them.
//!
//! A pod's cgroup is made by the kubelet moments after the pod reaches the
//! node, often before the daemon's own watch has brought it, and its first
//! container can map a runtime soon after. So the choice is made here, in
//! the instant of the `mkdir`: the daemon writes the paths a pod's cgroup
//! can have as soon as it sees the pod, and a cgroup made under a kubelet
//! QoS level whose path the daemon has not written yet is held until the
//! daemon has looked at its pod. Cgroups never move, and a task can only
//! enter one after it exists, so a chosen pod is covered from its first
//! process on.
use aya_ebpf::{
    helpers::{bpf_ktime_get_boot_ns, bpf_probe_read_kernel_str_bytes},
    macros::{map, raw_tracepoint},
    maps::{HashMap, LruHashMap},
    programs::RawTracePointContext,
};
use observer_common::discovery::{
    MAX_HOLD_CGROUPS, MAX_POD_PARENTS, MAX_POD_PATHS, MAX_UNCLASSIFIED_PODS, POD_PATH_CHOSEN, POD_PATH_LEN,
    POD_PATH_PARENT, UNCLASSIFIED_HOLD_NS,
};

use crate::kernel::{cgroup_id, cgroup_parent, offsets, unified_cgroup_id};

/// Cgroups whose processes, and those of the cgroups below, are held even
/// without `--hold`: canary pods and pods with the readiness gate. cgroup id -> 1.
#[map(name = "HOLD_CGROUPS")] // observer_common::discovery::HOLD_CGROUPS_MAP
static HOLD_CGROUPS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_HOLD_CGROUPS, 0);

/// Pod and QoS-level cgroup paths the daemon wrote: path -> `POD_PATH_*`.
#[map(name = "POD_PATHS")] // observer_common::discovery::POD_PATHS_MAP
static POD_PATHS: HashMap<[u8; POD_PATH_LEN], u32> = HashMap::with_max_entries(MAX_POD_PATHS, 0);

/// QoS-level cgroups that exist: cgroup id -> 1.
#[map(name = "POD_PARENTS")] // observer_common::discovery::POD_PARENTS_MAP
static POD_PARENTS: HashMap<u64, u32> = HashMap::with_max_entries(MAX_POD_PARENTS, 0);

/// Pod cgroups made before the daemon classified their pod: id -> boot ns
/// of the `mkdir`.
#[map(name = "UNCLASSIFIED_PODS")] // observer_common::discovery::UNCLASSIFIED_PODS_MAP
static UNCLASSIFIED_PODS: LruHashMap<u64, u64> = LruHashMap::with_max_entries(MAX_UNCLASSIFIED_PODS, 0);

/// Whether processes of `cgroup` (and of the cgroups below it) are held at
/// `now` (boot ns).
#[inline(always)]
pub fn holds(cgroup: u64, now: u64) -> bool {
    // SAFETY: read-only map lookups.
    unsafe {
        HOLD_CGROUPS.get(&cgroup).is_some()
            || UNCLASSIFIED_PODS
                .get(&cgroup)
                .is_some_and(|made| now.saturating_sub(*made) < UNCLASSIFIED_HOLD_NS)
    }
}

/// A new cgroup: a chosen pod's joins the held set, a QoS level's the
/// parents, and one made under a QoS level that the daemon has no word on
/// the unclassified pods.
///
/// match-proto: cgroup_mkdir(struct cgroup *cgrp, const char *path), the
/// path from the hierarchy's root (`kernfs_path`).
#[raw_tracepoint(tracepoint = "cgroup_mkdir")]
pub fn hold_cgroup_mkdir(ctx: RawTracePointContext) -> i32 {
    try_mkdir(&ctx).unwrap_or(1)
}

fn try_mkdir(ctx: &RawTracePointContext) -> Result<i32, i64> {
    let o = offsets();
    let cgroup = ctx.arg::<u64>(0) as *const u8;
    let Some(id) = unified_cgroup_id(cgroup, &o)? else { return Ok(0) };
    let path = ctx.arg::<u64>(1) as *const u8;
    let mut key = [0u8; POD_PATH_LEN];
    // A path longer than the key (a container's) is cut short and matches
    // no pod path, which are all shorter: it is looked at by its parent.
    // SAFETY: the helper reads at most the buffer's length and faults softly.
    if !path.is_null() && unsafe { bpf_probe_read_kernel_str_bytes(path, &mut key) }.is_err() {
        return Ok(0);
    }
    // SAFETY: read-only map lookup; the value is copied out.
    match unsafe { POD_PATHS.get(&key) }.copied() {
        Some(POD_PATH_CHOSEN) => HOLD_CGROUPS.insert(&id, &1, 0).map_err(|e| e as i64)?,
        Some(POD_PATH_PARENT) => POD_PARENTS.insert(&id, &1, 0).map_err(|e| e as i64)?,
        Some(_) => {} // a pod the daemon knows and does not hold
        None => {
            let parent = cgroup_parent(cgroup, &o)?;
            if parent.is_null() {
                return Ok(0);
            }
            // SAFETY: read-only map lookup.
            if unsafe { POD_PARENTS.get(&cgroup_id(parent, &o)?) }.is_some() {
                // SAFETY: helper without arguments.
                let now = unsafe { bpf_ktime_get_boot_ns() };
                UNCLASSIFIED_PODS.insert(&id, &now, 0).map_err(|e| e as i64)?;
            }
        }
    }
    Ok(0)
}

/// A removed cgroup leaves every set (kernfs ids are never reused).
///
/// match-proto: cgroup_rmdir(struct cgroup *cgrp, const char *path).
#[raw_tracepoint(tracepoint = "cgroup_rmdir")]
pub fn hold_cgroup_rmdir(ctx: RawTracePointContext) -> i32 {
    let Ok(Some(id)) = unified_cgroup_id(ctx.arg::<u64>(0) as *const u8, &offsets()) else { return 0 };
    let _ = HOLD_CGROUPS.remove(&id);
    let _ = POD_PARENTS.remove(&id);
    let _ = UNCLASSIFIED_PODS.remove(&id);
    0
}
