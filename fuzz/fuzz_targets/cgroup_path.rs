//! `parse_pod_cgroup` on arbitrary text: the path comes from `/proc/PID/cgroup`
//! and the cgroup tree, both named by whoever creates cgroups on the node.
//!
//! Beyond "never panics", whatever parses must obey the module's documented
//! validation, and be built from the input rather than invented.
#![no_main]

use canaryscope_fuzz::cgroup_path::{parse_pod_cgroup, PodRef, Qos, Runtime};
use libfuzzer_sys::fuzz_target;

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

/// The UID is a canonical 8-4-4-4-12 UUID with dashes, or a static pod's
/// 32-hex config hash, and it is spelled in the input right after `pod`
/// (with `_` for `-` in systemd slices).
fn check_uid(input: &str, uid: &str) -> usize {
    let b = uid.as_bytes();
    match b.len() {
        36 => {
            for (i, &c) in b.iter().enumerate() {
                if [8, 13, 18, 23].contains(&i) {
                    assert_eq!(c, b'-', "uid {uid:?} separator at {i}");
                } else {
                    assert!(is_lower_hex(c), "uid {uid:?} not lowercase hex at {i}");
                }
            }
        }
        32 => assert!(b.iter().all(|&c| is_lower_hex(c)), "static uid {uid:?} not lowercase hex"),
        n => panic!("uid {uid:?} has length {n}"),
    }
    let dashed = format!("pod{uid}");
    let underscored = format!("pod{}", uid.replace('-', "_"));
    [input.find(&dashed), input.find(&underscored)]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or_else(|| panic!("uid {uid:?} is not in the input after `pod`"))
}

fn check(input: &str, p: &PodRef) {
    let pod_at = check_uid(input, &p.pod_uid);
    // The QoS class is read from the path, never assumed.
    match p.qos {
        Qos::Burstable => assert!(input.contains("burstable"), "Burstable without `burstable`"),
        Qos::BestEffort => assert!(input.contains("besteffort"), "BestEffort without `besteffort`"),
        Qos::Guaranteed => {}
    }
    let Some(c) = &p.container else { return };
    assert_eq!(c.id.len(), 64, "container id {:?} is not 64 long", c.id);
    assert!(c.id.bytes().all(is_lower_hex), "container id {:?} is not lowercase hex", c.id);
    // The container is at or below the pod: its id follows the pod's UID.
    let below = &input[pod_at..];
    assert!(below.contains(&c.id), "container id is not below the pod in the input");
    // The runtime is named by the prefix written right before the id.
    let prefix = match c.runtime {
        Runtime::Containerd => Some("cri-containerd"),
        Runtime::CriO => Some("crio"),
        Runtime::Docker => Some("docker"),
        Runtime::Unknown => None,
    };
    if let Some(prefix) = prefix {
        let dash = format!("{prefix}-{}", c.id);
        let colon = format!("{prefix}:{}", c.id);
        assert!(below.contains(&dash) || below.contains(&colon), "{:?} without its prefix", c.runtime);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else { return };
    let parsed = parse_pod_cgroup(input);
    if let Some(p) = &parsed {
        check(input, p);
    }

    // Levels above the kubelet's are ignored (nested nodes, --cgroup-root).
    // Only for inputs that the added levels cannot alter: leading whitespace
    // and a `0::` prefix are stripped only at the very start.
    if input.trim_start() == input && !input.starts_with("0::") {
        let nested = format!("/system.slice/docker-node.scope/kubelet.slice/{input}");
        assert_eq!(parse_pod_cgroup(&nested), parsed, "outer levels changed the result");
    }
    // Levels below the container (`init`, sub-cgroups of the workload)
    // attribute to the same container; trailing whitespace is trimmed only at
    // the very end, so such inputs are left out.
    if input.trim_end() == input {
        let deeper = format!("{input}/init");
        assert_eq!(parse_pod_cgroup(&deeper), parsed, "an inner level changed the result");
    }
});
