//! Pod metadata from the Kubernetes API, joined to events on the pod UID that
//! [`super::cgroup_path`] reads from the cgroup path.
//!
//! One kube-rs [`watcher`] lists and watches the pods of this node (field
//! selector `spec.nodeName=<node>`) and keeps a [`PodCache`] of what the
//! attribution needs from each: namespace, name, owning workload, revision,
//! track and the container ID -> container name map. Whole `Pod` objects are
//! not kept: a node runs about a hundred pods, and their specs and managed
//! fields would cost far more memory than the few strings used.
//!
//! # Losing the API server
//!
//! An unreachable or failing API server never stops the daemon. The watcher
//! retries with kube-rs' default backoff (0.8 s doubling to 30 s, with
//! jitter), [`PodCache::api_healthy`] is false meanwhile, and the cache keeps
//! its last contents, so events keep their labels for pods that still run.
//! After any error the next attempt starts with a fresh list, which replaces
//! the cache as a whole, so pods deleted during the outage disappear and new
//! ones appear as soon as the server answers.
//!
//! # Canary or stable
//!
//! `track` is the value of a label that the user chooses (`track` unless
//! configured otherwise). Argo Rollouts knows which ReplicaSet is the canary
//! and which is stable from the Rollout's status, which this module does not
//! read; it only stamps `rollouts-pod-template-hash` on the pods. For such a
//! pod [`PodMeta::rollout`] names the Rollout, and [`super::rollouts`]
//! compares `revision` with the Rollout's `status.stableRS`.
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, PoisonError, RwLock,
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    config::{InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError},
    runtime::watcher,
    Api, Client, Config,
};
use tokio::sync::Notify;

pub use super::pod_meta::{container_name, pod_meta, GateCondition, GatedPod, PodMeta, CONDITION_TYPE};
use super::{
    pod_meta::cgroup_uid,
    watch::{self, Retry, Watched},
};
use crate::config::DEFAULT_TRACK_LABEL;

/// How long a deleted pod's names stay known: longer than any series grace
/// a daemon keeps the series of its last containers for.
const DEPARTED_FOR: std::time::Duration = std::time::Duration::from_secs(3600);
/// Deleted pods remembered at most: a rollout of a thousand pods a node.
const MAX_DEPARTED: usize = 4096;

/// Container IDs a pod's cached entry keeps at most: a crash loop's
/// every instance, for as long as anyone still counts it, and a bound on
/// what a pod restarting for weeks can cost.
const REMEMBERED_CONTAINER_IDS: usize = 64;

/// Carries the container IDs `old` knew into `meta`. The status names only
/// the current instance of a container and the one before (`lastState`),
/// while a crash-looping container's older instances may still have
/// series whose cgroups the kubelet removed before the daemon read their
/// ID: a name once learned is kept for the pod's life in the cache.
fn remember_container_ids(meta: &mut PodMeta, old: &PodMeta) {
    if meta.containers.len() + old.containers.len() > REMEMBERED_CONTAINER_IDS {
        return;
    }
    for (id, name) in &old.containers {
        meta.containers.entry(id.clone()).or_insert_with(|| name.clone());
    }
}

/// How to reach the API server and which pods to keep.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// A kubeconfig file to use instead of the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// Keep only the pods scheduled to this node; `None` keeps every pod in
    /// the cluster (for tests and single-node setups).
    pub node_name: Option<String>,
    /// The label whose value becomes [`PodMeta::track`].
    pub track_label: String,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions { kubeconfig: None, node_name: None, track_label: DEFAULT_TRACK_LABEL.to_owned() }
    }
}

/// Configuration problems that keep the Kubernetes client from being built.
/// An API server that does not answer is not one of them.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error(
        "--kubeconfig {}: {source}: give a readable kubeconfig file, or leave --kubeconfig out to use \
         the pod's service account",
        path.display()
    )]
    KubeconfigUnreadable { path: PathBuf, source: std::io::Error },
    #[error(
        "--kubeconfig {}: {source}: fix the file (`kubectl --kubeconfig {} config view` shows how \
         it reads)",
        path.display(),
        path.display()
    )]
    KubeconfigInvalid { path: PathBuf, source: KubeconfigError },
    #[error(
        "no Kubernetes API configuration: not running in a pod ({in_cluster}) and no usable \
         kubeconfig ({kubeconfig}): run as a pod with a service account, set KUBECONFIG, or pass \
         --kubeconfig"
    )]
    NoConfig { in_cluster: InClusterError, kubeconfig: KubeconfigError },
    #[error(
        "the node name is empty: pass the node this runs on (in a DaemonSet, from the downward API's \
         spec.nodeName), or none to watch every pod"
    )]
    EmptyNodeName,
    #[error(
        "cannot set up the Kubernetes client: {source}: check the certificates and credentials in the \
         kubeconfig or service account"
    )]
    Client { source: kube::Error },
}

#[derive(Debug, Default)]
struct Shared {
    pods: RwLock<HashMap<String, PodMeta>>,
    /// Pods deleted from the API lately, with when: kubelet deletes a pod
    /// right after its containers' last exit, and that exit's series still
    /// need the pod's and container's names (see [`PodCache::departed`]).
    departed: RwLock<HashMap<String, (PodMeta, std::time::Instant)>>,
    synced: AtomicBool,
    healthy: AtomicBool,
    generation: AtomicU64,
    /// Notified on every change of the contents, for whoever must act on a
    /// new pod before the next tick (the hold scope).
    changed: Arc<Notify>,
}

