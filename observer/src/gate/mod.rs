//! The GPU-runtime readiness gate: for pods of this node that declare
//! `spec.readinessGates: [{conditionType: canaryscope.io/gpu-runtime}]`, a
//! pod condition of that type that says whether the pod's GPU runtime has
//! been seen to work. Kubernetes counts a pod ready only when every gate's
//! condition is `True`, so a pod whose runtime failed to start gets no
//! Service traffic (and, under Argo Rollouts, no canary weight).
//!
//! This module judges; [`patcher`] writes the judgement to the API server.
//!
//! # Evidence
//!
//! Successful calls are never events (that would cost a ring-buffer record
//! per call): the kernel counts them per cgroup, function and result. A
//! container *started up* once an init call, a device-count call and a
//! context creation or allocation all returned success in its cgroup, for
//! one API (HIP or the CUDA driver API). Trouble is an init failure (an
//! event), a GPU call stalled past the stall threshold (the in-flight scan)
//! or a crash inside a GPU runtime library (an event).
//!
//! Order matters: a pod stays `False` after trouble until a *later* start-up
//! succeeds. The kernel's counters carry no time, so when trouble arrives the
//! counters are read at once and kept as the container's baseline; a later
//! start-up is one whose three counts all exceed the baseline. A success that
//! raced the trouble into the same read counts as earlier, which errs on the
//! side of keeping the pod out of traffic.
//!
//! A container is known by its cgroup; its instances (a restarted container
//! gets a new cgroup) are grouped by container name, so a restart that starts
//! up clears the trouble of the instance before it.
//!
//! # Names
//!
//! The kubelet reports a container's ID only after the container started
//! (its relist runs every second), so a container that fails at once fails
//! before the pod cache can name it. Names are therefore looked up in the
//! pod cache each time the wanted condition is worked out (every refresh),
//! never kept from when the evidence came: until the cache names the
//! container, the message names its short ID; once it does, the wanted
//! message names the container, differs from the one written, and the
//! patcher rewrites the condition (its transition time moves only with its
//! status). The cache keeps every container ID a pod's status has named,
//! `lastState` included, so an instance whose ID has since left the status
//! keeps its name.
//!
//! # What is never done
//!
//! - A pod without the gate is never given the condition.
//! - Without new evidence there is no opinion, so a daemon restart, which
//!   forgets all evidence, never flips a `True` condition by itself.
//! - A pod that has not called the runtime gets no condition (Kubernetes
//!   keeps it unready), unless `--gate-timeout` is set and the pod has no
//!   condition yet: then `False`, `NoRuntimeActivity`.
//!
//! # A GPU requested, never initialised
//!
//! A container whose limits request a GPU and that runs `--gpu-init-timeout`
//! (5 minutes by default) without a successful GPU initialisation (see
//! `pipeline::never_initialized`) makes its pod `False`,
//! `GpuNeverInitialized`, whatever `--gate-timeout` says: it serves, from the
//! CPU. Only containers that started while the daemon ran are judged, so a
//! daemon restart flips nothing here either; trouble of the pod's own calls
//! is the more precise reason and comes first, and a later initialisation
//! ends it.
pub mod patcher;

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

use observer_common::gpu::{is_init_function, Api, GpuStatsKey};

use crate::{
    attribution::{
        cgroup_path::parse_pod_cgroup,
        kube::{container_name, PodMeta},
    },
    events::{result_name, signal_label, Detail, Event},
    gpu_library::candidate_api,
    pipeline::{never_initialized::GpuContainer, stalls::Stall},
};

pub const REASON_READY: &str = "RuntimeReady";
pub const REASON_INIT_FAILED: &str = "InitFailed";
pub const REASON_STALLED: &str = "CallStalled";
pub const REASON_CRASHED: &str = "RuntimeCrashed";
pub const REASON_NO_ACTIVITY: &str = "NoRuntimeActivity";
pub const REASON_STARTUP_INCOMPLETE: &str = "StartupIncomplete";
pub const REASON_LIBRARY_LOAD_FAILED: &str = "LibraryLoadFailed";
pub const REASON_NEVER_INITIALIZED: &str = "GpuNeverInitialized";

