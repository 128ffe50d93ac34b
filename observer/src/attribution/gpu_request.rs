//! What a pod's containers ask of the node's devices, and since when they
//! run: the pod-cache part of the check for containers that requested a GPU
//! and never initialised one.
//!
//! A GPU reaches a container as an *extended resource* (`nvidia.com/gpu`,
//! `amd.com/gpu`, ...), a name with a domain that a device plugin
//! advertises. The API server refuses a pod whose container requests one
//! without a limit, or with a request that differs from its limit (extended
//! resources cannot be overcommitted), so a container's limits say what it
//! got; its requests are read only for a resource its limits leave out,
//! which an API server never lets through. Only nonzero quantities are kept,
//! and only extended resources: `cpu`, `memory` and the other native
//! resources have no domain.
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::{
    api::core::v1::{Container, ContainerStatus, Pod},
    apimachinery::pkg::api::resource::Quantity,
};

use crate::config::GpuResources;

/// Per container name: the extended resources its limits (else requests)
/// ask for, name and quantity as written, in name order.
pub type ExtendedResources = BTreeMap<String, Vec<(String, String)>>;

/// The extended resources of the pod's containers and init containers
/// (a sidecar is an init container that keeps running); containers that
/// ask for none are left out.
pub fn extended_resources(pod: &Pod) -> ExtendedResources {
    let Some(spec) = &pod.spec else { return ExtendedResources::new() };
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    containers.filter_map(|c| Some((c.name.clone(), container_extended(c)?))).collect()
}

fn container_extended(container: &Container) -> Option<Vec<(String, String)>> {
    let resources = container.resources.as_ref()?;
    let empty = BTreeMap::new();
    let limits = resources.limits.as_ref().unwrap_or(&empty);
    let requests = resources.requests.as_ref().unwrap_or(&empty);
    let mut asked: BTreeMap<&String, &Quantity> = requests.iter().collect();
    // A limit is what the container got; it replaces any request.
    asked.extend(limits.iter());
    let kept: Vec<(String, String)> = asked
        .into_iter()
        .filter(|(name, q)| is_extended(name) && !is_zero(&q.0))
        .map(|(name, q)| (name.clone(), q.0.trim().to_string()))
        .collect();
    (!kept.is_empty()).then_some(kept)
}

/// An extended resource's name has a domain outside `kubernetes.io`, whose
/// names (`kubernetes.io/...`, `requests.*`) are the API's own.
fn is_extended(name: &str) -> bool {
    name.split_once('/').is_some_and(|(domain, _)| {
        !domain.is_empty() && domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io")
    })
}

/// Whether a quantity (`1`, `2k`, `0.5`, `1e3`, `500m`) is zero: every
/// digit of its number is. Its suffix only scales a number that is not.
fn is_zero(quantity: &str) -> bool {
    let q = quantity.trim().trim_start_matches(['+', '-']);
    let number: &str = q.split(|c: char| !(c.is_ascii_digit() || c == '.')).next().unwrap_or("");
    number.chars().any(|c| c.is_ascii_digit()) && number.chars().all(|c| c == '0' || c == '.')
}

/// Per container ID (runtime prefix stripped) of a container that asks for
/// extended resources and runs now: when it started (`state.running.
/// startedAt`, Unix seconds), as the kubelet reports it.
pub fn running_since(pod: &Pod, extended: &ExtendedResources) -> HashMap<String, i64> {
    let Some(status) = &pod.status else { return HashMap::new() };
    let lists = [&status.container_statuses, &status.init_container_statuses];
    lists
        .into_iter()
        .flatten()
        .flatten()
        .filter(|s| extended.contains_key(&s.name))
        .filter_map(running_instance)
        .collect()
}

fn running_instance(status: &ContainerStatus) -> Option<(String, i64)> {
    let started = status.state.as_ref()?.running.as_ref()?.started_at.as_ref()?;
    let id = status.container_id.as_deref()?;
    let id = id.split_once("://").map_or(id, |(_, rest)| rest).trim();
    (!id.is_empty()).then(|| (id.to_string(), started.0.as_second()))
}

