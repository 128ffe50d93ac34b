//! Argo Rollouts' own answer to "is this pod a canary?".
//!
//! Argo stamps each pod of a Rollout with `rollouts-pod-template-hash`, and
//! keeps the hash of the stable ReplicaSet in the Rollout's
//! `status.stableRS`; every other revision of the Rollout is the one being
//! rolled out. That holds whatever labels the user put in the Rollout's
//! canary metadata, so a Rollout needs no track label for its canary pods to
//! be told apart (and only those get the expensive per-call probes).
//!
//! One kube-rs [`watcher`] lists and watches the Rollouts of the whole
//! cluster (a node's pods may belong to a Rollout of any namespace) through
//! the dynamic API, so no Argo types are compiled in, and [`RolloutCache`]
//! keeps only `(namespace, name) -> stableRS` of each: a Rollout embeds a
//! whole pod template, which is not worth keeping for one hash.
//!
//! # Without Argo, or without the right to read it
//!
//! Neither stops the daemon. When the API server answers 403 (the service
//! account may not read `rollouts.argoproj.io`) or 404 (the Argo Rollouts
//! CRD is not installed), one line says so, [`RolloutCache::access`] reports
//! [`RolloutAccess::Unavailable`] with that reason, canary pods are told by
//! the track label alone, and the Rollouts are asked for again every
//! [`RECHECK_UNAVAILABLE`], so a CRD installed or a role granted later is
//! picked up without a restart. Other errors (API server unreachable, 5xx)
//! are retried with kube-rs' backoff, like the pod watcher's, and the stable
//! revisions last listed are kept meanwhile.
use std::{
    collections::HashMap,
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};

use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind},
    core::Status,
    runtime::watcher,
    Api, Client,
};

use super::{
    kube::{error_chain, load_config, KubeError, KubeOptions, PodMeta},
    watch::{self, Retry, Watched},
};

/// [`canary_reason`] when the pod's track label says `canary`.
pub const REASON_TRACK_LABEL: &str = "canary track label";
/// [`canary_reason`] when the pod's Argo revision is not its Rollout's
/// stable one.
pub const REASON_ARGO_REVISION: &str = "argo canary revision";
/// How long to wait before asking again for Rollouts that were forbidden or
/// not served: the CRD or the role may come later, but a daemon on every
/// node asking every few seconds for something that is not there would be
/// noise for the API server.
pub const RECHECK_UNAVAILABLE: Duration = Duration::from_secs(300);

/// The track label value that marks a canary pod.
const CANARY_TRACK: &str = "canary";
const GROUP: &str = "argoproj.io";
const VERSION: &str = "v1alpha1";
const KIND: &str = "Rollout";
const PLURAL: &str = "rollouts";

/// Why a pod is a canary, or `None` when it is not known to be one.
///
/// The track label comes first: it is the user's explicit word, and the only
/// one for pods outside Argo. A pod of a Rollout is then a canary when the
/// Rollout's stable revision is known and is not the pod's. A Rollout whose
/// `status.stableRS` is empty (its first revision, before it ever became
/// stable) or not known (not listed yet, no access, no CRD, `rollouts` is
/// `None`) makes no pod a canary: without a stable revision there is nothing
/// the canary could be compared with.
pub fn canary_reason(meta: &PodMeta, rollouts: Option<&RolloutCache>) -> Option<&'static str> {
    if meta.track == CANARY_TRACK {
        return Some(REASON_TRACK_LABEL);
    }
    let rollout = meta.rollout.as_deref()?;
    let canary = rollouts?.revision_is_canary(&meta.namespace, rollout, &meta.revision)?;
    canary.then_some(REASON_ARGO_REVISION)
}

/// Whether the Rollouts are being read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RolloutAccess {
    /// Not listed yet: just started, or the API server has not answered
    /// (that is retried with backoff and says nothing about access).
    Pending,
    /// Listed and watched; the stable revisions are those of the last list
    /// and the changes since, kept through API server outages.
    Watching,
    /// The API server refused (403) or does not serve Rollouts (404), or no
    /// client could be built; the reason says which, and that canary pods
    /// are told by the track label meanwhile.
    Unavailable(String),
}

/// namespace -> Rollout name -> `status.stableRS`. Nested so that a lookup
/// with borrowed strings needs no allocation.
type StableMap = HashMap<String, HashMap<String, String>>;

