//! Attribution of a cgroup v2 path to a Kubernetes pod and container.
//!
//! The input is a path relative to the cgroup2 root, as in the `0::` line of
//! `/proc/<pid>/cgroup` or a directory found by walking `/sys/fs/cgroup`. The
//! kubelet and the container runtime lay these paths out in one of two ways,
//! depending on the cgroup driver.
//!
//! # systemd driver
//!
//! Every level is a systemd unit. A slice's name repeats its parents' names
//! joined with `-`, so the kubelet writes the pod UID with `_` in place of `-`.
//! Guaranteed pods sit directly under `kubepods.slice`:
//!
//! ```text
//! /kubepods.slice/kubepods-pod1c0a2b3e_4f5d_6789_abcd_ef0123456789.slice/cri-containerd-<id>.scope
//! /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope
//! /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/crio-<id>.scope
//! /kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/crio-conmon-<id>.scope
//! /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/docker-<id>.scope
//! ```
//!
//! The scope prefix names the runtime: `cri-containerd-` for containerd,
//! `crio-` for CRI-O and `docker-` for dockerd (cri-dockerd). `crio-conmon-`
//! is CRI-O's per-container monitor process, not a workload. With crun, CRI-O
//! may put the container's processes one level lower, in
//! `crio-<id>.scope/container`.
//!
//! When containerd runs with `SystemdCgroup = false` under a kubelet that
//! uses the systemd driver, runc takes the colon-separated systemd cgroup
//! path literally. One directory then holds both the pod and the container,
//! below containerd's own cgroup:
//!
//! ```text
//! /system.slice/containerd.service/kubepods-burstable-pod<uid_>.slice:cri-containerd:<id>
//! ```
//!
//! # cgroupfs driver
//!
//! Plain directories, with the UID keeping its dashes. The container
//! directory is the bare ID for containerd and dockerd, and `crio-<id>` (or
//! `crio-conmon-<id>`) for CRI-O:
//!
//! ```text
//! /kubepods/pod1c0a2b3e-4f5d-6789-abcd-ef0123456789/<id>
//! /kubepods/burstable/pod<uid->/<id>
//! /kubepods/besteffort/pod<uid->/crio-<id>
//! ```
//!
//! # Nesting
//!
//! The kubelet's `--cgroup-root`, and nodes that run inside a container (kind,
//! k3d, k3s in docker), add levels above `kubepods`. Seen from the host:
//!
//! ```text
//! /system.slice/docker-<node>.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod<uid_>.slice/cri-containerd-<id>.scope
//! /kubelet/kubepods/burstable/pod<uid->/<id>
//! ```
//!
//! The parser therefore does not anchor at the root. It looks for the
//! **first** (outermost) segment that is a pod cgroup in the kubelet's layout,
//! and takes the container from the segment directly below it. Levels above
//! the pod are ignored, including the node container's own
//! `docker-<node>.scope`. Levels below the container (`init`, `container`, or
//! sub-cgroups that a workload creates) still attribute to that container.
//! Outermost wins so that a cluster running inside a pod (kind in CI) is
//! attributed to the host pod, the one this node's kubelet knows.
//!
//! # What is validated
//!
//! - The pod UID must be a canonical UUID: 32 lowercase hex digits in 8-4-4-4-12
//!   groups, separated by `_` in systemd slices and by `-` in cgroupfs. It is
//!   returned with dashes. A static pod's UID is also accepted: the kubelet
//!   sets it to the hex MD5 of the manifest (32 hex digits, no dashes), and it
//!   is returned unchanged. That value equals the mirror pod's
//!   `kubernetes.io/config.hash` annotation, not the mirror pod's
//!   `metadata.uid`.
//! - The container ID must be exactly 64 lowercase hex digits. containerd,
//!   CRI-O and dockerd all name cgroups with the full ID. The 12-character form
//!   is only a CLI abbreviation and never appears in the cgroup tree, so
//!   accepting shorter IDs would gain nothing. It would, however, turn other
//!   names into IDs that match nothing in the pod status.
//! - A QoS class must be recognisable: either from the pod slice's name, or,
//!   for cgroupfs, from the parent directories (`kubepods`,
//!   `kubepods/burstable`, `kubepods/besteffort`). A `pod<uid>` directory
//!   anywhere else is not a kubelet pod cgroup.
//!
//! A path that has a pod but no recognisable container below it yields
//! `container: None`, so the process is still attributed to the pod. This
//! covers the pod-level cgroup itself, `crio-conmon-<id>` and any unknown
//! child. The pod sandbox (pause) container cannot be told apart from the
//! others by its path; callers match its ID against the CRI sandbox ID.
//!
//! Parsing never panics, on any input: it works on bytes, with checked
//! lengths, in time linear in the input.

