//! CFS bandwidth: throttling and oversubscription per cgroup, read from the
//! cgroup files. This kernel offers neither kprobes nor fentry on
//! `throttle_cfs_rq`, and no tracepoint exists for it (6.18), so the
//! kernel's own counters in `cpu.stat` are the portable source: v2
//! `nr_throttled`/`throttled_usec`, v1 `nr_throttled`/`throttled_time`.
//! Only cgroups with a quota are read, and of those below the scheduler
//! probe's roots only the ones whose tasks ran since their last read; the
//! hierarchy is walked for them every few seconds.
use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Where CPU limits live: the unified hierarchy (pure v2) or the v1 `cpu`
/// controller (hybrid hosts, where identity still comes from cgroup2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpuHierarchy {
    V2(PathBuf),
    V1(PathBuf),
}

impl CpuHierarchy {
    pub fn detect(cgroup2_root: Option<&Path>) -> Option<Self> {
        if let Some(root) = cgroup2_root {
            let controllers = fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            if controllers.split_whitespace().any(|c| c == "cpu") {
                return Some(Self::V2(root.to_path_buf()));
            }
        }
        ["/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.join("cpu.cfs_quota_us").exists())
            .map(Self::V1)
    }

    pub fn describe(&self) -> String {
        match self {
            Self::V2(p) => format!("cgroup v2 cpu.stat under {}", p.display()),
            Self::V1(p) => format!("cgroup v1 cpu.stat under {} (hybrid host)", p.display()),
        }
    }
}

/// Counters of one cgroup at one instant.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuStat {
    pub nr_periods: u64,
    pub nr_throttled: u64,
    pub throttled_ns: u64,
}

/// `path` and each of its ancestors below the root, as cgroup paths.
pub fn with_ancestors(path: &str, into: &mut HashSet<String>) {
    let mut at = path;
    while !at.is_empty() && at != "/" {
        if !into.insert(at.to_string()) {
            return; // its ancestors are in already
        }
        at = at.rfind('/').map_or("", |i| &at[..i]);
    }
}

/// Parses v2 (`throttled_usec`) and v1 (`throttled_time`, ns) cpu.stat.
pub fn parse_cpu_stat(text: &str) -> CpuStat {
    let mut s = CpuStat::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(key), Some(value)) = (it.next(), it.next()) else { continue };
        let Ok(v) = value.parse::<u64>() else { continue };
        match key {
            "nr_periods" => s.nr_periods = v,
            "nr_throttled" => s.nr_throttled = v,
            "throttled_usec" => s.throttled_ns = v.saturating_mul(1000),
            "throttled_time" => s.throttled_ns = v,
            _ => {}
        }
    }
    s
}

/// Quota in cores from v2 `cpu.max` ("max 100000" or "200000 100000").
pub fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut it = text.split_whitespace();
    let quota = it.next()?;
    let period: f64 = it.next()?.parse().ok()?;
    if quota == "max" || period <= 0.0 {
        return None;
    }
    Some(quota.parse::<f64>().ok()? / period)
}

fn read_u64ish(path: &Path) -> Option<i64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A directory's quota in cores, from v2 `cpu.max` or v1's pair of files.
fn read_quota(dir: &Path, v2: bool) -> Option<f64> {
    if v2 {
        fs::read_to_string(dir.join("cpu.max")).ok().and_then(|t| parse_cpu_max(&t))
    } else {
        v1_quota(dir)
    }
}

