//! Who an event belongs to: cgroup id -> cgroup path -> pod and container.
//!
//! Without Kubernetes the cgroup path and the process name stand in for the
//! pod; with it, pod metadata is joined on the pod UID parsed from the path.
#[expect(dead_code, reason = "wired into the daemon's pod attribution next")]
pub mod cgroup_path;
pub mod cgroups;
#[expect(dead_code, reason = "wired into the daemon next")]
pub mod kube;
pub mod labels;

pub use cgroups::CgroupResolver;
