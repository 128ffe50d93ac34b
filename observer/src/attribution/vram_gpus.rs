//! GPU memory as KFD and amdgpu report it in sysfs: what each process holds
//! on each GPU, and what each GPU holds in all. The first gives VRAM per
//! pod; the two together give the VRAM nobody alive holds (stranded).
//!
//! What the kernels say (Debian's 5.10, 6.1 and 6.12 sources, the kernels
//! the test VMs boot):
//! - `kfd_process.c`, `kfd_procfs_add_sysfs_files`: one `vram_<gpu_id>`
//!   file per process device under `/sys/class/kfd/kfd/proc/<pid>/` (the
//!   directory is named by the lead thread's host pid), shown as `"%llu\n"`
//!   by `kfd_procfs_show`. Process devices are made for every GPU by
//!   `kfd_init_apertures` when the process opens `/dev/kfd`, so a machine
//!   without a GPU lists `pasid` alone.
//! - `kfd_chardev.c` adds a VRAM allocation's size to that number (5.10 as
//!   asked, 6.1 page-aligned); 6.12 also counts SVM ranges migrated to VRAM
//!   (`kfd_svm.c`). Page tables and other driver buffers are not counted.
//! - `kfd_process.c`, `kfd_process_wq_release`: the directory is removed
//!   before the process's buffers are freed, in a work item queued after
//!   the process's address space went away.
//! - `kfd_topology.c`: `topology/nodes/<n>/gpu_id` (0 on a CPU node), and
//!   `properties` with `drm_render_minor <n>`. `mem_banks/<m>/properties`
//!   has `heap_type` and `size_in_bytes`, and in these kernels no used
//!   memory: `mem_banks/<m>/used_memory` (`"%llu\n"`, empty on a CPU node)
//!   is ROCm's own build of the driver (amdgpu-dkms, ROCK-Kernel-Driver).
//! - `amdgpu_vram_mgr.c`: `mem_info_vram_used` on the GPU's PCI device
//!   (`/sys/class/drm/renderD<minor>/device/`), `"%llu\n"`: the VRAM
//!   manager's usage, the same number ROCm's `used_memory` shows.
//!
//! Every read here degrades on its own: a file missing, renamed, unreadable
//! or gone with its process leaves out that number, not the rest.
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

/// Where KFD and the DRM devices are in sysfs (tests lay out their own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KfdPaths {
    /// `/sys/class/kfd/kfd`: `proc/` and `topology/` below it.
    pub kfd: PathBuf,
    /// `/sys/class/drm`.
    pub drm: PathBuf,
}

impl Default for KfdPaths {
    fn default() -> Self {
        Self { kfd: PathBuf::from("/sys/class/kfd/kfd"), drm: PathBuf::from("/sys/class/drm") }
    }
}

impl KfdPaths {
    /// KFD's per-process directory.
    pub fn proc_dir(&self) -> PathBuf {
        self.kfd.join("proc")
    }

    fn nodes(&self) -> PathBuf {
        self.kfd.join("topology").join("nodes")
    }
}

/// VRAM per GPU (KFD's gpu_id), sorted by GPU.
pub type Vram = Vec<(u32, u64)>;

/// A sysfs number: decimal, then a newline.
pub fn parse_bytes(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

fn read_number(path: &Path) -> Option<u64> {
    parse_bytes(&fs::read_to_string(path).ok()?)
}

/// The GPU a `vram_<gpu_id>` file is about.
fn vram_file_gpu(name: &str) -> Option<u32> {
    name.strip_prefix("vram_")?.parse().ok()
}

/// What one process's KFD directory says it holds per GPU. `None` when the
/// directory is gone, or a `vram_<gpu_id>` file in it went while it was
/// read (the process is exiting) or does not read as a number: an
/// incomplete reading is no reading, and the caller keeps its last one.
/// Files of other names are not this reading's. Empty: a process with no
/// GPU device (`pasid` only).
pub fn process_vram(dir: &Path) -> Option<Vram> {
    let mut vram = Vram::new();
    for entry in fs::read_dir(dir).ok()?.flatten() {
        let Some(gpu) = entry.file_name().to_str().and_then(vram_file_gpu) else { continue };
        let bytes = parse_bytes(&fs::read_to_string(entry.path()).ok()?)?;
        vram.push((gpu, bytes));
    }
    vram.sort_unstable();
    Some(vram)
}

/// Where a GPU's used memory is read, or why it is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UsedMemory {
    /// ROCm's driver: `topology/nodes/<n>/mem_banks/<m>/used_memory`.
    MemBank(PathBuf),
    /// amdgpu's `mem_info_vram_used` of the node's render device.
    Amdgpu(PathBuf),
    /// Neither could be read; the reason, for `check`.
    Unknown(&'static str),
}

impl UsedMemory {
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::MemBank(p) | Self::Amdgpu(p) => Some(p),
            Self::Unknown(_) => None,
        }
    }
}