/// A pod, and possibly one of its containers, identified from a cgroup path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    /// Pod UID with dashes, e.g. `1c0a2b3e-4f5d-6789-abcd-ef0123456789`; for a
    /// static pod, the 32-hex config hash as the kubelet spells it.
    pub pod_uid: String,
    pub qos: Qos,
    /// `None` for the pod-level cgroup, CRI-O's conmon, or an unrecognised
    /// child of the pod cgroup.
    pub container: Option<ContainerRef>,
}

/// Kubernetes QoS class, as in the pod's `status.qosClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Qos {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// A container cgroup below a pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ContainerRef {
    pub runtime: Runtime,
    /// Full container ID, 64 lowercase hex digits.
    pub id: String,
}

/// The container runtime, as far as the cgroup name tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    Containerd,
    CriO,
    Docker,
    /// A bare ID (cgroupfs layout of containerd or dockerd) or an unknown
    /// prefix.
    Unknown,
}

/// Parses a cgroup v2 path (see the module documentation for the layouts).
///
/// Leading and trailing whitespace, a `0::` prefix (the form of a
/// `/proc/<pid>/cgroup` line), repeated and trailing slashes, and any levels
/// above the kubelet's are tolerated. Returns `None` when the path contains no
/// pod cgroup.
pub fn parse_pod_cgroup(path: &str) -> Option<PodRef> {
    let path = path.trim();
    let path = path.strip_prefix("0::").unwrap_or(path);
    let mut segments = path.split('/').filter(|s| !s.is_empty());
    let mut parent: Option<&str> = None;
    let mut grandparent: Option<&str> = None;
    while let Some(segment) = segments.next() {
        if let Some(pod) = pod_segment(segment, parent, grandparent) {
            let container = match pod.container {
                ContainerSource::Inline(container) => container,
                ContainerSource::NextSegment => segments.next().and_then(container_segment),
            };
            return Some(PodRef { pod_uid: pod.uid, qos: pod.qos, container });
        }
        grandparent = parent;
        parent = Some(segment);
    }
    None
}

/// A segment recognised as a pod cgroup.
struct PodSegment {
    uid: String,
    qos: Qos,
    container: ContainerSource,
}

/// Where the container of a pod segment comes from.
enum ContainerSource {
    /// The next path segment (the usual layouts).
    NextSegment,
    /// The pod segment itself (the colon form), with its container if that
    /// part parsed.
    Inline(Option<ContainerRef>),
}

fn pod_segment(segment: &str, parent: Option<&str>, grandparent: Option<&str>) -> Option<PodSegment> {
    // Colon form: `<pod slice>:<runtime prefix>:<id>`.
    if let Some((slice, rest)) = segment.split_once(':') {
        let (uid, qos) = systemd_pod_slice(slice)?;
        let container = rest.split_once(':').and_then(|(prefix, id)| container_from_parts(prefix, id));
        return Some(PodSegment { uid, qos, container: ContainerSource::Inline(container) });
    }
    let (uid, qos) = systemd_pod_slice(segment).or_else(|| cgroupfs_pod_dir(segment, parent, grandparent))?;
    Some(PodSegment { uid, qos, container: ContainerSource::NextSegment })
}

/// `kubepods[-<qos>]-pod<uid_with_underscores>.slice`, possibly with more
/// leading levels (`kubelet-kubepods-...`).
fn systemd_pod_slice(segment: &str) -> Option<(String, Qos)> {
    let name = segment.strip_suffix(".slice")?.as_bytes();
    // A canonical UID (36 bytes) or a static pod's hash (32 bytes) ends the name.
    [36usize, 32].iter().find_map(|&uid_len| {
        let split = name.len().checked_sub(uid_len)?;
        let (head, uid) = name.split_at(split);
        let head = head.strip_suffix(b"pod")?;
        let uid = parse_uid(uid, b'_')?;
        Some((uid, qos_from_slice_head(head)?))
    })
}