/// The GPUs among `requested` (a container's extended resources), as a
/// person reads them: `nvidia.com/gpu: 1`, comma-separated; `None` when it
/// asks for none.
pub fn gpus_requested(requested: &[(String, String)], gpus: &GpuResources) -> Option<String> {
    let named: Vec<String> = requested
        .iter()
        .filter(|(name, _)| gpus.matches(name))
        .map(|(name, q)| format!("{name}: {q}"))
        .collect();
    (!named.is_empty()).then(|| named.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("valid Pod JSON")
    }

    const ID: &str = "4f1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c";

    fn gpu_pod() -> Pod {
        pod(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "infer-0", "namespace": "ml", "uid": "u1"},
            "spec": {
                "containers": [
                    {"name": "worker", "resources": {
                        "limits": {"nvidia.com/gpu": "1", "cpu": "4", "memory": "16Gi"},
                        "requests": {"nvidia.com/gpu": "1", "cpu": "2"}}},
                    {"name": "proxy", "resources": {"limits": {"cpu": "500m"}}},
                    {"name": "mig", "resources": {"limits": {"nvidia.com/mig-1g.5gb": "2", "example.com/fpga": "0"}}},
                    {"name": "bare"},
                ],
                "initContainers": [
                    {"name": "warmup", "restartPolicy": "Always",
                     "resources": {"requests": {"amd.com/gpu": "1"}}},
                ],
            },
            "status": {"containerStatuses": [
                {"name": "worker", "containerID": format!("containerd://{ID}"), "image": "", "imageID": "",
                 "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:00:10Z"}}},
                {"name": "proxy", "containerID": "containerd://p", "image": "", "imageID": "",
                 "ready": true, "restartCount": 0, "state": {"running": {"startedAt": "2026-01-01T00:00:10Z"}}},
                {"name": "mig", "containerID": "containerd://m", "image": "", "imageID": "",
                 "ready": false, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            ]},
        }))
    }

    #[test]
    fn limits_say_what_each_container_asked_for_and_native_resources_are_left_out() {
        let got = extended_resources(&gpu_pod());
        let want: ExtendedResources = [
            ("worker".to_string(), vec![("nvidia.com/gpu".to_string(), "1".to_string())]),
            ("mig".to_string(), vec![("nvidia.com/mig-1g.5gb".to_string(), "2".to_string())]),
            // Requests alone, which the API server refuses for an extended
            // resource, still say what was asked.
            ("warmup".to_string(), vec![("amd.com/gpu".to_string(), "1".to_string())]),
        ]
        .into();
        assert_eq!(got, want);
        assert!(extended_resources(&pod(serde_json::json!({"metadata": {"name": "x"}}))).is_empty());
    }

    #[test]
    fn a_limit_replaces_the_request_of_the_same_resource() {
        let p = pod(serde_json::json!({"spec": {"containers": [{"name": "c", "resources": {
            "limits": {"amd.com/gpu": "0"}, "requests": {"amd.com/gpu": "1"}}}]}}));
        assert!(extended_resources(&p).is_empty(), "the limit of 0 is what the container got");
    }

    #[test]
    fn zero_is_any_spelling_of_zero() {
        for zero in ["0", "0.0", "00", " 0 ", "0k", "0e3", "+0", "0m"] {
            assert!(is_zero(zero), "{zero}");
        }
        for some in ["1", "2k", "0.5", "1e3", "500m", "10", "1Ki", "not a number"] {
            assert!(!is_zero(some), "{some}");
        }
    }

    #[test]
    fn only_named_domains_are_extended_resources() {
        assert!(is_extended("nvidia.com/gpu") && is_extended("gpu.intel.com/i915"));
        for native in
            ["cpu", "memory", "hugepages-2Mi", "ephemeral-storage", "kubernetes.io/x", "a.kubernetes.io/y"]
        {
            assert!(!is_extended(native), "{native}");
        }
    }

    #[test]
    fn running_containers_with_extended_resources_carry_their_start() {
        let p = gpu_pod();
        let running = running_since(&p, &extended_resources(&p));
        // proxy asks for nothing; mig waits in back-off.
        assert_eq!(running, HashMap::from([(ID.to_string(), 1_767_225_610)]));
    }

    #[test]
    fn the_gpus_among_a_containers_resources_read_as_written() {
        let gpus = GpuResources::default();
        let ext = extended_resources(&gpu_pod());
        assert_eq!(gpus_requested(&ext["worker"], &gpus).as_deref(), Some("nvidia.com/gpu: 1"));
        assert_eq!(gpus_requested(&ext["mig"], &gpus).as_deref(), Some("nvidia.com/mig-1g.5gb: 2"));
        let fpga = vec![("example.com/fpga".to_string(), "1".to_string())];
        assert_eq!(gpus_requested(&fpga, &gpus), None);
        let with_fpga = GpuResources::with_extra(&["example.com/fpga".to_string()]).expect("valid");
        assert_eq!(gpus_requested(&fpga, &with_fpga).as_deref(), Some("example.com/fpga: 1"));
    }
}