/// The condition the daemon wants a pod to have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Desired {
    pub fn status(&self) -> &'static str {
        if self.ready {
            "True"
        } else {
            "False"
        }
    }
}

/// The three steps of a start-up, as indexes into [`StepCounts`].
const INIT: usize = 0;
const DEVICE_COUNT: usize = 1;
const SETUP: usize = 2;

/// Successful calls per start-up step.
pub type StepCounts = [u64; 3];

/// Successful calls per cgroup and API, by start-up step.
pub type Counts = HashMap<(u64, Api), StepCounts>;

fn step_of(function: &str) -> Option<usize> {
    match function {
        // The CUDA runtime initialises on first use; binding a device is
        // its explicit step.
        "hipInit" | "cuInit" | "cudaSetDevice" | "cudaInitDevice" => Some(INIT),
        "hipGetDeviceCount" | "cuDeviceGetCount" | "cudaGetDeviceCount" => Some(DEVICE_COUNT),
        // A context, or memory on the device: the runtime has bound a GPU.
        "hipCtxCreate"
        | "hipMalloc"
        | "hipMallocManaged"
        | "hipMallocAsync"
        | "cuCtxCreate_v2"
        | "cuCtxCreate_v4"
        | "cuDevicePrimaryCtxRetain"
        | "cuMemAlloc_v2"
        | "cuMemAllocAsync"
        | "cudaMalloc"
        | "cudaMallocManaged"
        | "cudaMallocAsync" => Some(SETUP),
        _ => None,
    }
}

/// The successful start-up calls in the kernel's aggregates.
pub fn startup_counts<'a, S: StatCount + 'a>(
    stats: impl IntoIterator<Item = &'a (GpuStatsKey, S)>,
) -> Counts {
    let mut counts = Counts::new();
    for (key, stat) in stats {
        if key.result != 0 {
            continue;
        }
        let Some(api) = Api::from_u32(key.api) else { continue };
        let Some(f) = api.functions().get(key.function as usize) else { continue };
        if let Some(step) = step_of(f.name) {
            counts.entry((key.cgroup_id, api)).or_default()[step] += stat.count();
        }
    }
    counts
}

/// A kernel aggregate with a call count (so tests need no histograms).
pub trait StatCount {
    fn count(&self) -> u64;
}

impl StatCount for observer_common::gpu::GpuStats {
    fn count(&self) -> u64 {
        self.count
    }
}

impl StatCount for u64 {
    fn count(&self) -> u64 {
        *self
    }
}

/// Something that keeps a pod out of traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trouble {
    pub reason: &'static str,
    pub message: String,
    /// The API whose call it was, if a call.
    api: Option<Api>,
    /// When it was noted, in evidence order.
    seq: u64,
    /// An init failure beneath another layer counts from this instant on
    /// (see [`OUTER_CALL_SETTLE`]).
    settles_at: Option<Instant>,
}

/// How long an init failure of a lower layer waits for the call above it.
/// Under ZLUDA, `cuInit` fails because the `hipInit` it calls did, and the
/// CUDA runtime's `cudaGetDeviceCount` fails because `cuInit` did; the
/// lower failure returns first, and judging it at once would patch the pod
/// once per layer within a second.
pub const OUTER_CALL_SETTLE: Duration = Duration::from_millis(300);

impl Trouble {
    /// Whether `other`, noted while this trouble stands, should describe the
    /// container instead: a failure of the same kind one layer further out
    /// (the CUDA driver above HIP, the CUDA runtime above the driver). The
    /// outer call fails *because* the one below it did, and the outermost
    /// is the call the application made, the one its operators know.
    fn yields_to(&self, other: &Trouble) -> bool {
        self.reason == other.reason
            && matches!((self.api, other.api), (Some(inner), Some(outer)) if inner.is_beneath(outer))
    }
}

/// One container instance (one cgroup).
#[derive(Debug, Default)]
struct Instance {
    pod_uid: String,
    /// Full container ID from the cgroup path ("" for the pod's own cgroup).
    container_id: String,
    /// Evidence order of its latest completed start-up, and what started.
    ready: Option<(u64, String)>,
    trouble: Option<Trouble>,
    /// Start-up counts per API when the trouble was last seen.
    baseline: HashMap<Api, StepCounts>,
    /// Whether any GPU runtime call of it was seen.
    active: bool,
}

