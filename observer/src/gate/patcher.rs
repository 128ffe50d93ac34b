//! Writes the gate's conditions to `pods/{name}/status`.
//!
//! A pod is patched only when the condition the API server holds differs
//! from the one wanted, at most once a second per pod, and after a failed
//! request (a conflict, a refusal, an API server that does not answer) again
//! with a backoff doubling from 1 s to 30 s, for as long as the difference
//! lasts. What the API server holds is the pod watcher's copy, or, until the
//! watch has caught up with it, the pod this daemon's own last patch
//! returned.
//!
//! The patch is a strategic-merge patch of one element of
//! `status.conditions`: the API server merges that list by `type`, so the
//! kubelet's `Ready`, `PodScheduled`, `ContainersReady` and `Initialized`
//! stay as they are. A JSON merge patch would replace the whole list and
//! wipe them.
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{Patch, PatchParams},
    Api, Client,
};
use log::{debug, info, warn};
use tokio::sync::Notify;

use super::Desired;
use crate::attribution::kube::CONDITION_TYPE;
use crate::attribution::kube::{self as podkube, GateCondition, GatedPod, KubeError, KubeOptions, PodCache};

/// Least time between two patches of one pod.
const MIN_INTERVAL: Duration = Duration::from_secs(1);
/// Longest wait before retrying a failed patch.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A request that takes longer than this is a failure (and retried).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the loop looks again without being woken.
const POLL: Duration = Duration::from_millis(200);

/// A pod and the condition it should have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub name: String,
    pub desired: Desired,
}

/// What the last successful patch of a pod returned.
#[derive(Clone, Debug)]
struct Sent {
    condition: Option<GateCondition>,
    /// The pod's resourceVersion in the patch's answer.
    resource_version: String,
    /// The watcher's resourceVersion of the pod when the patch was sent.
    cached_before: String,
}

#[derive(Debug)]
struct PodPatch {
    next_at: Instant,
    failures: u32,
    sent: Option<Sent>,
}

#[derive(Debug, Default)]
struct State {
    targets: HashMap<String, Target>,
    pods: HashMap<String, PodPatch>,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    wake: Notify,
    patches_ok: AtomicU64,
    patches_failed: AtomicU64,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves maps that are still maps.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The gate's numbers for the exporter and `check`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Gated pods by the condition the API server holds.
    pub pods_true: u64,
    pub pods_false: u64,
    pub pods_none: u64,
    /// Gated pods whose condition in the API differs from the wanted one.
    pub pending: u64,
    pub patches_ok: u64,
    pub patches_failed: u64,
}

/// Handle to the patching task; cheap to clone.
#[derive(Clone, Debug)]
pub struct Patcher {
    shared: Arc<Shared>,
    cache: PodCache,
}

/// Whether the watcher's copy already includes what a patch returned.
/// resourceVersions are opaque to clients, but every API server in use
/// hands out increasing integers (etcd revisions); for anything else the
/// copy counts as newer once it changed since the patch was sent.
fn caught_up(cached: &str, sent: &Sent) -> bool {
    match (cached.parse::<u64>(), sent.resource_version.parse::<u64>()) {
        (Ok(cached), Ok(sent)) => cached >= sent,
        _ => cached != sent.cached_before,
    }
}

/// The gate's condition as the API server holds it, as far as this daemon
/// knows.
fn api_view(cached: &GatedPod, sent: Option<&Sent>) -> Option<GateCondition> {
    match sent {
        Some(sent) if !caught_up(&cached.resource_version, sent) => sent.condition.clone(),
        _ => cached.condition.clone(),
    }
}

fn matches(condition: Option<&GateCondition>, desired: &Desired) -> bool {
    condition.is_some_and(|c| {
        c.status == desired.status() && c.reason == desired.reason && c.message == desired.message
    })
}

