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

/// How final a cgroup's labels are. kubelet reports a container's ID a
/// second or so after the container starts (its PLEG relist), so a
/// container that fails at once is seen before the API names it; its
/// labels are provisional until then, and are bound again when the name
/// comes, even after the cgroup is gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Naming {
    /// Only what the cgroup path says, without Kubernetes: as final as it
    /// gets there.
    #[default]
    Path,
    /// Only what the cgroup path says, with Kubernetes: the pod is not in
    /// the pod cache (not listed yet, or deleted long ago).
    Unlisted,
    /// The pod is known, its container not yet: the container label is
    /// the 12-character short ID.
    ShortId,
    /// As final as it gets: the API named the container, or the cgroup is
    /// no pod's (a systemd service), whose path is its name.
    Named,
}

/// A cgroup's labels as resolved now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub labels: WorkloadLabels,
    pub liveness: Liveness,
    pub naming: Naming,
}

impl Naming {
    /// Labels that the API is expected to better soon: a pod not listed
    /// yet, a container not named yet.
    pub fn provisional(self) -> bool {
        matches!(self, Naming::Unlisted | Naming::ShortId)
    }
}

impl Resolved {
    fn new(labels: WorkloadLabels, liveness: Liveness, naming: Naming) -> Self {
        Self { labels, liveness, naming }
    }
}

/// Labels for a cgroup path. `pods` is `None` without Kubernetes.
pub fn labels_for(cgroup: Option<&str>, pods: Option<&PodCache>) -> Resolved {
    let Some(path) = cgroup else {
        return Resolved::new(WorkloadLabels::default(), Liveness::Gone, Naming::Path);
    };
    let Some(PodRef { pod_uid, container, .. }) = parse_pod_cgroup(path) else {
        // Not a pod: a systemd service or a plain cgroup. Its path is the
        // most specific name there is.
        let labels = WorkloadLabels { workload: path.to_string(), ..Default::default() };
        return Resolved::new(labels, Liveness::Live, Naming::Named);
    };
    let container_id = container.as_ref().map(|c| c.id.clone()).unwrap_or_default();
    // A pod deleted a moment ago keeps its names, gone: kubelet deletes
    // a pod right after its containers' last exit, whose series need them.
    let known = pods.and_then(|p| p.get(&pod_uid).map(|m| (m, Liveness::Live)));
    let known = known.or_else(|| pods.and_then(|p| p.departed(&pod_uid)).map(|m| (m, Liveness::Gone)));
    if let Some((meta, liveness)) = known {
        let name = container_name(&meta, &container_id);
        let naming = if name.is_some() { Naming::Named } else { Naming::ShortId };
        let container = name.map(str::to_string).unwrap_or_else(|| short_id(&container_id));
        let labels = WorkloadLabels {
            namespace: meta.namespace.clone(),
            pod: meta.name.clone(),
            container,
            workload: meta.workload.clone(),
            revision: meta.revision.clone(),
            track: meta.track.clone(),
        };
        return Resolved::new(labels, liveness, naming);
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
    let labels =
        WorkloadLabels { pod: pod_uid, container: short_id(&container_id), workload, ..Default::default() };
    let naming = if pods.is_some() { Naming::Unlisted } else { Naming::Path };
    Resolved::new(labels, liveness, naming)
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
        let Resolved { labels: l, liveness: live, naming } = labels_for(Some(path), None);
        assert_eq!(naming, Naming::Path);
        assert_eq!(l.pod, "1c0a2b3e-4f5d-6789-abcd-ef0123456789");
        assert_eq!(l.container, "0123456789ab");
        assert_eq!(
            l.workload,
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1c0a2b3e_4f5d_6789_abcd_ef0123456789.slice",
            "the pod's own cgroup stands for its unknown revision"
        );
        assert_eq!(live, Liveness::Live);
        let service = labels_for(Some("/system.slice/solver.service"), None);
        assert_eq!(service.labels.workload, "/system.slice/solver.service");
        assert_eq!(service.naming, Naming::Named, "a service's path is its final name");
        assert_eq!(labels_for(None, None).liveness, Liveness::Gone);
    }
}