/// Quota in cores for a v1 cgroup directory.
fn v1_quota(dir: &Path) -> Option<f64> {
    let quota = read_u64ish(&dir.join("cpu.cfs_quota_us"))?;
    let period = read_u64ish(&dir.join("cpu.cfs_period_us"))?;
    (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
}

/// Threads of a cgroup that are runnable (state R: running or waiting for
/// a CPU, which includes threads parked by throttling).
pub fn runnable_threads(dir: &Path, v2: bool) -> u32 {
    let list = if v2 { "cgroup.threads" } else { "tasks" };
    let Ok(text) = fs::read_to_string(dir.join(list)) else { return 0 };
    text.lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .filter(|tid| thread_state(*tid) == Some('R'))
        .count() as u32
}

fn thread_state(tid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: the state is the
    // first field after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// One limited cgroup as last sampled.
#[derive(Clone, Debug)]
pub struct CpuCgroup {
    /// Path below the hierarchy root; the same path names the cgroup2 cgroup.
    pub rel: String,
    /// The cgroup2 cgroup's id (its directory's inode), read once when the
    /// cgroup is first seen rather than on every sample; 0 if unknown.
    pub cgroup_id: u64,
    pub quota_cores: f64,
    pub stat: CpuStat,
    pub runnable: u32,
    /// When `cpu.stat` was last read (an idle cgroup's sample reuses it).
    read_at: Instant,
    /// Consecutive samples with new throttled periods.
    throttled_streak: u32,
    throttle_reported: bool,
    oversubscribed_since: Option<Instant>,
    oversubscribed_reported: bool,
}

/// Something a person should hear about.
#[derive(Clone, Debug, PartialEq)]
pub enum CpuFinding {
    /// Throttled in consecutive periods: `periods` throttled out of `total`
    /// periods and `throttled_ns` lost since the previous sample.
    Throttled { rel: String, periods: u64, total: u64, throttled_ns: u64 },
    /// More runnable threads than the quota has cores, for a while.
    Oversubscribed { rel: String, runnable: u32, quota_cores: f64 },
}

/// How often the hierarchy is walked for limited cgroups and their quotas.
/// Between walks only the known limited cgroups' `cpu.stat` is read: with a
/// thousand pods a walk is thousands of directory and file reads (a pod's
/// slice and its containers, two quota files each), most of an idle
/// daemon's CPU, while a new pod's limit found five seconds later is
/// throttling caught seconds later, on counters that lose nothing.
const WALK_EVERY: Duration = Duration::from_secs(5);

/// The walk's period where the scheduler probe reports which cgroups ran:
/// a new pod's cgroups are then checked for a quota as soon as its first
/// task runs (a cgroup nothing ran in cannot be throttled), and the walk
/// is left to find the rest (limited cgroups outside the probe's roots).
const WALK_EVERY_WITH_ACTIVITY: Duration = Duration::from_secs(30);

/// How long a directory's quota, as read by a walk, is trusted. Quotas are
/// written when a container is created and change only on an in-place
/// resize, so later walks list directories without reading their quota
/// files again until this has passed.
const QUOTA_TRUSTED_FOR: Duration = Duration::from_secs(60);

/// The longest a limited cgroup goes unread while the scheduler probe sees
/// none of its tasks run. Throttling needs tasks switched in, so an idle
/// cgroup's throttle counters cannot move; its period count can (a lone
/// task running without a switch), and this bounds how stale it gets.
const IDLE_REREAD_EVERY: Duration = Duration::from_secs(30);

/// What the scheduler probe saw since the last sample: every task switched
/// in below `roots` is counted, so a limited cgroup there that is not in
/// `ran` had none of its tasks run. With a thousand idle pods, reading
/// `cpu.stat` each second for each was most of an idle daemon's CPU.
pub struct RunActivity<'a> {
    /// Cgroup paths, `/`-prefixed, whose tasks the probe counts.
    pub roots: &'a [String],
    /// Cgroups with tasks switched in since the last sample, and each of
    /// their ancestors (a pod's limit is on its slice, its tasks below).
    pub ran: &'a HashSet<String>,
}

impl RunActivity<'_> {
    /// Whether the probe would have seen a task of `rel` run, and did not.
    fn idle(&self, rel: &str) -> bool {
        let covered = self.roots.iter().any(|root| {
            rel.strip_prefix(root.as_str()).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        });
        covered && !self.ran.contains(rel)
    }
}

/// A limited cgroup found by the last walk.
#[derive(Clone, Debug)]
struct Limited {
    dir: PathBuf,
    rel: String,
    quota_cores: f64,
}

pub struct CpuMonitor {
    hierarchy: Option<CpuHierarchy>,
    /// Where cgroup ids are read: the cgroup2 mount.
    cgroup2_root: Option<PathBuf>,
    cgroups: HashMap<String, CpuCgroup>,
    oversubscribed_after: Duration,
    limited: Vec<Limited>,
    last_walk: Option<Instant>,
    /// Each directory's quota as last read, and when.
    quotas: HashMap<PathBuf, (Option<f64>, Instant)>,
}

impl CpuMonitor {
    pub fn new(cgroup2_root: Option<&Path>, oversubscribed_after: Duration) -> Self {
        Self {
            hierarchy: CpuHierarchy::detect(cgroup2_root),
            cgroup2_root: cgroup2_root.map(Path::to_path_buf),
            cgroups: HashMap::new(),
            oversubscribed_after,
            limited: Vec::new(),
            last_walk: None,
            quotas: HashMap::new(),
        }
    }

