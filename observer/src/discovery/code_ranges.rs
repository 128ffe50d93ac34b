//! Where each GPU process has its GPU runtime's code mapped, remembered
//! from `/proc/PID/maps` when the process is found and for a while after it
//! exits.
//!
//! A crash report names the faulting library from the kernel's own lookup
//! of the address (`bpf_find_vma`). That lookup only try-locks the address
//! space, and gives up while someone holds it for writing, which is what
//! attaching uprobes to that very process does: a process selected for
//! hot-call probes that crashes during its first second, an init crash,
//! would be reported without its library. Its exit record arrives after the
//! process is gone, so its mappings must be known from before.
use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use crate::{gpu_library::candidate_api, procfs::parse_line};

/// Exited processes' ranges are kept this long: their exit records (with
/// the crash) are behind at most the ring buffer's backlog.
const KEEP_AFTER_EXIT: Duration = Duration::from_secs(30);
/// Bounds what a burst of short-lived GPU processes leaves behind.
const MAX_EXITED: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeRange {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// The path as the process sees it.
    pub path: String,
}

#[derive(Default)]
pub struct CodeRanges {
    live: HashMap<u32, Vec<CodeRange>>,
    exited: VecDeque<(Instant, u32, Vec<CodeRange>)>,
}

/// The executable mappings of GPU runtime files in one `/proc/PID/maps`.
pub fn gpu_code_ranges(maps: &str) -> Vec<CodeRange> {
    maps.lines()
        .filter_map(parse_line)
        .filter(|m| m.executable && !m.path.is_empty())
        .filter(|m| {
            let path = m.path.strip_suffix(" (deleted)").unwrap_or(m.path);
            let name = path.rsplit('/').next().unwrap_or(path);
            candidate_api(name).is_some()
        })
        .map(|m| CodeRange {
            start: m.start,
            end: m.end,
            offset: m.offset,
            path: m.path.strip_suffix(" (deleted)").unwrap_or(m.path).to_string(),
        })
        .collect()
}

impl CodeRanges {
    /// Reads the process's mappings now (it is alive, and usually stopped
    /// or at its start).
    pub fn note(&mut self, pid: u32) {
        let Ok(maps) = std::fs::read(format!("/proc/{pid}/maps")) else { return };
        let ranges = gpu_code_ranges(&String::from_utf8_lossy(&maps));
        if !ranges.is_empty() {
            self.live.insert(pid, ranges);
        }
    }

    /// The process is gone; its ranges stay for its exit record.
    pub fn exited(&mut self, pid: u32, now: Instant) {
        if let Some(ranges) = self.live.remove(&pid) {
            self.exited.push_back((now, pid, ranges));
        }
        while self.exited.len() > MAX_EXITED
            || self.exited.front().is_some_and(|(t, _, _)| now.duration_since(*t) > KEEP_AFTER_EXIT)
        {
            self.exited.pop_front();
        }
    }

    /// The GPU library file and file offset at `ip` in process `pid`.
    pub fn at(&self, pid: u32, ip: u64) -> Option<(String, u64)> {
        let live = self.live.get(&pid).into_iter().flatten();
        // The newest exit of a reused pid comes last.
        let gone = self.exited.iter().rev().filter(|(_, p, _)| *p == pid).flat_map(|(_, _, r)| r);
        live.chain(gone)
            .find(|r| (r.start..r.end).contains(&ip))
            .map(|r| (r.path.clone(), ip - r.start + r.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0000000-55d0c0001000 r-xp 00000000 fe:01 131 /usr/bin/cuda_app
7f1000000000-7f1000010000 r--p 00000000 fe:01 42 /opt/zluda/libcuda.so.1
7f1000010000-7f1000050000 r-xp 00010000 fe:01 42 /opt/zluda/libcuda.so.1
7f1000050000-7f1000060000 r-xp 00000000 fe:01 43 /usr/lib/libm.so.6
";

    #[test]
    fn a_crash_address_in_gpu_code_names_the_library_and_offset_after_exit() {
        let ranges = gpu_code_ranges(MAPS);
        assert_eq!(ranges.len(), 1, "only executable GPU runtime mappings: {ranges:?}");
        let mut r = CodeRanges::default();
        r.live.insert(7, ranges);
        assert_eq!(r.at(7, 0x7f1000010100), Some(("/opt/zluda/libcuda.so.1".into(), 0x10100)));
        assert_eq!(r.at(7, 0x7f1000050100), None, "not a GPU library");
        assert_eq!(r.at(8, 0x7f1000010100), None, "another process");
        let now = Instant::now();
        r.exited(7, now);
        assert!(r.at(7, 0x7f1000010100).is_some(), "kept for the exit record");
        r.exited(99, now + KEEP_AFTER_EXIT + Duration::from_secs(1));
        assert_eq!(r.at(7, 0x7f1000010100), None, "forgotten after a while");
    }
}