/// Shared, cheap-to-clone cache of pods on this node, keyed by the pod UID
/// as it appears in cgroup paths (see [`super::cgroup_path`]): `metadata.uid`,
/// or for a static pod the manifest hash.
///
/// [`start`] fills one; `PodCache::default()` is an empty cache that never
/// syncs, for running without Kubernetes.
#[derive(Clone, Debug, Default)]
pub struct PodCache {
    shared: Arc<Shared>,
}

impl PodCache {
    pub fn get(&self, uid: &str) -> Option<PodMeta> {
        self.read().get(uid).cloned()
    }

    /// The pods have been listed at least once; until then a miss means
    /// nothing.
    pub fn is_synced(&self) -> bool {
        self.shared.synced.load(Ordering::Acquire)
    }

    /// The last request to the API server succeeded: false until the first
    /// list completes, and from any list or watch error until the next list
    /// completes.
    pub fn api_healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `judge` of every pod, by cache key.
    pub fn classify<T>(&self, judge: impl Fn(&PodMeta) -> T) -> HashMap<String, T> {
        self.read().iter().map(|(k, m)| (k.clone(), judge(m))).collect()
    }

    /// Wakes one waiter (or the next one) after each change of the contents.
    pub fn change_signal(&self) -> Arc<Notify> {
        self.shared.changed.clone()
    }

