//! Why the host killed a pod's container, filled into the exit's event
//! once, here, so `trace --json`, the gate and the series see the same
//! field.
//!
//! A rollout that deletes a pod sends two things at about the same time:
//! the pod's deletion timestamp, as a watch update to kubelet and to this
//! daemon, and kubelet's kill of the container once kubelet has read it.
//! The kill can reach the daemon before the update does. A kill of a pod
//! the cache still shows as alive is therefore held for [`SETTLE`], and
//! called a container restart only if the pod is still not being deleted
//! then; a pod being deleted, or gone from a synced cache, decides at once.
use std::time::{Duration, Instant};

use crate::{
    attribution::kube::PodCache,
    events::{Detail, Event},
    exit_cause::{kill_reason, KillReason, SenderScope},
};

/// How long a host kill of a living pod's container waits for the pod's
/// deletion to arrive: the watch update and kubelet's kill leave the API
/// server together, so a second covers any delay between the two streams
/// but a stalled watch, with room to spare.
pub const SETTLE: Duration = Duration::from_secs(2);

#[derive(Default)]
pub struct KillReasons {
    /// The node's pods; `None` without Kubernetes (`trace`), where no
    /// reason is given.
    pods: Option<PodCache>,
    /// Kills of living pods' containers, with when they came.
    held: Vec<(Instant, Event)>,
}

impl KillReasons {
    pub fn set_pods(&mut self, pods: PodCache) {
        self.pods = Some(pods);
    }

    /// The event with its kill reason, or `None` while it is held.
    pub fn settle(&mut self, mut event: Event, now: Instant) -> Option<Event> {
        let Some(pods) = &self.pods else { return Some(event) };
        let Detail::Exit { sender: Some(sender), kill_reason: reason, .. } = &mut event.detail else {
            return Some(event);
        };
        if sender.scope != SenderScope::Host {
            return Some(event);
        }
        *reason = kill_reason(event.origin.cgroup.as_deref(), pods);
        if *reason == Some(KillReason::ContainerRestart) {
            self.held.push((now, event));
            return None;
        }
        Some(event)
    }

    /// Held kills whose pod is now being deleted, or whose wait is over.
    pub fn due(&mut self, now: Instant) -> Vec<Event> {
        let Some(pods) = &self.pods else { return Vec::new() };
        let mut out = Vec::new();
        for (since, mut event) in std::mem::take(&mut self.held) {
            let reason = kill_reason(event.origin.cgroup.as_deref(), pods);
            if reason == Some(KillReason::PodDeleted) || now.duration_since(since) >= SETTLE {
                if let Detail::Exit { kill_reason: slot, .. } = &mut event.detail {
                    // A cache that stopped answering meanwhile keeps the
                    // reason it gave when the kill came.
                    *slot = reason.or(*slot);
                }
                out.push(event);
            } else {
                self.held.push((since, event));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        attribution::kube::PodMeta,
        events::Origin,
        exit_cause::{Cause, Sender},
    };

    const UID: &str = "1c0a2b3e-4f5d-6789-abcd-ef0123456789";
    const CGROUP: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1c0a2b3e_4f5d_6789_abcd_ef0123456789.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope";

    fn host_kill() -> Event {
        let sender = Sender {
            pid: 1,
            comm: "kubelet".into(),
            cgroup_id: 1,
            cgroup: Some("/".into()),
            scope: SenderScope::Host,
        };
        Event {
            origin: Origin { cgroup_id: 9, cgroup: Some(CGROUP.into()), ..Default::default() },
            detail: Detail::Exit {
                signal: 9,
                exit_code: 0,
                core_dumped: false,
                cause: Cause::Sent,
                sender: Some(sender),
                kill_reason: None,
                vram: None,
            },
        }
    }

    fn reason(event: &Event) -> Option<KillReason> {
        match &event.detail {
            Detail::Exit { kill_reason, .. } => *kill_reason,
            _ => None,
        }
    }

    fn stage(deleting: bool) -> (KillReasons, PodCache) {
        let pods = PodCache::default();
        pods.insert_for_test(UID, PodMeta { name: "infer-0".into(), deleting, ..Default::default() });
        let mut stage = KillReasons::default();
        stage.set_pods(pods.clone());
        (stage, pods)
    }

    #[test]
    fn a_kill_that_comes_before_the_pods_deletion_is_a_deletion() {
        let (mut stage, pods) = stage(false);
        let t0 = Instant::now();
        assert!(stage.settle(host_kill(), t0).is_none(), "held: the pod still looks alive");
        assert!(stage.due(t0 + Duration::from_millis(500)).is_empty());
        // The watch update arrives after the kill.
        pods.insert_for_test(UID, PodMeta { name: "infer-0".into(), deleting: true, ..Default::default() });
        let out = stage.due(t0 + Duration::from_millis(600));
        assert_eq!(out.iter().map(reason).collect::<Vec<_>>(), vec![Some(KillReason::PodDeleted)]);
        assert!(stage.due(t0 + SETTLE * 2).is_empty(), "given once");
    }

    #[test]
    fn a_kill_of_a_pod_that_lives_on_is_a_restart_once_settled() {
        let (mut stage, _pods) = stage(false);
        let t0 = Instant::now();
        assert!(stage.settle(host_kill(), t0).is_none());
        assert!(stage.due(t0 + SETTLE - Duration::from_millis(1)).is_empty());
        let out = stage.due(t0 + SETTLE);
        assert_eq!(out.iter().map(reason).collect::<Vec<_>>(), vec![Some(KillReason::ContainerRestart)]);
    }

    #[test]
    fn a_pod_already_being_deleted_decides_at_once_and_other_events_pass() {
        let (mut stage, _pods) = stage(true);
        let now = Instant::now();
        assert_eq!(stage.settle(host_kill(), now).as_ref().and_then(reason), Some(KillReason::PodDeleted));
        let oom = Event {
            origin: Origin::default(),
            detail: Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 },
        };
        assert!(stage.settle(oom, now).is_some());
        // Without Kubernetes nothing is held and no reason is given.
        let mut bare = KillReasons::default();
        assert_eq!(bare.settle(host_kill(), now).as_ref().map(reason), Some(None));
    }
}
