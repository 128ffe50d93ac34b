//! The hold for chosen pods: a process of a canary pod, or of a pod with
//! the readiness gate, that maps a GPU runtime file canaryscope has never
//! seen is stopped until that file's probes exist, as `--hold` does for
//! every process. A canary ships exactly such a file and calls `cuInit` at
//! once, and a gated pod's verdict rests on its start-up calls, so without
//! this those first calls would race the attach.
//!
//! In a rollout the pod reaches the daemon's watch first, then the kubelet
//! makes its cgroup, then its containers start. The daemon cannot look for a
//! cgroup that does not exist yet, so it tells the kernel, as soon as it
//! sees a pod, the paths that pod's cgroup can have and whether to hold it;
//! the kernel's `cgroup_mkdir` program puts a chosen pod's cgroup into the
//! held set in the instant it is made. A pod cgroup the kubelet made before
//! the daemon saw its pod is held until the daemon has (the kernel's
//! unclassified set), and one that already existed is found here by its
//! path. Each pod's cgroup exists before its containers' and the kernel
//! compares a mapping process's cgroup and its ancestors with the held set,
//! so the containers are covered from their first process on.
use std::{collections::HashMap, fs, os::unix::fs::MetadataExt, path::Path};

use log::debug;
use observer_common::discovery::{POD_PATH_CHOSEN, POD_PATH_NOT_CHOSEN, POD_PATH_PARENT};

use crate::attribution::cgroup_path::Qos;

/// Where the kernel's sets live (the daemon's loaded programs; a test double
/// in unit tests).
pub trait HoldCgroups {
    fn set_hold_cgroup(&mut self, cgroup_id: u64, held: bool);
    /// What the kernel does with a cgroup made at `path`; `None` forgets it.
    fn set_pod_path(&mut self, path: &str, kind: Option<u32>) -> bool;
    fn set_pod_parent(&mut self, cgroup_id: u64);
    fn set_pod_classified(&mut self, cgroup_id: u64);
}

impl HoldCgroups for crate::probes::Loaded {
    fn set_hold_cgroup(&mut self, cgroup_id: u64, held: bool) {
        crate::probes::Loaded::set_hold_cgroup(self, cgroup_id, held);
    }

    fn set_pod_path(&mut self, path: &str, kind: Option<u32>) -> bool {
        crate::probes::Loaded::set_pod_path(self, path, kind)
    }

    fn set_pod_parent(&mut self, cgroup_id: u64) {
        crate::probes::Loaded::set_pod_parent(self, cgroup_id);
    }

    fn set_pod_classified(&mut self, cgroup_id: u64) {
        crate::probes::Loaded::set_pod_classified(self, cgroup_id);
    }
}

/// What the daemon decided about one pod of the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodChoice {
    /// A canary, or a pod with the readiness gate.
    pub chosen: bool,
    /// Its QoS class, which narrows where its cgroup can be.
    pub qos: Option<Qos>,
}

/// The kubelet's QoS-level cgroups, for the systemd and cgroupfs drivers: a
/// pod's cgroup is made directly below one of them.
const QOS_LEVELS: [&str; 6] = [
    "/kubepods.slice",
    "/kubepods.slice/kubepods-burstable.slice",
    "/kubepods.slice/kubepods-besteffort.slice",
    "/kubepods",
    "/kubepods/burstable",
    "/kubepods/besteffort",
];

/// The paths (below the cgroup2 mount) the kubelet gives the cgroup of the
/// pod `uid`, under either cgroup driver; for each QoS class when it is not
/// known.
pub fn pod_cgroup_paths(uid: &str, qos: Option<Qos>) -> Vec<String> {
    let classes = match qos {
        Some(qos) => vec![qos],
        None => vec![Qos::Guaranteed, Qos::Burstable, Qos::BestEffort],
    };
    let systemd_uid = uid.replace('-', "_");
    let mut paths = Vec::with_capacity(classes.len() * 2);
    for class in classes {
        let (slice, dir) = match class {
            Qos::Guaranteed => (None, None),
            Qos::Burstable => (Some("burstable"), Some("burstable")),
            Qos::BestEffort => (Some("besteffort"), Some("besteffort")),
        };
        paths.push(match slice {
            None => format!("/kubepods.slice/kubepods-pod{systemd_uid}.slice"),
            Some(q) => format!("/kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{systemd_uid}.slice"),
        });
        paths.push(match dir {
            None => format!("/kubepods/pod{uid}"),
            Some(q) => format!("/kubepods/{q}/pod{uid}"),
        });
    }
    paths
}

/// One pod as told to the kernel.
#[derive(Debug)]
struct Told {
    choice: PodChoice,
    paths: Vec<String>,
    /// Its cgroup's id, once found.
    cgroup: Option<u64>,
}

/// The node's pods as told to the kernel's sets.
#[derive(Debug, Default)]
pub struct PodHold {
    pods: HashMap<String, Told>,
    /// The QoS levels' paths are written and the existing ones' ids put in.
    levels_told: bool,
}