    /// The pods that declare the GPU-runtime readiness gate, by cache key.
    pub fn gated(&self) -> Vec<(String, PodMeta)> {
        self.read().iter().filter(|(_, m)| m.gate.is_some()).map(|(k, m)| (k.clone(), m.clone())).collect()
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Files a pod as the watcher would (for tests of the cache's users).
    #[cfg(test)]
    pub(crate) fn insert_for_test(&self, key: &str, meta: PodMeta) {
        self.upsert(key.to_owned(), meta);
    }

    #[cfg(test)]
    pub fn uids(&self) -> Vec<String> {
        self.read().keys().cloned().collect()
    }

    /// Bumped on every change of the contents, so a caller holding derived
    /// state (per-pod series, say) knows when to look for deleted pods.
    pub fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::Acquire)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, PodMeta>> {
        // A panic while writing leaves a map that is still a valid map; a
        // stale entry is better than taking the daemon down.
        self.shared.pods.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, PodMeta>> {
        self.shared.pods.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn upsert(&self, key: String, mut meta: PodMeta) {
        let mut pods = self.write();
        if let Some(old) = pods.get(&key) {
            remember_container_ids(&mut meta, old);
        }
        if pods.get(&key) != Some(&meta) {
            pods.insert(key, meta);
            self.changed();
        }
    }

    fn remove(&self, key: &str) {
        let mut pods = self.write();
        if let Some(meta) = pods.remove(key) {
            self.depart(key, meta);
            self.changed();
        }
    }

    /// Keeps a deleted pod's metadata for [`DEPARTED_FOR`], at most
    /// [`MAX_DEPARTED`] of them.
    fn depart(&self, key: &str, meta: PodMeta) {
        let mut departed = self.shared.departed.write().unwrap_or_else(PoisonError::into_inner);
        let now = std::time::Instant::now();
        departed.retain(|_, (_, at)| now.duration_since(*at) < DEPARTED_FOR);
        if departed.len() < MAX_DEPARTED {
            departed.insert(key.to_owned(), (meta, now));
        }
    }

    /// A pod deleted from the API within [`DEPARTED_FOR`]: names for the
    /// series of containers whose last exit came just before the deletion.
    pub fn departed(&self, uid: &str) -> Option<PodMeta> {
        let departed = self.shared.departed.read().unwrap_or_else(PoisonError::into_inner);
        departed.get(uid).filter(|(_, at)| at.elapsed() < DEPARTED_FOR).map(|(meta, _)| meta.clone())
    }

    fn replace_all(&self, mut new: HashMap<String, PodMeta>) {
        let mut pods = self.write();
        let gone: Vec<(String, PodMeta)> =
            pods.iter().filter(|(k, _)| !new.contains_key(*k)).map(|(k, m)| (k.clone(), m.clone())).collect();
        for (key, meta) in gone {
            self.depart(&key, meta);
        }
        for (key, meta) in &mut new {
            if let Some(old) = pods.get(key) {
                remember_container_ids(meta, old);
            }
        }
        if *pods != new {
            *pods = new;
            self.changed();
        }
        self.shared.synced.store(true, Ordering::Release);
    }

    fn changed(&self) {
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        self.shared.changed.notify_one();
    }

    fn set_healthy(&self, healthy: bool) -> bool {
        self.shared.healthy.swap(healthy, Ordering::AcqRel)
    }
}

/// The pod cache as [`watch::run`] keeps it: pods filed under their cgroup's
/// uid, with the track label read from the label this node was told.
struct PodWatch {
    cache: PodCache,
    track_label: String,
}

impl PodWatch {
    fn entry(&self, pod: &Pod) -> Option<(String, PodMeta)> {
        Some((cgroup_uid(pod)?, pod_meta(pod, &self.track_label)?))
    }
}

impl Watched for PodWatch {
    type Object = Pod;
    type Relist = HashMap<String, PodMeta>;
    const CHANGES_SHOW_HEALTH: bool = true;

    fn in_use(&self) -> bool {
        Arc::strong_count(&self.cache.shared) > 1
    }

    fn collect(&self, relist: &mut Self::Relist, pod: &Pod) {
        if let Some((key, meta)) = self.entry(pod) {
            relist.insert(key, meta);
        }
    }

    fn replace_all(&self, relist: Self::Relist) {
        self.cache.replace_all(relist);
    }

    fn apply(&self, pod: &Pod) {
        if let Some((key, meta)) = self.entry(pod) {
            self.cache.upsert(key, meta);
        }
    }

    fn delete(&self, pod: &Pod) {
        if let Some(key) = cgroup_uid(pod) {
            self.cache.remove(&key);
        }
    }

    fn answered(&self) {
        if !self.cache.set_healthy(true) {
            log::info!("Kubernetes API: pods listed, {} cached", self.cache.len());
        }
    }

    fn failed(&self, error: Option<&watcher::Error>, retry: &mut Retry) -> Duration {
        self.cache.set_healthy(false);
        let error = error.map_or_else(|| "watch stream ended".to_owned(), |e| error_chain(e));
        let (delay, first) = retry.transient();
        if first {
            let labels = if self.cache.is_synced() {
                "pod labels stay as they were"
            } else {
                "events carry no pod labels"
            };
            log::warn!("Kubernetes API: {error}; {labels} until it answers, retrying");
        } else {
            log::debug!("Kubernetes API: {error}; retrying in {delay:?}");
        }
        delay
    }
}

/// Builds the Kubernetes client and starts watching this node's pods on the
/// current tokio runtime. Returns at once with an empty, unsynced cache; see
/// [`PodCache::is_synced`] and [`PodCache::api_healthy`].
///
/// The client comes from the `--kubeconfig` file if given, else from the
/// in-cluster service account, else from `KUBECONFIG` or `~/.kube/config`.
/// Errors only for configuration problems; an unreachable API server is
/// retried in the background for as long as the cache is in use.
pub async fn start(options: KubeOptions) -> Result<PodCache, KubeError> {
    if options.node_name.as_deref().is_some_and(|n| n.trim().is_empty()) {
        return Err(KubeError::EmptyNodeName);
    }
    let config = load_config(&options).await?;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|source| KubeError::Client { source })?;
    let api: Api<Pod> = Api::all(client);

    // Lists at resourceVersion 0, which the API server answers from its
    // watch cache instead of etcd, as the kubelet does: every node of a large
    // cluster relisting at once after an API outage must not turn into
    // thousands of etcd range reads. The watch that follows brings the list
    // up to date. kube-rs drops resourceVersion=0 from paged lists, hence no
    // page size; one node's pods fit in one response.
    let mut watch_config = watcher::Config { page_size: None, ..watcher::Config::default().any_semantic() };
    if let Some(node) = &options.node_name {
        watch_config = watch_config.fields(&format!("spec.nodeName={}", node.trim()));
    }
    let scope = options.node_name.as_deref().map_or_else(|| "all nodes".to_owned(), |n| format!("node {n}"));
    log::info!("watching pods of {scope} at {server}");

    let cache = PodCache::default();
    let weak = Arc::downgrade(&cache.shared);
    let track_label = options.track_label;
    tokio::spawn(watch::run(api, watch_config, move || {
        let cache = PodCache { shared: weak.upgrade()? };
        Some(PodWatch { cache, track_label: track_label.clone() })
    }));
    Ok(cache)
}

/// The client configuration for `options`; [`super::rollouts`] builds its
/// own client from it, so both watchers talk as the same identity.
pub(crate) async fn load_config(options: &KubeOptions) -> Result<Config, KubeError> {
    if let Some(path) = &options.kubeconfig {
        let kubeconfig = Kubeconfig::read_from(path).map_err(|err| match err {
            KubeconfigError::ReadConfig(source, _) => {
                KubeError::KubeconfigUnreadable { path: path.clone(), source }
            }
            source => KubeError::KubeconfigInvalid { path: path.clone(), source },
        })?;
        return Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| KubeError::KubeconfigInvalid { path: path.clone(), source });
    }
    // In a pod the service account is the intended identity, even when a
    // kubeconfig happens to be around (kube's own `Config::infer` prefers
    // the kubeconfig).
    match Config::incluster() {
        Ok(config) => Ok(config),
        Err(in_cluster) => Config::from_kubeconfig(&KubeConfigOptions::default())
            .await
            .map_err(|kubeconfig| KubeError::NoConfig { in_cluster, kubeconfig }),
    }
}

/// The error with its causes: kube's own messages often stop at "client
/// error (Connect)", and the cause (refused, DNS, TLS) is what the operator
/// needs.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use kube::runtime::watcher::Event;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("valid Pod JSON")
    }

    const ID_A: &str = "4f1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c";
    const ID_B: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";
    const ID_C: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    fn container_status(name: &str, id: Option<&str>) -> serde_json::Value {
        let mut status = serde_json::json!({
            "name": name, "image": "registry.example/app:1", "imageID": "", "ready": true,
            "restartCount": 0, "started": true, "state": {"running": {"startedAt": "2025-05-01T10:00:00Z"}},
        });
        if let Some(id) = id {
            status["containerID"] = id.into();
        }
        status
    }

    fn deployment_pod() -> Pod {
        pod(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web-7d4b9c8f6d-x2k9p", "namespace": "shop",
                "uid": "1c0a2b3e-4f5d-6789-abcd-ef0123456789", "resourceVersion": "48213",
                "generateName": "web-7d4b9c8f6d-",
                "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d", "track": "canary"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f6d",
                    "uid": "9b1e3c5a-1111-2222-3333-444455556666", "controller": true,
                    "blockOwnerDeletion": true,
                }],
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": "registry.example/app:1"}]},
            "status": {
                "phase": "Running", "qosClass": "Burstable",
                "initContainerStatuses": [container_status("migrate", Some(&format!("containerd://{ID_C}")))],
                "containerStatuses": [
                    container_status("app", Some(&format!("containerd://{ID_A}"))),
                    container_status("sidecar", Some(&format!("containerd://{ID_B}"))),
                    container_status("pending", None),
                ],
            },
        }))
    }

    #[test]
    fn deployment_pod_workload_revision_track_and_containers() {
        let meta = pod_meta(&deployment_pod(), "track").expect("meta");
        assert_eq!(meta.namespace, "shop");
        assert_eq!(meta.name, "web-7d4b9c8f6d-x2k9p");
        assert_eq!(meta.uid, "1c0a2b3e-4f5d-6789-abcd-ef0123456789");
        assert_eq!(meta.workload, "web");
        assert_eq!(meta.revision, "7d4b9c8f6d");
        assert_eq!(meta.track, "canary");
        assert_eq!(meta.rollout, None, "a Deployment's pod belongs to no Rollout");
        assert_eq!(meta.containers.len(), 3, "{:?}", meta.containers);
        assert_eq!(container_name(&meta, ID_A), Some("app"));
        assert_eq!(container_name(&meta, ID_B), Some("sidecar"));
        assert_eq!(container_name(&meta, ID_C), Some("migrate"));
        assert_eq!(container_name(&meta, &format!("containerd://{ID_A}")), Some("app"));
        assert_eq!(container_name(&meta, "0000"), None);
    }

    #[test]
    fn custom_track_label_and_no_track_label() {
        let mut p = deployment_pod();
        let labels = p.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.insert("canaryscope.io/track".into(), "stable".into());
        assert_eq!(pod_meta(&p, "canaryscope.io/track").expect("meta").track, "stable");
        assert_eq!(pod_meta(&p, "release-track").expect("meta").track, "");
        assert_eq!(pod_meta(&p, "").expect("meta").track, "");
    }

    fn argo_pod() -> Pod {
        pod(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "checkout-6b8f7c9d4-abcde", "namespace": "shop",
                "uid": "2d1b3c4e-5f60-4789-8abc-def012345678",
                "labels": {"app": "checkout", "rollouts-pod-template-hash": "6b8f7c9d4"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "checkout-6b8f7c9d4",
                    "uid": "aaaa0000-1111-2222-3333-444455556666", "controller": true,
                }],
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "checkout"}]},
            "status": {"containerStatuses": [container_status("checkout", Some(&format!("cri-o://{ID_A}")))]},
        }))
    }

    #[test]
    fn argo_rollout_pod_uses_rollouts_hash() {
        let meta = pod_meta(&argo_pod(), "track").expect("meta");
        assert_eq!(meta.workload, "checkout");
        assert_eq!(meta.revision, "6b8f7c9d4");
        // Argo's canary/stable comes from the Rollout status, not the pod.
        assert_eq!(meta.track, "");
        assert_eq!(meta.rollout.as_deref(), Some("checkout"));
        assert_eq!(container_name(&meta, ID_A), Some("checkout"));
    }

    #[test]
    fn rollout_is_named_only_when_argo_named_the_replica_set() {
        let with_owner = |kind: &str, name: &str| {
            let mut p = argo_pod();
            let owners = p.metadata.owner_references.get_or_insert_with(Vec::new);
            owners[0].kind = kind.into();
            owners[0].name = name.into();
            pod_meta(&p, "track").expect("meta").rollout
        };
        // A ReplicaSet whose name does not end in the pod's hash: not known
        // to be Argo's, though `workload` still falls back to its name.
        assert_eq!(with_owner("ReplicaSet", "checkout-manual"), None);
        assert_eq!(with_owner("ReplicaSet", "-6b8f7c9d4"), None);
        assert_eq!(with_owner("ReplicaSet", "6b8f7c9d4"), None);
        // Not a ReplicaSet at all.
        assert_eq!(with_owner("StatefulSet", "checkout-6b8f7c9d4"), None);
        // Rollout names may themselves contain dashes.
        assert_eq!(with_owner("ReplicaSet", "shop-checkout-6b8f7c9d4").as_deref(), Some("shop-checkout"));

        // No owner: a bare pod carrying the label is no Rollout's.
        let mut bare = argo_pod();
        bare.metadata.owner_references = None;
        assert_eq!(pod_meta(&bare, "track").expect("meta").rollout, None);

        // A Deployment's pod-template-hash is not Argo's label.
        let mut deployment_labelled = argo_pod();
        let labels = deployment_labelled.metadata.labels.get_or_insert_with(BTreeMap::new);
        let hash = labels.remove("rollouts-pod-template-hash").expect("label");
        labels.insert("pod-template-hash".into(), hash);
        let meta = pod_meta(&deployment_labelled, "track").expect("meta");
        assert_eq!((meta.workload.as_str(), meta.rollout), ("checkout", None));
    }

    #[test]
    fn statefulset_pod() {
        let p = pod(serde_json::json!({
            "metadata": {
                "name": "db-0", "namespace": "data", "uid": "3e2c4d5f-6071-4a9b-9cde-f01234567890",
                "labels": {
                    "app": "db", "controller-revision-hash": "db-5f7b8c9d6",
                    "statefulset.kubernetes.io/pod-name": "db-0",
                },
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db",
                    "uid": "bbbb0000-1111-2222-3333-444455556666", "controller": true,
                }],
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "postgres"}]},
            "status": {"containerStatuses": [container_status("postgres", Some(&format!("docker://{ID_B}")))]},
        }));
        let meta = pod_meta(&p, "track").expect("meta");
        assert_eq!(meta.workload, "db");
        assert_eq!(meta.revision, "db-5f7b8c9d6");
        assert_eq!(container_name(&meta, ID_B), Some("postgres"));
    }

    #[test]
    fn daemonset_and_job_pods() {
        let ds = pod(serde_json::json!({
            "metadata": {
                "name": "agent-7xk2p", "namespace": "kube-system", "uid": "5a4e6f70-8192-4bcd-8ef0-123456789abc",
                "labels": {"controller-revision-hash": "6c9d8b7f5", "pod-template-generation": "3"},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                    "uid": "dddd0000-1111-2222-3333-444455556666", "controller": true,
                }],
            },
        }));
        let meta = pod_meta(&ds, "track").expect("meta");
        assert_eq!((meta.workload.as_str(), meta.revision.as_str()), ("agent", "6c9d8b7f5"));

        let job = pod(serde_json::json!({
            "metadata": {
                "name": "train-28391040-q7w8e", "namespace": "ml", "uid": "4f3d5e60-7182-4bac-9def-0123456789ab",
                "labels": {
                    "batch.kubernetes.io/controller-uid": "cccc0000-1111-2222-3333-444455556666",
                    "batch.kubernetes.io/job-name": "train-28391040", "job-name": "train-28391040",
                },
                "ownerReferences": [{
                    "apiVersion": "batch/v1", "kind": "Job", "name": "train-28391040",
                    "uid": "cccc0000-1111-2222-3333-444455556666", "controller": true,
                }],
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "trainer"}]},
            "status": {"containerStatuses": [{
                "name": "trainer", "image": "trainer:2", "imageID": "", "ready": false, "restartCount": 1,
                "containerID": format!("containerd://{ID_A}"),
                "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                    "containerID": format!("containerd://{ID_B}")}},
            }]},
        }));
        let meta = pod_meta(&job, "track").expect("meta");
        assert_eq!(meta.workload, "train-28391040");
        assert_eq!(meta.revision, "");
        // The OOM-killed previous instance still maps to its container.
        assert_eq!(container_name(&meta, ID_A), Some("trainer"));
        assert_eq!(container_name(&meta, ID_B), Some("trainer"));
    }

    #[test]
    fn bare_pod_and_missing_uid() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "debug", "namespace": "default", "uid": "6b5f7081-92a3-4cde-8f01-23456789abcd"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "sh"}]},
        }));
        let meta = pod_meta(&p, "track").expect("meta");
        assert_eq!(meta.workload, "debug");
        assert_eq!(meta.revision, "");
        assert_eq!(meta.track, "");
        assert!(meta.containers.is_empty());

        let no_uid = pod(serde_json::json!({"metadata": {"name": "x", "namespace": "default"}}));
        assert_eq!(pod_meta(&no_uid, "track"), None);
    }

    #[test]
    fn replica_set_without_hash_label_keeps_its_name() {
        let p = pod(serde_json::json!({
            "metadata": {
                "name": "frontend-abcde", "namespace": "default", "uid": "7c608192-a3b4-4def-9012-3456789abcde",
                "labels": {"tier": "frontend"},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "unrelated", "uid": "x"},
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "frontend-v2", "uid": "y",
                     "controller": true},
                ],
            },
        }));
        assert_eq!(pod_meta(&p, "track").expect("meta").workload, "frontend-v2");
    }

    #[test]
    fn only_pods_that_declare_the_gate_carry_its_condition() {
        let mut json = serde_json::to_value(deployment_pod()).expect("json");
        json["metadata"]["resourceVersion"] = "77".into();
        json["status"]["startTime"] = "2026-01-01T00:00:10Z".into();
        json["status"]["conditions"] = serde_json::json!([
            {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"},
            {"type": CONDITION_TYPE, "status": "False", "reason": "InitFailed",
             "message": "container worker: cuInit returned 101 CUDA_ERROR_INVALID_DEVICE",
             "lastTransitionTime": "2026-01-01T00:01:00Z"},
        ]);
        assert_eq!(pod_meta(&pod(json.clone()), "track").expect("meta").gate, None, "no gate declared");
        json["spec"]["readinessGates"] =
            serde_json::json!([{"conditionType": "example.com/other"}, {"conditionType": CONDITION_TYPE}]);
        let gate = pod_meta(&pod(json.clone()), "track").expect("meta").gate.expect("gated");
        assert_eq!(gate.resource_version, "77");
        assert_eq!(gate.started_at, Some(1_767_225_610));
        let condition = gate.condition.expect("condition");
        assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("False", "InitFailed"));
        assert_eq!(condition.last_transition_time.as_deref(), Some("2026-01-01T00:01:00Z"));
        json["status"]["conditions"] = serde_json::json!([{"type": "Ready", "status": "False"}]);
        assert_eq!(pod_meta(&pod(json), "track").expect("meta").gate.expect("gated").condition, None);
    }

    #[test]
    fn static_pod_is_filed_under_its_config_hash() {
        let hash = "6a1f3b0c9d2e4f5a6b7c8d9e0f1a2b3c";
        let p = pod(serde_json::json!({
            "metadata": {
                "name": "kube-apiserver-node-a", "namespace": "kube-system",
                "uid": "8d7192a3-b4c5-4ef0-8123-456789abcdef",
                "annotations": {"kubernetes.io/config.hash": hash, "kubernetes.io/config.mirror": hash,
                                "kubernetes.io/config.source": "file"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "z",
                                     "controller": true}],
            },
        }));
        assert_eq!(cgroup_uid(&p).as_deref(), Some(hash));
        let meta = pod_meta(&p, "track").expect("meta");
        assert_eq!(meta.workload, "kube-apiserver");
        assert_eq!(meta.uid, "8d7192a3-b4c5-4ef0-8123-456789abcdef");
        assert_eq!(cgroup_uid(&deployment_pod()).as_deref(), Some("1c0a2b3e-4f5d-6789-abcd-ef0123456789"));
    }

    /// A pod whose one container, `worker`, runs as `id`, with `previous`
    /// in `lastState` as the kubelet reports a restart.
    fn restarted_pod(id: &str, previous: Option<&str>) -> Pod {
        let mut status = container_status("worker", Some(id));
        if let Some(previous) = previous {
            status["lastState"] =
                serde_json::json!({"terminated": {"exitCode": 139, "containerID": previous}});
        }
        let mut json =
            serde_json::json!({"metadata": {"name": "crashy-0", "namespace": "ml", "uid": "uid-c"}});
        json["status"] = serde_json::json!({"containerStatuses": [status]});
        pod(json)
    }

    #[test]
    fn a_crash_loops_every_container_id_keeps_its_name() {
        let cache = PodCache::default();
        let mut applier =
            watch::Relister::new(PodWatch { cache: cache.clone(), track_label: "track".into() });
        applier.apply(Event::Init);
        applier.apply(Event::InitApply(restarted_pod("containerd://aaa", None)));
        applier.apply(Event::InitDone);
        applier.apply(Event::Apply(restarted_pod("containerd://bbb", Some("containerd://aaa"))));
        // The third instance: the status no longer names the first.
        applier.apply(Event::Apply(restarted_pod("containerd://ccc", Some("containerd://bbb"))));
        let meta = cache.get("uid-c").expect("cached");
        for id in ["aaa", "bbb", "ccc"] {
            assert_eq!(container_name(&meta, id), Some("worker"), "{id}");
        }
        // A relist keeps them too.
        applier.apply(Event::Init);
        applier.apply(Event::InitApply(restarted_pod("containerd://ddd", Some("containerd://ccc"))));
        applier.apply(Event::InitDone);
        let meta = cache.get("uid-c").expect("cached");
        assert_eq!(container_name(&meta, "aaa"), Some("worker"));
        // Deleted, the pod's names go with it.
        applier.apply(Event::Delete(restarted_pod("containerd://ddd", None)));
        assert!(cache.get("uid-c").is_none());
    }

    fn named_pod(name: &str, uid: &str) -> Pod {
        pod(serde_json::json!({"metadata": {"name": name, "namespace": "default", "uid": uid}}))
    }

    #[test]
    fn relist_replaces_the_cache_and_deletes_remove() {
        let cache = PodCache::default();
        let mut applier =
            watch::Relister::new(PodWatch { cache: cache.clone(), track_label: "track".into() });
        assert!(!cache.is_synced());

        applier.apply(Event::Init);
        applier.apply(Event::InitApply(named_pod("a", "uid-a")));
        applier.apply(Event::InitApply(named_pod("b", "uid-b")));
        // Nothing is visible until the list is complete.
        assert_eq!(cache.len(), 0);
        applier.apply(Event::InitDone);
        assert!(cache.is_synced());
        let mut uids = cache.uids();
        uids.sort();
        assert_eq!(uids, ["uid-a", "uid-b"]);
        let generation = cache.generation();

        // Re-applying an unchanged pod is not a change.
        applier.apply(Event::Apply(named_pod("a", "uid-a")));
        assert_eq!(cache.generation(), generation);

        applier.apply(Event::Delete(named_pod("a", "uid-a")));
        assert!(cache.get("uid-a").is_none());
        assert!(cache.generation() > generation);
        let generation = cache.generation();

        // A relist drops what it does not contain (b, deleted while
        // disconnected) and adds what is new (c).
        applier.apply(Event::Init);
        applier.apply(Event::InitApply(named_pod("c", "uid-c")));
        assert!(cache.get("uid-b").is_some());
        applier.apply(Event::InitDone);
        assert_eq!(cache.uids(), ["uid-c"]);
        assert_eq!(cache.get("uid-c").map(|m| m.name), Some("c".to_owned()));
        assert!(cache.generation() > generation);
    }
}

