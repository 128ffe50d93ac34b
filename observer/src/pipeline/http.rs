//! The HTTP family's stage: drains the ring of pods' TCP segments, follows
//! their connections (`crate::http`) and hands out what completed as
//! events; attaches the programs to each parent cgroup of pods as it
//! appears.
use std::{path::PathBuf, time::Instant};

use observer_common::http::{HttpSegment, SEGMENT_FIN, SEGMENT_INGRESS, SEGMENT_RST};

use super::runq_scope::KUBEPODS_ROOTS;
use crate::{
    events::{Detail, Event, Origin},
    http::{Found, Segment, Tracker},
    probes::{http::HttpProbes, ProbeStatus},
};

/// How often parent cgroups of pods are looked for and idle connections
/// forgotten.
const LOOK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

pub struct HttpStage {
    probes: HttpProbes,
    tracker: Tracker,
    cgroup2: Option<PathBuf>,
    roots: Vec<String>,
    last_look: Option<Instant>,
}

impl HttpStage {
    /// `prefixes`: the `--cgroup` prefixes, followed besides the kubepods
    /// hierarchy.
    pub fn new(probes: HttpProbes, cgroup2: Option<PathBuf>, prefixes: &[String]) -> Self {
        let mut roots: Vec<String> = KUBEPODS_ROOTS.iter().map(|r| r.to_string()).collect();
        for p in prefixes {
            let p = format!("/{}", p.trim_matches('/'));
            if !roots.contains(&p) {
                roots.push(p);
            }
        }
        Self { probes, tracker: Tracker::default(), cgroup2, roots, last_look: None }
    }

    /// Attaches to parent cgroups that appeared, and forgets idle
    /// connections, once a second.
    pub fn housekeeping(&mut self, ebpf: &mut aya::Ebpf) {
        if self.last_look.is_some_and(|t| t.elapsed() < LOOK_EVERY) {
            return;
        }
        self.last_look = Some(Instant::now());
        if let Some(cgroup2) = &self.cgroup2 {
            self.probes.attach_roots(ebpf, cgroup2, &self.roots);
        }
        self.tracker.expire(monotonic_ns());
    }

    /// What the segments in the ring completed, as events of `origin`'s
    /// making (a cgroup id to an origin).
    pub fn drain(&mut self, mut origin: impl FnMut(u64) -> Origin, out: &mut Vec<Event>) {
        let mut found = Vec::new();
        let tracker = &mut self.tracker;
        self.probes.drain(|s, head| tracker.segment(&segment(s, head), &mut found));
        for f in found {
            let (cgroup_id, detail) = match f {
                Found::Request(r) => (
                    r.cgroup_id,
                    Detail::HttpRequest {
                        method: r.method,
                        status: match r.outcome {
                            crate::http::Outcome::Status(s) => Some(s),
                            crate::http::Outcome::Closed => None,
                        },
                        class: r.outcome.class(),
                        duration_ns: r.duration_ns,
                        probe: r.probe,
                    },
                ),
                Found::Unparsed { cgroup_id, protocol } => {
                    (cgroup_id, Detail::HttpUnparsed { protocol: protocol.as_str() })
                }
            };
            out.push(Event { origin: origin(cgroup_id), detail });
        }
    }

    pub fn status(&self) -> ProbeStatus {
        self.probes.status()
    }

    /// A descriptor of the ring that turns readable when the programs wake
    /// the daemon.
    pub fn ring_fd(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.probes.ring_fd()
    }

    pub fn segments_lost(&self) -> u64 {
        self.probes.lost()
    }
}

/// A ring record as the tracker reads it.
fn segment<'a>(s: &'a HttpSegment, head: &'a [u8]) -> Segment<'a> {
    Segment {
        ts_ns: s.ts_ns,
        cookie: s.cookie,
        cgroup_id: s.cgroup_id,
        seq: s.seq,
        len: s.len,
        ingress: s.flags & SEGMENT_INGRESS != 0,
        fin: s.flags & SEGMENT_FIN != 0,
        rst: s.flags & SEGMENT_RST != 0,
        head,
        tail: &s.tail,
    }
}

/// CLOCK_MONOTONIC, the kernel side's `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
