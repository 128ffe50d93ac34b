//! The HTTP family's kernel side as userspace holds it: two cgroup_skb
//! programs, attached to each parent cgroup of pods as it appears, and the
//! ring of TCP segments they fill.
//!
//! Attached as BPF links (Linux 5.7 and later), which run beside whatever
//! else the node attached to those cgroups (a CNI's programs): a link takes
//! no attach flags, and link attachments always combine. The programs only
//! copy, and every one of their paths lets the packet through.
use std::{
    collections::BTreeMap,
    fs::File,
    os::fd::{AsFd, OwnedFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{CgroupAttachMode, CgroupSkb, CgroupSkbAttachType},
    Ebpf,
};
use observer_common::http::{HttpSegment, HTTP_LOST_MAP, HTTP_RING_MAP};

use super::ProbeStatus;

pub const INGRESS_PROGRAM: &str = "http_ingress";
pub const EGRESS_PROGRAM: &str = "http_egress";

/// The ring, the lost counter and where the programs are attached.
pub struct HttpProbes {
    ring: RingBuf<MapData>,
    lost: PerCpuArray<MapData, u64>,
    /// Why the programs could not be loaded, if they could not.
    unavailable: Option<String>,
    /// Parent cgroups of pods (paths below the cgroup2 root) the programs
    /// are attached to, or why they could not be.
    roots: BTreeMap<String, Result<(), String>>,
}

impl HttpProbes {
    /// Takes the family's maps and loads its programs; a kernel that
    /// refuses them leaves the status saying why.
    pub fn load(ebpf: &mut Ebpf) -> Option<Self> {
        let ring = RingBuf::try_from(ebpf.take_map(HTTP_RING_MAP)?).ok()?;
        let lost = PerCpuArray::try_from(ebpf.take_map(HTTP_LOST_MAP)?).ok()?;
        let unavailable = [INGRESS_PROGRAM, EGRESS_PROGRAM].iter().find_map(|name| {
            let program: Result<&mut CgroupSkb, _> = match ebpf.program_mut(name) {
                Some(p) => p.try_into().map_err(|e: aya::programs::ProgramError| e.to_string()),
                None => Err(format!("{name} is not in the object")),
            };
            program.and_then(|p| p.load().map_err(|e| format!("{name}: {e}"))).err()
        });
        Some(Self { ring, lost, unavailable, roots: BTreeMap::new() })
    }

    /// Attaches to each of `roots` (paths below the cgroup2 root at
    /// `cgroup2`) that exists now and is not attached yet.
    pub fn attach_roots(&mut self, ebpf: &mut Ebpf, cgroup2: &Path, roots: &[String]) {
        if self.unavailable.is_some() {
            return;
        }
        for root in roots {
            if self.roots.get(root).is_some_and(|r| r.is_ok()) {
                continue;
            }
            let dir: PathBuf = cgroup2.join(root.trim_start_matches('/'));
            if !dir.is_dir() {
                continue;
            }
            let result = attach(ebpf, &dir);
            let first = !self.roots.contains_key(root);
            match &result {
                Ok(()) => log::info!("http: attached to {root}"),
                // Tried again each second; said once.
                Err(e) if first => log::warn!("http: not attached to {root}: {e}"),
                Err(_) => {}
            }
            self.roots.insert(root.clone(), result);
        }
    }

    /// Every segment the ring holds now, with the payload bytes its record
    /// copied (`head_len` of them; none when the record is shorter, which
    /// the programs never write).
    pub fn drain(&mut self, mut each: impl FnMut(&HttpSegment, &[u8])) {
        const FIXED: usize = std::mem::size_of::<HttpSegment>();
        while let Some(item) = self.ring.next() {
            if item.len() < FIXED {
                continue;
            }
            // SAFETY: the record is at least one HttpSegment long, the
            // type is plain data, and the read copies it unaligned.
            let segment: HttpSegment = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            let head = item.get(FIXED..FIXED + segment.head_len as usize).unwrap_or_default();
            each(&segment, head);
        }
    }

    /// A descriptor of the ring for a reactor to wait on: readable when the
    /// programs wake the daemon (a quarter of the ring waiting).
    pub fn ring_fd(&self) -> std::io::Result<OwnedFd> {
        self.ring.as_fd().try_clone_to_owned()
    }

    /// Segments the ring had no room for, since the start.
    pub fn lost(&self) -> u64 {
        self.lost.get(&0, 0).map(|values| values.iter().sum()).unwrap_or(0)
    }

    pub fn status(&self) -> ProbeStatus {
        let attached: Vec<&str> =
            self.roots.iter().filter(|(_, r)| r.is_ok()).map(|(root, _)| root.as_str()).collect();
        let failed: Vec<String> = self
            .roots
            .iter()
            .filter_map(|(root, r)| r.as_ref().err().map(|e| format!("{root}: {e}")))
            .collect();
        let detail = match (&self.unavailable, attached.is_empty(), failed.is_empty()) {
            (Some(why), _, _) => why.clone(),
            (None, true, true) => {
                "no parent cgroup of pods on this node yet; attached when one appears".into()
            }
            (None, _, false) => failed.join("; "),
            (None, false, true) => {
                "server-side HTTP/1.x of pods' sockets (cgroup_skb: TCP segments of pods only)".into()
            }
        };
        ProbeStatus {
            probe: "http",
            target: format!(
                "cgroup_skb:{}",
                if attached.is_empty() { "-".into() } else { attached.join(",") }
            ),
            attached: !attached.is_empty(),
            detail,
        }
    }
}

fn attach(ebpf: &mut Ebpf, dir: &Path) -> Result<(), String> {
    let cgroup = File::open(dir).map_err(|e| e.to_string())?;
    for (name, kind) in
        [(INGRESS_PROGRAM, CgroupSkbAttachType::Ingress), (EGRESS_PROGRAM, CgroupSkbAttachType::Egress)]
    {
        let program: &mut CgroupSkb = ebpf
            .program_mut(name)
            .ok_or_else(|| format!("{name} is not in the object"))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| e.to_string())?;
        program
            .attach(&cgroup, kind, CgroupAttachMode::Single)
            .map_err(|e| format!("{name}: {}", with_causes(&e)))?;
    }
    Ok(())
}

/// An error with its causes: aya's attach errors name the call, their
/// source the errno a person can act on.
fn with_causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}
