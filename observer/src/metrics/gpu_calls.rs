//! The GPU call family's series: calls and durations per revision from the
//! kernel's aggregates, failures, init failures, stalled calls and driver
//! versions per pod.
use super::decl::{
    decl,
    Kind::{Counter, Gauge, Histogram},
    MetricDecl,
    Scope::{Revision, Workload},
};
use std::collections::BTreeMap;

use observer_common::{
    gpu::{is_init_function, Api, GpuStats, GpuStatsKey},
    LatencyHistogram,
};

use super::{
    context::{workload_values, Render},
    decl::View,
    families::FamilySet,
    revision::{owner_labels, revision_key, Retired},
    series::{OnNode, PodCounts, PodGauges},
};
use crate::{
    attribution::labels::WorkloadLabels,
    events::{function_name, result_name},
};

pub const GPU_API_CALLS: MetricDecl = decl(
    "gpu_api_calls_total",
    "GPU runtime API calls by result, per revision on this node (a failure's pod and container are in gpu_api_call_failures_total).",
    Counter,
    Revision,
    &["api", "function", "result"],
);
/// Per tier, not per function: a start-up calls twenty or more cold
/// functions, and a histogram each would cost a revision hundreds of series
/// (the per-pod view keeps the function).
pub const GPU_API_CALL_DURATION: MetricDecl = MetricDecl {
    per_pod_extra: Some(&["api", "function"]),
    ..decl(
        "gpu_api_call_duration_seconds",
        "Duration of GPU runtime API calls per revision on this node and tier (cold: init, allocation, synchronous copies and synchronisation; hot: launches, async copies), measured in the kernel; hot calls only where they are timed (--hot-detail timed).",
        Histogram,
        Revision,
        &["api", "tier"],
    )
};
pub const GPU_API_CALL_FAILURES: MetricDecl = decl(
    "gpu_api_call_failures_total",
    "GPU runtime API calls that returned an error, per pod and container, by result.",
    Counter,
    Workload,
    &["api", "function", "result"],
);
pub const GPU_INIT_FAILURES: MetricDecl = decl(
    "gpu_init_failures_total",
    "GPU runtime initialisation calls that failed (hipInit, cuInit, the CUDA runtime's cudaGetDeviceCount and cudaSetDevice, device and context setup).",
    Counter,
    Workload,
    &["api", "function", "result"],
);
pub const GPU_DRIVER_VERSION: MetricDecl = decl(
    "gpu_driver_version",
    "The CUDA version the GPU driver reported to the container's processes (cuDriverGetVersion or cudaDriverGetVersion), encoded as CUDA does: 1000 x major + 10 x minor, so 12020 is CUDA 12.2. Beside a cudaErrorInsufficientDriver init failure it tells a runtime newer than the driver from a missing device.",
    Gauge,
    Workload,
    &[],
);
pub const GPU_API_STALLED_CALLS: MetricDecl = decl(
    "gpu_api_stalled_calls",
    "GPU calls in flight longer than the stall threshold.",
    Gauge,
    Workload,
    &["api", "function"],
);

/// A failed call's (api, function, result) as the kernel numbers them.
type CallKey = (u32, u32, i32);

