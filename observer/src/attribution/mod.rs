//! Who an event belongs to: cgroup id -> cgroup path -> pod and container.
//!
//! Without Kubernetes the cgroup path and the process name stand in for the
//! pod; with it, pod metadata is joined on the pod UID parsed from the path.
pub mod cgroup_path;
pub mod cgroups;
pub mod gpu_request;
#[cfg(test)]
pub mod kfd_tree;
pub mod kube;
pub mod label_names;
pub mod labels;
pub mod pod_meta;
pub mod rollouts;
pub mod vram_gpus;
pub mod vram_procs;
pub mod watch;

pub use cgroups::CgroupResolver;
