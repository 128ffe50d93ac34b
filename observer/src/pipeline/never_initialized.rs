//! Containers that requested a GPU and never initialised one: a framework
//! that lost its GPU library, or found no device, falls back to the CPU and
//! serves, slower by an order of magnitude, with no GPU call failing.
//!
//! # What is judged
//!
//! A container whose limits ask for a GPU resource (`run --gpu-resource`,
//! see [`crate::config::GpuResources`]) and that the kubelet reports
//! running, from its `state.running.startedAt`. Only containers that
//! started while this daemon's probes were attached are judged: a container
//! already running at a daemon (re)start made its start-up calls unseen,
//! and it must not be called idle for that.
//!
//! # What counts as a successful GPU initialisation
//!
//! A call, from a process in the container's cgroup, that returned success
//! (`hipSuccess`, `CUDA_SUCCESS`, `cudaSuccess`) and whose failure would
//! have counted as an init failure ([`observer_common::gpu::is_init_function`]):
//! `hipInit`, `hipGetDeviceCount`, `hipSetDevice`, `cuInit`, `cuDeviceGet`,
//! `cuDeviceGetCount`, `cuCtxCreate`, `cuDevicePrimaryCtxRetain`,
//! `cudaGetDeviceCount`, `cudaSetDevice` or `cudaInitDevice`. Each of them
//! succeeds only once the runtime has found a device; all are probed in
//! every process, and the kernel counts successes per cgroup. A version
//! query (`cuDriverGetVersion`), a symbol lookup (`cuGetProcAddress`) or a
//! failed init is no initialisation. Runtimes canaryscope does not probe
//! (Intel's Level Zero and OpenCL, Vulkan) make none.
//!
//! A container running `timeout` past its start without one is *never
//! initialised* until one comes; a later initialisation (a server that
//! loads its model on the first request) clears it.
use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use observer_common::gpu::{is_init_function, Api, GpuStatsKey};

use crate::{
    attribution::{gpu_request::gpus_requested, kube::PodCache, CgroupResolver},
    config::GpuResources,
};

/// One running container that requested a GPU, as judged now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuContainer {
    pub pod_uid: String,
    /// The container's name in the pod spec.
    pub container: String,
    /// The cgroup its processes run in.
    pub cgroup: u64,
    /// The GPUs it asked for, as written: `nvidia.com/gpu: 1`.
    pub gpus: String,
    /// Running past the timeout without a successful GPU initialisation.
    pub never_initialized: bool,
}

/// A running container that asked for a GPU, from the pod cache.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Candidate {
    pod_uid: String,
    container: String,
    container_id: String,
    gpus: String,
    /// Unix seconds, as the kubelet reports it.
    started_at: i64,
}

/// The check, kept between refreshes.
pub struct NeverInitialized {
    timeout: Duration,
    gpus: GpuResources,
    /// Unix seconds when the probes were attached: containers started
    /// before are not judged.
    attached_at: i64,
    /// Container ID -> its cgroup, once found.
    cgroups: HashMap<String, u64>,
}

impl NeverInitialized {
    pub fn new(timeout: Duration, gpus: GpuResources, attached_at: i64) -> Self {
        Self { timeout, gpus, attached_at, cgroups: HashMap::new() }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The running GPU containers of `pods` that started while the probes
    /// were attached, judged at `now` (Unix seconds) against the kernel's
    /// successful calls (`gpu`: its aggregates' keys).
    pub fn judge<'a>(
        &mut self,
        pods: &PodCache,
        resolver: &CgroupResolver,
        gpu: impl IntoIterator<Item = &'a GpuStatsKey>,
        now: i64,
    ) -> Vec<GpuContainer> {
        let (gpus, attached_at) = (&self.gpus, self.attached_at);
        let mut candidates: Vec<Candidate> =
            pods.classify(|meta| candidates(meta, gpus, attached_at)).into_values().flatten().collect();
        if candidates.is_empty() {
            // No GPU container runs: the kernel's aggregates need no walk.
            self.cgroups.clear();
            return Vec::new();
        }
        candidates.sort_by(|a, b| (&a.pod_uid, &a.container_id).cmp(&(&b.pod_uid, &b.container_id)));
        // A container that stopped running needs its cgroup no more.
        let running: HashSet<&str> = candidates.iter().map(|c| c.container_id.as_str()).collect();
        self.cgroups.retain(|id, _| running.contains(id.as_str()));
        for c in &candidates {
            if !self.cgroups.contains_key(&c.container_id) {
                if let Some(cgroup) = resolver.container_cgroup(&c.pod_uid, &c.container_id) {
                    self.cgroups.insert(c.container_id.clone(), cgroup);
                }
            }
        }
        judged(candidates, &self.cgroups, &initialized_cgroups(gpu), self.timeout, now)
    }
}

/// The pod's running containers that asked for a GPU and started once the
/// probes were attached. `startedAt` has whole seconds: one started in the
/// second of the attach counts, though it may have begun a moment before
/// (a start-up call in that moment would be missed; a container never
/// judged would be worse).
fn candidates(
    meta: &crate::attribution::kube::PodMeta,
    gpus: &GpuResources,
    attached_at: i64,
) -> Vec<Candidate> {
    meta.running_since
        .iter()
        .filter(|(_, started_at)| **started_at >= attached_at)
        .filter_map(|(id, started_at)| {
            let container = meta.containers.get(id)?;
            let asked = gpus_requested(meta.extended_resources.get(container)?, gpus)?;
            Some(Candidate {
                pod_uid: meta.uid.clone(),
                container: container.clone(),
                container_id: id.clone(),
                gpus: asked,
                started_at: *started_at,
            })
        })
        .collect()
}