    /// The hierarchy sampled, if any cpu controller was found.
    pub fn hierarchy(&self) -> Option<&CpuHierarchy> {
        self.hierarchy.as_ref()
    }

    /// Limited cgroups as of the last sample.
    pub fn cgroups(&self) -> impl Iterator<Item = &CpuCgroup> {
        self.cgroups.values()
    }

    /// Every cgroup with a CPU quota under the hierarchy's root. A quota
    /// read less than `QUOTA_TRUSTED_FOR` ago is taken as it was.
    fn walk(&mut self, hierarchy: &CpuHierarchy) -> Vec<Limited> {
        let (root, v2) = match hierarchy {
            CpuHierarchy::V2(p) => (p, true),
            CpuHierarchy::V1(p) => (p, false),
        };
        let now = Instant::now();
        let mut quotas = HashMap::with_capacity(self.quotas.len());
        let mut limited = Vec::new();
        let mut stack = vec![root.clone()];
        while let Some(dir) = stack.pop() {
            if let Ok(entries) = fs::read_dir(&dir) {
                for e in entries.flatten() {
                    if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                        stack.push(e.path());
                    }
                }
            }
            let (quota, read_at) = match self.quotas.remove(&dir) {
                Some((quota, read_at)) if now.duration_since(read_at) < QUOTA_TRUSTED_FOR => (quota, read_at),
                _ => (read_quota(&dir, v2), now),
            };
            let rel = match dir.strip_prefix(root) {
                Ok(p) if p.as_os_str().is_empty() => "/".to_string(),
                Ok(p) => format!("/{}", p.display()),
                Err(_) => continue,
            };
            if let Some(quota_cores) = quota {
                limited.push(Limited { dir: dir.clone(), rel, quota_cores });
            }
            quotas.insert(dir, (quota, read_at));
        }
        // Directories not listed this time are gone: their entries go too.
        self.quotas = quotas;
        limited
    }

    /// Checks the cgroups that ran and that no walk has listed for a quota:
    /// a new pod's limit is known from its first task's run, not the next
    /// walk.
    fn find_new(&mut self, hierarchy: &CpuHierarchy, activity: &RunActivity) {
        let (root, v2) = match hierarchy {
            CpuHierarchy::V2(p) => (p, true),
            CpuHierarchy::V1(p) => (p, false),
        };
        let now = Instant::now();
        for rel in activity.ran {
            let dir = root.join(rel.trim_start_matches('/'));
            if self.quotas.contains_key(&dir) {
                continue;
            }
            // A cgroup without this controller (v1) or gone has none; the
            // container runtime makes every hierarchy's directory before
            // the first task starts, so one that ran is already there.
            let quota = read_quota(&dir, v2);
            if let Some(quota_cores) = quota {
                self.limited.push(Limited { dir: dir.clone(), rel: rel.clone(), quota_cores });
            }
            self.quotas.insert(dir, (quota, now));
        }
    }

    /// Samples limited cgroups (walking the hierarchy for them when due),
    /// returns new findings. With `activity`, a cgroup the scheduler probe
    /// saw idle is not read again until `IDLE_REREAD_EVERY` has passed.
    pub fn sample(&mut self, activity: Option<&RunActivity>) -> Vec<CpuFinding> {
        let Some(hierarchy) = self.hierarchy.clone() else { return Vec::new() };
        let v2 = matches!(hierarchy, CpuHierarchy::V2(_));
        let walk_every = if activity.is_some() { WALK_EVERY_WITH_ACTIVITY } else { WALK_EVERY };
        if self.last_walk.is_none_or(|t| t.elapsed() >= walk_every) {
            self.limited = self.walk(&hierarchy);
            self.last_walk = Some(Instant::now());
        } else if let Some(activity) = activity {
            self.find_new(&hierarchy, activity);
        }
        // A set: with a thousand limited pods, a list's `contains` at the
        // end was a million path comparisons per sample.
        let mut seen = HashSet::with_capacity(self.limited.len());
        let mut findings = Vec::new();
        for Limited { dir, rel, quota_cores } in &self.limited {
            if let Some(known) = self.cgroups.get_mut(rel.as_str()) {
                let idle = activity.is_some_and(|a| a.idle(rel));
                if idle && known.read_at.elapsed() < IDLE_REREAD_EVERY {
                    // What a read would have found: the same counters, no
                    // task runnable. Gone since? The next read drops it.
                    seen.insert(rel.as_str());
                    findings.extend(known.update(known.stat, 0, *quota_cores, self.oversubscribed_after));
                    continue;
                }
            }
            // Gone since the walk: dropped below, as if never found.
            let Ok(stat_text) = fs::read_to_string(dir.join("cpu.stat")) else { continue };
            let stat = parse_cpu_stat(&stat_text);
            seen.insert(rel.as_str());
            let known = self.cgroups.get(rel.as_str());
            // CFS periods only advance while the cgroup has runnable
            // threads: without new ones none ran, so none is runnable, and
            // an idle pod costs one read.
            let ran = known.is_none_or(|c| c.stat.nr_periods != stat.nr_periods);
            let runnable = if ran { runnable_threads(dir, v2) } else { 0 };
            let cgroup2_root = self.cgroup2_root.as_deref();
            let entry = self.cgroups.entry(rel.clone()).or_insert_with(|| CpuCgroup {
                rel: rel.clone(),
                cgroup_id: cgroup2_root
                    .and_then(|r| fs::metadata(r.join(rel.trim_start_matches('/'))).ok())
                    .map_or(0, |m| std::os::unix::fs::MetadataExt::ino(&m)),
                quota_cores: *quota_cores,
                stat,
                runnable,
                read_at: Instant::now(),
                throttled_streak: 0,
                throttle_reported: false,
                oversubscribed_since: None,
                oversubscribed_reported: false,
            });
            entry.read_at = Instant::now();
            findings.extend(entry.update(stat, runnable, *quota_cores, self.oversubscribed_after));
        }
        self.cgroups.retain(|rel, _| seen.contains(rel.as_str()));
        findings
    }
}