/// Judges gated pods from GPU evidence. Pure state: no I/O, no clock but
/// the one passed in.
pub struct Gate {
    timeout: Option<Duration>,
    /// [`OUTER_CALL_SETTLE`], shorter in tests.
    settle: Duration,
    /// Unix seconds when the daemon started; `--gate-timeout` counts from
    /// here at the earliest, since earlier activity was not seen.
    daemon_start: i64,
    instances: HashMap<u64, Instance>,
    seq: u64,
    /// Per pod UID, its containers that requested a GPU and are past
    /// `--gpu-init-timeout` without initialising one: name and message.
    never_initialized: HashMap<String, BTreeMap<String, String>>,
}

impl Gate {
    pub fn new(timeout: Option<Duration>, daemon_start: i64) -> Self {
        Self {
            timeout,
            settle: OUTER_CALL_SETTLE,
            daemon_start,
            instances: HashMap::new(),
            seq: 0,
            never_initialized: HashMap::new(),
        }
    }

    #[cfg(test)]
    fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// The instance of a cgroup below a pod, created on first sight.
    fn instance(&mut self, cgroup: u64, path: Option<&str>) -> Option<&mut Instance> {
        match self.instances.entry(cgroup) {
            std::collections::hash_map::Entry::Occupied(e) => Some(e.into_mut()),
            std::collections::hash_map::Entry::Vacant(e) => {
                let pod = parse_pod_cgroup(path?)?;
                let container_id = pod.container.map(|c| c.id).unwrap_or_default();
                Some(e.insert(Instance { pod_uid: pod.pod_uid, container_id, ..Instance::default() }))
            }
        }
    }

    /// What an event says, if it is trouble: an init failure, or a crash in
    /// a GPU runtime library or during a GPU call.
    pub fn trouble_of(event: &Event) -> Option<(&'static str, String, Option<Api>)> {
        match &event.detail {
            Detail::GpuCall { api, function, result, driver_version, .. }
                if *result != 0 && is_init_function(function) =>
            {
                let name = result_name(*api, *result).unwrap_or("unknown error");
                let mut message = format!("{function} returned {result} {name}");
                if let Some(v) = driver_version {
                    message.push_str(&format!(" (driver reports CUDA {})", crate::names::cuda_version(*v)));
                }
                Some((REASON_INIT_FAILED, message, Some(*api)))
            }
            Detail::Crash { signal, library, in_call, .. } => {
                let file = library.as_deref().map(|l| l.rsplit('/').next().unwrap_or(l));
                let in_gpu_library = file.and_then(candidate_api).is_some();
                if !in_gpu_library && in_call.is_none() {
                    return None;
                }
                let mut message = signal_label(*signal);
                if let Some(file) = file {
                    message.push_str(&format!(" in {file}"));
                }
                if let Some(call) = in_call {
                    message.push_str(&format!(" during {call}"));
                }
                Some((REASON_CRASHED, message, None))
            }
            // A framework that lost its GPU library falls back to the CPU:
            // it serves, slower by an order of magnitude or more.
            Detail::LibraryLoadFailed { library, missing, .. } => {
                let message = match missing.as_str() {
                    m if m == library => format!("dlopen of {library} failed: {library} not found"),
                    crate::discovery::load_failure::UNKNOWN => {
                        format!("dlopen of {library} failed (its dependencies were all found)")
                    }
                    m => format!("dlopen of {library} failed: {m} not found"),
                };
                Some((REASON_LIBRARY_LOAD_FAILED, message, None))
            }
            _ => None,
        }
    }