/// A GPU in KFD's topology.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub gpu_id: u32,
    pub used: UsedMemory,
}

/// The GPUs in KFD's topology (CPU nodes have gpu_id 0 and are left out),
/// each with where its used memory is read. Two GPUs whose number comes
/// from one file (partitions of one device) share their memory, and no
/// process's VRAM can be told from the other's in it: neither gets one.
pub fn gpus(paths: &KfdPaths) -> Vec<Gpu> {
    let Ok(nodes) = fs::read_dir(paths.nodes()) else { return Vec::new() };
    let mut gpus: Vec<Gpu> = nodes
        .flatten()
        .filter_map(|node| {
            let dir = node.path();
            let gpu_id = u32::try_from(read_number(&dir.join("gpu_id"))?).ok().filter(|id| *id != 0)?;
            Some(Gpu { gpu_id, used: used_memory(&dir, &paths.drm) })
        })
        .collect();
    gpus.sort_unstable_by_key(|g| g.gpu_id);
    let mut sharing: HashMap<PathBuf, usize> = HashMap::new();
    for path in gpus.iter().filter_map(|g| g.used.path()) {
        *sharing.entry(fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())).or_default() += 1;
    }
    for gpu in &mut gpus {
        let shared = gpu.used.path().is_some_and(|p| {
            sharing.get(&fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())).is_some_and(|n| *n > 1)
        });
        if shared {
            gpu.used = UsedMemory::Unknown("its used memory is one device's, shared with another KFD node");
        }
    }
    gpus
}

/// Where a topology node's used memory can be read now.
fn used_memory(node: &Path, drm: &Path) -> UsedMemory {
    if let Ok(banks) = fs::read_dir(node.join("mem_banks")) {
        let mut banks: Vec<PathBuf> = banks.flatten().map(|b| b.path().join("used_memory")).collect();
        banks.sort();
        if let Some(path) = banks.into_iter().find(|p| read_number(p).is_some()) {
            return UsedMemory::MemBank(path);
        }
    }
    let properties = fs::read_to_string(node.join("properties")).unwrap_or_default();
    let minor = properties.lines().find_map(|l| l.strip_prefix("drm_render_minor ")).and_then(parse_bytes);
    let Some(minor) = minor else {
        return UsedMemory::Unknown("no used_memory in mem_banks and no drm_render_minor in properties");
    };
    let path = drm.join(format!("renderD{minor}")).join("device").join("mem_info_vram_used");
    match read_number(&path) {
        Some(_) => UsedMemory::Amdgpu(path),
        None => {
            UsedMemory::Unknown("no used_memory in mem_banks and no mem_info_vram_used at its render node")
        }
    }
}

/// A GPU's used memory now; `None` when it cannot be read this time.
pub fn read_used(gpu: &Gpu) -> Option<u64> {
    read_number(gpu.used.path()?)
}

/// What `check` says of KFD's memory files on this machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Survey {
    /// Whether KFD's process directory exists (amdgpu is loaded).
    pub kfd_proc: bool,
    /// Process directories listed, and those with `vram_<gpu_id>` files.
    pub processes: usize,
    pub with_vram: usize,
    /// Directories whose files could not be read (gone meanwhile).
    pub unreadable: usize,
    pub gpus: Vec<Gpu>,
}

