//! What the daemon keeps of one Pod object: names, owning workload,
//! revision and track, QoS, container IDs and names, extended resources,
//! and the readiness gate's condition. Read from a whole `Pod` once per
//! watch event; [`super::kube`] caches the result.
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{
    api::core::v1::{ContainerStatus, Pod},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};

use super::{
    cgroup_path::Qos,
    gpu_request::{extended_resources, running_since, ExtendedResources},
};

/// Set by Argo Rollouts on the pods of each revision of a Rollout.
pub(super) const ROLLOUTS_HASH_LABEL: &str = "rollouts-pod-template-hash";
/// Set by the Deployment controller on the pods of each ReplicaSet.
pub(super) const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";
/// Set by the StatefulSet and DaemonSet controllers.
pub(super) const CONTROLLER_REVISION_LABEL: &str = "controller-revision-hash";
/// On a mirror pod (the API's copy of a static pod): the kubelet's hash of
/// the manifest, which is also the pod UID in the cgroup path.
pub(super) const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
pub(super) const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";

/// What the attribution needs to know about one pod.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    /// `metadata.uid`. For a static pod this differs from the UID in the
    /// cgroup path; [`PodCache`] files such pods under the cgroup one.
    pub uid: String,
    /// The owning workload: for a ReplicaSet, its name without the
    /// pod-template-hash suffix, i.e. the Deployment's or Argo Rollout's
    /// name; the StatefulSet, DaemonSet or Job name (a CronJob's Jobs keep
    /// their own, per-run names); for a static pod the manifest's name (the
    /// pod name without the `-<node>` suffix); for a bare pod the pod name.
    pub workload: String,
    /// `rollouts-pod-template-hash` label, else `pod-template-hash`, else
    /// `controller-revision-hash`, else "".
    pub revision: String,
    /// Value of the configured track label (`track` by default), else "".
    /// Argo Rollouts' canary/stable distinction lives in the Rollout status,
    /// which is not read here: see [`PodMeta::rollout`].
    pub track: String,
    /// The Argo Rollout the pod belongs to, for a pod labelled
    /// `rollouts-pod-template-hash` whose controller is a ReplicaSet named
    /// `<rollout>-<hash>`; `revision` then holds that hash, which
    /// [`super::rollouts::canary_reason`] compares with the Rollout's
    /// `status.stableRS`. `None` for every other pod. The pod only names its
    /// ReplicaSet, and Argo always names that `<rollout>-<hash>`, so the
    /// Rollout is known without reading ReplicaSets (and without RBAC on
    /// them).
    pub rollout: Option<String>,
    /// Container ID (the runtime's `containerd://`, `cri-o://` or `docker://`
    /// prefix stripped) -> container name, for regular, init and ephemeral
    /// containers, including the previous instance of a restarted container.
    pub containers: HashMap<String, String>,
    /// Whether the pod has a deletion timestamp: its containers are being
    /// stopped because the pod goes (a rollout, an eviction, a scale-down),
    /// not restarted.
    pub deleting: bool,
    /// For a pod that declares the readiness gate
    /// [`CONDITION_TYPE`] in `spec.readinessGates`: what the API
    /// server holds of that condition. `None` for every other pod, which the
    /// gate never touches.
    pub gate: Option<GatedPod>,
    /// `status.qosClass`, which the API server sets when the pod is made:
    /// it says where the kubelet will make the pod's cgroup. `None` when the
    /// API did not say.
    pub qos: Option<Qos>,
    /// The extended resources (GPUs among them) each container's limits ask
    /// for; only containers that ask for any (see [`super::gpu_request`]).
    pub extended_resources: ExtendedResources,
    /// Of those containers, the ones running now: container ID -> when the
    /// kubelet says it started (Unix seconds).
    pub running_since: HashMap<String, i64>,
}

