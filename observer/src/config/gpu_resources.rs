//! Which extended resources of a container's limits mean "a GPU" (`run
//! --gpu-resource`), and how long such a container may run without a
//! successful GPU initialisation (`run --gpu-init-timeout`).
use std::time::Duration;

use super::parse_duration;

/// The device plugins' resource names for GPUs: NVIDIA's whole GPUs and
/// MIG slices, AMD's GPUs and Intel's (`gpu.intel.com/i915`, `/xe`, and
/// their `millicores` and `memory.max` companions, which only come with a
/// GPU). A trailing `*` matches any rest of the name.
pub const DEFAULT_GPU_RESOURCES: [&str; 4] =
    ["nvidia.com/gpu", "nvidia.com/mig-*", "amd.com/gpu", "gpu.intel.com/*"];

/// How long a container that requested a GPU may run without a successful
/// GPU initialisation: a model server loads its weights onto the GPU in its
/// first minutes, while a framework that fell back to the CPU never does.
pub const DEFAULT_GPU_INIT_TIMEOUT: &str = "5m";

/// Resource-name patterns: exact names, or prefixes ending in `*`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuResources {
    patterns: Vec<String>,
}

impl Default for GpuResources {
    fn default() -> Self {
        Self { patterns: DEFAULT_GPU_RESOURCES.iter().map(|p| p.to_string()).collect() }
    }
}

impl GpuResources {
    /// The defaults and `extra` (each checked by [`parse_gpu_resource`]).
    pub fn with_extra(extra: &[String]) -> Result<Self, String> {
        let mut resources = Self::default();
        for pattern in extra {
            let pattern = parse_gpu_resource(pattern)?;
            if !resources.patterns.contains(&pattern) {
                resources.patterns.push(pattern);
            }
        }
        Ok(resources)
    }

    /// Whether the resource `name` (as in a pod's `resources.limits`) is a GPU.
    pub fn matches(&self, name: &str) -> bool {
        self.patterns.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == p,
        })
    }

    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

/// One `--gpu-resource` value: an extended resource name (`domain/name`,
/// as a device plugin advertises it), optionally ending in `*`.
pub fn parse_gpu_resource(text: &str) -> Result<String, String> {
    let pattern = text.trim();
    let Some((domain, name)) = pattern.split_once('/') else {
        return Err(format!(
            "`{pattern}` is not an extended resource name: use domain/name as the device plugin \
             advertises it (example.com/fpga), or a prefix ending in * (example.com/*)"
        ));
    };
    if domain.is_empty() || (name.is_empty() && !pattern.ends_with('*')) {
        return Err(format!("`{pattern}`: both the domain and the name are needed (example.com/fpga)"));
    }
    if pattern.trim_end_matches('*').contains('*') || pattern.ends_with("**") {
        return Err(format!("`{pattern}`: * may only end the name (example.com/gpu-*)"));
    }
    if let Some(bad) = pattern.chars().find(|c| !(c.is_ascii_alphanumeric() || "-._/*".contains(*c))) {
        return Err(format!("`{pattern}`: {bad:?} is in no resource name"));
    }
    Ok(pattern.to_string())
}

/// `--gpu-init-timeout`: `0` turns the check off; otherwise at least 1s.
pub fn parse_gpu_init_timeout(text: &str) -> Result<Option<Duration>, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Ok(None);
    }
    if d < Duration::from_secs(1) {
        return Err(format!("`{}` is shorter than 1s (0 turns the check off)", text.trim()));
    }
    Ok(Some(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_names_match_the_device_plugins_resources() {
        let r = GpuResources::default();
        for gpu in ["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.20gb", "amd.com/gpu"] {
            assert!(r.matches(gpu), "{gpu}");
        }
        assert!(r.matches("gpu.intel.com/i915") && r.matches("gpu.intel.com/xe"));
        for other in [
            "nvidia.com/gpux",
            "nvidia.com/gpu.shared",
            "amd.com/fpga",
            "cpu",
            "memory",
            "example.com/gpu",
            "",
        ] {
            assert!(!r.matches(other), "{other}");
        }
    }

    #[test]
    fn extra_names_add_to_the_defaults() {
        let extra = vec!["nvidia.com/gpu.shared".to_string(), " example.com/accel-* ".to_string()];
        let r = GpuResources::with_extra(&extra).expect("valid");
        assert!(r.matches("nvidia.com/gpu.shared") && r.matches("example.com/accel-a100"));
        assert!(r.matches("amd.com/gpu"), "the defaults stay");
        assert!(!r.matches("example.com/accel"), "the prefix is accel-");
        let twice = GpuResources::with_extra(&["amd.com/gpu".to_string()]).expect("valid");
        assert_eq!(twice, GpuResources::default());
    }

    #[test]
    fn bad_names_are_refused_with_the_fix() {
        for (bad, says) in [
            ("gpu", "domain/name"),
            ("/gpu", "both the domain and the name"),
            ("example.com/", "both the domain and the name"),
            ("example.com/*gpu", "* may only end"),
            ("example.com/g**", "* may only end"),
            ("example.com/g pu", "' '"),
        ] {
            let err = parse_gpu_resource(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert_eq!(parse_gpu_resource("example.com/*"), Ok("example.com/*".to_string()));
    }

    #[test]
    fn the_timeout_is_a_duration_or_zero_for_off() {
        assert_eq!(parse_gpu_init_timeout(DEFAULT_GPU_INIT_TIMEOUT), Ok(Some(Duration::from_secs(300))));
        assert_eq!(parse_gpu_init_timeout("0"), Ok(None));
        assert_eq!(parse_gpu_init_timeout("0s"), Ok(None));
        assert!(parse_gpu_init_timeout("500ms").expect_err("short").contains("0 turns the check off"));
        assert!(parse_gpu_init_timeout("soon").is_err());
    }
}
