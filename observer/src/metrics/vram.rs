//! The VRAM family's series: what each container holds on each GPU now
//! (a gauge, the live cgroup's), what dead processes left behind per
//! revision, and per GPU and node.
use super::decl::{
    decl,
    Kind::{Counter, Gauge},
    MetricDecl,
    Scope::{Node, Revision, Workload},
};
use std::collections::{BTreeMap, HashSet};

use super::{
    context::{workload_values, Render},
    families::FamilySet,
    revision::{owner_labels, retired_owner, revision_key, RevisionKey},
    series::PodGauges,
};
use crate::attribution::labels::WorkloadLabels;

// VRAM, read from KFD's and amdgpu's sysfs each second (docs/daemon.md: stranded
// VRAM): per container while its processes hold it; what dead processes
// left per revision whose process died abnormally, else per node.
pub const GPU_VRAM: MetricDecl = decl(
    "gpu_vram_bytes",
    "VRAM the container's live processes hold per GPU (gpu: KFD's gpu_id), summed from KFD's vram_<gpu_id> per process each second; 0 once they hold none.",
    Gauge,
    Workload,
    &["gpu"],
);
pub const GPU_VRAM_STRANDED: MetricDecl = decl(
    "gpu_vram_stranded_bytes_total",
    "VRAM still held on a GPU, beyond its baseline, 30 s after a process of the revision that held it died abnormally (crash, OOM kill, a fatal signal), per revision on this node: each such death adds what it left, at most what it held.",
    Counter,
    Revision,
    &[],
);
pub const NODE_GPU_VRAM_STRANDED: MetricDecl = decl(
    "node_gpu_vram_stranded_bytes",
    "VRAM on each GPU (gpu: KFD's gpu_id) that no live process holds, beyond the GPU's baseline, left by processes that are gone; only for GPUs whose used memory can be read.",
    Gauge,
    Node,
    &["gpu"],
);
pub const NODE_GPU_VRAM_STRANDED_UNATTRIBUTED: MetricDecl = decl(
    "node_gpu_vram_stranded_unattributed_bytes_total",
    "Stranded VRAM put on no pod: left by a process that exited without an abnormal death, or whose pod is not known.",
    Counter,
    Node,
    &[],
);

#[derive(Default)]
pub struct Vram {
    /// Bytes per (cgroup, KFD gpu_id): a pair once above 0 stays, at 0 when
    /// its processes hold none, until its cgroup is purged.
    held: PodGauges<u32>,
    /// Stranded VRAM per GPU now (the node's gauge).
    stranded_now: Vec<(u32, u64)>,
    /// Stranded bytes put on each revision, while it has a pod here.
    stranded: BTreeMap<RevisionKey, u64>,
    /// Stranded bytes put on no pod.
    stranded_unattributed: u64,
}

impl Vram {
    /// VRAM per (cgroup, gpu) of live processes now, of admitted cgroups;
    /// whether anything changed.
    pub fn set_held(&mut self, now: Vec<(u64, u32, u64)>, admit: impl FnMut(u64) -> bool) -> bool {
        let mut admit = admit;
        let mut next: BTreeMap<(u64, u32), f64> = self.held.keys().map(|k| (*k, 0.0)).collect();
        for (cgroup, gpu, bytes) in now {
            if (bytes > 0 || next.contains_key(&(cgroup, gpu))) && admit(cgroup) {
                next.insert((cgroup, gpu), bytes as f64);
            }
        }
        self.held.replace(next)
    }

    pub fn set_stranded_now(&mut self, now: Vec<(u32, u64)>) -> bool {
        let changed = now != self.stranded_now;
        self.stranded_now = now;
        changed
    }

    /// Stranded bytes: the revision's, when the pod's labels are known
    /// (`labels`), else the node's.
    pub fn left(&mut self, labels: Option<&WorkloadLabels>, bytes: u64) {
        match labels.filter(|l| **l != WorkloadLabels::default()) {
            Some(labels) => *self.stranded.entry(revision_key(labels)).or_default() += bytes,
            None => self.stranded_unattributed += bytes,
        }
    }

    pub fn retire(&mut self, cgroup: u64) {
        self.held.forget(cgroup);
    }

    /// Forgets what was put on revisions no longer on the node.
    pub fn keep_revisions(&mut self, live: &HashSet<RevisionKey>) {
        self.stranded.retain(|k, _| live.contains(k));
    }

    pub fn render(&self, fams: &mut FamilySet, r: &Render) {
        for ((labels, gpu), bytes) in self.held.shown(r.series) {
            fams.get(&GPU_VRAM).value(&workload_values(labels, &[&gpu.to_string()]), bytes);
        }
        for (key, bytes) in &self.stranded {
            fams.get(&GPU_VRAM_STRANDED)
                .value(&owner_labels(&retired_owner(key), r.view, &[]), *bytes as f64);
        }
        for (gpu, bytes) in &self.stranded_now {
            fams.get(&NODE_GPU_VRAM_STRANDED).value(&[&gpu.to_string()], *bytes as f64);
        }
        fams.get(&NODE_GPU_VRAM_STRANDED_UNATTRIBUTED).value(&[], self.stranded_unattributed as f64);
    }
}
