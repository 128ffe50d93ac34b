//! Resolving cgroup2 ids (what `bpf_get_current_cgroup_id()` returns: the
//! inode number of the cgroup's directory in cgroupfs) to cgroup paths.
use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Where the cgroup2 hierarchy is mounted: `/sys/fs/cgroup` on pure v2
/// hosts, `/sys/fs/cgroup/unified` on hybrid ones.
pub fn cgroup2_root() -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    parse_cgroup2_mount(&mountinfo)
}

fn parse_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    // Fields: id parent major:minor root mount_point options ... - fstype source super_options
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// Caches id -> path; a miss rescans the tree at most once per `rescan_every`
/// so a flood of events from an unknown cgroup cannot turn into a flood of
/// directory walks.
pub struct CgroupResolver {
    root: Option<PathBuf>,
    by_id: HashMap<u64, String>,
    last_scan: Option<Instant>,
    rescan_every: Duration,
}

impl CgroupResolver {
    pub fn new() -> Self {
        Self::with_root(cgroup2_root())
    }
}

impl Default for CgroupResolver {
    fn default() -> Self {
        Self::new()
    }
}

impl CgroupResolver {
    pub fn with_root(root: Option<PathBuf>) -> Self {
        let mut resolver =
            Self { root, by_id: HashMap::new(), last_scan: None, rescan_every: Duration::from_millis(200) };
        resolver.rescan();
        resolver
    }

    pub fn root(&self) -> Option<&Path> {
        self.root.as_deref()
    }

    /// The cgroup path below the cgroup2 root (`/` for the root itself), or
    /// `None` when the cgroup is gone or was never seen.
    pub fn path(&mut self, id: u64) -> Option<String> {
        if let Some(path) = self.by_id.get(&id) {
            return Some(path.clone());
        }
        if let Some(path) = self.path_by_handle(id) {
            self.by_id.insert(id, path.clone());
            return Some(path);
        }
        let due = self.last_scan.is_none_or(|t| t.elapsed() >= self.rescan_every);
        if due {
            self.rescan();
        }
        self.by_id.get(&id).cloned()
    }

    /// O(1) lookup: kernfs accepts a cgroup id as a file handle
    /// (`FILEID_KERNFS`), so the directory can be opened by id and its path
    /// read back from /proc/self/fd. Needs CAP_DAC_READ_SEARCH; without it
    /// the directory walk still works.
    fn path_by_handle(&self, id: u64) -> Option<String> {
        use std::os::fd::AsRawFd;
        #[repr(C)]
        struct KernfsHandle {
            handle_bytes: u32,
            handle_type: i32,
            id: u64,
        }
        const FILEID_KERNFS: i32 = 0xfe;
        let root = self.root.as_ref()?;
        let mount = fs::File::open(root).ok()?;
        let mut handle = KernfsHandle { handle_bytes: 8, handle_type: FILEID_KERNFS, id };
        // SAFETY: `handle` is a valid file_handle header followed by its
        // 8 payload bytes, and `mount` is an open directory on the cgroup2 mount.
        let fd = unsafe {
            libc::open_by_handle_at(
                mount.as_raw_fd(),
                (&mut handle as *mut KernfsHandle).cast::<libc::file_handle>(),
                libc::O_RDONLY | libc::O_CLOEXEC | libc::O_DIRECTORY,
            )
        };
        if fd < 0 {
            return None;
        }
        let link = fs::read_link(format!("/proc/self/fd/{fd}"));
        // SAFETY: `fd` was just returned to us and is closed exactly once.
        unsafe { libc::close(fd) };
        let link = link.ok()?;
        let rel = link.strip_prefix(root).ok()?;
        Some(format!("/{}", rel.display()))
    }

    /// The id of a cgroup path (below the root), read from its inode.
    pub fn id_of(&self, path: &str) -> Option<u64> {
        let root = self.root.as_ref()?;
        let full = root.join(path.trim_start_matches('/'));
        fs::metadata(full).ok().map(|m| m.ino())
    }