#[derive(Debug)]
struct Shared {
    stable: RwLock<StableMap>,
    access: RwLock<RolloutAccess>,
}

/// Shared, cheap-to-clone view of every Rollout's stable revision. [`start`]
/// fills one and keeps it up to date for as long as a handle lives.
#[derive(Clone, Debug)]
pub struct RolloutCache {
    shared: Arc<Shared>,
}

impl RolloutCache {
    fn new(access: RolloutAccess) -> Self {
        RolloutCache { shared: Arc::new(Shared { stable: RwLock::default(), access: RwLock::new(access) }) }
    }

    /// A cache that holds these `(namespace, rollout, stableRS)` and never
    /// changes, reporting [`RolloutAccess::Watching`]: for tests of code that
    /// takes a cache, without an API server.
    pub fn fixed<I, S>(entries: I) -> Self
    where
        I: IntoIterator<Item = (S, S, S)>,
        S: Into<String>,
    {
        let cache = RolloutCache::new(RolloutAccess::Watching);
        let mut stable = StableMap::new();
        for (namespace, name, stable_rs) in entries {
            stable.entry(namespace.into()).or_default().insert(name.into(), stable_rs.into());
        }
        cache.replace_all(stable);
        cache
    }

    /// The Rollout's `status.stableRS`: the `rollouts-pod-template-hash` of
    /// its stable pods. `None` for a Rollout not (yet) known, and for one
    /// that has no stable revision yet.
    pub fn stable_revision(&self, namespace: &str, rollout: &str) -> Option<String> {
        self.read().get(namespace)?.get(rollout).filter(|hash| !hash.is_empty()).cloned()
    }

