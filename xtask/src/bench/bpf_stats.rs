//! BPF program statistics and map memory, read from /proc/PID/fdinfo.
//!
//! Program run time is the diagnostic behind an overhead figure: it splits
//! what an observer's programs cost in the kernel from what the probe traps
//! cost around them. It is gathered in a pass of its own because the
//! statistics (`kernel.bpf_stats_enabled`) add clock reads to every program
//! run and would disturb the timed runs.
use std::{collections::BTreeMap, fs, process::Command};

use anyhow::{Context, Result};
use serde_json::Value;

use super::{report::num, Env};

/// `kernel.bpf_stats_enabled=1` for as long as this lives.
struct BpfStats {
    old: String,
}

pub(super) const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    fn enable() -> Result<BpfStats> {
        let old = fs::read_to_string(BPF_STATS).with_context(|| format!("cannot read {BPF_STATS}"))?;
        fs::write(BPF_STATS, "1").with_context(|| format!("cannot write {BPF_STATS}"))?;
        Ok(BpfStats { old: old.trim().to_string() })
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS, &self.old);
    }
}

fn bpf_fdinfos(pid: u32, kind: &str) -> Vec<BTreeMap<String, String>> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let want = format!("anon_inode:{kind}");
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Ok(target) = fs::read_link(entry.path()) else { continue };
        if target.to_string_lossy() != want {
            continue;
        }
        let fd = entry.file_name();
        let Ok(info) = fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.to_string_lossy())) else {
            continue;
        };
        let map = info
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        out.push(map);
    }
    out
}

/// BPF links (attached programs) held by `pid`.
pub(super) fn bpf_links_of(pid: u32) -> usize {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else { return 0 };
    dir.flatten()
        .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy() == "anon_inode:bpf_link"))
        .count()
}

/// prog id -> (run_cnt, run_time_ns)
fn prog_counters(pid: u32) -> BTreeMap<u64, (u64, u64)> {
    let mut m = BTreeMap::new();
    for info in bpf_fdinfos(pid, "bpf-prog") {
        let get = |k: &str| info.get(k).and_then(|v| v.parse::<u64>().ok());
        if let Some(id) = get("prog_id") {
            m.insert(id, (get("run_cnt").unwrap_or(0), get("run_time_ns").unwrap_or(0)));
        }
    }
    m
}

fn prog_names(env: &Env) -> BTreeMap<u64, String> {
    let Some(tool) = &env.bpftool else { return BTreeMap::new() };
    let Ok(out) = Command::new(tool).args(["-j", "prog", "show"]).output() else { return BTreeMap::new() };
    let Ok(v) = serde_json::from_slice::<Value>(&out.stdout) else { return BTreeMap::new() };
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p.get("id")?.as_u64()?, p.get("name")?.as_str()?.to_string())))
        .collect()
}

/// One program's runs and time over a profiled stretch.
pub(super) struct ProgRuns {
    pub(super) name: String,
    pub(super) runs: u64,
    pub(super) ns: u64,
}

/// BPF program time of `pid`'s programs while `work` runs, with statistics
/// enabled: (total ns, per-program "name: ns/run × runs" lines).
/// `None` (and a warning) when the statistics cannot be switched on.
pub(super) fn profile_programs(
    env: &Env,
    pid: u32,
    work: impl FnOnce() -> Result<()>,
) -> Result<Option<(u64, Vec<String>)>> {
    let Some(programs) = program_runs(env, pid, work)? else { return Ok(None) };
    let total = programs.iter().map(|p| p.ns).sum();
    Ok(Some((total, programs.iter().map(ProgRuns::line).collect())))
}

impl ProgRuns {
    /// `name: ns/run × runs`.
    pub(super) fn line(&self) -> String {
        format!("{}: {} ns/run × {} runs", self.name, num(self.ns as f64 / self.runs as f64), self.runs)
    }
}

/// Each of `pid`'s programs that ran while `work` ran, with statistics
/// enabled; `None` (and a warning) when they cannot be switched on.
pub(super) fn program_runs(
    env: &Env,
    pid: u32,
    work: impl FnOnce() -> Result<()>,
) -> Result<Option<Vec<ProgRuns>>> {
    let stats = match BpfStats::enable() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("    no BPF program statistics: {e:#}");
            return Ok(None);
        }
    };
    let before = prog_counters(pid);
    work()?;
    let after = prog_counters(pid);
    drop(stats);
    let names = prog_names(env);
    let mut programs = Vec::new();
    for (id, (cnt, ns)) in &after {
        let (c0, n0) = before.get(id).copied().unwrap_or((0, 0));
        let (runs, ns) = (cnt.saturating_sub(c0), ns.saturating_sub(n0));
        if runs == 0 {
            continue;
        }
        let name = names.get(id).cloned().unwrap_or_else(|| format!("prog {id}"));
        programs.push(ProgRuns { name, runs, ns });
    }
    Ok(Some(programs))
}

/// (maps, bytes of memlock) of the BPF maps `pid` holds.
pub(super) fn map_memory(pid: u32) -> (usize, u64) {
    let mut seen = BTreeMap::new();
    for info in bpf_fdinfos(pid, "bpf-map") {
        let id = info.get("map_id").cloned().unwrap_or_default();
        let memlock = info.get("memlock").and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        seen.insert(id, memlock);
    }
    (seen.len(), seen.values().sum())
}