impl CpuCgroup {
    /// Takes a new sample; returns what a person should hear of it.
    fn update(
        &mut self,
        stat: CpuStat,
        runnable: u32,
        quota_cores: f64,
        oversubscribed_after: Duration,
    ) -> Vec<CpuFinding> {
        let mut findings = Vec::new();
        let new_throttled = stat.nr_throttled.saturating_sub(self.stat.nr_throttled);
        let new_periods = stat.nr_periods.saturating_sub(self.stat.nr_periods);
        let new_throttled_ns = stat.throttled_ns.saturating_sub(self.stat.throttled_ns);
        // Two samples in a row with several throttled periods is a
        // pattern, not a blip; one event per episode.
        if new_throttled >= 2 {
            self.throttled_streak += 1;
            if self.throttled_streak >= 2 && !self.throttle_reported {
                self.throttle_reported = true;
                findings.push(CpuFinding::Throttled {
                    rel: self.rel.clone(),
                    periods: new_throttled,
                    total: new_periods,
                    throttled_ns: new_throttled_ns,
                });
            }
        } else {
            self.throttled_streak = 0;
            self.throttle_reported = false;
        }
        if f64::from(runnable) > quota_cores {
            let since = *self.oversubscribed_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= oversubscribed_after && !self.oversubscribed_reported {
                self.oversubscribed_reported = true;
                findings.push(CpuFinding::Oversubscribed { rel: self.rel.clone(), runnable, quota_cores });
            }
        } else {
            self.oversubscribed_since = None;
            self.oversubscribed_reported = false;
        }
        self.quota_cores = quota_cores;
        self.stat = stat;
        self.runnable = runnable;
        findings
    }
}

