//! A series is its label set: cgroups that share one add up (counters) or
//! show the live one (gauges), counts survive purges while their pod is on
//! the node, and a label learned late moves a count without doubling it.
use std::collections::BTreeMap;

use super::*;

/// Every sample of an exposition by its name and label set, asserting
/// that no label set appears twice.
fn samples(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a sample: {line}"));
        let value: f64 = value.parse().unwrap_or_else(|_| panic!("a number: {line}"));
        let before = out.insert(series.to_string(), value);
        assert!(before.is_none(), "two samples with one label set: {series}\n{text}");
    }
    out
}

const POD: &str =
    r#"namespace="ml",pod="pod-x",container="worker",workload="infer",revision="abc",track="canary""#;

fn worker(liveness: Liveness) -> Resolved {
    let labels = WorkloadLabels {
        namespace: "ml".into(),
        pod: "pod-x".into(),
        container: "worker".into(),
        workload: "infer".into(),
        revision: "abc".into(),
        track: "canary".into(),
    };
    Resolved { labels, liveness, naming: Naming::Named }
}

/// `worker` with the container known only by the short ID of `cgroup`.
fn provisional(cgroup: u64, liveness: Liveness) -> Resolved {
    let mut r = worker(liveness);
    r.labels.container = format!("{cgroup:012x}");
    r.naming = Naming::ShortId;
    r
}

fn value(text: &str, family: &str, extra: &str) -> Option<f64> {
    let key =
        if extra.is_empty() { format!("{family}{{{POD}}}") } else { format!("{family}{{{POD},{extra}}}") };
    samples(text).get(&key).copied()
}

fn init_failure() -> Detail {
    Detail::GpuCall {
        api: Api::Cuda,
        library: "/x/libcuda.so.1".into(),
        function: "cuInit".into(),
        result: 100,
        duration_ns: Some(10),
        driver_version: None,
    }
}

fn crash() -> Detail {
    Detail::Crash {
        signal: 11,
        si_code: 1,
        addr: 0,
        ip: 0,
        library: Some("/opt/zluda/libcuda.so.1".into()),
        library_offset: None,
        in_call: None,
        crash_tid: 1,
    }
}

/// Two instances of one container: cgroup 10, restarted away (gone), and
/// cgroup 11, live. Every per-pod family has an entry for both.
fn two_instances() -> Metrics {
    let mut m = Metrics::new(100);
    for cgroup in [10, 11] {
        m.record(&event(cgroup, init_failure()));
        m.record(&event(cgroup, crash()));
        m.record(&event(cgroup, Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 }));
        m.record(&event(cgroup, kill(9, 0, Cause::Sent)));
        let fault = Detail::GpuHardware {
            kind: HwKind::MemoryFault,
            function: "f",
            detail: String::new(),
            attributed: true,
        };
        m.record(&event(cgroup, fault));
    }
    m.set_stalled([(10, Api::Hip, "hipMemcpy".into()), (11, Api::Hip, "hipMemcpy".into())]);
    m.set_driver_versions(vec![(10, 12020), (11, 12040)]);
    m.set_vram(vec![(10, 7, 1 << 30), (11, 7, 2 << 30)]);
    // The dead instance never initialised; the restarted one is within its timeout.
    m.set_gpu_never_initialized(vec![(10, true), (11, false)]);
    let gk = |cgroup_id| GpuStatsKey { cgroup_id, api: 1, function: 0, result: 100, untimed: 0 };
    m.set_gpu(vec![(gk(10), hist(1, 10, &[(0, 1)])), (gk(11), hist(2, 20, &[(0, 2)]))]);
    let kk = |cgroup_id| KfdStatsKey { cgroup_id, nr: 1, result: -22 };
    m.set_kfd(vec![(kk(10), hist(1, 10, &[(0, 1)])), (kk(11), hist(2, 20, &[(0, 2)]))]);
    let mk = |cgroup_id| MemLimitKey { cgroup_id, limit: MemLimit::As as u32, _pad: 0 };
    m.set_mem_limits(vec![(mk(10), 3), (mk(11), 4)]);
    let cpu = |periods, runnable, quota_cores| CpuSnapshot {
        periods,
        throttled_periods: periods / 2,
        throttled_ns: 1_000_000_000,
        runnable,
        quota_cores,
    };
    m.set_cpu(vec![(10, cpu(100, 3, 0.5)), (11, cpu(8, 1, 2.0))]);
    m.refresh_labels(Duration::from_secs(600), &HashSet::new(), |c| {
        worker(if c == 10 { Liveness::Gone } else { Liveness::Live })
    });
    m
}

