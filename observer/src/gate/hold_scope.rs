//! The hold for chosen pods: a process of a canary pod, or of a pod with
//! the readiness gate, that maps a GPU runtime file canaryscope has never
//! seen is stopped until that file's probes exist, as `--hold` does for
//! every process. A canary ships exactly such a file and calls `cuInit` at
//! once, and a gated pod's verdict rests on its start-up calls, so without
//! this those first calls would race the attach.
//!
//! The kernel side compares the mapping process's cgroup and its ancestors
//! with a set of cgroup ids; this module keeps the chosen pods' cgroups in
//! that set. A pod's cgroup exists before its containers' (the kubelet makes
//! it first, then the sandbox, then each container), so the containers are
//! covered from their first process on, whatever their own cgroups are.
use std::{
    collections::{HashMap, HashSet},
    fs,
    os::unix::fs::MetadataExt,
    path::Path,
};

use log::debug;

use crate::{attribution::cgroup_path::parse_pod_cgroup, pipeline::runq_scope::KUBEPODS_ROOTS};

/// Where the kernel's set lives (the daemon's loaded programs; a test double
/// in unit tests).
pub trait HoldCgroups {
    fn set_hold_cgroup(&mut self, cgroup_id: u64, held: bool);
}

impl HoldCgroups for crate::probes::Loaded {
    fn set_hold_cgroup(&mut self, cgroup_id: u64, held: bool) {
        crate::probes::Loaded::set_hold_cgroup(self, cgroup_id, held);
    }
}

/// The chosen pods' cgroups, as put into the kernel's set.
#[derive(Debug, Default)]
pub struct PodHold {
    /// Pod UID -> its pod cgroup's id.
    held: HashMap<String, u64>,
}

impl PodHold {
    /// Puts the cgroup of every chosen pod that has one into the kernel's set
    /// and takes out those of pods no longer chosen (or gone). A pod whose
    /// cgroup does not exist yet is looked for again on the next call.
    pub fn refresh(&mut self, chosen: &HashSet<String>, cgroup2: &Path, kernel: &mut impl HoldCgroups) {
        self.held.retain(|uid, id| {
            let keep = chosen.contains(uid);
            if !keep {
                kernel.set_hold_cgroup(*id, false);
            }
            keep
        });
        if chosen.iter().all(|uid| self.held.contains_key(uid)) {
            return; // nothing to look for: no walk of the hierarchy
        }
        for (uid, id) in pod_cgroups(cgroup2, |uid| chosen.contains(uid) && !self.held.contains_key(uid)) {
            debug!("holding the processes of pod {uid} (cgroup {id}) at their first GPU runtime mapping");
            kernel.set_hold_cgroup(id, true);
            self.held.insert(uid, id);
        }
    }

    /// How many chosen pods' cgroups are in the kernel's set.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

/// The pod-level cgroups under the kubelet's roots whose pod UID `wanted`
/// accepts: pod UID -> cgroup id (the directory's inode number). Pod cgroups
/// sit one level below a root (Guaranteed) or two (Burstable, BestEffort).
fn pod_cgroups(cgroup2: &Path, wanted: impl Fn(&str) -> bool) -> Vec<(String, u64)> {
    let mut found = Vec::new();
    for root in KUBEPODS_ROOTS {
        walk(cgroup2, &cgroup2.join(root.trim_start_matches('/')), 2, &wanted, &mut found);
    }
    found
}

fn walk(
    cgroup2: &Path,
    dir: &Path,
    depth: usize,
    wanted: &impl Fn(&str) -> bool,
    found: &mut Vec<(String, u64)>,
) {
    // A directory that vanished mid-walk is simply not there.
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let Some(rel) = path.strip_prefix(cgroup2).ok().and_then(Path::to_str) else { continue };
        match parse_pod_cgroup(rel) {
            Some(pod) if pod.container.is_none() && wanted(&pod.pod_uid) => {
                if let Ok(meta) = entry.metadata() {
                    found.push((pod.pod_uid, meta.ino()));
                }
            }
            Some(pod) if pod.container.is_none() => {} // a pod not asked for
            Some(_) => {}                              // a container: below the pod level already
            None if depth > 1 => walk(cgroup2, &path, depth - 1, wanted, found),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[derive(Default)]
    struct KernelSet(BTreeMap<u64, bool>);

    impl HoldCgroups for KernelSet {
        fn set_hold_cgroup(&mut self, cgroup_id: u64, held: bool) {
            match held {
                true => self.0.insert(cgroup_id, true),
                false => self.0.remove(&cgroup_id),
            };
        }
    }

    const GATED: &str = "11111111-2222-3333-4444-555555555555";
    const PLAIN: &str = "66666666-7777-8888-9999-000000000000";

    fn pod_dir(root: &Path, qos_slice: Option<&str>, uid: &str) -> std::path::PathBuf {
        let mut dir = root.join("kubepods.slice");
        let name = match qos_slice {
            Some(qos) => {
                dir.push(format!("kubepods-{qos}.slice"));
                format!("kubepods-{qos}-pod{}.slice", uid.replace('-', "_"))
            }
            None => format!("kubepods-pod{}.slice", uid.replace('-', "_")),
        };
        dir.push(name);
        fs::create_dir_all(dir.join("cri-containerd-0123.scope")).expect("mkdir");
        dir
    }

    /// A scratch cgroup2 stand-in, removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("canaryscope-hold-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("mkdir");
            Self(dir)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn ino(dir: &Path) -> u64 {
        fs::metadata(dir).expect("stat").ino()
    }

    #[test]
    fn a_gated_pods_cgroup_is_held_and_let_go_when_the_gate_goes() {
        let tmp = Scratch::new("gated");
        let gated = pod_dir(tmp.path(), Some("burstable"), GATED);
        pod_dir(tmp.path(), None, PLAIN);
        let mut kernel = KernelSet::default();
        let mut hold = PodHold::default();
        hold.refresh(&HashSet::from([GATED.to_owned()]), tmp.path(), &mut kernel);
        assert_eq!(
            kernel.0.keys().copied().collect::<Vec<_>>(),
            [ino(&gated)],
            "only the gated pod's cgroup"
        );
        hold.refresh(&HashSet::new(), tmp.path(), &mut kernel);
        assert!(kernel.0.is_empty() && hold.is_empty(), "a pod no longer gated is let go");
    }

    #[test]
    fn a_pod_cgroup_made_after_the_pod_was_seen_is_held_on_a_later_refresh() {
        let tmp = Scratch::new("later");
        fs::create_dir_all(tmp.path().join("kubepods.slice")).expect("mkdir");
        let mut kernel = KernelSet::default();
        let mut hold = PodHold::default();
        let gated = HashSet::from([GATED.to_owned()]);
        hold.refresh(&gated, tmp.path(), &mut kernel);
        assert!(kernel.0.is_empty());
        let dir = pod_dir(tmp.path(), None, GATED);
        hold.refresh(&gated, tmp.path(), &mut kernel);
        assert_eq!(kernel.0.keys().copied().collect::<Vec<_>>(), [ino(&dir)]);
        assert_eq!(hold.len(), 1);
    }
}