/// One reading of everything VRAM per pod and stranded VRAM rest on.
pub fn survey(paths: &KfdPaths) -> Survey {
    let mut survey = Survey { gpus: gpus(paths), ..Survey::default() };
    let Ok(entries) = fs::read_dir(paths.proc_dir()) else { return survey };
    survey.kfd_proc = true;
    for entry in entries.flatten() {
        if entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()).is_none() {
            continue;
        }
        survey.processes += 1;
        match process_vram(&entry.path()) {
            Some(vram) if !vram.is_empty() => survey.with_vram += 1,
            Some(_) => {}
            None => survey.unreadable += 1,
        }
    }
    survey
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::kfd_tree::Tree;

    #[test]
    fn a_process_reads_as_its_vram_files_and_nothing_else() {
        let tree = Tree::new("mem-files");
        tree.process(4242, 32769, "/x");
        tree.vram(4242, 48879, 1 << 30);
        tree.vram(4242, 1234, 0);
        let dir = tree.kfd_proc(4242);
        // Files KFD has beside them, and names a newer kernel might use.
        fs::write(dir.join("sdma_48879"), "17\n").expect("sdma");
        fs::write(dir.join("vram_"), "5\n").expect("no gpu");
        fs::write(dir.join("vram_77x"), "5\n").expect("renamed");
        fs::create_dir_all(dir.join("stats_48879")).expect("stats");
        assert_eq!(process_vram(&dir), Some(vec![(1234, 0), (48879, 1 << 30)]));
        assert_eq!(process_vram(&tree.kfd_proc(1)), None, "no directory, no reading");
        fs::write(dir.join("vram_99"), "garbage\n").expect("garbage");
        assert_eq!(process_vram(&dir), None, "an incomplete reading is none");
    }

    #[test]
    fn a_pasid_only_entry_holds_no_vram() {
        let tree = Tree::new("mem-pasid");
        tree.process(4242, 32769, "/x");
        assert_eq!(process_vram(&tree.kfd_proc(4242)), Some(Vec::new()));
    }

    #[test]
    fn used_memory_comes_from_rocms_file_or_from_amdgpus() {
        let tree = Tree::new("mem-topology");
        tree.cpu_node(0);
        tree.gpu_node(1, 48879, 128);
        tree.rocm_used(1, 5 << 30);
        tree.gpu_node(2, 1234, 129);
        tree.amdgpu_used(129, 7 << 30);
        tree.gpu_node(3, 777, 130);
        let gpus = gpus(&tree.paths());
        let ids: Vec<u32> = gpus.iter().map(|g| g.gpu_id).collect();
        assert_eq!(ids, vec![777, 1234, 48879], "CPU nodes are no GPU");
        let used: Vec<Option<u64>> = gpus.iter().map(read_used).collect();
        assert_eq!(used, vec![None, Some(7 << 30), Some(5 << 30)]);
        assert!(matches!(gpus[0].used, UsedMemory::Unknown(_)), "{:?}", gpus[0]);
        assert!(matches!(gpus[1].used, UsedMemory::Amdgpu(_)));
        assert!(matches!(gpus[2].used, UsedMemory::MemBank(_)));
    }

    #[test]
    fn two_nodes_on_one_devices_memory_get_none() {
        let tree = Tree::new("mem-shared");
        tree.gpu_node(1, 100, 128);
        tree.gpu_node(2, 200, 128);
        tree.amdgpu_used(128, 1 << 30);
        assert!(gpus(&tree.paths()).iter().all(|g| read_used(g).is_none()));
    }

    #[test]
    fn without_kfd_the_survey_is_empty() {
        let tree = Tree::new("mem-none");
        let paths = KfdPaths { kfd: tree.dir.join("absent"), drm: tree.dir.join("absent") };
        assert_eq!(survey(&paths), Survey::default());
        tree.process(4242, 32769, "/x");
        tree.process(4343, 32770, "/y");
        tree.vram(4343, 1234, 4096);
        let s = survey(&tree.paths());
        assert_eq!((s.kfd_proc, s.processes, s.with_vram, s.unreadable), (true, 2, 1, 0));
    }
}