/// The strategic-merge patch that sets the condition. The transition time
/// moves only when the status does.
fn patch_body(desired: &Desired, current: Option<&GateCondition>, now: &str) -> serde_json::Value {
    let mut condition = serde_json::json!({
        "type": CONDITION_TYPE,
        "status": desired.status(),
        "reason": desired.reason,
        "message": desired.message,
    });
    if current.is_none_or(|c| c.status != desired.status()) {
        condition["lastTransitionTime"] = now.into();
    }
    serde_json::json!({"status": {"conditions": [condition]}})
}

fn gate_condition(pod: &Pod) -> Option<GateCondition> {
    pod.status.as_ref()?.conditions.as_deref()?.iter().find(|c| c.type_ == CONDITION_TYPE).map(|c| {
        GateCondition {
            status: c.status.clone(),
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
            last_transition_time: c.last_transition_time.as_ref().map(|t| t.0.to_string()),
        }
    })
}

fn backoff(failures: u32) -> Duration {
    MIN_INTERVAL.saturating_mul(1 << failures.saturating_sub(1).min(5)).min(MAX_BACKOFF)
}

impl Patcher {
    /// Builds a client from the same configuration as the pod watcher and
    /// starts the patching task on the current runtime.
    pub async fn start(options: &KubeOptions, cache: PodCache) -> Result<Patcher, KubeError> {
        let config = podkube::load_config(options).await?;
        let client = Client::try_from(config).map_err(|source| KubeError::Client { source })?;
        let patcher = Patcher { shared: Arc::new(Shared::default()), cache };
        tokio::spawn(patcher.clone().run(client));
        Ok(patcher)
    }

    /// The conditions wanted now, by pod UID (the cache's key). Pods not
    /// listed are left alone.
    pub fn set_targets(&self, targets: HashMap<String, Target>) {
        let mut state = self.shared.state();
        if state.targets != targets {
            state.targets = targets;
            drop(state);
            self.shared.wake.notify_one();
        }
    }

    pub fn summary(&self) -> Summary {
        let state = self.shared.state();
        let mut s = Summary {
            patches_ok: self.shared.patches_ok.load(Ordering::Relaxed),
            patches_failed: self.shared.patches_failed.load(Ordering::Relaxed),
            ..Summary::default()
        };
        for (uid, meta) in self.cache.gated() {
            let Some(gated) = &meta.gate else { continue };
            let view = api_view(gated, state.pods.get(&uid).and_then(|p| p.sent.as_ref()));
            match view.as_ref().map(|c| c.status.as_str()) {
                Some("True") => s.pods_true += 1,
                Some(_) => s.pods_false += 1,
                None => s.pods_none += 1,
            }
            if state.targets.get(&uid).is_some_and(|t| !matches(view.as_ref(), &t.desired)) {
                s.pending += 1;
            }
        }
        s
    }

