//! A KFD, DRM and procfs tree in a temporary directory, laid out as the
//! kernel lays out its own (see `vram_gpus` for the sources), for the
//! tests of what reads it.
use std::{
    fs,
    path::{Path, PathBuf},
};

use super::{vram_gpus::KfdPaths, vram_procs::KfdProcesses};

pub struct Tree {
    pub dir: PathBuf,
}

impl Tree {
    pub fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("cs-kfd-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for sub in ["kfd/proc", "kfd/topology/nodes", "drm", "proc"] {
            fs::create_dir_all(dir.join(sub)).expect("tree");
        }
        Self { dir }
    }

    pub fn paths(&self) -> KfdPaths {
        KfdPaths { kfd: self.dir.join("kfd"), drm: self.dir.join("drm") }
    }

    pub fn kfd_proc(&self, pid: u32) -> PathBuf {
        self.dir.join("kfd/proc").join(pid.to_string())
    }

    fn proc(&self, pid: u32) -> PathBuf {
        self.dir.join("proc").join(pid.to_string())
    }

    /// A running process in KFD's table (`pasid` only, as with no GPU
    /// device) and in procfs.
    pub fn process(&self, pid: u32, pasid: u32, cgroup: &str) {
        let kfd = self.kfd_proc(pid);
        fs::create_dir_all(&kfd).expect("kfd proc");
        write(&kfd.join("pasid"), &format!("{pasid}\n"));
        let proc = self.proc(pid);
        fs::create_dir_all(&proc).expect("proc");
        write(&proc.join("cgroup"), &format!("12:memory:/x\n0::{cgroup}\n"));
        write(&proc.join("stat"), &format!("{pid} (a (b) c) S 1 {pid} {pid} 0 -1 4194560\n"));
    }

    /// KFD's `vram_<gpu_id>` of a process.
    pub fn vram(&self, pid: u32, gpu_id: u32, bytes: u64) {
        write(&self.kfd_proc(pid).join(format!("vram_{gpu_id}")), &format!("{bytes}\n"));
    }

    /// The process exited and was reaped, and KFD removed its directory.
    pub fn exit(&self, pid: u32) {
        let _ = fs::remove_dir_all(self.kfd_proc(pid));
        let _ = fs::remove_dir_all(self.proc(pid));
    }

    /// The process died: a zombie in procfs, its KFD directory still there
    /// (KFD removes it later, from a work item).
    pub fn zombie(&self, pid: u32) {
        write(&self.proc(pid).join("stat"), &format!("{pid} (worker) Z 1 {pid} {pid} 0 -1 4227084\n"));
    }

    /// A CPU node of KFD's topology: gpu_id 0, an empty `used_memory`.
    pub fn cpu_node(&self, node: u32) {
        let dir = self.dir.join("kfd/topology/nodes").join(node.to_string());
        fs::create_dir_all(dir.join("mem_banks/0")).expect("node");
        write(&dir.join("gpu_id"), "0\n");
        write(&dir.join("properties"), "cpu_cores_count 2\nsimd_count 0\ndrm_render_minor 0\n");
        write(&dir.join("mem_banks/0/properties"), "heap_type 0\nsize_in_bytes 1073741824\n");
        write(&dir.join("mem_banks/0/used_memory"), "");
    }

    /// A GPU node, its render device's minor in `properties`, and one
    /// memory bank without `used_memory` (as the kernels' own driver).
    pub fn gpu_node(&self, node: u32, gpu_id: u32, render_minor: u32) {
        let dir = self.dir.join("kfd/topology/nodes").join(node.to_string());
        fs::create_dir_all(dir.join("mem_banks/0")).expect("node");
        write(&dir.join("gpu_id"), &format!("{gpu_id}\n"));
        let properties = format!("cpu_cores_count 0\nsimd_count 256\ndrm_render_minor {render_minor}\n");
        write(&dir.join("properties"), &properties);
        write(&dir.join("mem_banks/0/properties"), "heap_type 1\nsize_in_bytes 68702699520\n");
    }

    /// ROCm's driver's `used_memory` of a GPU node's bank.
    pub fn rocm_used(&self, node: u32, bytes: u64) {
        let dir = self.dir.join("kfd/topology/nodes").join(node.to_string()).join("mem_banks/0");
        write(&dir.join("used_memory"), &format!("{bytes}\n"));
    }

    /// amdgpu's `mem_info_vram_used` of a render device.
    pub fn amdgpu_used(&self, render_minor: u32, bytes: u64) {
        let dir = self.dir.join("drm").join(format!("renderD{render_minor}")).join("device");
        fs::create_dir_all(&dir).expect("drm device");
        write(&dir.join("mem_info_vram_used"), &format!("{bytes}\n"));
    }

    pub fn table(&self) -> KfdProcesses {
        KfdProcesses::new(&self.dir.join("kfd/proc"), &self.dir.join("proc"))
    }
}

fn write(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