#[derive(Default)]
pub struct GpuCalls {
    /// The kernel's per-cgroup aggregates, sorted by key.
    stats: Vec<(GpuStatsKey, GpuStats)>,
    /// Failed calls per pod, from `stats`, kept through purges.
    failures: PodCounts<CallKey>,
    /// Failed init calls per pod: (api, function, result name).
    init_failures: PodCounts<(&'static str, String, String)>,
    /// Calls in flight past the stall threshold now.
    stalled: PodGauges<(&'static str, String)>,
    /// The driver version each cgroup's processes were told.
    driver_versions: PodGauges<()>,
}

impl GpuCalls {
    /// A failed init call (an event: counted as it comes).
    pub fn init_failed(&mut self, cgroup: u64, api: Api, function: &str, result: i32) {
        let name = result_name(api, result).map(str::to_string).unwrap_or_else(|| result.to_string());
        self.init_failures.add(cgroup, (api.as_str(), function.to_string(), name), 1);
    }

    /// The kernel's aggregates of admitted cgroups, sorted; whether they
    /// moved. Returns the cgroups whose processes called an init function.
    pub fn set_stats(&mut self, now: Vec<(GpuStatsKey, GpuStats)>) -> (bool, Vec<(u64, Api)>) {
        let mut initialised = Vec::new();
        let mut failures = BTreeMap::new();
        for (k, s) in &now {
            let Some(api) = Api::from_u32(k.api) else { continue };
            let init = api.functions().get(k.function as usize).is_some_and(|f| is_init_function(f.name));
            if init && s.count > 0 {
                initialised.push((k.cgroup_id, api));
            }
            if k.result != 0 {
                *failures.entry((k.cgroup_id, (k.api, k.function, k.result))).or_default() += s.count;
            }
        }
        let changed = self.failures.update(failures) | (now != self.stats);
        self.stats = now;
        (changed, initialised)
    }

    pub fn set_stalled(&mut self, now: BTreeMap<(u64, (&'static str, String)), f64>) -> bool {
        self.stalled.replace(now)
    }

    pub fn set_driver_versions(&mut self, now: BTreeMap<(u64, ()), f64>) -> bool {
        self.driver_versions.replace(now)
    }

    /// Hands a purged cgroup's counts to its revision and its pod.
    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels, retired: &mut Retired) {
        let key = revision_key(labels);
        retired.fold_gpu(&key, self.stats.iter().filter(|(k, _)| k.cgroup_id == cgroup));
        self.failures.retire(cgroup, labels);
        self.init_failures.retire(cgroup, labels);
        self.stats.retain(|(k, _)| k.cgroup_id != cgroup);
        self.stalled.forget(cgroup);
        self.driver_versions.forget(cgroup);
    }

    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.failures.keep_pods(on_node);
        self.init_failures.keep_pods(on_node);
    }

    /// Counters per result and durations per revision (the kernel keeps a
    /// histogram per result; they are merged here), failures per pod. Hot
    /// calls counted at return only add to the counters and have no
    /// durations.
    pub fn render_calls(&self, fams: &mut FamilySet, r: &Render) {
        let mut calls: BTreeMap<(u32, u32, u32, i32), u64> = BTreeMap::new();
        // Durations per tier when scraped, per function in the per-pod view.
        let mut durations: BTreeMap<(u32, u32, &'static str), LatencyHistogram> = BTreeMap::new();
        for (owner, k, s) in r.owners.owned(r.view, &self.stats, |k| k.cgroup_id, &r.retired.gpu) {
            *calls.entry((owner, k.api, k.function, k.result)).or_default() += s.count;
            if let (0, Some(api)) = (k.untimed, Api::from_u32(k.api)) {
                let function = api.functions().get(k.function as usize);
                let split = match r.view {
                    View::Scrape => function.map_or("unknown", |f| f.tier.as_str()),
                    View::PerPod => function.map_or("unknown", |f| f.name),
                };
                durations.entry((owner, k.api, split)).or_default().add(s);
            }
        }
        for ((owner, api, function, result), count) in &calls {
            let Some((api, function, result)) = named(*api, *function, *result) else { continue };
            let v = owner_labels(r.owners.get(*owner), r.view, &[api.as_str(), &function, &result]);
            fams.get(&GPU_API_CALLS).value(&v, *count as f64);
        }
        for ((owner, api, split), merged) in &durations {
            let Some(api) = Api::from_u32(*api) else { continue };
            let v = owner_labels(r.owners.get(*owner), r.view, &[api.as_str(), split]);
            fams.get(&GPU_API_CALL_DURATION).latency(&v, merged);
        }
        for ((labels, (api, function, result)), count) in self.failures.shown(r.series) {
            let Some((api, function, result)) = named(*api, *function, *result) else { continue };
            let v = workload_values(labels, &[api.as_str(), &function, &result]);
            fams.get(&GPU_API_CALL_FAILURES).value(&v, count as f64);
        }
    }

    /// Init failures, driver versions and stalled calls per pod.
    pub fn render_pod_state(&self, fams: &mut FamilySet, r: &Render) {
        for ((labels, (api, function, result)), n) in self.init_failures.shown(r.series) {
            fams.get(&GPU_INIT_FAILURES).value(&workload_values(labels, &[api, function, result]), n as f64);
        }
        for ((labels, ()), version) in self.driver_versions.shown(r.series) {
            fams.get(&GPU_DRIVER_VERSION).value(&workload_values(labels, &[]), version);
        }
        for ((labels, (api, function)), n) in self.stalled.shown(r.series) {
            fams.get(&GPU_API_STALLED_CALLS).value(&workload_values(labels, &[api, function]), n);
        }
    }
}

/// A kernel call key's API, function and result names; `None` for an API
/// this build does not know (a newer kernel side).
fn named(api: u32, function: u32, result: i32) -> Option<(Api, String, String)> {
    let api = Api::from_u32(api)?;
    let function = function_name(api, function);
    let result = result_name(api, result).map(str::to_string).unwrap_or_else(|| result.to_string());
    Some((api, function, result))
}