    /// Notes trouble in a cgroup. `counts` are the start-up counts read
    /// now, the baseline a later start-up must exceed.
    pub fn note_trouble(
        &mut self,
        cgroup: u64,
        path: Option<&str>,
        reason: &'static str,
        message: String,
        api: Option<Api>,
        counts: &Counts,
    ) {
        let seq = self.next_seq();
        // Only the outermost layer has no call above it to wait for.
        let beneath_another = api.is_some_and(|a| a != Api::Cudart);
        let settles_at =
            (beneath_another && reason == REASON_INIT_FAILED).then(|| Instant::now() + self.settle);
        let Some(instance) = self.instance(cgroup, path) else { return };
        instance.active = true;
        instance.baseline = Api::ALL
            .into_iter()
            .map(|a| (a, counts.get(&(cgroup, a)).copied().unwrap_or_default()))
            .collect();
        let new = Trouble { reason, message, api, seq, settles_at };
        match &instance.trouble {
            Some(old) if !old.yields_to(&new) => {}
            // Replacing keeps the original order: it is the same trouble.
            Some(old) => instance.trouble = Some(Trouble { seq: old.seq, ..new }),
            None => instance.trouble = Some(new),
        }
    }

    /// Stalled calls from the in-flight scan.
    pub fn note_stalls(
        &mut self,
        stalls: &[Stall],
        threshold: Duration,
        counts: &Counts,
        mut path: impl FnMut(u64) -> Option<String>,
    ) {
        for stall in stalls {
            let p = path(stall.cgroup_id);
            let message = format!(
                "{} has not returned within the stall threshold ({})",
                stall.function,
                short_duration(threshold)
            );
            self.note_trouble(
                stall.cgroup_id,
                p.as_deref(),
                REASON_STALLED,
                message,
                Some(stall.api),
                counts,
            );
        }
    }

    /// The kernel's start-up counts, read at a refresh: completes start-ups.
    pub fn note_counts(&mut self, counts: &Counts, mut path: impl FnMut(u64) -> Option<String>) {
        let mut cgroups: Vec<u64> = counts.keys().map(|(c, _)| *c).collect();
        cgroups.sort_unstable();
        cgroups.dedup();
        for cgroup in cgroups {
            let seq = self.seq + 1;
            let p = if self.instances.contains_key(&cgroup) { None } else { path(cgroup) };
            if !self.instances.contains_key(&cgroup) && p.as_deref().and_then(parse_pod_cgroup).is_none() {
                continue;
            }
            let Some(instance) = self.instance(cgroup, p.as_deref()) else { continue };
            instance.active = true;
            let started = Api::ALL.into_iter().find(|api| {
                let Some(now) = counts.get(&(cgroup, *api)) else { return false };
                let base = if instance.trouble.is_some() {
                    instance.baseline.get(api).copied().unwrap_or_default()
                } else {
                    [0; 3]
                };
                now.iter().zip(base).all(|(n, b)| *n > b)
            });
            let Some(api) = started else { continue };
            if instance.trouble.is_none() && instance.ready.is_some() {
                continue;
            }
            instance.trouble = None;
            let what = match api {
                Api::Hip => "hipInit, hipGetDeviceCount and a context or allocation call",
                Api::Cuda => "cuInit, cuDeviceGetCount and a context or allocation call",
                Api::Cudart => "cudaSetDevice, cudaGetDeviceCount and an allocation call",
            };
            instance.ready = Some((seq, what.to_string()));
            self.seq = seq;
        }
    }

    /// The running containers that requested a GPU, judged at this refresh
    /// against `timeout` (`--gpu-init-timeout`): those never initialised
    /// replace the ones before.
    pub fn note_gpu_containers(&mut self, containers: &[GpuContainer], timeout: Duration) {
        self.never_initialized.clear();
        for c in containers.iter().filter(|c| c.never_initialized) {
            let message = format!(
                "requested {} and made no successful GPU initialisation (cuInit, hipInit, \
                 cudaGetDeviceCount or another init call) within {} of its start",
                c.gpus,
                short_duration(timeout)
            );
            self.never_initialized.entry(c.pod_uid.clone()).or_default().insert(c.container.clone(), message);
        }
    }

    /// Forgets the instances for which `keep(cgroup, pod UID)` says no.
    pub fn retain(&mut self, mut keep: impl FnMut(u64, &str) -> bool) {
        self.instances.retain(|cgroup, i| keep(*cgroup, &i.pod_uid));
    }

