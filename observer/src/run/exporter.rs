//! The daemon's consumer of the pipeline: series for scrapes, the
//! readiness verdicts for `/readyz`, the gate, and the pods whose processes
//! are held.
use crate::{
    attribution::{
        gpu_request::gpus_requested,
        kube::PodCache,
        rollouts::{canary_reason, RolloutCache},
    },
    config::GpuResources,
    discovery::hold_scope::{PodChoice, PodHold},
    error::CliError,
    event_loop::{Consumer, Flow},
    events::Event,
    metrics::{recorder::Recorder, server::Shared, Metrics},
    pipeline::{
        never_initialized::{GpuContainer, NeverInitialized},
        Pipeline,
    },
};

use super::gate_runner::{unix_now, GateRunner};

/// Counts events into series and publishes them for scrapes.
pub struct Exporter {
    pub recorder: Recorder,
    pub shared: Shared,
    pub pods: Option<PodCache>,
    /// The readiness gate, with Kubernetes unless turned off.
    pub gate: Option<GateRunner>,
    /// The pods whose processes are held at a never-seen GPU runtime file
    /// (with Kubernetes).
    pub held_pods: Option<HeldPods>,
    /// GPU call counts of the last read that found them moved (the
    /// readiness gate judges start-ups from them on every refresh, and the
    /// check of GPU containers their initialisations).
    pub last_gpu: Vec<(observer_common::gpu::GpuStatsKey, observer_common::gpu::GpuStats)>,
    /// Containers that requested a GPU and never initialised one (with
    /// Kubernetes, unless `--gpu-init-timeout 0`).
    pub never_initialized: Option<NeverInitialized>,
}

impl Consumer for Exporter {
    type Error = CliError;

    fn events(&mut self, pipeline: &mut Pipeline, events: Vec<Event>) -> Result<Flow, CliError> {
        if let Some(gate) = &mut self.gate {
            gate.events(pipeline, &events);
        }
        self.recorder.record(&events);
        Ok(Flow::Continue)
    }

    fn tick(&mut self, pipeline: &mut Pipeline) -> Result<Flow, CliError> {
        let generation = self.pods.as_ref().map(PodCache::generation).unwrap_or(0);
        if self.recorder.due(generation) {
            self.refresh(pipeline);
        }
        let not_ready = readiness(&self.recorder.lock().metrics, self.pods.as_ref());
        let mut state = self.shared.write().unwrap_or_else(|p| p.into_inner());
        if state.not_ready != not_ready {
            state.not_ready = not_ready;
        }
        Ok(Flow::Continue)
    }

    fn wake(&mut self, pipeline: &mut Pipeline) -> Result<Flow, CliError> {
        if let Some(held) = &mut self.held_pods {
            held.refresh(pipeline);
        }
        Ok(Flow::Continue)
    }
}

impl Exporter {
    /// Kernel aggregates, stalls, CPU limits and labels; the held pods and
    /// the gate between the kernel's reading and the series' publishing.
    fn refresh(&mut self, pipeline: &mut Pipeline) {
        let read = self.recorder.read_kernel(pipeline);
        if let Some(held) = &mut self.held_pods {
            held.refresh(pipeline);
        }
        // Only the gate and the GPU containers' check need the last counts
        // again when nothing moved.
        if let (Some((gpu, _, _)), true) =
            (&read.aggregates, self.gate.is_some() || self.never_initialized.is_some())
        {
            self.last_gpu.clone_from(gpu);
        }
        let gpu_containers = self.judge_gpu_containers(pipeline);
        if let Some(gate) = &mut self.gate {
            let init_timeout = self.never_initialized.as_ref().map(NeverInitialized::timeout);
            gate.refresh(pipeline, &read.stalls, &self.last_gpu, (&gpu_containers, init_timeout));
        }
        if self.never_initialized.is_some() {
            self.recorder.set_gpu_never_initialized(&gpu_containers);
        }
        let gate = self.gate.as_ref().map(|g| g.patcher.summary());
        self.recorder.publish(pipeline, read, self.pods.as_ref(), gate);
    }

    /// The running containers that requested a GPU, each judged now.
    fn judge_gpu_containers(&mut self, pipeline: &mut Pipeline) -> Vec<GpuContainer> {
        let (Some(check), Some(pods)) = (&mut self.never_initialized, &self.pods) else { return Vec::new() };
        let keys = self.last_gpu.iter().map(|(key, _)| key);
        check.judge(pods, pipeline.cgroups_mut(), keys, unix_now())
    }
}

/// The pods whose processes the kernel holds at a GPU runtime file it has
/// not seen until that file's probes exist (see `discovery::hold_scope`): canary
/// pods, whose new runtime file is the one a rollback decision rests on, and
/// with the readiness gate the pods that declare it; while containers that
/// request a GPU are checked for a GPU initialisation, the pods that request
/// one, whose first start-up call may be their only one.
pub struct HeldPods {
    pub hold: PodHold,
    pub pods: PodCache,
    pub rollouts: RolloutCache,
    pub gated: bool,
    /// The GPU resource names, with `--gpu-init-timeout` on.
    pub gpus: Option<GpuResources>,
}

impl HeldPods {
    pub fn refresh(&mut self, pipeline: &mut Pipeline) {
        let (rollouts, gated, gpus) = (&self.rollouts, self.gated, self.gpus.as_ref());
        let pods = self.pods.classify(|meta| {
            let canary = canary_reason(meta, Some(rollouts)).is_some();
            let asks_gpu = gpus.is_some_and(|gpus| {
                meta.extended_resources.values().any(|asked| gpus_requested(asked, gpus).is_some())
            });
            PodChoice { chosen: canary || (gated && meta.gate.is_some()) || asks_gpu, qos: meta.qos }
        });
        pipeline.hold_pods(&mut self.hold, &pods);
    }
}

fn readiness(metrics: &Metrics, pods: Option<&PodCache>) -> Option<String> {
    if !metrics.node.probes.iter().any(|p| p.attached) {
        return Some("no probe attached".into());
    }
    if let Some(p) = pods {
        if !p.is_synced() {
            return Some("pod cache not synced with the Kubernetes API yet".into());
        }
    }
    None
}