/// The cgroups with a successful initialisation among the kernel's
/// aggregates (see the module documentation).
pub fn initialized_cgroups<'a>(keys: impl IntoIterator<Item = &'a GpuStatsKey>) -> HashSet<u64> {
    keys.into_iter()
        .filter(|k| k.result == 0)
        .filter(|k| {
            let function = Api::from_u32(k.api).and_then(|api| api.functions().get(k.function as usize));
            function.is_some_and(|f| is_init_function(f.name))
        })
        .map(|k| k.cgroup_id)
        .collect()
}

/// Each candidate whose cgroup is known, judged: never initialised once
/// it has run `timeout` without a successful initialisation.
fn judged(
    candidates: Vec<Candidate>,
    cgroups: &HashMap<String, u64>,
    initialized: &HashSet<u64>,
    timeout: Duration,
    now: i64,
) -> Vec<GpuContainer> {
    let timeout = i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX);
    candidates
        .into_iter()
        .filter_map(|c| {
            let cgroup = *cgroups.get(&c.container_id)?;
            let overdue = now.saturating_sub(c.started_at) >= timeout;
            Some(GpuContainer {
                never_initialized: overdue && !initialized.contains(&cgroup),
                pod_uid: c.pod_uid,
                container: c.container,
                cgroup,
                gpus: c.gpus,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::kube::PodMeta;

    const ID_GPU: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const ID_CPU: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn meta(started_at: i64) -> PodMeta {
        PodMeta {
            uid: "u1".into(),
            containers: [
                (ID_GPU.to_string(), "worker".to_string()),
                (ID_CPU.to_string(), "proxy".to_string()),
            ]
            .into(),
            extended_resources: [
                ("worker".to_string(), vec![("nvidia.com/gpu".to_string(), "1".to_string())]),
                ("proxy".to_string(), vec![("example.com/nic".to_string(), "1".to_string())]),
            ]
            .into(),
            running_since: [(ID_GPU.to_string(), started_at), (ID_CPU.to_string(), started_at)].into(),
            ..PodMeta::default()
        }
    }

    fn key(cgroup_id: u64, api: Api, function: &str, result: i32) -> GpuStatsKey {
        let function = api.functions().iter().position(|f| f.name == function).expect("probed") as u32;
        GpuStatsKey { cgroup_id, api: api as u32, function, result, untimed: 0 }
    }

    #[test]
    fn only_running_gpu_containers_started_after_the_attach_are_candidates() {
        let gpus = GpuResources::default();
        let c = candidates(&meta(1000), &gpus, 1000);
        assert_eq!(c.len(), 1, "started in the second of the attach: {c:?}");
        assert_eq!((c[0].container.as_str(), c[0].gpus.as_str()), ("worker", "nvidia.com/gpu: 1"));
        assert!(candidates(&meta(1000), &gpus, 1001).is_empty(), "running before the attach");
        let mut unnamed = meta(1000);
        unnamed.containers.clear();
        assert!(candidates(&unnamed, &gpus, 0).is_empty(), "the kubelet names a container with its status");
        let with_nic = GpuResources::with_extra(&["example.com/nic".to_string()]).expect("valid");
        assert_eq!(candidates(&meta(1000), &with_nic, 0).len(), 2);
    }

    #[test]
    fn only_a_successful_init_class_call_initialises() {
        let keys = [
            key(1, Api::Cuda, "cuInit", 0),
            key(2, Api::Cuda, "cuInit", 100),
            key(3, Api::Cuda, "cuDriverGetVersion", 0),
            key(4, Api::Cudart, "cudaGetDeviceCount", 0),
            key(5, Api::Hip, "hipGetDeviceCount", 0),
            key(6, Api::Cuda, "cuMemAlloc_v2", 0),
        ];
        assert_eq!(initialized_cgroups(&keys), HashSet::from([1, 4, 5]));
    }

    #[test]
    fn a_gpu_container_is_never_initialised_from_the_timeout_until_it_initialises() {
        let candidate = || candidates(&meta(1000), &GpuResources::default(), 0);
        let cgroups = HashMap::from([(ID_GPU.to_string(), 7)]);
        let timeout = Duration::from_secs(300);
        let at = |now, initialized: &HashSet<u64>| judged(candidate(), &cgroups, initialized, timeout, now);
        let none = HashSet::new();
        let within = at(1299, &none);
        assert_eq!(within.len(), 1);
        assert!(!within[0].never_initialized, "within the timeout");
        let late = at(1300, &none);
        assert!(late[0].never_initialized);
        assert_eq!((late[0].cgroup, late[0].container.as_str()), (7, "worker"));
        assert!(!at(5000, &HashSet::from([7]))[0].never_initialized, "initialised, even late");
        assert!(at(5000, &HashSet::from([8]))[0].never_initialized, "another cgroup's init");
        assert!(
            judged(candidate(), &HashMap::new(), &none, timeout, 5000).is_empty(),
            "no cgroup, no verdict"
        );
    }
}