    /// The condition pod `uid` should have, or `None` for no opinion.
    /// `now` is Unix seconds.
    pub fn desired(&self, uid: &str, meta: &PodMeta, now: i64) -> Option<Desired> {
        // Instances grouped by container name: a restarted container's new
        // instance answers for the old one.
        let mut groups: BTreeMap<String, Vec<&Instance>> = BTreeMap::new();
        for instance in self.instances.values().filter(|i| i.pod_uid == uid) {
            let name = container_name(meta, &instance.container_id)
                .map(str::to_string)
                .unwrap_or_else(|| instance.container_id.clone());
            groups.entry(name).or_default().push(instance);
        }
        let mut worst: Option<(&String, &Trouble)> = None;
        let mut ready: Option<(&String, &str)> = None;
        for (name, instances) in &groups {
            let latest_ready = instances.iter().filter_map(|i| i.ready.as_ref()).max_by_key(|(seq, _)| *seq);
            let after = latest_ready.map_or(0, |(seq, _)| *seq);
            let now = Instant::now();
            let trouble = instances
                .iter()
                .filter_map(|i| i.trouble.as_ref())
                .filter(|t| t.seq > after && t.settles_at.is_none_or(|at| at <= now))
                .min_by_key(|t| t.seq);
            match trouble {
                Some(t) => {
                    if worst.is_none_or(|(_, w)| t.seq < w.seq) {
                        worst = Some((name, t));
                    }
                }
                None => {
                    if let (None, Some((_, what))) = (ready, latest_ready) {
                        ready = Some((name, what));
                    }
                }
            }
        }
        if let Some((name, t)) = worst {
            return Some(Desired {
                ready: false,
                reason: t.reason,
                message: format!("container {}: {}", display_name(name), t.message),
            });
        }
        // A container that started up before may have been restarted into
        // one that never initialises: it serves from the CPU now.
        if let Some((name, message)) = self.never_initialized.get(uid).and_then(|c| c.iter().next()) {
            return Some(Desired {
                ready: false,
                reason: REASON_NEVER_INITIALIZED,
                message: format!("container {name}: {message}"),
            });
        }
        if let Some((name, what)) = ready {
            return Some(Desired {
                ready: true,
                reason: REASON_READY,
                message: format!("container {}: {what} succeeded", display_name(name)),
            });
        }
        self.timed_out(meta, groups.values().flatten().any(|i| i.active), now)
    }

    /// `--gate-timeout` for a pod without a start-up or trouble: only while
    /// the pod has no condition, or one this timeout set.
    fn timed_out(&self, meta: &PodMeta, active: bool, now: i64) -> Option<Desired> {
        let timeout = self.timeout?;
        let gated = meta.gate.as_ref()?;
        if let Some(c) = &gated.condition {
            if c.reason != REASON_NO_ACTIVITY && c.reason != REASON_STARTUP_INCOMPLETE {
                return None;
            }
        }
        let since = gated.started_at.unwrap_or(self.daemon_start).max(self.daemon_start);
        if now.saturating_sub(since) < timeout.as_secs() as i64 {
            return None;
        }
        Some(if active {
            Desired {
                ready: false,
                reason: REASON_STARTUP_INCOMPLETE,
                message: format!(
                    "GPU runtime calls seen, but no completed start-up (init, device count and a context or \
                     allocation) within {}",
                    short_duration(timeout)
                ),
            }
        } else {
            Desired {
                ready: false,
                reason: REASON_NO_ACTIVITY,
                message: format!("no GPU runtime call seen within {}", short_duration(timeout)),
            }
        })
    }
}

fn display_name(name: &str) -> &str {
    if name.is_empty() {
        "(pod cgroup)"
    } else if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        // A container the API has not named yet: its short ID.
        &name[..12]
    } else {
        name
    }
}