impl PodHold {
    /// Brings the kernel's sets in line with `pods` (pod UID -> choice): the
    /// paths of each new pod are written first, then its cgroup is looked for,
    /// so a cgroup is either made after the kernel knows its path or found
    /// here. Pods gone from `pods` are forgotten, and a pod no longer chosen
    /// is let go.
    pub fn refresh(
        &mut self,
        pods: &HashMap<String, PodChoice>,
        cgroup2: &Path,
        kernel: &mut impl HoldCgroups,
    ) {
        if !self.levels_told {
            self.levels_told = true;
            for level in QOS_LEVELS {
                kernel.set_pod_path(level, Some(POD_PATH_PARENT));
                if let Some(id) = cgroup_id(cgroup2, level) {
                    kernel.set_pod_parent(id);
                }
            }
        }
        self.pods.retain(|uid, told| {
            let keep = pods.contains_key(uid);
            if !keep {
                forget(told, kernel);
            }
            keep
        });
        for (uid, choice) in pods {
            match self.pods.get_mut(uid) {
                Some(told) if told.choice == *choice => {
                    // Known and told: only a chosen pod's cgroup is still
                    // looked for, to let it go by id later.
                    if choice.chosen && told.cgroup.is_none() {
                        look(uid, told, cgroup2, kernel);
                    }
                }
                _ => {
                    if let Some(mut old) = self.pods.remove(uid) {
                        forget(&mut old, kernel);
                    }
                    let kind = if choice.chosen { POD_PATH_CHOSEN } else { POD_PATH_NOT_CHOSEN };
                    let paths = pod_cgroup_paths(uid, choice.qos);
                    for path in &paths {
                        kernel.set_pod_path(path, Some(kind));
                    }
                    let mut told = Told { choice: *choice, paths, cgroup: None };
                    look(uid, &mut told, cgroup2, kernel);
                    self.pods.insert(uid.clone(), told);
                }
            }
        }
    }