/// The part of a pod slice's name before `pod`: `kubepods-`,
/// `kubepods-burstable-` or `kubepods-besteffort-`, each possibly preceded by
/// further `<level>-` prefixes.
fn qos_from_slice_head(head: &[u8]) -> Option<Qos> {
    let head = head.strip_suffix(b"-")?;
    let (rest, qos) = if let Some(rest) = head.strip_suffix(b"-burstable") {
        (rest, Qos::Burstable)
    } else if let Some(rest) = head.strip_suffix(b"-besteffort") {
        (rest, Qos::BestEffort)
    } else {
        (head, Qos::Guaranteed)
    };
    // `kubepods` itself, or `<level>-kubepods` with a non-empty level.
    let under_kubepods =
        rest == b"kubepods" || (rest.len() > b"-kubepods".len() && rest.ends_with(b"-kubepods"));
    under_kubepods.then_some(qos)
}

/// `pod<uid-with-dashes>` directly below `kubepods`, `kubepods/burstable` or
/// `kubepods/besteffort`.
fn cgroupfs_pod_dir(segment: &str, parent: Option<&str>, grandparent: Option<&str>) -> Option<(String, Qos)> {
    let uid = segment.strip_prefix("pod")?;
    let qos = match (grandparent, parent) {
        (_, Some("kubepods")) => Qos::Guaranteed,
        (Some("kubepods"), Some("burstable")) => Qos::Burstable,
        (Some("kubepods"), Some("besteffort")) => Qos::BestEffort,
        _ => return None,
    };
    Some((parse_uid(uid.as_bytes(), b'-')?, qos))
}

/// A canonical UID with `sep` between its 8-4-4-4-12 groups (returned with
/// dashes), or a static pod's 32-hex hash (returned as is).
fn parse_uid(uid: &[u8], sep: u8) -> Option<String> {
    const SEPARATORS: [usize; 4] = [8, 13, 18, 23];
    match uid.len() {
        36 => {
            let well_formed =
                uid.iter().enumerate().all(
                    |(i, &b)| {
                        if SEPARATORS.contains(&i) {
                            b == sep
                        } else {
                            is_lower_hex(b)
                        }
                    },
                );
            well_formed.then(|| uid.iter().map(|&b| if b == sep { '-' } else { char::from(b) }).collect())
        }
        32 => uid.iter().all(|&b| is_lower_hex(b)).then(|| uid.iter().map(|&b| char::from(b)).collect()),
        _ => None,
    }
}

/// The segment directly below a pod cgroup.
fn container_segment(segment: &str) -> Option<ContainerRef> {
    let name = segment.strip_suffix(".scope").unwrap_or(segment);
    if is_container_id(name) {
        return Some(ContainerRef { runtime: Runtime::Unknown, id: name.to_owned() });
    }
    let (prefix, id) = name.rsplit_once('-')?;
    container_from_parts(prefix, id)
}