    /// Pods whose condition differs and whose time has come, as (UID,
    /// target, body, watcher's resourceVersion).
    fn due(&self) -> Vec<(String, Target, serde_json::Value, String)> {
        let now = Instant::now();
        let stamp = k8s_openapi::jiff::Timestamp::now().as_second();
        let stamp = k8s_openapi::jiff::Timestamp::from_second(stamp)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into());
        let mut state = self.shared.state();
        let state = &mut *state;
        // Pods that are gone or no longer wanted need no bookkeeping.
        state.pods.retain(|uid, _| state.targets.contains_key(uid));
        let mut due = Vec::new();
        for (uid, target) in &state.targets {
            // Checked here, not only where targets are made: a pod that
            // does not declare the gate is never patched.
            let Some(gated) = self.cache.get(uid).and_then(|m| m.gate) else { continue };
            let pod = state.pods.get(uid);
            if pod.is_some_and(|p| now < p.next_at) {
                continue;
            }
            let view = api_view(&gated, pod.and_then(|p| p.sent.as_ref()));
            if matches(view.as_ref(), &target.desired) {
                continue;
            }
            let body = patch_body(&target.desired, view.as_ref(), &stamp);
            due.push((uid.clone(), target.clone(), body, gated.resource_version.clone()));
        }
        due
    }

    async fn run(self, client: Client) {
        loop {
            let due = self.due();
            if due.is_empty() {
                tokio::select! {
                    _ = self.shared.wake.notified() => {}
                    _ = tokio::time::sleep(POLL) => {}
                }
                continue;
            }
            let requests = due.into_iter().map(|(uid, target, body, cached_before)| {
                let api: Api<Pod> = Api::namespaced(client.clone(), &target.namespace);
                async move {
                    let params = PatchParams::default();
                    let result = tokio::time::timeout(
                        REQUEST_TIMEOUT,
                        api.patch_status(&target.name, &params, &Patch::Strategic(body)),
                    )
                    .await;
                    (uid, target, cached_before, result)
                }
            });
            let results = futures::future::join_all(requests).await;
            let now = Instant::now();
            for (uid, target, cached_before, result) in results {
                let result = match result {
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(err)) => Err(crate::attribution::kube::error_chain(&err)),
                    Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
                };
                self.settle(uid, &target, cached_before, result, now);
            }
        }
    }

    /// Books a patch's outcome: the next patch of the pod waits a second
    /// after a success, and a backoff after a failure.
    fn settle(
        &self,
        uid: String,
        target: &Target,
        cached_before: String,
        result: Result<Pod, String>,
        now: Instant,
    ) {
        let mut state = self.shared.state();
        let pod = state.pods.entry(uid).or_insert(PodPatch { next_at: now, failures: 0, sent: None });
        let error = match result {
            Ok(answer) => {
                self.shared.patches_ok.fetch_add(1, Ordering::Relaxed);
                info!(
                    "readiness gate: {}/{}: {} {}: {}",
                    target.namespace,
                    target.name,
                    target.desired.status(),
                    target.desired.reason,
                    target.desired.message
                );
                pod.failures = 0;
                pod.next_at = now + MIN_INTERVAL;
                pod.sent = Some(Sent {
                    condition: gate_condition(&answer),
                    resource_version: answer.metadata.resource_version.unwrap_or_default(),
                    cached_before,
                });
                return;
            }
            Err(error) => error,
        };
        self.shared.patches_failed.fetch_add(1, Ordering::Relaxed);
        pod.failures = pod.failures.saturating_add(1);
        let delay = backoff(pod.failures);
        pod.next_at = now + delay;
        let what = format!(
            "readiness gate: cannot patch pods/{}/status in {} ({} {}): {error}; retrying in {delay:?}",
            target.name,
            target.namespace,
            target.desired.status(),
            target.desired.reason
        );
        if pod.failures == 1 {
            warn!("{what}");
        } else {
            debug!("{what}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desired(ready: bool) -> Desired {
        Desired {
            ready,
            reason: if ready { super::super::REASON_READY } else { super::super::REASON_INIT_FAILED },
            message: "m".into(),
        }
    }

    fn condition(status: &str, reason: &str) -> GateCondition {
        GateCondition {
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            last_transition_time: None,
        }
    }

    #[test]
    fn the_body_is_one_condition_merged_by_type() {
        let body = patch_body(&desired(false), None, "2026-01-01T00:00:00Z");
        assert_eq!(
            body,
            serde_json::json!({"status": {"conditions": [{
                "type": "canaryscope.io/gpu-runtime", "status": "False", "reason": "InitFailed", "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
        );
        // Same status, other reason: the transition time stays.
        let same = condition("False", "CallStalled");
        let body = patch_body(&desired(false), Some(&same), "2026-01-01T00:00:00Z");
        assert!(body["status"]["conditions"][0].get("lastTransitionTime").is_none(), "{body}");
    }

    #[test]
    fn a_patch_answer_counts_until_the_watch_catches_up() {
        let sent = Sent {
            condition: Some(condition("False", "InitFailed")),
            resource_version: "120".into(),
            cached_before: "100".into(),
        };
        let cached = |rv: &str, c: Option<GateCondition>| GatedPod {
            condition: c,
            resource_version: rv.into(),
            started_at: None,
        };
        assert_eq!(api_view(&cached("100", None), Some(&sent)), sent.condition);
        assert_eq!(api_view(&cached("121", None), Some(&sent)), None, "a newer copy wins");
        let opaque = Sent { resource_version: "x2".into(), cached_before: "x1".into(), ..sent.clone() };
        assert_eq!(api_view(&cached("x1", None), Some(&opaque)), sent.condition);
        assert_eq!(api_view(&cached("x3", None), Some(&opaque)), None);
        assert!(matches(Some(&condition("False", "InitFailed")), &desired(false)));
        assert!(!matches(Some(&condition("True", "InitFailed")), &desired(false)));
        assert!(!matches(None, &desired(true)));
    }

    /// A patcher without its task, over a cache holding one gated pod.
    fn patcher() -> (Patcher, Target) {
        let meta = crate::attribution::kube::PodMeta {
            namespace: "ml".into(),
            name: "w".into(),
            gate: Some(GatedPod { condition: None, resource_version: "10".into(), started_at: None }),
            ..Default::default()
        };
        let cache = PodCache::default();
        cache.insert_for_test("uid-w", meta);
        let target = Target { namespace: "ml".into(), name: "w".into(), desired: desired(false) };
        (Patcher { shared: Arc::new(Shared::default()), cache }, target)
    }

    fn answer(status: &str, rv: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w", "resourceVersion": rv},
            "status": {"conditions": [{"type": CONDITION_TYPE, "status": status, "reason": "InitFailed", "message": "m"}]},
        }))
        .expect("pod")
    }

    #[test]
    fn a_pod_is_patched_at_most_once_a_second_and_only_on_a_change() {
        let (p, target) = patcher();
        p.set_targets([("uid-w".to_string(), target.clone())].into());
        assert_eq!(p.due().len(), 1);
        assert_eq!(p.summary().pending, 1);
        p.settle("uid-w".into(), &target, "10".into(), Ok(answer("False", "11")), Instant::now());
        // The answer counts while the watch lags: nothing differs.
        assert_eq!(p.summary().pending, 0);
        assert!(p.due().is_empty());
        // A change within the second waits for it.
        let ready = Target { desired: desired(true), ..target.clone() };
        p.set_targets([("uid-w".to_string(), ready.clone())].into());
        assert!(p.due().is_empty(), "a second patch within a second");
        assert_eq!(p.summary().pending, 1);
        p.shared.state().pods.get_mut("uid-w").expect("booked").next_at = Instant::now();
        let due = p.due();
        assert_eq!(due.len(), 1);
        // The status changes, so the transition time moves.
        assert!(due[0].2["status"]["conditions"][0]["lastTransitionTime"].is_string(), "{}", due[0].2);
    }

    #[test]
    fn a_failed_patch_is_retried_after_a_backoff_and_pods_without_the_gate_never_are() {
        let (p, target) = patcher();
        p.set_targets([("uid-w".to_string(), target.clone())].into());
        let now = Instant::now();
        p.settle("uid-w".into(), &target, "10".into(), Err("503".into()), now);
        p.settle("uid-w".into(), &target, "10".into(), Err("503".into()), now);
        let next = p.shared.state().pods.get("uid-w").map(|b| b.next_at);
        assert_eq!(next, Some(now + Duration::from_secs(2)));
        assert_eq!(p.summary().patches_failed, 2);
        // A target for a pod the cache does not know as gated is skipped.
        p.set_targets([("uid-other".to_string(), target)].into());
        assert!(p.due().is_empty());
    }

    #[test]
    fn retries_back_off_to_thirty_seconds() {
        let delays: Vec<u64> = (1..=8).map(|f| backoff(f).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30, 30]);
    }
}
