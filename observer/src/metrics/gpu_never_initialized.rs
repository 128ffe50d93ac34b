//! Containers that requested a GPU and never initialised one (see
//! `pipeline::never_initialized` for what is judged and what counts as an
//! initialisation): a gauge per container, the live instance's verdict.
use std::collections::BTreeMap;

use super::{
    context::{workload_values, Render},
    decl::{decl, Kind::Gauge, MetricDecl, Scope::Workload},
    families::FamilySet,
    series::PodGauges,
};

pub const GPU_NEVER_INITIALIZED: MetricDecl = decl(
    "gpu_never_initialized",
    "1 while a running container whose limits request a GPU (nvidia.com/gpu, nvidia.com/mig-*, amd.com/gpu, gpu.intel.com/* and --gpu-resource) has made no successful GPU initialisation (cuInit, hipInit, cudaGetDeviceCount or another init-class call returning success) within --gpu-init-timeout of its start: a framework serving from the CPU. 0 while it is within the timeout or once it initialised. Only containers started while this daemon ran, with Kubernetes.",
    Gauge,
    Workload,
    &[],
);

#[derive(Default)]
pub struct GpuNeverInitialized {
    /// 1 or 0 per running GPU container's cgroup.
    verdicts: PodGauges<()>,
}

impl GpuNeverInitialized {
    /// The verdicts now, of admitted cgroups; a container that no longer
    /// runs has none. Whether anything changed.
    pub fn set(&mut self, now: BTreeMap<(u64, ()), f64>) -> bool {
        self.verdicts.replace(now)
    }

    pub fn retire(&mut self, cgroup: u64) {
        self.verdicts.forget(cgroup);
    }

    pub fn render(&self, fams: &mut FamilySet, r: &Render) {
        for ((labels, ()), v) in self.verdicts.shown(r.series) {
            fams.get(&GPU_NEVER_INITIALIZED).value(&workload_values(labels, &[]), v);
        }
    }
}