/// `prefix` is the runtime part of `<prefix>-<id>` or `<prefix>:<id>`.
fn container_from_parts(prefix: &str, id: &str) -> Option<ContainerRef> {
    if !is_container_id(id) {
        return None;
    }
    let runtime = match prefix {
        "cri-containerd" => Runtime::Containerd,
        "crio" => Runtime::CriO,
        "docker" => Runtime::Docker,
        // CRI-O's monitor (`crio-conmon-<id>`) and its kin are not workloads.
        p if p.contains("conmon") => return None,
        p if !p.is_empty()
            && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_') =>
        {
            Runtime::Unknown
        }
        _ => return None,
    };
    Some(ContainerRef { runtime, id: id.to_owned() })
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(is_lower_hex)
}

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1c0a2b3e-4f5d-6789-abcd-ef0123456789";
    const UID_SYSTEMD: &str = "1c0a2b3e_4f5d_6789_abcd_ef0123456789";
    /// A static pod's UID: hex MD5 of the manifest (kube-apiserver, etcd...).
    const STATIC_UID: &str = "7c8d3e5f1a2b3c4d5e6f708192a3b4c5";
    const CID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const CID2: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
    const NODE: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

    fn pod(uid: &str, qos: Qos, container: Option<(Runtime, &str)>) -> Option<PodRef> {
        Some(PodRef {
            pod_uid: uid.to_owned(),
            qos,
            container: container.map(|(runtime, id)| ContainerRef { runtime, id: id.to_owned() }),
        })
    }

    // ---- systemd driver -------------------------------------------------

    #[test]
    fn systemd_containerd_burstable() {
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope"
        );
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::Burstable, Some((Runtime::Containerd, CID))));
    }

    #[test]
    fn systemd_containerd_besteffort() {
        let p = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope"
        );
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::BestEffort, Some((Runtime::Containerd, CID))));
    }

    #[test]
    fn systemd_containerd_guaranteed() {
        let p = format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope");
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::Guaranteed, Some((Runtime::Containerd, CID))));
    }

    #[test]
    fn systemd_crio() {
        let base =
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice");
        assert_eq!(
            parse_pod_cgroup(&format!("{base}/crio-{CID}.scope")),
            pod(UID, Qos::Burstable, Some((Runtime::CriO, CID)))
        );
        // crun places the processes in a `container` sub-cgroup.
        assert_eq!(
            parse_pod_cgroup(&format!("{base}/crio-{CID}.scope/container")),
            pod(UID, Qos::Burstable, Some((Runtime::CriO, CID)))
        );
        // conmon is attributed to the pod but is not a workload container.
        assert_eq!(
            parse_pod_cgroup(&format!("{base}/crio-conmon-{CID}.scope")),
            pod(UID, Qos::Burstable, None)
        );
    }

    #[test]
    fn systemd_docker() {
        let p = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice/docker-{CID}.scope"
        );
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::BestEffort, Some((Runtime::Docker, CID))));
    }

    #[test]
    fn systemd_pod_level_without_container() {
        for p in [
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice/"),
            format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice//"),
        ] {
            let got = parse_pod_cgroup(&p).unwrap();
            assert_eq!(got.pod_uid, UID, "{p}");
            assert_eq!(got.container, None, "{p}");
        }
    }

    #[test]
    fn systemd_static_pod() {
        let p = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/cri-containerd-{CID}.scope"
        );
        assert_eq!(parse_pod_cgroup(&p), pod(STATIC_UID, Qos::Burstable, Some((Runtime::Containerd, CID))));
        let p = format!("/kubepods.slice/kubepods-pod{STATIC_UID}.slice/crio-{CID}.scope");
        assert_eq!(parse_pod_cgroup(&p), pod(STATIC_UID, Qos::Guaranteed, Some((Runtime::CriO, CID))));
    }

    #[test]
    fn systemd_colon_form_below_containerd_service() {
        let p = format!(
            "/system.slice/containerd.service/kubepods-burstable-pod{UID_SYSTEMD}.slice:cri-containerd:{CID}"
        );
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::Burstable, Some((Runtime::Containerd, CID))));
        let p = format!(
            "/system.slice/containerd.service/kubepods-pod{UID_SYSTEMD}.slice:cri-containerd:{CID}/sub"
        );
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::Guaranteed, Some((Runtime::Containerd, CID))));
        let p = format!("/kubepods-besteffort-pod{UID_SYSTEMD}.slice:crio:{CID}");
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::BestEffort, Some((Runtime::CriO, CID))));
        // A broken container part still attributes to the pod.
        let p = format!("/kubepods-besteffort-pod{UID_SYSTEMD}.slice:cri-containerd:xyz");
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::BestEffort, None));
        let p = format!("/kubepods-besteffort-pod{UID_SYSTEMD}.slice:");
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::BestEffort, None));
        // The colon form needs a real pod slice before the first colon.
        assert_eq!(parse_pod_cgroup(&format!("/foo.slice:cri-containerd:{CID}")), None);
    }

    // ---- cgroupfs driver ------------------------------------------------

    #[test]
    fn cgroupfs_containerd_each_qos() {
        assert_eq!(
            parse_pod_cgroup(&format!("/kubepods/pod{UID}/{CID}")),
            pod(UID, Qos::Guaranteed, Some((Runtime::Unknown, CID)))
        );
        assert_eq!(
            parse_pod_cgroup(&format!("/kubepods/burstable/pod{UID}/{CID}")),
            pod(UID, Qos::Burstable, Some((Runtime::Unknown, CID)))
        );
        assert_eq!(
            parse_pod_cgroup(&format!("/kubepods/besteffort/pod{UID}/{CID}")),
            pod(UID, Qos::BestEffort, Some((Runtime::Unknown, CID)))
        );
    }

    #[test]
    fn cgroupfs_crio() {
        assert_eq!(
            parse_pod_cgroup(&format!("/kubepods/burstable/pod{UID}/crio-{CID}")),
            pod(UID, Qos::Burstable, Some((Runtime::CriO, CID)))
        );
        assert_eq!(
            parse_pod_cgroup(&format!("/kubepods/burstable/pod{UID}/crio-conmon-{CID}")),
            pod(UID, Qos::Burstable, None)
        );
    }

    #[test]
    fn cgroupfs_pod_level_and_static_pod() {
        assert_eq!(
            parse_pod_cgroup(&format!("/kubepods/besteffort/pod{UID}/")),
            pod(UID, Qos::BestEffort, None)
        );
        assert_eq!(
            parse_pod_cgroup(&format!("/kubepods/burstable/pod{STATIC_UID}/{CID}")),
            pod(STATIC_UID, Qos::Burstable, Some((Runtime::Unknown, CID)))
        );
    }

    // ---- nesting and input forms ----------------------------------------

    #[test]
    fn kind_node_seen_from_host() {
        let p = format!(
            "/system.slice/docker-{NODE}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope"
        );
        // The node's own docker scope above the pod is not the container.
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::BestEffort, Some((Runtime::Containerd, CID))));
    }

    #[test]
    fn kind_node_inside_its_cgroup_namespace() {
        let p = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope"
        );
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::Guaranteed, Some((Runtime::Containerd, CID))));
        let p = format!(
            "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID_SYSTEMD}.slice"
        );
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::Burstable, None));
    }

    #[test]
    fn cgroupfs_below_another_root() {
        assert_eq!(
            parse_pod_cgroup(&format!("/kubelet/kubepods/burstable/pod{UID}/{CID}")),
            pod(UID, Qos::Burstable, Some((Runtime::Unknown, CID)))
        );
        assert_eq!(
            parse_pod_cgroup(&format!("/docker/{NODE}/kubepods/besteffort/pod{UID}/{CID}")),
            pod(UID, Qos::BestEffort, Some((Runtime::Unknown, CID)))
        );
        assert_eq!(
            parse_pod_cgroup(&format!("/kubelet/kubepods/pod{UID}/crio-{CID}")),
            pod(UID, Qos::Guaranteed, Some((Runtime::CriO, CID)))
        );
    }

    #[test]
    fn nested_cgroups_below_the_container() {
        let base = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope"
        );
        for tail in ["/init", "/init/", "/workers/worker-3", "/a/b/c/d", &format!("/{CID2}")] {
            assert_eq!(
                parse_pod_cgroup(&format!("{base}{tail}")),
                pod(UID, Qos::Burstable, Some((Runtime::Containerd, CID))),
                "{tail}"
            );
        }
        assert_eq!(
            parse_pod_cgroup(&format!("/kubepods/pod{UID}/{CID}/sub/{CID2}")),
            pod(UID, Qos::Guaranteed, Some((Runtime::Unknown, CID)))
        );
    }

    #[test]
    fn outermost_pod_wins() {
        // kind running inside a pod of the host cluster: the host pod is the
        // one this node's kubelet knows.
        let inner = format!(
            "kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{STATIC_UID}.slice/cri-containerd-{CID2}.scope"
        );
        let p = format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope/{inner}");
        assert_eq!(parse_pod_cgroup(&p), pod(UID, Qos::Guaranteed, Some((Runtime::Containerd, CID))));
    }

    #[test]
    fn proc_cgroup_line_and_sysfs_forms() {
        let rel = format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope");
        let expected = pod(UID, Qos::Guaranteed, Some((Runtime::Containerd, CID)));
        assert_eq!(parse_pod_cgroup(&format!("0::{rel}\n")), expected);
        assert_eq!(parse_pod_cgroup(&format!("  {rel}  ")), expected);
        assert_eq!(parse_pod_cgroup(&format!("/sys/fs/cgroup{rel}")), expected);
        assert_eq!(parse_pod_cgroup(&rel[1..]), expected);
        assert_eq!(parse_pod_cgroup(&format!("//{}//", &rel[1..])), expected);
    }

    #[test]
    fn unknown_runtime_prefix_keeps_the_id() {
        let base = format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice");
        assert_eq!(
            parse_pod_cgroup(&format!("{base}/kata-{CID}.scope")),
            pod(UID, Qos::Guaranteed, Some((Runtime::Unknown, CID)))
        );
        for child in [
            format!("libpod-conmon-{CID}.scope"),
            format!("-{CID}.scope"),
            format!("KATA-{CID}.scope"),
            format!("caf\u{e9}-{CID}.scope"),
            "init".to_owned(),
            "cri-containerd-.scope".to_owned(),
        ] {
            assert_eq!(
                parse_pod_cgroup(&format!("{base}/{child}")),
                pod(UID, Qos::Guaranteed, None),
                "{child}"
            );
        }
    }

    #[test]
    fn container_id_must_be_64_lowercase_hex() {
        let base = format!("/kubepods/burstable/pod{UID}");
        let upper = CID.to_ascii_uppercase();
        let short = &CID[..12];
        let bad = [
            &CID[..63],
            &format!("{CID}0"),
            upper.as_str(),
            short,
            &format!("cri-containerd-{short}.scope"),
            &format!("crio-{}", &CID[..63]),
            &format!("docker-{}g.scope", &CID[..63]),
        ];
        for child in bad {
            let got = parse_pod_cgroup(&format!("{base}/{child}"));
            assert_eq!(got, pod(UID, Qos::Burstable, None), "{child}");
        }
    }

    // ---- negative cases -------------------------------------------------

    #[test]
    fn non_pod_cgroups() {
        for p in [
            "",
            "/",
            "//",
            "0::/",
            "0::/init.scope",
            "/init.scope",
            "/system.slice/containerd.service",
            "/system.slice/kubelet.service",
            "/user.slice/user-1000.slice/session-3.scope",
            "/kubepods.slice",
            "/kubepods.slice/kubepods-burstable.slice",
            "/kubepods.slice/kubepods-besteffort.slice/",
            "/kubepods",
            "/kubepods/burstable",
            "/kubepods/besteffort/",
            "/docker/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope",
        ] {
            assert_eq!(parse_pod_cgroup(p), None, "{p:?}");
        }
    }

    #[test]
    fn malformed_pod_uids() {
        let bad_systemd = [
            // Dashes cannot appear inside a slice's UID.
            UID.to_owned(),
            // Mixed separators.
            "1c0a2b3e_4f5d-6789_abcd_ef0123456789".to_owned(),
            // Wrong group lengths.
            "1c0a2b3e4_f5d_6789_abcd_ef0123456789".to_owned(),
            // Too short / too long.
            UID_SYSTEMD[..35].to_owned(),
            format!("{UID_SYSTEMD}0"),
            // Uppercase, non-hex.
            UID_SYSTEMD.to_ascii_uppercase(),
            UID_SYSTEMD.replace('a', "g"),
            STATIC_UID[..31].to_owned(),
            format!("{STATIC_UID}z"),
            String::new(),
        ];
        for uid in &bad_systemd {
            let p = format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{CID}.scope"
            );
            assert_eq!(parse_pod_cgroup(&p), None, "{p}");
        }
        let bad_cgroupfs = [
            UID_SYSTEMD.to_owned(),
            UID.to_ascii_uppercase(),
            UID[..35].to_owned(),
            format!("{UID}-"),
            UID.replace('-', ""),
            "".to_owned(),
        ];
        for uid in &bad_cgroupfs {
            let p = format!("/kubepods/burstable/pod{uid}/{CID}");
            // `UID.replace('-', "")` is 32 hex: a valid static-pod UID.
            if uid.len() == 32 {
                assert_eq!(parse_pod_cgroup(&p).unwrap().pod_uid, *uid);
            } else {
                assert_eq!(parse_pod_cgroup(&p), None, "{p}");
            }
        }
    }

    #[test]
    fn pod_dirs_outside_the_kubelet_layout() {
        for p in [
            // Unknown QoS level.
            format!("/kubepods/guaranteed/pod{UID}/{CID}"),
            format!("/kubepods/burstable/extra/pod{UID}/{CID}"),
            // QoS directory not under kubepods.
            format!("/burstable/pod{UID}/{CID}"),
            format!("/other/burstable/pod{UID}/{CID}"),
            // No parent at all, or a non-kubelet parent.
            format!("/pod{UID}/{CID}"),
            format!("pod{UID}"),
            format!("/user.slice/pod{UID}"),
            // systemd slices with an unknown or missing QoS / root.
            format!("/kubepods.slice/kubepods-guaranteed-pod{UID_SYSTEMD}.slice"),
            format!("/kubepods-burstable.slice/burstable-pod{UID_SYSTEMD}.slice"),
            format!("/x.slice/pod{UID_SYSTEMD}.slice"),
            format!("/x.slice/xkubepods-pod{UID_SYSTEMD}.slice"),
            format!("/x.slice/kubepodspod{UID_SYSTEMD}.slice"),
            format!("/x.slice/-kubepods-pod{UID_SYSTEMD}.slice/crio-{CID}.scope"),
            // The suffix is required.
            format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}"),
            format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}.scope"),
            format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice.slice"),
        ] {
            assert_eq!(parse_pod_cgroup(&p), None, "{p}");
        }
        // Any non-empty level may precede `kubepods` (as `kubelet-` does in kind).
        assert!(parse_pod_cgroup(&format!("/a-kubepods-pod{UID_SYSTEMD}.slice")).is_some());
    }

    #[test]
    fn non_ascii_input_never_panics() {
        let samples = [
            "\u{1F600}".to_owned(),
            "/kubepods/burstable/pod\u{e9}\u{e9}\u{e9}".to_owned(),
            format!("/kubepods.slice/kubepods-pod{}\u{e9}.slice", &UID_SYSTEMD[..34]),
            // Multi-byte characters exactly where the UID would start.
            format!("/kubepods.slice/kubepods-pod\u{00e9}{}.slice", &UID_SYSTEMD[2..]),
            format!("/kubepods.slice/kubepods-pod\u{20ac}{}.slice", &UID_SYSTEMD[3..]),
            format!("/kubepods.slice/\u{20ac}pod{UID_SYSTEMD}.slice"),
            // Fullwidth digits look like hex but are not.
            format!("/kubepods/pod{}\u{ff11}/{CID}", &UID[..35]),
            format!("/kubepods/pod{UID}/cri-containerd-{}\u{ff10}.scope", &CID[..63]),
            format!("/kubepods/pod{UID}/\u{20ac}-{CID}"),
            "\0\0\0".to_owned(),
            "0::".to_owned(),
            ":::".to_owned(),
            "/:/:/".to_owned(),
        ];
        for s in &samples {
            let _ = parse_pod_cgroup(s);
        }
        // The one with a non-hex byte in the container id keeps the pod only.
        assert_eq!(parse_pod_cgroup(&samples[7]), pod(UID, Qos::Guaranteed, None));
        assert_eq!(parse_pod_cgroup(&samples[8]), pod(UID, Qos::Guaranteed, None));
    }

    #[test]
    fn every_prefix_and_suffix_of_valid_paths_is_safe() {
        let paths = [
            format!(
                "0::/system.slice/docker-{NODE}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_SYSTEMD}.slice/cri-containerd-{CID}.scope/init"
            ),
            format!("/system.slice/containerd.service/kubepods-burstable-pod{UID_SYSTEMD}.slice:cri-containerd:{CID}"),
            format!("/kubelet/kubepods/burstable/pod{UID}/crio-conmon-{CID}"),
            format!("/kubepods/pod{STATIC_UID}/\u{e9}{CID}\u{1F600}"),
        ];
        for p in &paths {
            for (i, _) in p.char_indices() {
                let _ = parse_pod_cgroup(&p[..i]);
                let _ = parse_pod_cgroup(&p[i..]);
            }
        }
    }

    #[test]
    fn huge_inputs() {
        // 1 MiB of one segment, of many segments, and a valid path buried
        // below 100k levels of noise.
        let long_segment = "a".repeat(1 << 20);
        assert_eq!(parse_pod_cgroup(&long_segment), None);
        let many = "/x".repeat(1 << 19);
        assert_eq!(parse_pod_cgroup(&many), None);
        let slashes = "/".repeat(1 << 20);
        assert_eq!(parse_pod_cgroup(&slashes), None);
        let colons = ":".repeat(1 << 20);
        assert_eq!(parse_pod_cgroup(&colons), None);
        let buried =
            format!("{}/kubepods/besteffort/pod{UID}/{CID}/{}", "/n".repeat(100_000), "/m".repeat(100_000));
        assert_eq!(parse_pod_cgroup(&buried), pod(UID, Qos::BestEffort, Some((Runtime::Unknown, CID))));
        let long_pod = format!("/kubepods.slice/kubepods-pod{}{UID_SYSTEMD}.slice", "0".repeat(1 << 20));
        assert_eq!(parse_pod_cgroup(&long_pod), None);
    }

    /// Deterministic pseudo-random paths: plausible segments joined by `/`,
    /// then mutated by inserting fragments and truncating at random character
    /// boundaries, so that inputs land both on and just off valid layouts.
    /// No external crates.
    #[test]
    fn pseudo_random_inputs_never_panic() {
        let segments = [
            "kubepods".to_owned(),
            "burstable".to_owned(),
            "besteffort".to_owned(),
            "kubepods.slice".to_owned(),
            "kubepods-burstable.slice".to_owned(),
            "kubelet.slice".to_owned(),
            format!("pod{UID}"),
            format!("pod{STATIC_UID}"),
            format!("kubepods-pod{UID_SYSTEMD}.slice"),
            format!("kubepods-besteffort-pod{UID_SYSTEMD}.slice"),
            format!("kubelet-kubepods-burstable-pod{UID_SYSTEMD}.slice"),
            format!("kubepods-burstable-pod{UID_SYSTEMD}.slice:cri-containerd:{CID}"),
            format!("cri-containerd-{CID}.scope"),
            format!("crio-conmon-{CID}.scope"),
            format!("docker-{CID}.scope"),
            CID.to_owned(),
            "init".to_owned(),
            "system.slice".to_owned(),
            String::new(),
        ];
        let fragments = [
            "/",
            ":",
            "-",
            "_",
            ".slice",
            ".scope",
            "pod",
            "0::",
            "a",
            "\u{e9}",
            "\u{1F600}",
            "\u{ff10}",
            " ",
            "\n",
        ];
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move |bound: usize| {
            // xorshift64*
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % bound.max(1)
        };
        let (mut parsed, mut rejected) = (0, 0);
        for _ in 0..20_000 {
            let mut s = String::new();
            for _ in 0..next(8) {
                s.push('/');
                s.push_str(&segments[next(segments.len())]);
            }
            for _ in 0..next(4) {
                let boundaries: Vec<usize> = s.char_indices().map(|(i, _)| i).chain([s.len()]).collect();
                let at = boundaries[next(boundaries.len())];
                s.insert_str(at, fragments[next(fragments.len())]);
            }
            if next(4) == 0 {
                let boundaries: Vec<usize> = s.char_indices().map(|(i, _)| i).collect();
                if !boundaries.is_empty() {
                    s.truncate(boundaries[next(boundaries.len())]);
                }
            }
            match parse_pod_cgroup(&s) {
                Some(p) => {
                    parsed += 1;
                    // Whatever parses satisfies the documented invariants.
                    assert!(p.pod_uid == UID || p.pod_uid == STATIC_UID, "{s:?}");
                    if let Some(c) = &p.container {
                        assert_eq!(c.id, CID, "{s:?}");
                    }
                }
                None => rejected += 1,
            }
        }
        // Both outcomes occur, so the generator exercises real layouts.
        assert!(parsed > 1000 && rejected > 1000, "{parsed} parsed, {rejected} rejected");
    }
}
