//! Which process a GPU hardware event belongs to. A memory fault names the
//! faulting address space by its pasid, not by a process; KFD keeps one
//! directory per process that opened `/dev/kfd`, with that process's pasid
//! (`/sys/class/kfd/kfd/proc/<pid>/pasid`). A fault is often reported after
//! its process died of it, so what was seen there is remembered for a while.
//!
//! The same walk reads what each listed process holds per GPU
//! (`vram_<gpu_id>`, see `vram_gpus`) and whether it is still alive:
//! VRAM per pod, and the input of stranded VRAM.
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::vram_gpus::{self, Vram};

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
    /// Whether the last read of the table listed it.
    listed: bool,
    /// Whether it was alive then: in procfs and not a zombie. KFD removes
    /// a dead process's directory later, from a work item.
    alive: bool,
    /// What it held per GPU at the last reading that succeeded.
    vram: Option<Vram>,
}

/// A process KFD lists now, as the last read found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listed<'a> {
    pub pid: u32,
    pub cgroup: Option<&'a str>,
    pub alive: bool,
    /// This daemon's own entry (a monitor that opens `/dev/kfd` is listed
    /// too): its memory is alive, but it is no workload's.
    pub own: bool,
    /// Empty until a reading succeeded, and for a process with no GPU.
    pub vram: &'a [(u32, u64)],
}

pub struct KfdProcesses {
    kfd_proc: PathBuf,
    proc_root: PathBuf,
    by_pid: HashMap<u32, Seen>,
    own_pid: u32,
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
        Self {
            kfd_proc: kfd_proc.to_path_buf(),
            proc_root: proc_root.to_path_buf(),
            by_pid: HashMap::new(),
            own_pid: std::process::id(),
        }
    }

    /// Which entry is this daemon's own (tests name another pid).
    pub fn with_own_pid(mut self, pid: u32) -> Self {
        self.own_pid = pid;
        self
    }

    /// Reads KFD's table: new processes are noted with their pasid and
    /// cgroup, every listed one with its VRAM and whether it is alive;
    /// processes gone from it are kept for a while, then dropped. Without
    /// amdgpu the directory does not exist and this is one failed
    /// `read_dir`.
    pub fn refresh(&mut self) {
        let now = Instant::now();
        for seen in self.by_pid.values_mut() {
            seen.listed = false;
        }
        if let Ok(entries) = fs::read_dir(&self.kfd_proc) {
            for entry in entries.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                let (alive, vram) = (self.alive(pid), vram_gpus::process_vram(&entry.path()));
                let seen = match self.by_pid.entry(pid) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        let pasid = read_number(&entry.path().join("pasid"));
                        let cgroup = cgroup_of(&self.proc_root, pid);
                        let process = KfdProcess { pid, cgroup };
                        e.insert(Seen { process, pasid, last: now, listed: true, alive, vram: None })
                    }
                };
                (seen.last, seen.listed, seen.alive) = (now, true, alive);
                // A reading cut short by the exit keeps the last one.
                if vram.is_some() {
                    seen.vram = vram;
                }
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

    /// The processes the last read listed, in pid order.
    pub fn listed(&self) -> Vec<Listed<'_>> {
        let mut listed: Vec<Listed> = self
            .by_pid
            .iter()
            .filter(|(_, s)| s.listed)
            .map(|(pid, s)| Listed {
                pid: *pid,
                cgroup: s.process.cgroup.as_deref(),
                alive: s.alive,
                own: *pid == self.own_pid,
                vram: s.vram.as_deref().unwrap_or_default(),
            })
            .collect();
        listed.sort_unstable_by_key(|l| l.pid);
        listed
    }

    /// What a process that just died held per GPU: its directory read now
    /// (KFD removes it only after the exit), else the last reading. `None`
    /// for a process KFD never listed: it had no `/dev/kfd` open.
    pub fn vram_at_exit(&mut self, pid: u32) -> Option<Vram> {
        if let Some(vram) = vram_gpus::process_vram(&self.kfd_proc.join(pid.to_string())) {
            if let Some(seen) = self.by_pid.get_mut(&pid) {
                seen.vram = Some(vram.clone());
            }
            return Some(vram);
        }
        let seen = self.by_pid.get(&pid)?;
        // Listed, but never read whole: it held nothing we know of.
        Some(seen.vram.clone().unwrap_or_default())
    }

    /// Whether a process is alive: procfs has it and it is no zombie.
    fn alive(&self, pid: u32) -> bool {
        let stat = fs::read_to_string(self.proc_root.join(pid.to_string()).join("stat")).unwrap_or_default();
        // The state follows the command name, which may hold ") ".
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        matches!(state, Some(s) if !matches!(s, 'Z' | 'X' | 'x'))
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
        if let Some(cgroup) = cgroup_of(&self.proc_root, pid) {
            return Some(KfdProcess { pid, cgroup: Some(cgroup) });
        }
        self.by_pid.get(&pid).map(|s| s.process.clone())
    }
}

/// The unified-hierarchy path of a live process (`0::/path`).
fn cgroup_of(proc_root: &Path, pid: u32) -> Option<String> {
    let text = fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup")).ok()?;
    text.lines().find_map(|l| l.strip_prefix("0::")).map(|p| p.trim().to_string())
}

fn read_number(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::kfd_tree::Tree;

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

    #[test]
    fn each_listed_process_has_its_vram_and_whether_it_is_alive() {
        let tree = Tree::new("listed");
        tree.process(4242, 32769, POD);
        tree.vram(4242, 48879, 1 << 30);
        tree.process(4343, 32770, "/system.slice/monitor.service");
        tree.vram(4343, 48879, 4096);
        tree.process(4444, 32771, POD);
        let mut table = tree.table().with_own_pid(4343);
        table.refresh();
        let listed = table.listed();
        type Seen<'a> = (u32, bool, bool, &'a [(u32, u64)]);
        let seen: Vec<Seen> = listed.iter().map(|l| (l.pid, l.alive, l.own, l.vram)).collect();
        assert_eq!(
            seen,
            vec![
                (4242, true, false, &[(48879, 1 << 30)][..]),
                (4343, true, true, &[(48879, 4096)][..]),
                (4444, true, false, &[][..]),
            ]
        );
        // Dead, its directory not yet removed; then removed.
        tree.zombie(4242);
        table.refresh();
        assert!(!table.listed()[0].alive, "a zombie holds nothing alive");
        assert_eq!(table.vram_at_exit(4242), Some(vec![(48879, 1 << 30)]));
        tree.exit(4242);
        table.refresh();
        assert_eq!(table.listed().len(), 2);
        assert_eq!(table.vram_at_exit(4242), Some(vec![(48879, 1 << 30)]), "the last reading");
        assert_eq!(table.vram_at_exit(4444), Some(Vec::new()), "pasid only: no VRAM");
        assert_eq!(table.vram_at_exit(9999), None, "never had /dev/kfd open");
    }

    #[test]
    fn a_reading_cut_short_by_the_exit_keeps_the_last_one() {
        let tree = Tree::new("cut");
        tree.process(4242, 32769, POD);
        tree.vram(4242, 48879, 1 << 30);
        let mut table = tree.table();
        table.refresh();
        // A file listed, then gone when read (a dangling link reads as
        // one): the directory is still listed, but no reading is taken.
        let gone = tree.kfd_proc(4242).join("vram_1234");
        std::os::unix::fs::symlink(tree.dir.join("nowhere"), gone).expect("link");
        table.refresh();
        assert_eq!(table.listed()[0].vram, &[(48879, 1 << 30)][..]);
    }
}
