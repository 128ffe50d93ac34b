//! `footprint`: what the daemon holds while it runs: RSS, CPU and BPF map
//! memory, idle and while many cgroups run the real HIP runtime.
//!
//! A node agent runs on every node for as long as the node does, so its
//! memory and idle CPU are paid everywhere, all the time. Many short-lived
//! processes in many cgroups are the load that grows its tables and
//! /metrics series; the idle window after the load shows what stays.
//!
//! It shares the detection case's daemon (detection.rs): its idle window
//! runs first, before anything has run under the daemon, its load last.
use std::{
    collections::BTreeMap,
    fs,
    path::PathBuf,
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};

use super::{
    bpf_stats::map_memory,
    cgroups::{cgroup2_root, CgroupTree, BENCH_CGROUP},
    daemon::{metric_sum, Daemon},
    div, median,
    process::{clock_ticks, Proc, SIGKILL},
    report::opt,
    step, sub, Env, Plan, Row, Target,
};

/// utime+stime of a whole process, in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / clock_ticks())
}

fn status_kib(pid: u32, key: &str) -> Option<f64> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().trim_end_matches("kB").trim().parse().ok())
}

/// "name: lines, ..." for the `n` metric names with the most sample lines.
/// Ten scrapes one after another as Prometheus makes them (gzip), each
/// one's time and the compressed size, then the text once (uncompressed,
/// to count its series).
fn scrapes(d: &Daemon) -> (String, Vec<f64>, usize) {
    let mut times = Vec::new();
    let mut compressed = 0;
    for _ in 0..10 {
        let t = Instant::now();
        if let Ok(size) = super::daemon::scrape_gzip(&d.addr) {
            times.push(t.elapsed().as_secs_f64() * 1e3);
            compressed = size;
        }
    }
    (d.metrics().unwrap_or_default(), times, compressed)
}

fn top_metric_names(text: &str, n: usize) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name = l.split(['{', ' ']).next().unwrap_or(l);
        *counts.entry(name).or_default() += 1;
    }
    let mut v: Vec<(&str, usize)> = counts.into_iter().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    v.iter().take(n).map(|(k, c)| format!("{k} {c}")).collect::<Vec<_>>().join(", ")
}

const MIB: f64 = 1024.0 * 1024.0;
/// Prometheus scrapes every 15 to 30 s; once a second is the harder case.
const SCRAPE_EVERY: Duration = Duration::from_secs(1);

/// RSS (MiB) at the end and CPU (% of one core) over an idle window.
fn idle_window(pid: u32, window: Duration) -> (Option<f64>, Option<f64>) {
    let c0 = cpu_seconds(pid);
    let t0 = Instant::now();
    sleep(window);
    let cpu = sub(cpu_seconds(pid), c0).map(|c| c / t0.elapsed().as_secs_f64() * 100.0);
    (status_kib(pid, "VmRSS:").map(|k| k / 1024.0), cpu)
}

/// The idle daemon: RSS (MiB), CPU (% of one core) and (maps, memlock bytes).
pub(super) struct Idle {
    rss: Option<f64>,
    cpu: Option<f64>,
    maps: (usize, u64),
}

/// Measures the idle daemon `pid` over the plan's window.
pub(super) fn idle(plan: &Plan, pid: u32) -> Idle {
    step(&format!("footprint: idle daemon, {:.0?} window", plan.window));
    sleep(Duration::from_secs(1));
    let (rss, cpu) = idle_window(pid, plan.window);
    Idle { rss, cpu, maps: map_memory(pid) }
}