    pub fn access(&self) -> RolloutAccess {
        self.shared.access.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// How many Rollouts are known.
    pub fn len(&self) -> usize {
        self.read().values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `Some(true)` when the stable revision is known and is not `revision`,
    /// `Some(false)` when it is; `None` when there is none to compare with.
    /// Compares under the lock, so the per-pod decision allocates nothing.
    fn revision_is_canary(&self, namespace: &str, rollout: &str, revision: &str) -> Option<bool> {
        let stable = self.read();
        let stable = stable.get(namespace)?.get(rollout).filter(|hash| !hash.is_empty())?;
        Some(stable != revision)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, StableMap> {
        // A panic while writing leaves a map that is still a valid map; a
        // stale entry is better than taking the daemon down.
        self.shared.stable.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, StableMap> {
        self.shared.stable.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn upsert(&self, entry: RolloutStable) {
        self.write().entry(entry.namespace).or_default().insert(entry.name, entry.stable_rs);
    }

    fn remove(&self, namespace: &str, name: &str) {
        let mut stable = self.write();
        if let Some(rollouts) = stable.get_mut(namespace) {
            rollouts.remove(name);
            if rollouts.is_empty() {
                stable.remove(namespace);
            }
        }
    }

    fn replace_all(&self, new: StableMap) {
        *self.write() = new;
    }

    /// Sets the access state; returns the previous one.
    fn set_access(&self, access: RolloutAccess) -> RolloutAccess {
        let mut current = self.shared.access.write().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *current, access)
    }
}

/// What is kept of one Rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RolloutStable {
    namespace: String,
    name: String,
    /// `status.stableRS`, "" when the Rollout has none yet (or no status).
    stable_rs: String,
}

/// The Rollout's namespace, name and stable revision; `None` for an object
/// without a name or namespace (Rollouts are namespaced, and the API server
/// always sets both, so only a malformed object lacks them).
fn parse_rollout(obj: &DynamicObject) -> Option<RolloutStable> {
    let name = obj.metadata.name.as_deref().filter(|s| !s.is_empty())?;
    let namespace = obj.metadata.namespace.as_deref().filter(|s| !s.is_empty())?;
    let stable_rs = obj
        .data
        .get("status")
        .and_then(|status| status.get("stableRS"))
        .and_then(serde_json::Value::as_str)
        .map(str::trim)
        .unwrap_or_default();
    Some(RolloutStable {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        stable_rs: stable_rs.to_owned(),
    })
}

/// The Rollout cache as [`watch::run`] keeps it; a Rollout that is
/// unavailable (403, 404) is asked for again every `recheck`.
struct RolloutWatch {
    cache: RolloutCache,
    recheck: Duration,
}

impl Watched for RolloutWatch {
    type Object = DynamicObject;
    type Relist = StableMap;
    /// Only a completed list says the cache is whole.
    const CHANGES_SHOW_HEALTH: bool = false;

    fn in_use(&self) -> bool {
        Arc::strong_count(&self.cache.shared) > 1
    }

    fn collect(&self, relist: &mut StableMap, obj: &DynamicObject) {
        if let Some(entry) = parse_rollout(obj) {
            relist.entry(entry.namespace).or_default().insert(entry.name, entry.stable_rs);
        }
    }

    fn replace_all(&self, relist: StableMap) {
        self.cache.replace_all(relist);
    }

    fn apply(&self, obj: &DynamicObject) {
        if let Some(entry) = parse_rollout(obj) {
            self.cache.upsert(entry);
        }
    }

    fn delete(&self, obj: &DynamicObject) {
        if let Some(entry) = parse_rollout(obj) {
            self.cache.remove(&entry.namespace, &entry.name);
        }
    }

    fn answered(&self) {
        if self.cache.set_access(RolloutAccess::Watching) != RolloutAccess::Watching {
            log::info!(
                "Argo Rollouts: watching {PLURAL}.{GROUP}, {} listed; their pods are canary unless of the \
                 stable revision",
                self.cache.len()
            );
        }
    }

    fn failed(&self, error: Option<&watcher::Error>, retry: &mut Retry) -> Duration {
        let failure = error.map_or_else(|| Failure::Transient("watch stream ended".to_owned()), classify);
        let cache = &self.cache;
        match failure {
            Failure::Unavailable { reason, expected } => {
                // Stable revisions that can no longer be followed would go
                // stale as rollouts move on, and mark the wrong pods.
                cache.replace_all(StableMap::new());
                let previous = cache.set_access(RolloutAccess::Unavailable(reason.clone()));
                let every = self.recheck.as_secs();
                if previous == RolloutAccess::Unavailable(reason.clone()) {
                    log::debug!("Argo Rollouts: still {reason}");
                } else if expected {
                    log::info!("Argo Rollouts: {reason}; asking again every {every}s");
                } else {
                    log::warn!("Argo Rollouts: {reason}; asking again every {every}s");
                }
                retry.settled();
                self.recheck
            }
            Failure::Transient(error) => {
                let (delay, first) = retry.transient();
                if first {
                    let kept = match cache.access() {
                        RolloutAccess::Watching => "stable revisions stay as they were",
                        _ => "canary pods are told by the track label",
                    };
                    log::warn!("Argo Rollouts: {error}; {kept} until it answers, retrying");
                } else {
                    log::debug!("Argo Rollouts: {error}; retrying in {delay:?}");
                }
                delay
            }
        }
    }
}

/// How a failed list or watch is handled.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// 403 or 404: the answer will not change soon; the reason is for the
    /// log and for [`RolloutAccess::Unavailable`]. `expected` is false for
    /// 403, which the shipped RBAC rules out, so it is worth a warning;
    /// a cluster without Argo (404) is normal.
    Unavailable { reason: String, expected: bool },
    /// Anything else: retried with backoff.
    Transient(String),
}

fn classify(err: &watcher::Error) -> Failure {
    let status: Option<&Status> = match err {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => match e {
            kube::Error::Api(status) => Some(status),
            _ => None,
        },
        watcher::Error::WatchError(status) => Some(status),
        watcher::Error::NoResourceVersion => None,
    };
    match status.map(|s| s.code) {
        Some(403) => Failure::Unavailable {
            reason: format!(
                "no access to {PLURAL}.{GROUP} (403): canary pods are told by the track label; grant \
                 get, list and watch on {PLURAL} in API group {GROUP} (deploy/rbac.yaml) to tell Argo \
                 canaries by the Rollout's stable revision"
            ),
            expected: false,
        },
        Some(404) => Failure::Unavailable {
            reason: format!(
                "the Argo Rollouts CRD is not installed (404 for {PLURAL}.{GROUP}/{VERSION}): canary \
                 pods are told by the track label"
            ),
            expected: true,
        },
        _ => Failure::Transient(error_chain(err)),
    }
}

fn rollouts_api(client: Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(GROUP, VERSION, KIND);
    Api::all_with(client, &ApiResource::from_gvk_with_plural(&gvk, PLURAL))
}

/// Builds a client as [`super::kube::start`] does and starts watching the
/// Rollouts of the cluster on the current tokio runtime. Returns at once
/// with an empty cache in [`RolloutAccess::Pending`], and never fails: when
/// no client can be built (which `kube::start` would already have reported
/// as an error), the cache is [`RolloutAccess::Unavailable`] for good.
pub async fn start(options: &KubeOptions) -> RolloutCache {
    let client = match load_config(options).await {
        Ok(config) => Client::try_from(config).map_err(|source| KubeError::Client { source }),
        Err(err) => Err(err),
    };
    match client {
        Ok(client) => start_with_client(client).await,
        Err(err) => {
            let reason = format!("no Kubernetes client ({err}): canary pods are told by the track label");
            log::warn!("Argo Rollouts: {reason}");
            RolloutCache::new(RolloutAccess::Unavailable(reason))
        }
    }
}

/// [`start`] with a client built by the caller.
pub async fn start_with_client(client: Client) -> RolloutCache {
    spawn(client, RECHECK_UNAVAILABLE)
}

fn spawn(client: Client, recheck: Duration) -> RolloutCache {
    let cache = RolloutCache::new(RolloutAccess::Pending);
    let weak = Arc::downgrade(&cache.shared);
    // Lists at resourceVersion 0, from the API server's watch cache, as the
    // pod watcher does and for the same reason: a daemon on every node.
    let config = watcher::Config { page_size: None, ..watcher::Config::default().any_semantic() };
    tokio::spawn(watch::run(rollouts_api(client), config, move || {
        Some(RolloutWatch { cache: RolloutCache { shared: weak.upgrade()? }, recheck })
    }));
    cache
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn rollout(json: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json).expect("valid Rollout JSON")
    }

    fn checkout_rollout(stable_rs: Option<&str>) -> DynamicObject {
        let mut json = serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "checkout", "namespace": "shop", "uid": "5e6f7081-92a3-4b4c-8d5e-6f708192a3b4",
                         "resourceVersion": "77120", "generation": 4},
            "spec": {
                "replicas": 4,
                "selector": {"matchLabels": {"app": "checkout"}},
                "template": {"metadata": {"labels": {"app": "checkout"}},
                             "spec": {"containers": [{"name": "checkout", "image": "checkout:2"}]}},
                "strategy": {"canary": {"steps": [{"setWeight": 25}, {"pause": {}}]}},
            },
        });
        if let Some(stable_rs) = stable_rs {
            json["status"] = serde_json::json!({
                "currentPodHash": "7c9d8e6f5", "stableRS": stable_rs, "replicas": 5,
                "updatedReplicas": 1, "readyReplicas": 5, "availableReplicas": 5, "phase": "Paused",
                "canary": {}, "observedGeneration": "4",
            });
        }
        rollout(json)
    }

    fn stable(namespace: &str, name: &str, stable_rs: &str) -> RolloutStable {
        RolloutStable { namespace: namespace.into(), name: name.into(), stable_rs: stable_rs.into() }
    }

    #[test]
    fn parses_namespace_name_and_stable_rs() {
        assert_eq!(
            parse_rollout(&checkout_rollout(Some("6b8f7c9d4"))),
            Some(stable("shop", "checkout", "6b8f7c9d4"))
        );
        // A new Rollout has no status, or a status without stableRS, until
        // its first revision is up.
        assert_eq!(parse_rollout(&checkout_rollout(None)), Some(stable("shop", "checkout", "")));
        let mut no_stable = checkout_rollout(Some("x"));
        no_stable.data["status"] = serde_json::json!({"phase": "Progressing"});
        assert_eq!(parse_rollout(&no_stable), Some(stable("shop", "checkout", "")));
        // Not a string: ignored rather than guessed at.
        no_stable.data["status"] = serde_json::json!({"stableRS": 42});
        assert_eq!(parse_rollout(&no_stable), Some(stable("shop", "checkout", "")));

        let mut no_namespace = checkout_rollout(Some("6b8f7c9d4"));
        no_namespace.metadata.namespace = None;
        assert_eq!(parse_rollout(&no_namespace), None);
        let mut no_name = checkout_rollout(Some("6b8f7c9d4"));
        no_name.metadata.name = Some(String::new());
        assert_eq!(parse_rollout(&no_name), None);
    }

    fn argo_meta(namespace: &str, rollout: &str, hash: &str) -> PodMeta {
        PodMeta {
            namespace: namespace.into(),
            name: format!("{rollout}-{hash}-x7k2p"),
            uid: "2d1b3c4e-5f60-4789-8abc-def012345678".into(),
            workload: rollout.into(),
            revision: hash.into(),
            rollout: Some(rollout.into()),
            ..PodMeta::default()
        }
    }

    #[test]
    fn track_label_canary_comes_first() {
        let mut meta = argo_meta("shop", "checkout", "6b8f7c9d4");
        meta.track = "canary".into();
        assert_eq!(canary_reason(&meta, None), Some(REASON_TRACK_LABEL));
        // Even when Argo says the pod is stable: the label is the user's word.
        let rollouts = RolloutCache::fixed([("shop", "checkout", "6b8f7c9d4")]);
        assert_eq!(canary_reason(&meta, Some(&rollouts)), Some(REASON_TRACK_LABEL));

        let plain = PodMeta { track: "canary".into(), ..PodMeta::default() };
        assert_eq!(canary_reason(&plain, Some(&rollouts)), Some(REASON_TRACK_LABEL));
        for track in ["stable", "", "Canary", "canary-2"] {
            let other = PodMeta { track: track.into(), ..PodMeta::default() };
            assert_eq!(canary_reason(&other, Some(&rollouts)), None, "track {track:?}");
        }
    }

    #[test]
    fn argo_pod_is_canary_when_not_of_the_stable_revision() {
        let rollouts = RolloutCache::fixed([
            ("shop", "checkout", "6b8f7c9d4"),
            ("shop", "fresh", ""),
            ("ml", "checkout", "7c9d8e6f5"),
        ]);
        let canary = argo_meta("shop", "checkout", "7c9d8e6f5");
        assert_eq!(canary_reason(&canary, Some(&rollouts)), Some(REASON_ARGO_REVISION));
        let stable_pod = argo_meta("shop", "checkout", "6b8f7c9d4");
        assert_eq!(canary_reason(&stable_pod, Some(&rollouts)), None);
        // Same Rollout name in another namespace: its own stable revision.
        assert_eq!(canary_reason(&argo_meta("ml", "checkout", "7c9d8e6f5"), Some(&rollouts)), None);
        assert_eq!(
            canary_reason(&argo_meta("ml", "checkout", "6b8f7c9d4"), Some(&rollouts)),
            Some(REASON_ARGO_REVISION)
        );

        // First rollout: no stable revision yet, so nothing is a canary.
        assert_eq!(canary_reason(&argo_meta("shop", "fresh", "5a4b3c2d1"), Some(&rollouts)), None);
        // Rollout not known (not listed yet, or no access): not a canary.
        assert_eq!(canary_reason(&argo_meta("shop", "payments", "5a4b3c2d1"), Some(&rollouts)), None);
        assert_eq!(canary_reason(&canary, None), None);
        let unavailable = RolloutCache::new(RolloutAccess::Unavailable("no CRD".into()));
        assert_eq!(canary_reason(&canary, Some(&unavailable)), None);

        // A pod that names no Rollout is never compared, whatever its
        // revision (a Deployment's pod-template-hash, say).
        let deployment_pod = PodMeta { rollout: None, ..canary.clone() };
        assert_eq!(canary_reason(&deployment_pod, Some(&rollouts)), None);
    }

    #[test]
    fn stable_revision_and_fixed_cache() {
        let rollouts = RolloutCache::fixed([("shop", "checkout", "6b8f7c9d4"), ("shop", "fresh", "")]);
        assert_eq!(rollouts.access(), RolloutAccess::Watching);
        assert_eq!(rollouts.len(), 2);
        assert_eq!(rollouts.stable_revision("shop", "checkout").as_deref(), Some("6b8f7c9d4"));
        assert_eq!(rollouts.stable_revision("shop", "fresh"), None);
        assert_eq!(rollouts.stable_revision("ml", "checkout"), None);
        // Clones share the contents.
        let clone = rollouts.clone();
        rollouts.remove("shop", "checkout");
        assert_eq!(clone.stable_revision("shop", "checkout"), None);
        assert_eq!(clone.len(), 1);
    }

    #[test]
    fn relist_replaces_and_changes_apply() {
        let cache = RolloutCache::new(RolloutAccess::Pending);
        let mut applier =
            watch::Relister::new(RolloutWatch { cache: cache.clone(), recheck: RECHECK_UNAVAILABLE });
        assert!(!applier.apply(Event::Init));
        assert!(!applier.apply(Event::InitApply(checkout_rollout(Some("6b8f7c9d4")))));
        // Nothing is visible until the list is complete.
        assert!(cache.is_empty());
        assert!(applier.apply(Event::InitDone));
        assert_eq!(cache.stable_revision("shop", "checkout").as_deref(), Some("6b8f7c9d4"));

        // Promotion: the canary's hash becomes the stable one.
        assert!(!applier.apply(Event::Apply(checkout_rollout(Some("7c9d8e6f5")))));
        assert_eq!(cache.stable_revision("shop", "checkout").as_deref(), Some("7c9d8e6f5"));

        assert!(!applier.apply(Event::Delete(checkout_rollout(Some("7c9d8e6f5")))));
        assert!(cache.is_empty());

        // A relist drops what it does not contain.
        applier.apply(Event::Apply(checkout_rollout(Some("7c9d8e6f5"))));
        let mut other = checkout_rollout(Some("1a2b3c4d5"));
        other.metadata.name = Some("payments".into());
        applier.apply(Event::Init);
        applier.apply(Event::InitApply(other));
        assert_eq!(cache.stable_revision("shop", "checkout").as_deref(), Some("7c9d8e6f5"));
        applier.apply(Event::InitDone);
        assert_eq!(cache.stable_revision("shop", "checkout"), None);
        assert_eq!(cache.stable_revision("shop", "payments").as_deref(), Some("1a2b3c4d5"));
        assert_eq!(cache.len(), 1);
    }

    fn api_error(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Status::failure("refused", reason).with_code(code).boxed())
    }

    #[test]
    fn forbidden_and_not_found_are_unavailable_the_rest_transient() {
        let forbidden = classify(&watcher::Error::InitialListFailed(api_error(403, "Forbidden")));
        let Failure::Unavailable { reason, expected: false } = forbidden else {
            panic!("403 must be unavailable and unexpected: {forbidden:?}")
        };
        assert!(reason.starts_with("no access to rollouts.argoproj.io (403)"), "{reason}");
        assert!(reason.contains("track label"), "{reason}");

        // The CRD deleted under a running watch: the rewatch is a 404.
        let absent = classify(&watcher::Error::WatchStartFailed(api_error(404, "NotFound")));
        let Failure::Unavailable { reason, expected: true } = absent else {
            panic!("404 must be unavailable and expected: {absent:?}")
        };
        assert!(reason.starts_with("the Argo Rollouts CRD is not installed (404"), "{reason}");

        let gone = Status::failure("too old resource version", "Expired").with_code(410).boxed();
        assert!(matches!(classify(&watcher::Error::WatchError(gone)), Failure::Transient(_)));
        let unavailable = classify(&watcher::Error::InitialListFailed(api_error(503, "ServiceUnavailable")));
        assert!(matches!(unavailable, Failure::Transient(ref m) if m.contains("refused")), "{unavailable:?}");
        assert!(matches!(classify(&watcher::Error::NoResourceVersion), Failure::Transient(_)));
    }
}

