//! Which process a GPU hardware event belongs to. A memory fault names the
//! faulting address space by its pasid, not by a process; KFD keeps one
//! directory per process that opened `/dev/kfd`, with that process's pasid
//! (`/sys/class/kfd/kfd/proc/<pid>/pasid`). A fault is often reported after
//! its process died of it, so what was seen there is remembered for a while.
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// KFD's per-process directory.
pub const KFD_PROC: &str = "/sys/class/kfd/kfd/proc";
/// How long a process that left KFD's table is still attributable.
const REMEMBER: Duration = Duration::from_secs(600);
/// At most this many remembered processes (a node runs far fewer GPU
/// processes at a time).
const MAX_REMEMBERED: usize = 4096;

/// A process that had `/dev/kfd` open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KfdProcess {
    pub pid: u32,
    /// Its cgroup path below the cgroup2 root, read while it was alive.
    pub cgroup: Option<String>,
}

struct Seen {
    process: KfdProcess,
    pasid: Option<u32>,
    last: Instant,
}

pub struct KfdProcesses {
    kfd_proc: PathBuf,
    proc_root: PathBuf,
    by_pid: HashMap<u32, Seen>,
}

impl Default for KfdProcesses {
    fn default() -> Self {
        Self::new(Path::new(KFD_PROC), Path::new("/proc"))
    }
}

impl KfdProcesses {
    /// `kfd_proc` is KFD's process directory, `proc_root` procfs (tests
    /// lay both out in a temporary directory).
    pub fn new(kfd_proc: &Path, proc_root: &Path) -> Self {
        Self { kfd_proc: kfd_proc.to_path_buf(), proc_root: proc_root.to_path_buf(), by_pid: HashMap::new() }
    }

    /// Reads KFD's table: new processes are noted with their pasid and
    /// cgroup; processes gone from it are kept for a while, then dropped.
    /// Without amdgpu the directory does not exist and this is one failed
    /// `read_dir`.
    pub fn refresh(&mut self) {
        let now = Instant::now();
        if let Ok(entries) = fs::read_dir(&self.kfd_proc) {
            for entry in entries.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                if let Some(seen) = self.by_pid.get_mut(&pid) {
                    seen.last = now;
                    continue;
                }
                let pasid = read_number(&entry.path().join("pasid"));
                let cgroup = self.cgroup_of(pid);
                self.by_pid.insert(pid, Seen { process: KfdProcess { pid, cgroup }, pasid, last: now });
            }
        }
        self.by_pid.retain(|_, s| now.duration_since(s.last) < REMEMBER);
        if self.by_pid.len() > MAX_REMEMBERED {
            let mut oldest: Vec<(Instant, u32)> = self.by_pid.iter().map(|(p, s)| (s.last, *p)).collect();
            oldest.sort_unstable();
            for (_, pid) in oldest.iter().take(self.by_pid.len() - MAX_REMEMBERED) {
                self.by_pid.remove(pid);
            }
        }
    }

    /// The process whose address space has this pasid.
    pub fn by_pasid(&mut self, pasid: u32) -> Option<KfdProcess> {
        if self.find_pasid(pasid).is_none() {
            self.refresh();
        }
        self.find_pasid(pasid)
    }

    fn find_pasid(&self, pasid: u32) -> Option<KfdProcess> {
        // A pasid is reused once its process is gone: the latest holder wins.
        self.by_pid
            .values()
            .filter(|s| s.pasid == Some(pasid))
            .max_by_key(|s| s.last)
            .map(|s| s.process.clone())
    }

    /// A process by pid: alive, or remembered from KFD's table.
    pub fn by_pid(&mut self, pid: u32) -> Option<KfdProcess> {
        if let Some(cgroup) = self.cgroup_of(pid) {
            return Some(KfdProcess { pid, cgroup: Some(cgroup) });
        }
        self.by_pid.get(&pid).map(|s| s.process.clone())
    }

    /// The unified-hierarchy path of a live process (`0::/path`).
    fn cgroup_of(&self, pid: u32) -> Option<String> {
        let text = fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup")).ok()?;
        text.lines().find_map(|l| l.strip_prefix("0::")).map(|p| p.trim().to_string())
    }
}

fn read_number(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tree {
        dir: PathBuf,
    }

    impl Tree {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("cs-kfd-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(dir.join("kfd")).expect("kfd dir");
            fs::create_dir_all(dir.join("proc")).expect("proc dir");
            Self { dir }
        }

        /// A process in KFD's table and in procfs.
        fn process(&self, pid: u32, pasid: u32, cgroup: &str) {
            let kfd = self.dir.join("kfd").join(pid.to_string());
            fs::create_dir_all(&kfd).expect("kfd proc");
            fs::write(kfd.join("pasid"), format!("{pasid}\n")).expect("pasid");
            let proc = self.dir.join("proc").join(pid.to_string());
            fs::create_dir_all(&proc).expect("proc");
            fs::write(proc.join("cgroup"), format!("12:memory:/x\n0::{cgroup}\n")).expect("cgroup");
        }

        fn exit(&self, pid: u32) {
            let _ = fs::remove_dir_all(self.dir.join("kfd").join(pid.to_string()));
            let _ = fs::remove_dir_all(self.dir.join("proc").join(pid.to_string()));
        }

        fn table(&self) -> KfdProcesses {
            KfdProcesses::new(&self.dir.join("kfd"), &self.dir.join("proc"))
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    const POD: &str = "/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope";

    #[test]
    fn a_pasid_names_its_process_and_cgroup() {
        let tree = Tree::new("pasid");
        tree.process(4242, 32769, POD);
        tree.process(4343, 32770, "/system.slice/other.service");
        let mut table = tree.table();
        let found = table.by_pasid(32769).expect("found on demand");
        assert_eq!(found, KfdProcess { pid: 4242, cgroup: Some(POD.into()) });
        assert_eq!(table.by_pasid(32770).map(|p| p.pid), Some(4343));
        assert_eq!(table.by_pasid(1), None, "an unknown pasid is not guessed");
    }

    #[test]
    fn a_process_that_died_of_its_fault_is_still_attributed() {
        let tree = Tree::new("exited");
        tree.process(4242, 32769, POD);
        let mut table = tree.table();
        table.refresh();
        tree.exit(4242);
        // The periodic read after its exit no longer lists it.
        table.refresh();
        assert_eq!(table.by_pasid(32769).and_then(|p| p.cgroup), Some(POD.into()));
        assert_eq!(table.by_pid(4242).and_then(|p| p.cgroup), Some(POD.into()));
    }

    #[test]
    fn without_kfd_nothing_is_attributed() {
        let dir = std::env::temp_dir().join(format!("cs-kfd-none-{}", std::process::id()));
        let mut table = KfdProcesses::new(&dir.join("absent"), &dir.join("absent-proc"));
        table.refresh();
        assert_eq!(table.by_pasid(32769), None);
        assert_eq!(table.by_pid(1), None);
    }
}
