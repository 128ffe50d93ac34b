//! Stall detection: GPU calls in flight longer than the threshold, read
//! from the kernel's in-flight map. Returns data; `trace` turns the newly
//! stalled calls into events, `run` exports the calls stalled now.
use std::collections::HashSet;

use observer_common::gpu::{Api, MAX_NESTING};

use crate::{clock::BootClock, events, probes::Loaded};

/// One call in flight past the threshold.
#[derive(Clone, Debug, PartialEq)]
pub struct Stall {
    pub pid: u32,
    pub tid: u32,
    pub cgroup_id: u64,
    pub api: Api,
    /// Index of the library in the attach cookies.
    pub library: u32,
    pub function: String,
    pub elapsed_ns: u64,
    /// Whether an earlier scan already saw this call stalled.
    pub reported: bool,
}

pub struct StallDetector {
    threshold_ns: u64,
    /// Calls already seen stalled, by (tid, api, entry timestamp).
    reported: HashSet<(u32, u32, u64)>,
}

impl StallDetector {
    pub fn new(threshold_ns: u64) -> Self {
        Self { threshold_ns, reported: HashSet::new() }
    }

    /// Every call stalled now. The kernel keeps a thread's entry between
    /// calls (depth 0); entries of threads that exited are removed here.
    pub fn scan(&mut self, kernel: &mut Loaded) -> Vec<Stall> {
        let now = BootClock::boot_now_ns();
        let mut stalls = Vec::new();
        let mut live = HashSet::new();
        for (key, stack) in kernel.inflight() {
            if !std::path::Path::new(&format!("/proc/{}/task/{}", stack.pid, key.tid)).exists() {
                kernel.forget_inflight(&key);
                continue;
            }
            let Some(api) = Api::from_u32(key.api) else { continue };
            let depth = (stack.depth as usize).min(MAX_NESTING);
            for frame in &stack.frames[..depth] {
                let tag = (key.tid, key.api, frame.start_ns);
                live.insert(tag);
                let elapsed_ns = now.saturating_sub(frame.start_ns);
                if elapsed_ns < self.threshold_ns {
                    continue;
                }
                stalls.push(Stall {
                    pid: stack.pid,
                    tid: key.tid,
                    cgroup_id: stack.cgroup_id,
                    api,
                    library: frame.library,
                    function: events::function_name(api, frame.function),
                    elapsed_ns,
                    reported: !self.reported.insert(tag),
                });
            }
        }
        self.reported.retain(|t| live.contains(t));
        stalls
    }
}