/// What the readiness gate needs of a pod that declares it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GatedPod {
    /// The gate's condition in `status.conditions`, if the pod has one.
    pub condition: Option<GateCondition>,
    /// `metadata.resourceVersion`: tells a watch event that reflects the
    /// daemon's own patch from an older one (kept only for gated pods, so
    /// the kubelet's status updates of other pods change nothing here).
    pub resource_version: String,
    /// `status.startTime` (else `metadata.creationTimestamp`), Unix seconds:
    /// where `--gate-timeout` counts from.
    pub started_at: Option<i64>,
}

/// One pod condition, as far as the gate compares it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct GateCondition {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    pub message: String,
    /// RFC 3339, as the API server returned it.
    pub last_transition_time: Option<String>,
}

/// The pod's metadata, or `None` when it has no UID or name (which the API
/// server always sets, so only a malformed object lacks them).
pub fn pod_meta(pod: &Pod, track_label: &str) -> Option<PodMeta> {
    let meta = &pod.metadata;
    let uid = meta.uid.as_deref().filter(|s| !s.is_empty())?;
    let name = meta.name.as_deref().filter(|s| !s.is_empty())?;
    let empty = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&empty);
    let label = |key: &str| labels.get(key).filter(|v| !v.is_empty());

    let revision = label(ROLLOUTS_HASH_LABEL)
        .or_else(|| label(POD_TEMPLATE_HASH_LABEL))
        .or_else(|| label(CONTROLLER_REVISION_LABEL))
        .cloned()
        .unwrap_or_default();
    let track = if track_label.is_empty() { None } else { label(track_label) };

    let mut containers = HashMap::new();
    if let Some(status) = &pod.status {
        let lists = [
            &status.init_container_statuses,
            &status.container_statuses,
            &status.ephemeral_container_statuses,
        ];
        for statuses in lists.into_iter().flatten() {
            for status in statuses {
                add_container_ids(&mut containers, status);
            }
        }
    }

    let extended_resources = extended_resources(pod);
    let running_since = running_since(pod, &extended_resources);
    Some(PodMeta {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        workload: workload(pod, name, labels),
        revision,
        track: track.cloned().unwrap_or_default(),
        rollout: argo_rollout(pod, labels),
        containers,
        deleting: meta.deletion_timestamp.is_some(),
        gate: gated_pod(pod),
        qos: pod.status.as_ref().and_then(|s| s.qos_class.as_deref()).and_then(qos_class),
        extended_resources,
        running_since,
    })
}

pub(super) fn qos_class(class: &str) -> Option<Qos> {
    match class {
        "Guaranteed" => Some(Qos::Guaranteed),
        "Burstable" => Some(Qos::Burstable),
        "BestEffort" => Some(Qos::BestEffort),
        _ => None,
    }
}

/// The condition type, and the readiness gate pods declare: the pod cache
/// reads it, the gate keeps it.
pub const CONDITION_TYPE: &str = "canaryscope.io/gpu-runtime";

/// The gate's view of a pod that declares [`CONDITION_TYPE`].
pub(super) fn gated_pod(pod: &Pod) -> Option<GatedPod> {
    let spec = pod.spec.as_ref()?;
    let gates = spec.readiness_gates.as_deref().unwrap_or_default();
    if !gates.iter().any(|g| g.condition_type == CONDITION_TYPE) {
        return None;
    }
    let status = pod.status.as_ref();
    let condition = status
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .find(|c| c.type_ == CONDITION_TYPE)
        .map(|c| GateCondition {
            status: c.status.clone(),
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
            last_transition_time: c.last_transition_time.as_ref().map(|t| t.0.to_string()),
        });
    let started_at = status
        .and_then(|s| s.start_time.as_ref())
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| t.0.as_second());
    Some(GatedPod {
        condition,
        resource_version: pod.metadata.resource_version.clone().unwrap_or_default(),
        started_at,
    })
}

pub(super) fn add_container_ids(containers: &mut HashMap<String, String>, status: &ContainerStatus) {
    // The previous instance of a restarted container matters too: its exit,
    // OOM kill or crash is reported after the kubelet has already moved
    // `containerID` on to the replacement.
    let previous =
        status.last_state.as_ref().and_then(|s| s.terminated.as_ref()).and_then(|t| t.container_id.as_ref());
    for id in [status.container_id.as_ref(), previous].into_iter().flatten() {
        let id = strip_runtime_prefix(id);
        if !id.is_empty() {
            containers.insert(id.to_owned(), status.name.clone());
        }
    }
}