/// (family, extra labels, the sum over both instances, the live one's value).
const EXPECTED: &[(&str, &str, f64, f64)] = &[
    (
        "canaryscope_gpu_init_failures_total",
        r#"api="cuda",function="cuInit",result="CUDA_ERROR_NO_DEVICE""#,
        2.0,
        1.0,
    ),
    ("canaryscope_native_crashes_total", r#"signal="SIGSEGV",library="libcuda.so.1""#, 2.0, 1.0),
    ("canaryscope_oom_kills_total", r#"scope="memcg""#, 2.0, 1.0),
    (
        "canaryscope_abnormal_exits_total",
        r#"signal="SIGKILL",cause="sent",sender_scope="host",kill_reason="container_restart""#,
        2.0,
        1.0,
    ),
    ("canaryscope_gpu_memory_faults_total", "", 2.0, 1.0),
    (
        "canaryscope_gpu_api_call_failures_total",
        r#"api="cuda",function="cuInit",result="CUDA_ERROR_NO_DEVICE""#,
        3.0,
        2.0,
    ),
    ("canaryscope_kfd_ioctl_failures_total", r#"ioctl="GET_VERSION",result="EINVAL""#, 3.0, 2.0),
    ("canaryscope_memory_limit_refusals_total", r#"limit="as""#, 7.0, 4.0),
    ("canaryscope_cpu_periods_total", "", 108.0, 8.0),
    ("canaryscope_cpu_throttled_periods_total", "", 54.0, 4.0),
    ("canaryscope_cpu_throttled_seconds_total", "", 2.0, 1.0),
];

/// Gauges: the live instance's value, never a sum.
const GAUGES: &[(&str, &str, f64)] = &[
    ("canaryscope_gpu_api_stalled_calls", r#"api="hip",function="hipMemcpy""#, 1.0),
    ("canaryscope_gpu_driver_version", "", 12040.0),
    ("canaryscope_gpu_vram_bytes", r#"gpu="7""#, 2147483648.0),
    ("canaryscope_cpu_runnable_threads", "", 1.0),
    ("canaryscope_cpu_quota_cores", "", 2.0),
    ("canaryscope_gpu_never_initialized", "", 0.0),
];

#[test]
fn cgroups_of_one_label_set_are_one_series_counters_summed_gauges_live() {
    let m = two_instances();
    for view in [View::Scrape, View::PerPod] {
        let text = m.render_text_in(view);
        // `samples` fails on any label set seen twice, in every family.
        samples(&text);
        for (family, extra, sum, _) in EXPECTED {
            assert_eq!(value(&text, family, extra), Some(*sum), "{family} {extra}: {text}");
        }
        for (family, extra, live) in GAUGES {
            assert_eq!(value(&text, family, extra), Some(*live), "{family} {extra}: {text}");
        }
    }
}

#[test]
fn a_purged_instances_counts_stay_with_its_pod() {
    let mut m = two_instances();
    let gone_then_live = |c| worker(if c == 10 { Liveness::Gone } else { Liveness::Live });
    let purged = m.refresh_labels(Duration::ZERO, &HashSet::new(), gone_then_live);
    assert_eq!(purged, vec![10]);
    let text = m.render_text();
    for (family, extra, sum, _) in EXPECTED {
        assert_eq!(
            value(&text, family, extra),
            Some(*sum),
            "kept through the purge: {family} {extra}: {text}"
        );
    }
    for (family, extra, live) in GAUGES {
        assert_eq!(value(&text, family, extra), Some(*live), "{family} {extra}: {text}");
    }
    // The last instance goes too, in back-off: the API still lists the pod.
    let listed = HashSet::from([("ml".to_string(), "pod-x".to_string())]);
    let all_gone = |_| worker(Liveness::Gone);
    assert_eq!(m.refresh_labels(Duration::ZERO, &listed, all_gone), vec![11]);
    let text = m.render_text();
    for (family, extra, sum, _) in EXPECTED {
        assert_eq!(
            value(&text, family, extra),
            Some(*sum),
            "the pod is still listed: {family} {extra}: {text}"
        );
    }
    for (family, extra, _) in GAUGES {
        assert_eq!(value(&text, family, extra), None, "no instance, no gauge: {family}: {text}");
    }
    // The pod leaves the node: its series end with it.
    m.record(&event(12, crash()));
    m.refresh_labels(Duration::ZERO, &HashSet::new(), |_| worker(Liveness::Gone));
    let text = m.render_text();
    assert!(!text.contains("pod-x"), "{text}");
}

#[test]
fn a_crash_loops_instances_named_late_count_once_each_under_the_name() {
    let mut m = Metrics::new(100);
    let grace = Duration::from_secs(600);
    let mut last = 0.0;
    // Five instances, each crashing before the API names it; each one's
    // cgroup is gone by the next refresh.
    for cgroup in 20..25 {
        m.record(&event(cgroup, crash()));
        m.refresh_labels(grace, &HashSet::new(), |c| provisional(c, Liveness::Live));
        let text = m.render_text();
        samples(&text);
        assert!(!text.contains(r#"container="worker""#), "not named yet: {text}");
    }
    let crashes = "canaryscope_native_crashes_total";
    let shown = |m: &Metrics| -> Vec<(String, f64)> {
        samples(&m.render_text()).into_iter().filter(|(k, _)| k.starts_with(crashes)).collect()
    };
    assert_eq!(shown(&m), vec![], "held back while named provisionally, never shown under a short ID");
    // The API names them one after another; the count under the name
    // grows by each instance it names.
    for named in 20..25 {
        m.refresh_labels(grace, &HashSet::new(), |c| {
            if c <= named {
                worker(Liveness::Gone)
            } else {
                provisional(c, Liveness::Gone)
            }
        });
        let text = m.render_text();
        let now = value(&text, crashes, r#"signal="SIGSEGV",library="libcuda.so.1""#).unwrap_or(0.0);
        assert_eq!(now, (named - 19) as f64, "{text}");
        assert!(now >= last, "never down: {last} -> {now}");
        last = now;
        assert_eq!(shown(&m).len(), 1, "only the name's series: {text}");
    }
    // A pod deleted from the API resolves to its uid and short ID, named
    // worse: the last good labels stay.
    m.refresh_labels(grace, &HashSet::new(), |c| Resolved {
        labels: WorkloadLabels { pod: "uid".into(), container: format!("{c:012x}"), ..Default::default() },
        liveness: Liveness::Gone,
        naming: Naming::Path,
    });
    assert_eq!(value(&m.render_text(), crashes, r#"signal="SIGSEGV",library="libcuda.so.1""#), Some(5.0));
}

#[test]
fn a_container_the_api_never_names_shows_under_its_short_id_after_the_hold() {
    let mut m = Metrics::new(100);
    m.record(&event(30, crash()));
    m.refresh_labels(Duration::from_secs(600), &HashSet::new(), |c| provisional(c, Liveness::Gone));
    assert!(!m.render_text().contains("canaryscope_native_crashes_total{"), "held back");
    // The hold has passed (the API is down, or the pod went at once).
    m.series.provisional_hold = Duration::ZERO;
    m.refresh_labels(Duration::from_secs(600), &HashSet::new(), |c| provisional(c, Liveness::Gone));
    assert!(m.take_changed(), "a provisional series may appear without an event");
    let text = m.render_text();
    let short = format!("container=\"{:012x}\"", 30);
    assert!(
        text.lines().any(|l| l.starts_with("canaryscope_native_crashes_total{") && l.contains(&short)),
        "{text}"
    );
}