/// The idle rows, then the loads and their rows: GPU pods on `d`, which
/// is stopped after them, and CPU pods on a daemon of their own.
pub(super) fn idle_and_load(env: &Env, plan: &Plan, d: Daemon, idle: Idle, out: &mut Vec<Row>) -> Result<()> {
    let mut r = Row::new("footprint_idle_rss", "MiB");
    r.canaryscope = idle.rss;
    r.notes.push(
        "VmRSS of `canaryscope run` (all probes, no Kubernetes) after start-up, nothing running".into(),
    );
    out.push(r);
    let mut r = Row::new("footprint_idle_cpu", "% of one core");
    r.canaryscope = idle.cpu;
    r.notes.push(format!("utime+stime from /proc/PID/stat over a {:.0?} idle window", plan.window));
    out.push(r);
    footprint_load(env, plan, d, idle.maps, out)
}

/// What the pods of a load run: GPU start-ups, or CPU work in a limit.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PodKind {
    Gpu,
    Cpu,
}

impl PodKind {
    fn name(self) -> &'static str {
        match self {
            PodKind::Gpu => "gpu",
            PodKind::Cpu => "cpu",
        }
    }

    /// Part of the pods' uids, which tells the loads' pods apart.
    fn uid_code(self) -> u32 {
        match self {
            PodKind::Gpu => 0xa,
            PodKind::Cpu => 0xc,
        }
    }

    /// The series budget of one pod (docs/daemon.md: the series budget).
    fn budget(self) -> f64 {
        match self {
            PodKind::Gpu => 40.0,
            PodKind::Cpu => 10.0,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            // Failures from the real runtime, successes from the stand-ins:
            // no test machine has a GPU the real runtimes would succeed on.
            PodKind::Gpu => {
                "each pod runs hip_probe (the real HIP runtime: hipInit and hipGetDeviceCount fail) and \
                 cuda_app_standin --startup (the ZLUDA-shaped library over the HIP stand-in: 14 driver \
                 calls and the HIP calls beneath them succeed, cuModuleLoadData fails)"
            }
            PodKind::Cpu => {
                "each pod runs busy_threads 2 1 (two spinning threads for a second) in a 0.5-core cpu.max"
            }
        }
    }
}

/// One pod's container cgroup, and where its CPU limit lives on a hybrid
/// host (the cpu controller on v1, at the same relative path, as the
/// kubelet lays it out there).
struct PodDir {
    dir: PathBuf,
    cpu_v1: Option<PathBuf>,
}

/// Pod-shaped cgroups under `base`, as the kubelet lays them out with the
/// systemd driver: `kubepods.slice/kubepods-burstable.slice/
/// kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`; a CPU
/// pod's container gets half a core.
fn pod_dirs(base: &std::path::Path, kind: PodKind, n: usize) -> Result<Vec<PodDir>> {
    let qos = base.join("kubepods.slice").join("kubepods-burstable.slice");
    fs::create_dir_all(&qos).with_context(|| format!("cannot create {}", qos.display()))?;
    let root = base.parent().map(PathBuf::from).unwrap_or_default();
    let v2_cpu = fs::read_to_string(root.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|x| x == "cpu"));
    if kind == PodKind::Cpu && v2_cpu {
        // cpu.max of a pod needs the controller enabled on the way down.
        let mut dir = root.clone();
        for part in [BENCH_CGROUP, "kubepods.slice", "kubepods-burstable.slice"] {
            let _ = fs::write(dir.join("cgroup.subtree_control"), "+cpu");
            dir.push(part);
        }
        let _ = fs::write(dir.join("cgroup.subtree_control"), "+cpu");
    }
    let mut dirs = Vec::with_capacity(n);
    for i in 0..n {
        let code = kind.uid_code();
        let pod = format!("kubepods-burstable-pod{i:08x}_{code:04x}_4000_8000_{i:012x}.slice");
        let container = format!("cri-containerd-{:064x}.scope", i + 1);
        let dir = qos.join(&pod).join(&container);
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut cpu_v1 = None;
        if kind == PodKind::Cpu && v2_cpu {
            let _ = fs::write(qos.join(&pod).join("cgroup.subtree_control"), "+cpu");
            fs::write(dir.join("cpu.max"), "50000 100000")
                .with_context(|| format!("cannot limit {}", dir.display()))?;
        } else if kind == PodKind::Cpu {
            let rel = dir.strip_prefix(&root).unwrap_or(&dir);
            let v1 = PathBuf::from("/sys/fs/cgroup/cpu").join(rel);
            fs::create_dir_all(&v1).with_context(|| format!("cannot create {}", v1.display()))?;
            fs::write(v1.join("cpu.cfs_period_us"), "100000")
                .and_then(|()| fs::write(v1.join("cpu.cfs_quota_us"), "50000"))
                .with_context(|| format!("cannot limit {}", v1.display()))?;
            cpu_v1 = Some(v1);
        }
        dirs.push(PodDir { dir, cpu_v1 });
    }
    Ok(dirs)
}

