//! The workload labels every series carries: namespace, pod, container,
//! workload, revision, track. With Kubernetes they come from the pod cache;
//! without it, from what the cgroup path says.
use super::{
    cgroup_path::{parse_pod_cgroup, PodRef},
    kube::{container_name, PodCache},
};

pub use super::label_names::LABEL_NAMES;

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub workload: String,
    pub revision: String,
    pub track: String,
}

impl WorkloadLabels {
    pub fn values(&self) -> [&str; 6] {
        [&self.namespace, &self.pod, &self.container, &self.workload, &self.revision, &self.track]
    }
}

/// Whether the labels belong to a pod the API still knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Known pod, or a cgroup that still exists (non-Kubernetes workloads).
    Live,
    /// The pod was deleted from the API or its cgroup is gone.
    Gone,
}

/// Labels for a cgroup path. `pods` is `None` without Kubernetes.
pub fn labels_for(cgroup: Option<&str>, pods: Option<&PodCache>) -> (WorkloadLabels, Liveness) {
    let Some(path) = cgroup else { return (WorkloadLabels::default(), Liveness::Gone) };
    let Some(PodRef { pod_uid, container, .. }) = parse_pod_cgroup(path) else {
        // Not a pod: a systemd service or a plain cgroup. Its path is the
        // most specific name there is.
        return (WorkloadLabels { workload: path.to_string(), ..Default::default() }, Liveness::Live);
    };
    let container_id = container.as_ref().map(|c| c.id.clone()).unwrap_or_default();
    if let Some(meta) = pods.and_then(|p| p.get(&pod_uid)) {
        let container = container_name(&meta, &container_id)
            .map(str::to_string)
            .unwrap_or_else(|| short_id(&container_id));
        let labels = WorkloadLabels {
            namespace: meta.namespace.clone(),
            pod: meta.name.clone(),
            container,
            workload: meta.workload.clone(),
            revision: meta.revision.clone(),
            track: meta.track.clone(),
        };
        return (labels, Liveness::Live);
    }
    let liveness = match pods {
        // The API is synced and does not know this pod: it was deleted.
        Some(p) if p.is_synced() && p.api_healthy() => Liveness::Gone,
        _ => Liveness::Live,
    };
    // Its revision is unknown (no Kubernetes, or the pod is not in the cache
    // yet): the pod's own cgroup stands for it, so series kept per revision
    // keep this pod apart rather than pooling every unknown pod under
    // empty labels.
    let workload = pod_cgroup(path, &pod_uid).to_string();
    (
        WorkloadLabels { pod: pod_uid, container: short_id(&container_id), workload, ..Default::default() },
        liveness,
    )
}

/// The pod-level cgroup of a path inside a pod: up to the component that
/// names the pod's uid (dashes in the cgroupfs form, underscores in the
/// systemd one).
fn pod_cgroup<'a>(path: &'a str, pod_uid: &str) -> &'a str {
    let systemd = pod_uid.replace('-', "_");
    let mut end = 0;
    for component in path.split_inclusive('/') {
        end += component.len();
        if component.contains(pod_uid) || component.contains(&systemd) {
            return path[..end].trim_end_matches('/');
        }
    }
    path
}

/// The 12-character form people know from `crictl ps`.
fn short_id(id: &str) -> String {
    id.chars().take(12).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_kubernetes_the_path_gives_what_it_can() {
        let path = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1c0a2b3e_4f5d_6789_abcd_ef0123456789.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope";
        let (l, live) = labels_for(Some(path), None);
        assert_eq!(l.pod, "1c0a2b3e-4f5d-6789-abcd-ef0123456789");
        assert_eq!(l.container, "0123456789ab");
        assert_eq!(
            l.workload,
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1c0a2b3e_4f5d_6789_abcd_ef0123456789.slice",
            "the pod's own cgroup stands for its unknown revision"
        );
        assert_eq!(live, Liveness::Live);
        let (l, _) = labels_for(Some("/system.slice/solver.service"), None);
        assert_eq!(l.workload, "/system.slice/solver.service");
        assert_eq!(labels_for(None, None).1, Liveness::Gone);
    }
}