/// `containerd://<id>` -> `<id>`; the scheme names the runtime, which the
/// cgroup path already tells.
pub(super) fn strip_runtime_prefix(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, rest)| rest).trim()
}

/// The managing controller is the owner with `controller: true`; other
/// owners (garbage-collection links) are only a fallback.
pub(super) fn controller(pod: &Pod) -> Option<&OwnerReference> {
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    owners.iter().find(|o| o.controller == Some(true)).or_else(|| owners.first())
}

pub(super) fn workload(pod: &Pod, pod_name: &str, labels: &BTreeMap<String, String>) -> String {
    let Some(owner) = controller(pod) else {
        return pod_name.to_owned();
    };
    match owner.kind.as_str() {
        "ReplicaSet" => replica_set_workload(&owner.name, labels),
        // A mirror pod is "owned" by its node and named `<manifest>-<node>`;
        // the manifest name is the same on every node.
        "Node" => pod_name
            .strip_suffix(owner.name.as_str())
            .and_then(|base| base.strip_suffix('-'))
            .filter(|base| !base.is_empty())
            .unwrap_or(pod_name)
            .to_owned(),
        _ => owner.name.clone(),
    }
}

/// Deployments and Rollouts name their ReplicaSets `<name>-<hash>` and label
/// the pods with the hash, so the hash is removed only when the pod says
/// which it is; a ReplicaSet created by hand keeps its whole name.
pub(super) fn replica_set_workload(rs_name: &str, labels: &BTreeMap<String, String>) -> String {
    [ROLLOUTS_HASH_LABEL, POD_TEMPLATE_HASH_LABEL]
        .iter()
        .filter_map(|key| labels.get(*key).filter(|hash| !hash.is_empty()))
        .find_map(|hash| {
            rs_name.strip_suffix(hash.as_str())?.strip_suffix('-').filter(|base| !base.is_empty())
        })
        .unwrap_or(rs_name)
        .to_owned()
}

/// The Rollout behind an Argo pod: its ReplicaSet's name less `-<hash>`.
/// Unlike [`replica_set_workload`], a name that does not end in the hash
/// gives `None`: a ReplicaSet that Argo did not name is not known to belong
/// to a Rollout, and guessing would compare the pod with another Rollout's
/// stable revision.
pub(super) fn argo_rollout(pod: &Pod, labels: &BTreeMap<String, String>) -> Option<String> {
    let hash = labels.get(ROLLOUTS_HASH_LABEL).filter(|hash| !hash.is_empty())?;
    let owner = controller(pod).filter(|owner| owner.kind == "ReplicaSet")?;
    let rollout = owner.name.strip_suffix(hash.as_str())?.strip_suffix('-')?;
    (!rollout.is_empty()).then(|| rollout.to_owned())
}

/// The name of the container with this ID (bare, or with its runtime
/// prefix), if it belongs to the pod.
pub fn container_name<'a>(meta: &'a PodMeta, container_id: &str) -> Option<&'a str> {
    meta.containers.get(strip_runtime_prefix(container_id)).map(String::as_str)
}

/// The key a pod is filed under: the UID that the kubelet puts in the
/// pod's cgroup path. That is `metadata.uid`, except for a static pod,
/// whose cgroup carries the manifest hash that the mirror pod shows in its
/// `kubernetes.io/config.hash` annotation.
pub(super) fn cgroup_uid(pod: &Pod) -> Option<String> {
    let meta = &pod.metadata;
    let annotations = meta.annotations.as_ref();
    let mirror_hash = annotations
        .filter(|a| a.contains_key(CONFIG_MIRROR_ANNOTATION))
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION).or_else(|| a.get(CONFIG_MIRROR_ANNOTATION)))
        .filter(|hash| !hash.is_empty());
    mirror_hash.or(meta.uid.as_ref()).filter(|uid| !uid.is_empty()).cloned()
}