/// The processes one pod of `kind` runs, each waiting `sleep_ms` before its
/// first call so that it is in the pod's cgroup by then.
fn pod_commands(env: &Env, kind: PodKind, sleep_ms: u64) -> Vec<Command> {
    let sleep = sleep_ms.to_string();
    match kind {
        PodKind::Gpu => {
            let mut hip = Command::new(env.fixture("hip_probe"));
            hip.args(["--sleep-before", &sleep]);
            let mut standin = Command::new(env.fixture("cuda_app_standin"));
            standin.args(["--sleep-before", &sleep, "--startup"]);
            vec![hip, standin]
        }
        PodKind::Cpu => {
            let mut busy = Command::new(env.fixture("busy_threads"));
            busy.args(["2", "1"]);
            vec![busy]
        }
    }
}

/// Series per pod on a scrape: those carrying its `pod` label, and those of
/// its revision (without Kubernetes a pod's own cgroup stands for its
/// revision). Returns (max own, mean own, mean revision, pods).
fn series_per_pod(text: &str, kind: PodKind) -> (f64, f64, f64, usize) {
    // Only this load's pods: an earlier load's may still be kept.
    let code = kind.uid_code();
    let (in_uid, in_path) = (format!("-{code:04x}-4000-8000-"), format!("_{code:04x}_4000_8000_"));
    let mut own: BTreeMap<&str, usize> = BTreeMap::new();
    let mut shared: BTreeMap<&str, usize> = BTreeMap::new();
    for l in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let pod = l.split("pod=\"").nth(1).and_then(|r| r.split('"').next()).filter(|p| p.contains(&in_uid));
        if let Some(pod) = pod {
            *own.entry(pod).or_default() += 1;
        } else if let Some(w) = l.split("workload=\"").nth(1).and_then(|r| r.split('"').next()) {
            if w.contains(&in_path) {
                *shared.entry(w).or_default() += 1;
            }
        }
    }
    let pods = own.len().max(1);
    let max = own.values().copied().max().unwrap_or(0) as f64;
    let mean = own.values().sum::<usize>() as f64 / pods as f64;
    (max, mean, shared.values().sum::<usize>() as f64 / pods as f64, own.len())
}

fn footprint_load(env: &Env, plan: &Plan, d: Daemon, idle: (usize, u64), rows: &mut Vec<Row>) -> Result<()> {
    pods_load(env, plan, &d, PodKind::Gpu, idle, rows)?;
    let took = d.stop();
    eprintln!("    canaryscope run took {took:.1?} to exit");
    // On the GPU pods' daemon the CPU pods would meet the GPU pods' series
    // still kept (series grace): a load of 2,000 pods, not 1,000.
    let bench = format!("/{BENCH_CGROUP}");
    let cpu = Daemon::start(env, "canaryscope-footprint-cpu", &["--cgroup", &bench])?;
    sleep(Duration::from_secs(1));
    let cpu_idle = map_memory(cpu.pid());
    pods_load(env, plan, &cpu, PodKind::Cpu, cpu_idle, rows)?;
    let took = cpu.stop();
    eprintln!("    canaryscope run (CPU pods) took {took:.1?} to exit");
    Ok(())
}

