//! The readiness gate in the daemon loop: init failures and crashes from
//! events, stalls and start-ups from each refresh, and the conditions the
//! patcher is to keep for the gated pods of this node.
use std::{collections::HashMap, time::Duration};

use observer_common::gpu::{GpuStats, GpuStatsKey};

use crate::{
    attribution::{cgroup_path::parse_pod_cgroup, kube::PodCache},
    events::Event,
    gate::{
        patcher::{Patcher, Target},
        startup_counts, Gate,
    },
    pipeline::{never_initialized::GpuContainer, stalls::Stall, Pipeline},
};

/// The readiness gate in the daemon loop: evidence in, targets out.
pub struct GateRunner {
    pub gate: Gate,
    pub patcher: Patcher,
    pub pods: PodCache,
    pub stall_threshold: Duration,
}

impl GateRunner {
    /// Init failures and GPU crashes. The kernel's start-up counts are read
    /// now, once per batch with trouble, as the baseline that a later
    /// start-up must exceed (the counts of the last refresh may be half a
    /// second old and miss the start-up just before a crash).
    pub fn events(&mut self, pipeline: &Pipeline, events: &[Event]) {
        let pods = &self.pods;
        let troubles: Vec<_> = events
            .iter()
            .filter(|e| {
                // Pods known not to declare the gate cost no map read.
                let pod = e.origin.cgroup.as_deref().and_then(parse_pod_cgroup);
                pod.is_some_and(|p| pods.get(&p.pod_uid).is_none_or(|m| m.gate.is_some()))
            })
            .filter_map(|e| Gate::trouble_of(e).map(|t| (e, t)))
            .collect();
        if troubles.is_empty() {
            return;
        }
        let counts = startup_counts(&pipeline.kernel().gpu_stats());
        for (event, (reason, message, api)) in troubles {
            let origin = &event.origin;
            self.gate.note_trouble(origin.cgroup_id, origin.cgroup.as_deref(), reason, message, api, &counts);
        }
        self.publish();
    }

    /// Stalls and start-ups, from the refresh's reads of the kernel, and
    /// the GPU containers as judged with `--gpu-init-timeout` (`None`: off).
    pub fn refresh(
        &mut self,
        pipeline: &mut Pipeline,
        stalls: &[Stall],
        gpu: &[(GpuStatsKey, GpuStats)],
        (gpu_containers, init_timeout): (&[GpuContainer], Option<Duration>),
    ) {
        let counts = startup_counts(gpu);
        let resolver = pipeline.cgroups_mut();
        self.gate.note_stalls(stalls, self.stall_threshold, &counts, |id| resolver.path(id));
        self.gate.note_counts(&counts, |id| resolver.path(id));
        if let Some(timeout) = init_timeout {
            self.gate.note_gpu_containers(gpu_containers, timeout);
        }
        // Evidence is kept for gated pods while the API knows them, and for
        // pods it does not know (yet: too new for the watch) while their
        // cgroups exist; a pod known without the gate never needs any.
        if self.pods.is_synced() {
            let pods = &self.pods;
            self.gate.retain(|cgroup, uid| match pods.get(uid) {
                Some(meta) => meta.gate.is_some(),
                None => resolver.exists(cgroup),
            });
        }
        self.publish();
    }

    fn publish(&mut self) {
        let now = unix_now();
        let mut targets = HashMap::new();
        for (uid, meta) in self.pods.gated() {
            if let Some(desired) = self.gate.desired(&uid, &meta, now) {
                targets.insert(uid, Target { namespace: meta.namespace, name: meta.name, desired });
            }
        }
        self.patcher.set_targets(targets);
    }
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}