/// Per-cgroup CPU numbers from the CPU monitor.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSnapshot {
    pub periods: u64,
    pub throttled_periods: u64,
    pub throttled_ns: u64,
    pub runnable: u32,
    pub quota_cores: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v1_and_v2_stat_and_quota() {
        let v2 = "usage_usec 5000\nuser_usec 4000\nsystem_usec 1000\nnr_periods 50\nnr_throttled 36\nthrottled_usec 7200000\n";
        assert_eq!(
            parse_cpu_stat(v2),
            CpuStat { nr_periods: 50, nr_throttled: 36, throttled_ns: 7_200_000_000 }
        );
        let v1 = "nr_periods 10\nnr_throttled 7\nthrottled_time 123456789\n";
        assert_eq!(
            parse_cpu_stat(v1),
            CpuStat { nr_periods: 10, nr_throttled: 7, throttled_ns: 123_456_789 }
        );
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2.0));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("garbage"), None);
    }

    /// A cgroup v2 hierarchy in a scratch directory: cpu.max and cpu.stat
    /// are plain files there, so a test can change a counter and see
    /// whether the monitor read it.
    struct FakeHierarchy(PathBuf);

    impl FakeHierarchy {
        fn new(tag: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("canaryscope-cpu-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("scratch dir");
            fs::write(dir.join("cgroup.controllers"), "cpu memory\n").expect("controllers");
            Self(dir)
        }

        fn limit(&self, rel: &str, throttled: u64) {
            let dir = self.0.join(rel.trim_start_matches('/'));
            fs::create_dir_all(&dir).expect("cgroup dir");
            fs::write(dir.join("cpu.max"), "50000 100000\n").expect("cpu.max");
            let stat = format!("nr_periods {throttled}\nnr_throttled {throttled}\nthrottled_usec 0\n");
            fs::write(dir.join("cpu.stat"), stat).expect("cpu.stat");
        }

        fn throttled(monitor: &CpuMonitor, rel: &str) -> Option<u64> {
            monitor.cgroups().find(|c| c.rel == rel).map(|c| c.stat.nr_throttled)
        }
    }

    impl Drop for FakeHierarchy {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn only_cgroups_that_ran_below_the_probe_roots_are_read_again() {
        let h = FakeHierarchy::new("ran");
        let (pod, outside) = ("/kubepods.slice/pod-a.slice", "/system.slice/limited.service");
        h.limit(pod, 1);
        h.limit(outside, 1);
        let mut monitor = CpuMonitor::new(Some(&h.0), Duration::from_secs(60));
        let roots = ["/kubepods.slice".to_string()];
        let nothing_ran = HashSet::new();
        let idle = RunActivity { roots: &roots, ran: &nothing_ran };
        monitor.sample(Some(&idle));
        assert_eq!(
            FakeHierarchy::throttled(&monitor, pod),
            Some(1),
            "first sample reads every limited cgroup"
        );

        h.limit(pod, 5);
        h.limit(outside, 5);
        monitor.sample(Some(&idle));
        assert_eq!(
            FakeHierarchy::throttled(&monitor, pod),
            Some(1),
            "an idle pod below the roots is not read"
        );
        assert_eq!(
            FakeHierarchy::throttled(&monitor, outside),
            Some(5),
            "outside the roots: read every sample"
        );

        let mut ran = HashSet::new();
        with_ancestors(&format!("{pod}/cri-a.scope"), &mut ran);
        monitor.sample(Some(&RunActivity { roots: &roots, ran: &ran }));
        assert_eq!(FakeHierarchy::throttled(&monitor, pod), Some(5), "a pod whose task ran is read");

        h.limit(pod, 9);
        monitor.sample(None);
        assert_eq!(
            FakeHierarchy::throttled(&monitor, pod),
            Some(9),
            "without the probe every cgroup is read"
        );
    }

    #[test]
    fn a_new_limited_cgroup_is_found_when_its_first_task_runs() {
        let h = FakeHierarchy::new("new");
        let roots = ["/kubepods.slice".to_string()];
        let nothing_ran = HashSet::new();
        let mut monitor = CpuMonitor::new(Some(&h.0), Duration::from_secs(60));
        monitor.sample(Some(&RunActivity { roots: &roots, ran: &nothing_ran }));
        let pod = "/kubepods.slice/pod-b.slice";
        h.limit(pod, 3);
        // Well before the next walk.
        let ran = HashSet::from([pod.to_string()]);
        monitor.sample(Some(&RunActivity { roots: &roots, ran: &ran }));
        assert_eq!(FakeHierarchy::throttled(&monitor, pod), Some(3));
    }

    #[test]
    fn ancestors_stop_at_the_root() {
        let mut paths = HashSet::new();
        with_ancestors("/kubepods.slice/pod1.slice/cri-a.scope", &mut paths);
        with_ancestors("/kubepods.slice/pod1.slice/cri-b.scope", &mut paths);
        let mut sorted: Vec<_> = paths.into_iter().collect();
        sorted.sort();
        assert_eq!(
            sorted,
            [
                "/kubepods.slice",
                "/kubepods.slice/pod1.slice",
                "/kubepods.slice/pod1.slice/cri-a.scope",
                "/kubepods.slice/pod1.slice/cri-b.scope"
            ]
        );
    }
    #[test]
    fn reads_thread_state_of_this_process() {
        // This test thread is running while it asks.
        let tid = unsafe { libc::gettid() } as u32;
        assert_eq!(thread_state(tid), Some('R'));
    }
}