fn pods_load(
    env: &Env,
    plan: &Plan,
    d: &Daemon,
    kind: PodKind,
    (idle_maps, idle_memlock): (usize, u64),
    rows: &mut Vec<Row>,
) -> Result<()> {
    let pid = d.pid();
    let cg2 = cgroup2_root().ok_or_else(|| anyhow!("no cgroup2 mount for the footprint cgroups"))?;
    let base = cg2.join(BENCH_CGROUP);
    step(&format!(
        "footprint: {} {} pods under {}, in waves of {}",
        plan.cgroups,
        kind.name(),
        base.display(),
        plan.wave
    ));
    let tree = CgroupTree { dir: base.clone() };
    // CPU limits on a hybrid host live in the v1 controller's own tree.
    let v1_tree = CgroupTree { dir: PathBuf::from("/sys/fs/cgroup/cpu").join(BENCH_CGROUP) };
    let dirs = pod_dirs(&base, kind, plan.cgroups)?;

    // VmHWM is the lifetime peak, start-up included (BTF parsing, program
    // loading); writing 5 to clear_refs resets it to the current RSS.
    let startup_hwm = status_kib(pid, "VmHWM:").map(|k| k / 1024.0);
    let hwm_reset = fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok();
    let c0 = cpu_seconds(pid);
    let t0 = Instant::now();
    let (peak_rss, failures) = run_waves(env, plan, d, kind, &dirs)?;
    let load_secs = t0.elapsed().as_secs_f64();
    let load_cpu = Some((cpu_seconds(pid).unwrap_or(0.0) - c0.unwrap_or(0.0)) / load_secs * 100.0);

    // After: let the daemon's refresh see the exits, scrape (timed), then
    // an idle window.
    sleep(Duration::from_secs(2));
    let (text, scrape_ms, compressed) = scrapes(d);
    let (after_rss, after_cpu) = idle_window(pid, plan.window);
    let hwm = status_kib(pid, "VmHWM:").map(|k| k / 1024.0);
    let (after_maps, after_memlock) = map_memory(pid);
    let saved = env.logs.join("metrics-after-load.prom");
    let _ = fs::write(&saved, &text);
    drop(tree);
    drop(v1_tree);

    let m = Measured {
        kind,
        load_desc: format!(
            "{} pod-shaped cgroups under {}: {}; waves of {} pods; load phase {:.1} s",
            plan.cgroups,
            base.display(),
            kind.describe(),
            plan.wave,
            load_secs
        ),
        load_rss_peak: if hwm_reset { peak_rss.max(hwm.unwrap_or(0.0)) } else { peak_rss },
        hwm_reset,
        startup_hwm,
        failures,
        load_cpu,
        series: text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count(),
        families: top_metric_names(&text, 5),
        text,
        scrape_ms,
        compressed,
        after_rss,
        after_cpu,
        maps: ((idle_maps, idle_memlock), (after_maps, after_memlock)),
        saved,
    };
    rows.push(m.series_row());
    m.memory_rows(plan, rows);
    m.scrape_rows(rows);
    Ok(())
}