#[cfg(test)]
mod fake_apiserver_tests {
    //! The real client and watcher against `tests/fake-apiserver`, which
    //! serves Rollouts and can refuse them with 403 or 404.
    use super::*;
    use crate::attribution::kube::fake_apiserver_tests::{kubeconfig_yaml, wait_for, Server};

    fn rollout_json(name: &str, stable_rs: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{"name": name, "image": "app:2"}]}}},
            "status": {"stableRS": stable_rs, "currentPodHash": "7c9d8e6f5"},
        })
    }

    async fn set_access(server: &Server, code: u16) {
        let (status, body) =
            server.control("POST", "/control/rollouts-access", &format!("{{\"code\": {code}}}")).await;
        assert_eq!(status, 200, "{body}");
    }

    fn unavailable_because(cache: &RolloutCache, start: &str) -> bool {
        matches!(cache.access(), RolloutAccess::Unavailable(reason) if reason.starts_with(start))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn follows_stable_revisions_and_falls_back_without_crd_or_access() {
        let dir = std::env::temp_dir().join(format!("canaryscope-rollouts-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let rollouts_file = dir.join("rollouts.json");
        let initial = serde_json::json!([rollout_json("checkout", "6b8f7c9d4")]);
        std::fs::write(&rollouts_file, initial.to_string()).expect("rollouts file");
        let rollouts_arg = rollouts_file.to_str().expect("UTF-8 temp path");
        // No CRD at first.
        let server =
            Server::start_with(&dir, 0, &[], &["--rollouts", rollouts_arg, "--rollouts-access", "404"]);
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(server.port())).expect("kubeconfig");
        let options = KubeOptions { kubeconfig: Some(kubeconfig), ..KubeOptions::default() };
        let config = load_config(&options).await.expect("config");
        let client = Client::try_from(config).expect("client");
        // Asks again after 300 ms instead of 5 minutes.
        let cache = spawn(client, Duration::from_millis(300));
        let long = Duration::from_secs(20);

        wait_for("404 reports the CRD missing", &server, long, || {
            unavailable_because(&cache, "the Argo Rollouts CRD is not installed (404")
        })
        .await;
        assert!(cache.is_empty());
        let canary = PodMeta {
            namespace: "shop".into(),
            name: "checkout-7c9d8e6f5-x7k2p".into(),
            revision: "7c9d8e6f5".into(),
            rollout: Some("checkout".into()),
            ..PodMeta::default()
        };
        assert_eq!(canary_reason(&canary, Some(&cache)), None);

        // The CRD appears: picked up at the next check, without a restart.
        set_access(&server, 200).await;
        wait_for("the Rollouts are listed", &server, long, || cache.access() == RolloutAccess::Watching)
            .await;
        assert_eq!(cache.stable_revision("shop", "checkout").as_deref(), Some("6b8f7c9d4"));
        assert_eq!(canary_reason(&canary, Some(&cache)), Some(REASON_ARGO_REVISION));

        // Changes come through the watch: a new Rollout, a promotion.
        let (status, body) = server
            .control("POST", "/control/rollouts", &rollout_json("payments", "1a2b3c4d5").to_string())
            .await;
        assert_eq!(status, 200, "{body}");
        wait_for("payments is added", &server, long, || cache.stable_revision("shop", "payments").is_some())
            .await;
        let (status, body) = server
            .control("POST", "/control/rollouts", &rollout_json("checkout", "7c9d8e6f5").to_string())
            .await;
        assert_eq!(status, 200, "{body}");
        wait_for("checkout is promoted", &server, long, || {
            cache.stable_revision("shop", "checkout").as_deref() == Some("7c9d8e6f5")
        })
        .await;
        assert_eq!(canary_reason(&canary, Some(&cache)), None);
        let (status, body) = server.control("DELETE", "/control/rollouts/shop/payments", "").await;
        assert_eq!(status, 200, "{body}");
        wait_for("payments is deleted", &server, long, || {
            cache.stable_revision("shop", "payments").is_none()
        })
        .await;

        // Read access taken away: the open watch ends, the rewatch is
        // refused, and what can no longer be followed is dropped.
        set_access(&server, 403).await;
        wait_for("403 reports no access", &server, long, || {
            unavailable_because(&cache, "no access to rollouts.argoproj.io (403)")
        })
        .await;
        assert!(cache.is_empty());

        // Given back: listed again.
        set_access(&server, 200).await;
        wait_for("listed again after the 403", &server, long, || {
            cache.access() == RolloutAccess::Watching && cache.len() == 1
        })
        .await;

        // The last handle gone, the watcher stops at its next event. The
        // server only sees the closed connection when a write fails, so it
        // is given changes to send until one does.
        drop(cache);
        let deadline = std::time::Instant::now() + long;
        for round in 0.. {
            let change = rollout_json("checkout", &format!("5a4b3c2d{round}"));
            let (status, body) = server.control("POST", "/control/rollouts", &change.to_string()).await;
            assert_eq!(status, 200, "{body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (status, response) = server.control("GET", "/control/health", "").await;
            assert_eq!(status, 200, "{response}");
            let health: serde_json::Value = response
                .split_once("\r\n\r\n")
                .and_then(|(_, body)| serde_json::from_str(body).ok())
                .expect("health JSON");
            if health["rolloutWatches"] == 0 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "the watch is still open: {health}");
        }
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