#[cfg(test)]
pub(super) mod fake_apiserver_tests {
    //! Against `tests/fake-apiserver/fake_apiserver.py`, a stand-in for the
    //! API server only: the client, the watcher and this module are real.
    //! [`Server`] also serves the tests of [`super::super::rollouts`].
    use super::*;
    use std::{
        path::Path,
        process::{Child, Command, Stdio},
        time::Instant,
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const UID_A1: &str = "0b7e0a4c-1d2e-4f30-8a41-5b6c7d8e9f01";
    const UID_A2: &str = "0b7e0a4c-1d2e-4f30-8a41-5b6c7d8e9f02";
    const UID_A3: &str = "0b7e0a4c-1d2e-4f30-8a41-5b6c7d8e9f03";
    const UID_A4: &str = "0b7e0a4c-1d2e-4f30-8a41-5b6c7d8e9f04";
    const UID_B1: &str = "0b7e0a4c-1d2e-4f30-8a41-5b6c7d8e9fb1";

    fn pod_json(name: &str, uid: &str, node: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": "shop", "uid": uid,
                "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d", "track": "canary"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f6d",
                                     "uid": "9b1e3c5a-1111-2222-3333-444455556666", "controller": true}],
            },
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app:1"}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "app", "image": "app:1", "imageID": "", "ready": true, "restartCount": 0,
                "containerID": format!("containerd://{}", "ab".repeat(32)),
            }]},
        })
    }

    /// The fake server as a child process; killed when dropped.
    pub(crate) struct Server {
        child: Child,
        port: u16,
        log: PathBuf,
    }

    impl Server {
        pub(crate) fn start(dir: &Path, port: u16, pods: &[serde_json::Value]) -> Server {
            Server::start_with(dir, port, pods, &[])
        }

        /// [`Server::start`] with more command-line arguments.
        pub(crate) fn start_with(dir: &Path, port: u16, pods: &[serde_json::Value], args: &[&str]) -> Server {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fake-apiserver/fake_apiserver.py");
            let pods_file = dir.join("pods.json");
            std::fs::write(&pods_file, serde_json::Value::from(pods.to_vec()).to_string())
                .expect("pods file");
            let port_file = dir.join("port");
            let _ = std::fs::remove_file(&port_file);
            let log = dir.join("fake-apiserver.log");
            let log_file =
                std::fs::OpenOptions::new().create(true).append(true).open(&log).expect("log file");
            let child = Command::new("python3")
                .arg(&script)
                .args(["--port", &port.to_string(), "--port-file"])
                .arg(&port_file)
                .arg("--pods")
                .arg(&pods_file)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log_file)
                .spawn()
                .unwrap_or_else(|err| {
                    panic!(
                        "cannot run python3 {}: {err} (the fake API server needs python3)",
                        script.display()
                    )
                });
            let mut server = Server { child, port: 0, log };
            let deadline = Instant::now() + Duration::from_secs(10);
            server.port = loop {
                if let Some(port) =
                    std::fs::read_to_string(&port_file).ok().and_then(|s| s.trim().parse().ok())
                {
                    break port;
                }
                if let Ok(Some(status)) = server.child.try_wait() {
                    panic!("fake API server exited with {status}:\n{}", server.log_text());
                }
                assert!(Instant::now() < deadline, "fake API server did not start:\n{}", server.log_text());
                std::thread::sleep(Duration::from_millis(20));
            };
            server
        }

        pub(crate) fn port(&self) -> u16 {
            self.port
        }

        pub(crate) fn log_text(&self) -> String {
            std::fs::read_to_string(&self.log).unwrap_or_default()
        }

        /// One request to the control API, over a plain TCP connection.
        pub(crate) async fn control(&self, method: &str, path: &str, body: &str) -> (u16, String) {
            let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.expect("connect");
            let request = format!(
                "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(request.as_bytes()).await.expect("send");
            let mut response = String::new();
            conn.read_to_string(&mut response).await.expect("receive");
            let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            (status, response)
        }

        fn stop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            self.stop();
        }
    }

    pub(crate) async fn wait_for(
        what: &str,
        server: &Server,
        timeout: Duration,
        mut cond: impl FnMut() -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        while !cond() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {what}; fake API server log:\n{}",
                server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watches_node_pods_and_survives_api_server_restart() {
        let dir = std::env::temp_dir().join(format!("canaryscope-kube-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut server = Server::start(
            &dir,
            0,
            &[pod_json("web-a1", UID_A1, "node-a"), pod_json("web-b1", UID_B1, "node-b")],
        );
        let port = server.port;

        // Plain HTTP, no credentials: what the fake server speaks.
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(port)).expect("kubeconfig");
        let options = KubeOptions {
            kubeconfig: Some(kubeconfig),
            node_name: Some("node-a".into()),
            track_label: DEFAULT_TRACK_LABEL.into(),
        };
        let cache = start(options).await.expect("start");
        let long = Duration::from_secs(20);

        wait_for("the first list", &server, long, || cache.is_synced() && cache.api_healthy()).await;
        let meta = cache.get(UID_A1).expect("pod on node-a");
        assert_eq!(
            (meta.workload.as_str(), meta.revision.as_str(), meta.track.as_str()),
            ("web", "7d4b9c8f6d", "canary")
        );
        assert_eq!(container_name(&meta, &"ab".repeat(32)), Some("app"));
        assert!(cache.get(UID_B1).is_none(), "pod on node-b must be filtered out by the field selector");

        // Changes arrive through the watch.
        let (status, body) =
            server.control("POST", "/control/pods", &pod_json("web-a2", UID_A2, "node-a").to_string()).await;
        assert_eq!(status, 200, "{body}");
        wait_for("web-a2 is added", &server, long, || cache.get(UID_A2).is_some()).await;
        let generation = cache.generation();
        let (status, body) = server.control("DELETE", "/control/pods/shop/web-a1", "").await;
        assert_eq!(status, 200, "{body}");
        wait_for("web-a1 is deleted", &server, long, || cache.get(UID_A1).is_none()).await;
        assert!(cache.generation() > generation);

        // API server gone: unhealthy, contents kept.
        server.stop();
        wait_for("api_healthy() turns false", &server, long, || !cache.api_healthy()).await;
        assert!(cache.get(UID_A2).is_some(), "the cache must keep its contents while the API is away");
        assert!(cache.is_synced());

        // Back on the same port with other pods: web-a2 was deleted while
        // the daemon was disconnected, web-a3 created. The restarted server
        // does not know the old resource versions, so the client relists.
        drop(server);
        let server = Server::start(
            &dir,
            port,
            &[pod_json("web-a3", UID_A3, "node-a"), pod_json("web-b1", UID_B1, "node-b")],
        );
        wait_for("web-a3 appears after the restart", &server, Duration::from_secs(60), || {
            cache.get(UID_A3).is_some()
        })
        .await;
        assert!(cache.get(UID_A2).is_none(), "a pod deleted during the outage must go with the relist");
        wait_for("api_healthy() turns true", &server, long, || cache.api_healthy()).await;
        let (status, body) =
            server.control("POST", "/control/pods", &pod_json("web-a4", UID_A4, "node-a").to_string()).await;
        assert_eq!(status, 200, "{body}");
        wait_for("web-a4 is added after the restart", &server, long, || cache.get(UID_A4).is_some()).await;
        assert_eq!(cache.len(), 2);

        // History compacted under an open watch: 410 Gone, relist, and the
        // watch carries on.
        let (status, body) = server.control("POST", "/control/compact", "").await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = server.control("DELETE", "/control/pods/shop/web-a3", "").await;
        assert_eq!(status, 200, "{body}");
        wait_for("web-a3 is deleted after the compaction", &server, long, || cache.get(UID_A3).is_none())
            .await;
        assert_eq!(cache.uids(), [UID_A4]);

        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_patches_follow_kube_apiserver_semantics_per_content_type() {
        use kube::api::{Patch, PatchParams};
        let dir = std::env::temp_dir().join(format!("canaryscope-kube-patch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let server = Server::start(&dir, 0, &[pod_json("web-a1", UID_A1, "node-a")]);
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(server.port())).expect("kubeconfig");
        let options = KubeOptions { kubeconfig: Some(kubeconfig), ..KubeOptions::default() };
        let client = Client::try_from(load_config(&options).await.expect("config")).expect("client");
        let pods: Api<Pod> = Api::namespaced(client, "shop");
        let types = |p: &Pod| -> Vec<String> {
            p.status.iter().flat_map(|s| s.conditions.iter().flatten()).map(|c| c.type_.clone()).collect()
        };
        let gate = |status: &str| serde_json::json!({"status": {"conditions": [{"type": CONDITION_TYPE, "status": status}]}});
        let params = PatchParams::default();
        // The server gave the pod the kubelet's conditions.
        let kubelet = ["PodScheduled", "Initialized", "ContainersReady", "Ready"];

        let merged =
            pods.patch_status("web-a1", &params, &Patch::Strategic(gate("False"))).await.expect("patch");
        assert_eq!(types(&merged), [&kubelet[..], &[CONDITION_TYPE]].concat());
        let merged =
            pods.patch_status("web-a1", &params, &Patch::Strategic(gate("True"))).await.expect("patch");
        assert_eq!(types(&merged).len(), 5, "merged by type, not appended");

        let json = Patch::Json::<()>(
            serde_json::from_value(
                serde_json::json!([{"op": "replace", "path": "/status/phase", "value": "Failed"}]),
            )
            .expect("json patch"),
        );
        let patched = pods.patch_status("web-a1", &params, &json).await.expect("patch");
        assert_eq!(patched.status.and_then(|s| s.phase).as_deref(), Some("Failed"));

        // A JSON merge patch replaces the list: the kubelet's conditions go.
        let replaced =
            pods.patch_status("web-a1", &params, &Patch::Merge(gate("True"))).await.expect("patch");
        assert_eq!(types(&replaced), [CONDITION_TYPE]);

        let (status, body) = server.control("GET", "/control/patches", "").await;
        assert_eq!(status, 200, "{body}");
        for kind in ["strategic-merge-patch", "json-patch", "merge-patch"] {
            assert!(body.contains(&format!("application/{kind}+json")), "{kind} not recorded: {body}");
        }
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn kubeconfig_errors_name_the_file_and_the_fix() {
        let missing = std::env::temp_dir().join("canaryscope-no-such-kubeconfig");
        let options = KubeOptions { kubeconfig: Some(missing.clone()), ..KubeOptions::default() };
        let err = start(options).await.expect_err("a missing kubeconfig is an error");
        let message = err.to_string();
        assert!(matches!(err, KubeError::KubeconfigUnreadable { .. }), "{message}");
        assert!(message.starts_with(&format!("--kubeconfig {}: ", missing.display())), "{message}");
        assert!(message.contains("No such file"), "{message}");

        let invalid = std::env::temp_dir().join(format!("canaryscope-bad-kubeconfig-{}", std::process::id()));
        std::fs::write(&invalid, "apiVersion: v1\nkind: Config\nclusters: [").expect("write");
        let options = KubeOptions { kubeconfig: Some(invalid.clone()), ..KubeOptions::default() };
        let err = start(options).await.expect_err("an unparsable kubeconfig is an error");
        assert!(matches!(err, KubeError::KubeconfigInvalid { .. }), "{err}");
        let _ = std::fs::remove_file(&invalid);

        let options = KubeOptions { node_name: Some(" ".into()), ..KubeOptions::default() };
        assert!(matches!(start(options).await, Err(KubeError::EmptyNodeName)));
    }

    pub(crate) fn kubeconfig_yaml(port: u16) -> String {
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\n\
             clusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n\
             users:\n- name: fake\n  user: {{}}\n"
        )
    }
}