/// Starts the pods wave by wave, each process moved into its pod's cgroup,
/// and waits for each wave while sampling the daemon's RSS and scraping it
/// as Prometheus would: (peak RSS in MiB, processes that did not exit
/// cleanly).
fn run_waves(env: &Env, plan: &Plan, d: &Daemon, kind: PodKind, dirs: &[PodDir]) -> Result<(f64, usize)> {
    let pid = d.pid();
    let t0 = Instant::now();
    let mut peak_rss: f64 = 0.0;
    let mut failures = 0usize;
    let sample = |peak: &mut f64| {
        if let Some(k) = status_kib(pid, "VmRSS:") {
            *peak = peak.max(k / 1024.0);
        }
    };
    let mut last_scrape = Instant::now();
    for (w, chunk) in dirs.chunks(plan.wave).enumerate() {
        let mut procs = Vec::new();
        for pod in chunk {
            for mut cmd in pod_commands(env, kind, plan.sleep_before_ms) {
                let p = Proc::spawn_silent("pod-load", &mut cmd, SIGKILL, Duration::from_secs(5))?;
                for procs_file in
                    [Some(pod.dir.join("cgroup.procs")), pod.cpu_v1.as_ref().map(|d| d.join("cgroup.procs"))]
                        .into_iter()
                        .flatten()
                {
                    fs::write(&procs_file, p.pid().to_string()).with_context(|| {
                        format!("cannot move pid {} into {}", p.pid(), procs_file.display())
                    })?;
                }
                procs.push(p);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            sample(&mut peak_rss);
            // Scraped as Prometheus would (more often): the exposition is
            // rendered on a scrape, and its size is part of the peak.
            if last_scrape.elapsed() >= SCRAPE_EVERY {
                last_scrape = Instant::now();
                let _ = super::daemon::scrape_gzip(&d.addr);
            }
            let running = procs.iter_mut().map(|p| p.exited()).filter(Option::is_none).count();
            if running == 0 || Instant::now() >= deadline {
                break;
            }
            sleep(Duration::from_millis(100));
        }
        failures += procs.iter_mut().map(|p| p.exited()).filter(|s| !s.is_some_and(|s| s.success())).count();
        eprintln!("    wave {}/{} done ({:.1?} so far)", w + 1, dirs.len().div_ceil(plan.wave), t0.elapsed());
        // Procs dropped here: any still running are killed and reaped.
    }
    sample(&mut peak_rss);
    Ok((peak_rss, failures))
}

/// What one load of pods measured, for its rows.
struct Measured {
    kind: PodKind,
    load_desc: String,
    load_rss_peak: f64,
    hwm_reset: bool,
    startup_hwm: Option<f64>,
    failures: usize,
    load_cpu: Option<f64>,
    /// The exposition after the load, its sample lines and the names with
    /// the most of them.
    text: String,
    series: usize,
    families: String,
    scrape_ms: Vec<f64>,
    compressed: usize,
    after_rss: Option<f64>,
    after_cpu: Option<f64>,
    /// (maps, memlock bytes) idle before the load, and after it.
    maps: ((usize, u64), (usize, u64)),
    saved: PathBuf,
}

impl Measured {
    fn name(&self, what: &str) -> String {
        format!("footprint_{}_pods_{what}", self.kind.name())
    }

    /// Series carrying one pod's own labels, against the kind's budget.
    fn series_row(&self) -> Row {
        let kind = self.kind;
        let (own_max, own_mean, shared_mean, pods) = series_per_pod(&self.text, kind);
        let mut r = Row::new(&self.name("series_per_pod"), "series");
        r.canaryscope = Some(own_max);
        r.target = Some(Target::new(
            &format!("at most {} series with a {} pod's own labels", kind.budget(), kind.name()),
            kind.budget(),
            Some(own_max),
            " series",
        ));
        r.notes.push(format!(
            "most series carrying one pod's `pod` label over {pods} pods (mean {own_mean:.1}); its revision's \
             series (successful calls, latency histograms), which pods of one revision share, add {shared_mean:.1} \
             a pod here, where without Kubernetes each pod is its own revision"
        ));
        r
    }

    /// RSS and CPU, during the load and in the idle window after it.
    fn memory_rows(&self, plan: &Plan, rows: &mut Vec<Row>) {
        let mut r = Row::new(&self.name("load_rss_peak"), "MiB");
        r.canaryscope = Some(self.load_rss_peak);
        r.target = Some(Target::new("RSS < 50 MiB at 1,000 pods", 50.0, r.canaryscope, " MiB"));
        r.notes.push(format!(
            "peak of VmRSS sampled every 100 ms{} (load, scraped every second, and the idle window after it); \
             {}",
            if self.hwm_reset { " and of VmHWM (reset through clear_refs when the load began)" } else { "" },
            self.load_desc
        ));
        r.notes.push(format!(
            "lifetime VmHWM before the load, start-up included: {} MiB (start-up peak, not load)",
            opt(self.startup_hwm)
        ));
        if plan.quick {
            r.notes.push(format!("--quick: only {} pods, the target is for 1,000", plan.cgroups));
        }
        if self.failures > 0 {
            r.notes.push(format!("{} pod processes did not exit cleanly", self.failures));
        }
        rows.push(r);
        let mut r = Row::new(&self.name("load_cpu"), "% of one core");
        r.canaryscope = self.load_cpu;
        r.notes.push("daemon utime+stime over the whole load phase".into());
        rows.push(r);
        let (series, text) = (self.series, &self.text);
        let tracked = metric_sum(text, "canaryscope_tracked_cgroups", &[]);
        let overflow = metric_sum(text, "canaryscope_series_overflow_total", &[]);
        let mut r = Row::new(&self.name("after_rss"), "MiB");
        r.canaryscope = self.after_rss;
        r.target = Some(Target::new("RSS < 50 MiB at 1,000 pods", 50.0, self.after_rss, " MiB"));
        r.notes.push(format!(
            "after the load, with the cgroups' series still kept (series grace): {series} sample lines on \
             /metrics \
             ({} KiB), canaryscope_tracked_cgroups={tracked}, canaryscope_series_overflow_total={overflow}",
            text.len() / 1024
        ));
        r.notes.push(format!(
            "most sample lines by metric name: {} (whole text in {})",
            self.families,
            self.saved.display()
        ));
        rows.push(r);
        let mut r = Row::new(&self.name("after_cpu"), "% of one core");
        r.canaryscope = self.after_cpu;
        r.target = Some(Target::new("idle CPU < 1% of a core at 1,000 pods", 1.0, self.after_cpu, "%"));
        r.notes.push(format!("idle window of {:.0?} after the load", plan.window));
        rows.push(r);
    }

    /// One scrape's time and size, and the memory of the BPF maps.
    fn scrape_rows(&self, rows: &mut Vec<Row>) {
        let (series, text, scrape_ms) = (self.series, &self.text, &self.scrape_ms);
        let mut r = Row::new(&self.name("scrape_ms"), "ms");
        r.canaryscope = median(scrape_ms);
        r.target = Some(Target::new("one scrape < 100 ms at 1,000 pods", 100.0, r.canaryscope, " ms"));
        r.notes.push(format!(
            "median of {} GET /metrics on loopback after the load, gzip accepted as Prometheus asks, slowest {} ms \
             (the first renders); {} KiB sent, the text is {} KiB ({series} sample lines)",
            scrape_ms.len(),
            opt(scrape_ms.iter().copied().reduce(f64::max)),
            self.compressed / 1024,
            text.len() / 1024
        ));
        rows.push(r);
        let mut r = Row::new(&self.name("scrape_size"), "KiB");
        r.canaryscope = Some(text.len() as f64 / 1024.0);
        r.notes.push(format!("{series} sample lines; most by metric name: {}", self.families));
        rows.push(r);
        let ((idle_maps, idle_memlock), (after_maps, after_memlock)) = self.maps;
        let mut r = Row::new(&self.name("bpf_map_memory"), "MiB");
        r.baseline = Some(idle_memlock as f64 / MIB);
        r.canaryscope = Some(after_memlock as f64 / MIB);
        r.ratio("after_vs_idle", div(r.canaryscope, r.baseline));
        r.notes.push(format!(
            "sum of `memlock` of the maps the daemon holds (/proc/PID/fdinfo): baseline column = idle \
             ({idle_maps} \
             maps), canaryscope column = after the load ({after_maps} maps); hash maps are preallocated, so this \
             does not grow with cgroups"
        ));
        rows.push(r);
    }
}