    /// How many chosen pods' cgroups are in the kernel's held set.
    pub fn len(&self) -> usize {
        self.pods.values().filter(|t| t.choice.chosen && t.cgroup.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Looks for the pod's cgroup at its paths: a chosen pod's is held, and any
/// pod's is classified (out of the kernel's unclassified set).
fn look(uid: &str, told: &mut Told, cgroup2: &Path, kernel: &mut impl HoldCgroups) {
    let Some(id) = told.paths.iter().find_map(|path| cgroup_id(cgroup2, path)) else { return };
    if told.choice.chosen {
        debug!("holding the processes of pod {uid} (cgroup {id}) at their first GPU runtime mapping");
        kernel.set_hold_cgroup(id, true);
    }
    kernel.set_pod_classified(id);
    told.cgroup = Some(id);
}

/// Takes a pod out of the kernel's sets.
fn forget(told: &mut Told, kernel: &mut impl HoldCgroups) {
    for path in &told.paths {
        kernel.set_pod_path(path, None);
    }
    if let (true, Some(id)) = (told.choice.chosen, told.cgroup) {
        kernel.set_hold_cgroup(id, false);
    }
}

/// The id of the cgroup at `path` below the cgroup2 mount (its directory's
/// inode number), if it exists.
fn cgroup_id(cgroup2: &Path, path: &str) -> Option<u64> {
    fs::metadata(cgroup2.join(path.trim_start_matches('/'))).ok().filter(|m| m.is_dir()).map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The kernel's sets, and what its `cgroup_mkdir` program would do.
    #[derive(Default)]
    struct Kernel {
        held: BTreeMap<u64, bool>,
        paths: BTreeMap<String, u32>,
        parents: Vec<u64>,
        unclassified: Vec<u64>,
    }

    impl HoldCgroups for Kernel {
        fn set_hold_cgroup(&mut self, cgroup_id: u64, held: bool) {
            match held {
                true => self.held.insert(cgroup_id, true),
                false => self.held.remove(&cgroup_id),
            };
        }

        fn set_pod_path(&mut self, path: &str, kind: Option<u32>) -> bool {
            match kind {
                Some(kind) => self.paths.insert(path.to_owned(), kind),
                None => self.paths.remove(path),
            };
            true
        }

        fn set_pod_parent(&mut self, cgroup_id: u64) {
            self.parents.push(cgroup_id);
        }

        fn set_pod_classified(&mut self, cgroup_id: u64) {
            self.unclassified.retain(|id| *id != cgroup_id);
        }
    }

    impl Kernel {
        /// `mkdir` of `dir` (below `root`), as the kernel program sees it.
        fn mkdir(&mut self, root: &Path, dir: &Path) {
            fs::create_dir_all(dir).expect("mkdir");
            let rel = format!("/{}", dir.strip_prefix(root).expect("below root").display());
            let id = ino(dir);
            match self.paths.get(&rel).copied() {
                Some(POD_PATH_CHOSEN) => self.set_hold_cgroup(id, true),
                Some(POD_PATH_PARENT) => self.parents.push(id),
                Some(_) => {}
                None if dir.parent().is_some_and(|p| self.parents.contains(&ino(p))) => {
                    self.unclassified.push(id)
                }
                None => {}
            }
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
        dir
    }

    /// A scratch cgroup2 stand-in, removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("canaryscope-hold-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("kubepods.slice/kubepods-burstable.slice")).expect("mkdir");
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

    fn chosen(uid: &str, chosen: bool) -> HashMap<String, PodChoice> {
        HashMap::from([(uid.to_owned(), PodChoice { chosen, qos: None })])
    }

    #[test]
    fn a_gated_pods_existing_cgroup_is_held_and_let_go_when_the_gate_goes() {
        let tmp = Scratch::new("gated");
        let gated = pod_dir(tmp.path(), Some("burstable"), GATED);
        fs::create_dir_all(&gated).expect("mkdir");
        fs::create_dir_all(pod_dir(tmp.path(), None, PLAIN)).expect("mkdir");
        let mut kernel = Kernel::default();
        let mut hold = PodHold::default();
        let mut pods = chosen(GATED, true);
        pods.insert(PLAIN.to_owned(), PodChoice { chosen: false, qos: None });
        hold.refresh(&pods, tmp.path(), &mut kernel);
        assert_eq!(
            kernel.held.keys().copied().collect::<Vec<_>>(),
            [ino(&gated)],
            "only the gated pod's cgroup"
        );
        hold.refresh(&chosen(GATED, false), tmp.path(), &mut kernel);
        assert!(kernel.held.is_empty() && hold.is_empty(), "a pod no longer gated is let go");
        hold.refresh(&HashMap::new(), tmp.path(), &mut kernel);
        assert!(
            kernel.paths.values().all(|k| *k == POD_PATH_PARENT),
            "a gone pod's paths are forgotten: {:?}",
            kernel.paths
        );
    }

    #[test]
    fn a_chosen_pods_cgroup_made_after_the_pod_was_seen_is_held_by_the_kernel_at_its_mkdir() {
        let tmp = Scratch::new("later");
        let mut kernel = Kernel::default();
        let mut hold = PodHold::default();
        hold.refresh(&chosen(GATED, true), tmp.path(), &mut kernel);
        assert!(kernel.held.is_empty(), "no cgroup yet");
        // The kubelet makes it: the kernel alone decides, before any refresh.
        let dir = pod_dir(tmp.path(), Some("burstable"), GATED);
        kernel.mkdir(tmp.path(), &dir);
        assert_eq!(kernel.held.keys().copied().collect::<Vec<_>>(), [ino(&dir)]);
        assert!(kernel.unclassified.is_empty());
        hold.refresh(&chosen(GATED, true), tmp.path(), &mut kernel);
        assert_eq!(hold.len(), 1, "found by id for letting it go later");
    }

    #[test]
    fn a_pod_cgroup_made_before_its_pod_was_seen_is_unclassified_until_it_is() {
        let tmp = Scratch::new("early");
        let mut kernel = Kernel::default();
        let mut hold = PodHold::default();
        hold.refresh(&HashMap::new(), tmp.path(), &mut kernel);
        let levels = kernel.parents.clone();
        assert_eq!(levels.len(), 2, "the QoS levels that exist: {levels:?}");
        let stable = pod_dir(tmp.path(), Some("burstable"), PLAIN);
        kernel.mkdir(tmp.path(), &stable);
        assert_eq!(kernel.unclassified, [ino(&stable)]);
        hold.refresh(&chosen(PLAIN, false), tmp.path(), &mut kernel);
        assert!(
            kernel.unclassified.is_empty() && kernel.held.is_empty(),
            "a stable pod, once seen, is let be"
        );
        // A stable pod seen before its cgroup exists is never unclassified.
        let mut pods = chosen(PLAIN, false);
        pods.insert(GATED.to_owned(), PodChoice { chosen: false, qos: Some(Qos::BestEffort) });
        hold.refresh(&pods, tmp.path(), &mut kernel);
        let besteffort = tmp.path().join("kubepods.slice/kubepods-besteffort.slice");
        kernel.mkdir(tmp.path(), &besteffort);
        assert!(
            kernel.parents.contains(&ino(&besteffort)),
            "a QoS level made later is a parent from its mkdir"
        );
        kernel.mkdir(tmp.path(), &pod_dir(tmp.path(), Some("besteffort"), GATED));
        assert!(kernel.unclassified.is_empty(), "{:?}", kernel.unclassified);
    }

    #[test]
    fn the_paths_cover_both_drivers_and_every_class_unless_told() {
        let all = pod_cgroup_paths(GATED, None);
        assert_eq!(all.len(), 6);
        assert!(all.contains(&format!("/kubepods/besteffort/pod{GATED}")));
        assert_eq!(
            pod_cgroup_paths(GATED, Some(Qos::Guaranteed)),
            [
                "/kubepods.slice/kubepods-pod11111111_2222_3333_4444_555555555555.slice".to_owned(),
                format!("/kubepods/pod{GATED}"),
            ]
        );
        let longest = all.iter().map(String::len).max().unwrap_or(0);
        assert!(longest < observer_common::discovery::POD_PATH_LEN, "{longest}");
        for path in &all {
            let pod = crate::attribution::cgroup_path::parse_pod_cgroup(path).expect("a pod path");
            assert_eq!(pod.pod_uid, GATED, "{path}");
        }
    }
}