    /// The cgroup a container's processes run in, among those known: each
    /// one whose processes were seen (an exec, any event) or that a rescan
    /// found. The deepest one, where a runtime nests a level below the
    /// container's (CRI-O with crun: `crio-<id>.scope/container`).
    pub fn container_cgroup(&self, pod_uid: &str, container_id: &str) -> Option<u64> {
        self.by_id
            .iter()
            .filter(|(_, path)| {
                super::cgroup_path::parse_pod_cgroup(path).is_some_and(|pod| {
                    pod.pod_uid == pod_uid && pod.container.is_some_and(|c| c.id == container_id)
                })
            })
            .max_by_key(|(_, path)| path.len())
            .map(|(id, _)| *id)
    }

    /// Drop a cgroup that was removed so a reused id cannot resolve to it.
    /// Whether the cgroup still exists: its last known directory is there
    /// and is still the same cgroup (ids are inode numbers and not reused
    /// while the kernel runs, but a path can be).
    pub fn exists(&self, id: u64) -> bool {
        let (Some(root), Some(path)) = (self.root.as_ref(), self.by_id.get(&id)) else {
            return false;
        };
        fs::metadata(root.join(path.trim_start_matches('/'))).is_ok_and(|m| m.ino() == id)
    }

    pub fn forget(&mut self, id: u64) {
        self.by_id.remove(&id);
    }

    pub fn rescan(&mut self) {
        self.last_scan = Some(Instant::now());
        let Some(root) = self.root.clone() else {
            return;
        };
        let mut fresh = HashMap::with_capacity(self.by_id.len().max(64));
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue;
            };
            let rel =
                dir.strip_prefix(&root).map(|p| format!("/{}", p.display())).unwrap_or_else(|_| "/".into());
            fresh.insert(meta.ino(), rel);
            // A cgroup removed while we walk is simply skipped.
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(entry.path());
                }
            }
        }
        self.by_id = fresh;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_in_hybrid_and_pure_layouts() {
        let hybrid = "25 20 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n\
                      27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(parse_cgroup2_mount(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let pure =
            "30 1 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n";
        assert_eq!(parse_cgroup2_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(parse_cgroup2_mount("garbage line\n"), None);
    }

    #[test]
    fn resolves_a_real_directory_tree() {
        let dir = std::env::temp_dir().join(format!("canaryscope-cg-{}", std::process::id()));
        let leaf = dir.join("kubepods.slice/pod.slice");
        fs::create_dir_all(&leaf).expect("temp dir");
        let mut r = CgroupResolver::with_root(Some(dir.clone()));
        let id = fs::metadata(&leaf).expect("leaf").ino();
        assert_eq!(r.path(id).as_deref(), Some("/kubepods.slice/pod.slice"));
        assert_eq!(r.id_of("/kubepods.slice/pod.slice"), Some(id));
        assert!(r.exists(id));
        fs::remove_dir_all(&dir).expect("cleanup");
        // Still known by path (events of its last moments keep their
        // attribution), but no longer there.
        assert_eq!(r.path(id).as_deref(), Some("/kubepods.slice/pod.slice"));
        assert!(!r.exists(id));
        r.forget(id);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(r.path(id), None);
    }

    #[test]
    fn a_containers_cgroup_is_found_by_pod_and_container_id_the_deepest_first() {
        let dir = std::env::temp_dir().join(format!("canaryscope-cgc-{}", std::process::id()));
        let uid = "1c0a2b3e-4f5d-6789-abcd-ef0123456789";
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        let pod = dir.join(format!("kubepods.slice/kubepods-pod{}.slice", uid.replace('-', "_")));
        let scope = pod.join(format!("crio-{a}.scope"));
        fs::create_dir_all(scope.join("container")).expect("temp dir");
        fs::create_dir_all(pod.join(format!("crio-{b}.scope"))).expect("temp dir");
        let r = CgroupResolver::with_root(Some(dir.clone()));
        let inner = fs::metadata(scope.join("container")).expect("inner").ino();
        assert_eq!(r.container_cgroup(uid, &a), Some(inner), "where crun puts the processes");
        let other = fs::metadata(pod.join(format!("crio-{b}.scope"))).expect("b").ino();
        assert_eq!(r.container_cgroup(uid, &b), Some(other));
        assert_eq!(r.container_cgroup("2d1b3c4e-5f60-4789-8abc-def012345678", &a), None, "another pod");
        assert_eq!(r.container_cgroup(uid, &"c".repeat(64)), None);
        fs::remove_dir_all(&dir).expect("cleanup");
    }
}