/// `1m30s`, `10s`, `500ms`: durations as the flags take them.
pub fn short_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        return format!("{ms}ms");
    }
    let s = d.as_secs();
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        attribution::kube::{GateCondition, GatedPod},
        events::Origin,
    };

    const UID: &str = "5f0c1d2e-3a4b-4c5d-8e6f-708192a3b4c5";
    const CID_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const CID_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

    fn path(cid: &str) -> String {
        format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cid}.scope",
            UID.replace('-', "_")
        )
    }

    fn meta() -> PodMeta {
        PodMeta {
            uid: UID.into(),
            name: "worker-0".into(),
            containers: [
                (CID_A.to_string(), "worker".to_string()),
                (CID_B.to_string(), "worker".to_string()),
            ]
            .into(),
            gate: Some(GatedPod { condition: None, resource_version: "1".into(), started_at: Some(1000) }),
            ..PodMeta::default()
        }
    }

    fn counts(cgroup: u64, api: Api, c: StepCounts) -> Counts {
        [((cgroup, api), c)].into()
    }

    fn paths(id: u64) -> Option<String> {
        Some(path(if id == 1 { CID_A } else { CID_B }))
    }

    fn init_failure(api: Api, function: &str, result: i32) -> Event {
        Event {
            origin: Origin { cgroup_id: 1, cgroup: Some(path(CID_A)), ..Origin::default() },
            detail: Detail::GpuCall {
                api,
                library: "libcuda.so.1".into(),
                function: function.into(),
                result,
                duration_ns: Some(1),
                driver_version: None,
            },
        }
    }

    fn note(gate: &mut Gate, event: &Event, counts: &Counts) {
        let (reason, message, api) = Gate::trouble_of(event).expect("trouble");
        gate.note_trouble(
            event.origin.cgroup_id,
            event.origin.cgroup.as_deref(),
            reason,
            message,
            api,
            counts,
        );
    }

    #[test]
    fn start_up_needs_init_device_count_and_setup_in_one_api() {
        let mut gate = Gate::new(None, 0);
        assert_eq!(gate.desired(UID, &meta(), 2000), None, "no activity, no opinion");
        gate.note_counts(&counts(1, Api::Cuda, [1, 1, 0]), paths);
        assert_eq!(gate.desired(UID, &meta(), 2000), None, "no context or allocation yet");
        let mut mixed = counts(1, Api::Cuda, [1, 1, 0]);
        mixed.insert((1, Api::Hip), [0, 0, 1]);
        gate.note_counts(&mixed, paths);
        assert_eq!(gate.desired(UID, &meta(), 2000), None, "steps of different APIs are no start-up");
        gate.note_counts(&counts(1, Api::Cuda, [1, 1, 1]), paths);
        let d = gate.desired(UID, &meta(), 2000).expect("ready");
        assert_eq!((d.ready, d.reason), (true, REASON_READY));
        assert!(d.message.starts_with("container worker: cuInit, cuDeviceGetCount"), "{}", d.message);
    }

    #[test]
    fn init_failure_names_the_cuda_call_and_stays_until_a_later_start_up() {
        let mut gate = Gate::new(None, 0).with_settle(Duration::from_secs(3600));
        let none = Counts::new();
        // ZLUDA's cuInit fails because hipInit below it did: the HIP failure
        // comes first and waits for it; the CUDA one names the condition.
        note(&mut gate, &init_failure(Api::Hip, "hipInit", 101), &none);
        assert_eq!(gate.desired(UID, &meta(), 2000), None, "a HIP init failure waits for the CUDA call");
        note(&mut gate, &init_failure(Api::Cuda, "cuInit", 101), &none);
        assert_eq!(
            gate.desired(UID, &meta(), 2000),
            None,
            "a driver init failure waits for the runtime's call"
        );
        // The CUDA runtime's call, the application's own, fails last and
        // names the condition at once; a lower failure after it changes
        // nothing.
        note(&mut gate, &init_failure(Api::Cudart, "cudaGetDeviceCount", 100), &none);
        note(&mut gate, &init_failure(Api::Hip, "hipGetDeviceCount", 100), &none);
        let d = gate.desired(UID, &meta(), 2000).expect("failed");
        assert_eq!((d.ready, d.reason), (false, REASON_INIT_FAILED));
        assert_eq!(d.message, "container worker: cudaGetDeviceCount returned 100 cudaErrorNoDevice");

        // Counts already there when the failure was noted are no later start-up.
        let before = counts(1, Api::Cuda, [2, 2, 2]);
        note(&mut gate, &init_failure(Api::Cuda, "cuInit", 101), &before);
        gate.note_counts(&before, paths);
        assert_eq!(gate.desired(UID, &meta(), 2000).map(|d| d.reason), Some(REASON_INIT_FAILED));
        // One more init and device count, but no allocation: still failed.
        gate.note_counts(&counts(1, Api::Cuda, [3, 3, 2]), paths);
        assert_eq!(gate.desired(UID, &meta(), 2000).map(|d| d.reason), Some(REASON_INIT_FAILED));
        gate.note_counts(&counts(1, Api::Cuda, [3, 3, 3]), paths);
        assert_eq!(gate.desired(UID, &meta(), 2000).map(|d| d.ready), Some(true));
    }

    #[test]
    fn a_runtime_newer_than_the_driver_says_what_the_driver_reports() {
        let mut gate = Gate::new(None, 0);
        let mut failure = init_failure(Api::Cudart, "cudaGetDeviceCount", 35);
        if let Detail::GpuCall { driver_version, .. } = &mut failure.detail {
            *driver_version = Some(12020);
        }
        note(&mut gate, &failure, &Counts::new());
        let d = gate.desired(UID, &meta(), 2000).expect("failed");
        assert_eq!((d.ready, d.reason), (false, REASON_INIT_FAILED));
        assert_eq!(
            d.message,
            "container worker: cudaGetDeviceCount returned 35 cudaErrorInsufficientDriver (driver reports CUDA 12.2)"
        );
    }

    #[test]
    fn a_restarted_container_that_starts_up_clears_its_predecessor() {
        let mut gate = Gate::new(None, 0);
        let crash = Event {
            origin: Origin { cgroup_id: 1, cgroup: Some(path(CID_A)), ..Origin::default() },
            detail: Detail::Crash {
                signal: 11,
                si_code: 1,
                addr: 16,
                ip: 0,
                library: Some("/opt/zluda/libcuda.so.1".into()),
                library_offset: None,
                in_call: Some("cuLaunchKernel".into()),
                crash_tid: 1,
            },
        };
        gate.note_counts(&counts(1, Api::Cuda, [1, 1, 1]), paths);
        note(&mut gate, &crash, &counts(1, Api::Cuda, [1, 1, 1]));
        let d = gate.desired(UID, &meta(), 2000).expect("crashed");
        assert_eq!(d.reason, REASON_CRASHED);
        assert_eq!(d.message, "container worker: SIGSEGV in libcuda.so.1 during cuLaunchKernel");
        gate.note_counts(&counts(2, Api::Cuda, [1, 1, 1]), paths);
        assert_eq!(gate.desired(UID, &meta(), 2000).map(|d| d.ready), Some(true));
    }

    #[test]
    fn a_container_the_cache_names_late_is_renamed_in_the_message() {
        let mut gate = Gate::new(None, 0);
        note(&mut gate, &init_failure(Api::Cudart, "cudaGetDeviceCount", 100), &Counts::new());
        let mut unnamed = meta();
        unnamed.containers.clear();
        let d = gate.desired(UID, &unnamed, 2000).expect("failed");
        assert_eq!(
            d.message,
            format!("container {}: cudaGetDeviceCount returned 100 cudaErrorNoDevice", &CID_A[..12])
        );
        let d = gate.desired(UID, &meta(), 2000).expect("failed");
        assert_eq!(d.message, "container worker: cudaGetDeviceCount returned 100 cudaErrorNoDevice");
    }

    #[test]
    fn a_hip_init_failure_alone_counts_once_settled() {
        let mut gate = Gate::new(None, 0).with_settle(Duration::ZERO);
        note(&mut gate, &init_failure(Api::Hip, "hipInit", 101), &Counts::new());
        let d = gate.desired(UID, &meta(), 2000).expect("failed");
        assert_eq!(d.message, "container worker: hipInit returned 101 hipErrorInvalidDevice");
    }

    #[test]
    fn a_crash_outside_gpu_code_is_no_trouble() {
        let crash = Event {
            origin: Origin::default(),
            detail: Detail::Crash {
                signal: 11,
                si_code: 1,
                addr: 16,
                ip: 0,
                library: Some("/usr/lib/libpython3.11.so".into()),
                library_offset: None,
                in_call: None,
                crash_tid: 1,
            },
        };
        assert_eq!(Gate::trouble_of(&crash), None);
        assert_eq!(Gate::trouble_of(&init_failure(Api::Cuda, "cuLaunchKernel", 1)), None);
    }

    #[test]
    fn the_timeout_applies_only_to_pods_without_a_condition() {
        let mut gate = Gate::new(Some(Duration::from_secs(60)), 500);
        let pod = meta();
        assert_eq!(gate.desired(UID, &pod, 1059), None);
        let d = gate.desired(UID, &pod, 1060).expect("timed out");
        assert_eq!((d.ready, d.reason), (false, REASON_NO_ACTIVITY));
        assert_eq!(d.message, "no GPU runtime call seen within 1m");
        // A condition from before a daemon restart stays as it is.
        let mut kept = pod.clone();
        if let Some(g) = kept.gate.as_mut() {
            g.condition = Some(GateCondition {
                status: "True".into(),
                reason: REASON_READY.into(),
                ..Default::default()
            });
        }
        assert_eq!(gate.desired(UID, &kept, 5000), None);
        // Calls, but no complete start-up.
        gate.note_counts(&counts(1, Api::Cuda, [1, 0, 0]), paths);
        assert_eq!(gate.desired(UID, &pod, 1060).map(|d| d.reason), Some(REASON_STARTUP_INCOMPLETE));
        // The daemon started after the pod: the timeout counts from its start.
        let late = Gate::new(Some(Duration::from_secs(60)), 2000);
        assert_eq!(late.desired(UID, &pod, 2059), None);
    }

    fn gpu_container(never_initialized: bool) -> GpuContainer {
        GpuContainer {
            pod_uid: UID.into(),
            container: "worker".into(),
            cgroup: 2,
            gpus: "nvidia.com/gpu: 1".into(),
            never_initialized,
        }
    }

    #[test]
    fn a_gpu_container_never_initialised_has_a_reason_of_its_own_without_a_gate_timeout() {
        let mut gate = Gate::new(None, 0);
        let timeout = Duration::from_secs(300);
        gate.note_gpu_containers(&[gpu_container(false)], timeout);
        assert_eq!(gate.desired(UID, &meta(), 2000), None, "within its timeout: no opinion");
        gate.note_gpu_containers(&[gpu_container(true)], timeout);
        let d = gate.desired(UID, &meta(), 2000).expect("never initialised");
        assert_eq!((d.ready, d.reason), (false, REASON_NEVER_INITIALIZED));
        assert_eq!(
            d.message,
            "container worker: requested nvidia.com/gpu: 1 and made no successful GPU initialisation \
             (cuInit, hipInit, cudaGetDeviceCount or another init call) within 5m of its start"
        );
        assert_eq!(gate.desired("another-pod", &meta(), 2000), None);
        // An earlier instance's start-up does not speak for this one.
        gate.note_counts(&counts(1, Api::Cuda, [1, 1, 1]), paths);
        assert_eq!(gate.desired(UID, &meta(), 2000).map(|d| d.reason), Some(REASON_NEVER_INITIALIZED));
        // The pod's own failed call says more.
        note(&mut gate, &init_failure(Api::Cudart, "cudaGetDeviceCount", 100), &Counts::new());
        assert_eq!(gate.desired(UID, &meta(), 2000).map(|d| d.reason), Some(REASON_INIT_FAILED));
        // Initialised at last: the next refresh no longer names it.
        let mut gate = Gate::new(None, 0);
        gate.note_gpu_containers(&[gpu_container(true)], timeout);
        gate.note_gpu_containers(&[gpu_container(false)], timeout);
        assert_eq!(gate.desired(UID, &meta(), 2000), None);
    }

    #[test]
    fn durations_read_as_flags_take_them() {
        assert_eq!(short_duration(Duration::from_secs(10)), "10s");
        assert_eq!(short_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(short_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(short_duration(Duration::from_secs(7200)), "2h");
    }
}
