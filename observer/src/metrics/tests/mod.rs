//! The exposition as a whole: every family rendered as declared, the
//! cap, escaping, change tracking. `identity` holds the label-set rule.
mod identity;
mod runs;

use super::*;
use crate::{
    attribution::labels::{Liveness, Naming, WorkloadLabels},
    events::Origin,
    exit_cause::{Cause, KillReason, Sender, SenderScope},
};
use observer_common::{kfd::HwKind, memlimit::MemLimit, LatencyHistogram};

/// An exit; a sent one from the host, killed for a container restart.
fn kill(signal: i32, exit_code: i32, cause: Cause) -> Detail {
    let sent = cause == Cause::Sent;
    Detail::Exit {
        signal,
        exit_code,
        core_dumped: false,
        cause,
        sender: sent.then(|| Sender {
            pid: 1,
            comm: "kubelet".into(),
            cgroup_id: 1,
            cgroup: Some("/".into()),
            scope: SenderScope::Host,
        }),
        kill_reason: sent.then_some(KillReason::ContainerRestart),
        vram: None,
    }
}

fn event(cgroup: u64, detail: Detail) -> Event {
    Event { origin: Origin { cgroup_id: cgroup, ..Default::default() }, detail }
}

fn labelled(cgroup: u64) -> Resolved {
    let l = WorkloadLabels {
        namespace: "ml".into(),
        pod: format!("pod-{cgroup}"),
        container: "worker".into(),
        workload: "infer".into(),
        revision: "abc".into(),
        track: if cgroup == 1 { "canary".into() } else { "stable".into() },
    };
    Resolved { labels: l, liveness: Liveness::Live, naming: Naming::Named }
}

fn gone(_: u64) -> Resolved {
    Resolved { labels: WorkloadLabels::default(), liveness: Liveness::Gone, naming: Naming::Path }
}

/// `refresh_labels` with no pod listed by the API.
fn refresh(m: &mut Metrics, grace: Duration, resolve: impl FnMut(u64) -> Resolved) -> Purged {
    m.refresh_labels(grace, &HashSet::new(), resolve)
}

#[test]
fn init_failures_are_counted_with_workload_labels() {
    let mut m = Metrics::new(100);
    let call = |result| Detail::GpuCall {
        api: Api::Hip,
        library: "/x/libamdhip64.so.5".into(),
        function: "hipInit".into(),
        result,
        duration_ns: Some(10),
        driver_version: None,
    };
    m.record(&event(1, call(101)));
    m.record(&event(1, call(101)));
    m.record(&event(2, call(0)));
    refresh(&mut m, Duration::from_secs(60), labelled);
    let text = m.render_text();
    assert!(
        text.contains(r#"canaryscope_gpu_init_failures_total{namespace="ml",pod="pod-1",container="worker",workload="infer",revision="abc",track="canary",api="hip",function="hipInit",result="hipErrorInvalidDevice"} 2"#),
        "{text}"
    );
    assert!(!text.contains(r#"pod="pod-2""#), "a successful call is no failure: {text}");
}

#[test]
fn an_unchanged_snapshot_in_another_order_is_no_change() {
    let mut m = Metrics::new(100);
    let h = |n| LatencyHistogram { count: n, ..Default::default() };
    m.set_runq(vec![(1, h(1)), (2, h(2))]);
    refresh(&mut m, Duration::from_secs(60), labelled);
    assert!(m.take_changed());
    let text = m.render_text();
    // Kernel maps list keys in hash order, which may differ next time.
    m.set_runq(vec![(2, h(2)), (1, h(1))]);
    refresh(&mut m, Duration::from_secs(60), labelled);
    assert!(!m.take_changed(), "same numbers, same labels");
    assert_eq!(m.render_text(), text);
    m.set_runq(vec![(2, h(3)), (1, h(1))]);
    assert!(m.take_changed(), "a histogram moved");
    m.record(&event(1, Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 }));
    assert!(m.take_changed(), "an event was counted");
}

#[test]
fn gone_cgroups_are_dropped_after_the_grace_period() {
    let mut m = Metrics::new(100);
    m.record(&event(7, Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 }));
    refresh(&mut m, Duration::ZERO, labelled);
    assert!(m.render_text().contains("canaryscope_oom_kills_total"));
    let purged = refresh(&mut m, Duration::ZERO, gone);
    assert_eq!(purged, vec![7]);
    assert!(!m.render_text().contains("canaryscope_oom_kills_total"));
}

#[test]
fn the_cardinality_cap_counts_what_it_drops() {
    let mut m = Metrics::new(2);
    for cgroup in 1..=5 {
        m.record(&event(cgroup, kill(9, 0, Cause::Sent)));
    }
    assert_eq!(m.tracked_cgroups(), 2);
    assert_eq!(m.series.overflow, 3);
    assert!(m.render_text().contains("canaryscope_series_overflow_total 3"));
}

#[test]
fn label_values_are_escaped() {
    let mut m = Metrics::new(10);
    m.record(&event(3, kill(9, 0, Cause::Sent)));
    refresh(&mut m, Duration::ZERO, |_| {
        let labels = WorkloadLabels { workload: "a\"b\\c\nd".into(), ..Default::default() };
        Resolved { labels, liveness: Liveness::Live, naming: Naming::Named }
    });
    let text = m.render_text();
    assert!(text.contains(r#"workload="a\"b\\c\nd""#), "{text}");
}

#[test]
fn two_files_at_one_path_give_one_probe_sample() {
    // The same path in two roots: two files, two statuses, one label set.
    let status = |attached| ProbeStatus {
        probe: "gpu",
        target: "/lib/x86_64-linux-gnu/libamdhip64.so.5".into(),
        attached,
        detail: String::new(),
    };
    for (statuses, want) in
        [(vec![status(true), status(true)], "1"), (vec![status(true), status(false)], "0")]
    {
        let mut m = Metrics::new(10);
        m.node.probes = statuses;
        let text = m.render_text();
        let samples: Vec<&str> =
            text.lines().filter(|l| l.starts_with("canaryscope_probe_attached{")).collect();
        assert_eq!(samples.len(), 1, "{text}");
        assert!(samples[0].ends_with(&format!(" {want}")), "{samples:?}");
    }
}

/// A gigabyte left on GPU 48879 by a process that held two and faulted.
fn stranded(attributed: bool) -> Detail {
    Detail::GpuVramStranded {
        gpu: 48879,
        bytes: 1 << 30,
        held_bytes: 2 << 30,
        cause: Some(Cause::Fault),
        attributed,
    }
}

fn hist(count: u64, total_ns: u64, buckets: &[(usize, u64)]) -> observer_common::LatencyHistogram {
    let mut h = observer_common::LatencyHistogram { count, total_ns, ..Default::default() };
    for (i, n) in buckets {
        h.buckets[*i] = *n;
    }
    h
}

/// Every family populated, with merges across results and an unlabelled
/// (gone, never resolved) cgroup.
fn rich() -> Metrics {
    let mut m = Metrics::new(100);
    let call = |api, function: &str, result| Detail::GpuCall {
        api,
        library: "/x/lib.so".into(),
        function: function.into(),
        result,
        duration_ns: Some(10),
        driver_version: None,
    };
    m.record(&event(1, call(Api::Hip, "hipInit", 101)));
    m.record(&event(1, call(Api::Hip, "hipInit", 101)));
    m.record(&event(2, call(Api::Cuda, "cuInit", 100)));
    m.record(&event(2, call(Api::Cuda, "cuInit", 7777)));
    let crash = |library: Option<&str>| Detail::Crash {
        signal: 11,
        si_code: 1,
        addr: 0,
        ip: 0,
        library: library.map(str::to_string),
        library_offset: None,
        in_call: None,
        crash_tid: 1,
    };
    m.record(&event(1, crash(Some("/opt/rocm/lib/libamdhip64.so.5"))));
    m.record(&event(2, crash(None)));
    m.record(&event(1, Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 }));
    m.record(&event(2, Detail::OomKill { scope: "global", anon_rss_bytes: Some(1), victims: 1 }));
    m.record(&event(1, kill(9, 0, Cause::Sent)));
    m.record(&event(2, kill(0, 137, Cause::Wrapped)));
    let hw =
        |kind, attributed| Detail::GpuHardware { kind, function: "f", detail: String::new(), attributed };
    m.record(&event(0, hw(HwKind::MemoryFault, false)));
    m.record(&event(0, hw(HwKind::MemoryFault, false)));
    m.record(&event(0, hw(HwKind::Reset, false)));
    m.record(&event(0, hw(HwKind::QueueEviction, false)));
    m.record(&event(1, hw(HwKind::MemoryFault, true)));
    m.record(&event(2, hw(HwKind::QueueEviction, true)));
    m.record(&event(2, hw(HwKind::Reset, true)));
    m.set_stalled([(1, Api::Hip, "hipMemcpy".to_string()), (1, Api::Hip, "hipMemcpy".to_string())]);
    m.set_driver_versions(vec![(2, 12020)]);
    m.set_vram(vec![(1, 48879, 2 << 30), (2, 1234, 0), (2, 48879, 1 << 30)]);
    m.set_vram_stranded(vec![(1234, 0), (48879, 3 << 30)]);
    m.set_gpu_never_initialized(vec![(1, true), (2, false)]);

    let gk = |cgroup_id, api, function, result| GpuStatsKey { cgroup_id, api, function, result, untimed: 0 };
    m.set_gpu(vec![
        (gk(1, 0, 0, 0), hist(3, 3_000, &[(0, 1), (10, 2)])),
        (gk(1, 0, 0, 101), hist(1, 1_500_000_000, &[(31, 1)])),
        (gk(1, 0, 2, 0), hist(2, 20, &[(3, 2)])),
        (gk(2, 1, 1, 0), hist(4, 4_000_000, &[(20, 4)])),
        (gk(2, 1, 9999, -5), hist(1, 7, &[(2, 1)])),
        (gk(3, 0, 1, 0), hist(1, 1, &[(0, 1)])),
        (gk(2, 42, 0, 0), hist(1, 1, &[(0, 1)])),
    ]);
    let kk = |cgroup_id, nr, result| KfdStatsKey { cgroup_id, nr, result };
    m.set_kfd(vec![
        (kk(1, 0x01, 0), hist(5, 5_000, &[(9, 5)])),
        (kk(1, 0x01, -22), hist(1, 100, &[(6, 1)])),
        (kk(2, 0xee, -4095), hist(2, 2, &[(1, 2)])),
    ]);
    m.set_runq(vec![(1, hist(6, 6_000_000, &[(0, 1), (15, 4), (25, 1)])), (2, hist(0, 0, &[]))]);
    let mk = |cgroup_id, limit: MemLimit| MemLimitKey { cgroup_id, limit: limit as u32, _pad: 0 };
    // An unknown limit number (a newer kernel side) is skipped, not mislabelled.
    m.set_mem_limits(vec![
        (mk(1, MemLimit::As), 4127),
        (mk(2, MemLimit::Data), 3),
        (MemLimitKey { cgroup_id: 1, limit: 7, _pad: 0 }, 1),
    ]);
    let cpu = |periods, runnable, quota_cores| CpuSnapshot {
        periods,
        throttled_periods: periods / 2,
        throttled_ns: 1_234_567_890,
        runnable,
        quota_cores,
    };
    m.set_cpu(vec![(0, cpu(1, 1, 1.0)), (1, cpu(100, 3, 0.5)), (2, cpu(7, 0, 2.25))]);
    m.node.probes = vec![
        ProbeStatus {
            probe: "gpu",
            target: "/x/libamdhip64.so".into(),
            attached: true,
            detail: String::new(),
        },
        ProbeStatus { probe: "kfd", target: "kfd_ioctl".into(), attached: false, detail: "no".into() },
    ];
    m.node.gate = Some(crate::gate::patcher::Summary {
        pods_true: 2,
        pods_false: 1,
        pods_none: 1,
        pending: 1,
        patches_ok: 5,
        patches_failed: 2,
    });
    m.node.events_lost = 17;
    m.node.decode_errors = 2;
    m.series.overflow = 4;
    m.node.records = BTreeMap::from([("gpu_call", 12), ("exit", 3)]);
    refresh(&mut m, Duration::from_secs(600), |cgroup| match cgroup {
        3 => gone(3),
        c => labelled(c),
    });
    let request = |class, status, probe| Detail::HttpRequest {
        method: "GET",
        status,
        class,
        duration_ns: 12_000_000,
        probe,
    };
    m.record(&event(1, request("2xx", Some(200), false)));
    m.record(&event(1, request("5xx", Some(503), false)));
    m.record(&event(2, request("closed", None, false)));
    m.record(&event(2, request("2xx", Some(200), true)));
    m.record(&event(1, Detail::HttpUnparsed { protocol: "h2" }));
    m.set_http_segments_lost(3);
    m.record(&event(
        1,
        Detail::RunEnded {
            executable: "z3".into(),
            duration_ns: 120_000_000,
            ending: crate::exit_cause::RunEnding::ExitZero,
            exit_code: 0,
        },
    ));
    // Put on a revision once its pod's labels are known.
    m.record(&event(1, stranded(true)));
    m.record(&event(2, stranded(false)));
    m.record(&event(
        1,
        Detail::LibraryLoadFailed {
            library: "libonnxruntime_providers_cuda.so".into(),
            missing: "libcublasLt.so.13".into(),
            requested: "/app/libonnxruntime_providers_cuda.so".into(),
            path: Some("/app/libonnxruntime_providers_cuda.so".into()),
            gpu_library: "libonnxruntime_providers_cuda.so".into(),
        },
    ));
    m
}

#[test]
fn a_render_in_parts_of_one_series_is_the_render_in_one_part() {
    let m = rich();
    for view in [View::Scrape, View::PerPod] {
        let whole = m.render_in_parts(view, 0, usize::MAX);
        assert_eq!(String::from_utf8_lossy(&m.render_in_parts(view, 0, 1)), String::from_utf8_lossy(&whole));
        assert_eq!(m.render(view, 0), whole);
    }
}

#[test]
fn every_family_renders_as_declared() {
    for view in [View::Scrape, View::PerPod] {
        families_render_as_declared(view);
    }
}

fn families_render_as_declared(view: View) {
    let families = rich().families(view);
    let rendered: Vec<&str> = families.iter().map(|f| f.name()).collect();
    let declared: Vec<String> = CATALOG.iter().map(|d| format!("{PREFIX}{}", d.name)).collect();
    assert_eq!(rendered, declared, "the fixture populates every family, in catalog order");
    for (f, d) in families.iter().zip(CATALOG) {
        assert_eq!(f.help(), d.help);
        let kind = match d.kind {
            Kind::Counter => prometheus::proto::MetricType::COUNTER,
            Kind::Gauge => prometheus::proto::MetricType::GAUGE,
            Kind::Histogram => prometheus::proto::MetricType::HISTOGRAM,
        };
        assert_eq!(f.get_field_type(), kind, "{}", d.name);
        let names: Vec<&str> = d.label_names_in(view).collect();
        for m in f.get_metric() {
            let got: Vec<&str> = m.get_label().iter().map(|l| l.name()).collect();
            assert_eq!(got, names, "{}: a sample's labels differ from the declaration", d.name);
            // The plain data model has no field presence: a sample of
            // another type shows as a non-default field of that type.
            let counter = *m.get_counter() != Default::default();
            let gauge = *m.get_gauge() != Default::default();
            let histogram = !m.get_histogram().get_bucket().is_empty();
            let ok = match d.kind {
                Kind::Counter => !gauge && !histogram,
                Kind::Gauge => !counter && !histogram,
                Kind::Histogram => !counter && !gauge && histogram,
            };
            assert!(ok, "{}: a sample of another type", d.name);
        }
    }
}

#[test]
fn exits_are_counted_by_cause_with_bounded_labels() {
    let mut m = Metrics::new(10);
    m.record(&event(1, kill(9, 0, Cause::Sent)));
    m.record(&event(1, kill(9, 0, Cause::Sent)));
    m.record(&event(1, kill(9, 0, Cause::OomKill)));
    m.record(&event(1, kill(0, 137, Cause::Wrapped)));
    refresh(&mut m, Duration::from_secs(60), labelled);
    let text = m.render_text();
    let line = |labels: &str| {
        text.lines()
            .find(|l| l.starts_with("canaryscope_abnormal_exits_total{") && l.contains(labels))
            .unwrap_or_else(|| panic!("no series with {labels} in {text}"))
            .to_string()
    };
    let sent = line(r#"signal="SIGKILL",cause="sent",sender_scope="host",kill_reason="container_restart""#);
    assert!(sent.ends_with(" 2"), "{sent}");
    assert!(!sent.contains("kubelet"), "never a comm in a label: {sent}");
    line(r#"signal="SIGKILL",cause="oom_kill",sender_scope="none",kill_reason="none""#);
    line(r#"signal="exit137",cause="wrapped",sender_scope="none",kill_reason="none""#);
}

#[test]
fn calls_counted_at_return_add_to_the_counter_and_not_to_durations() {
    let mut m = Metrics::new(10);
    let key = |function, untimed| GpuStatsKey { cgroup_id: 1, api: 0, function, result: 0, untimed };
    let counted = LatencyHistogram { count: 5, ..LatencyHistogram::default() };
    m.set_gpu(vec![
        (key(0, 0), hist(3, 3_000, &[(0, 1), (10, 2)])),
        (key(0, 1), counted),
        (key(1, 1), counted),
    ]);
    // Before its labels are bound the cgroup's revision is unknown: its
    // calls join no revision's series (one they would leave later).
    assert!(!m.render_text().contains("canaryscope_gpu_api_calls_total{"), "held until labelled");
    refresh(&mut m, Duration::from_secs(60), labelled);
    let text = m.render_text();
    let timed_function = format!("function=\"{}\"", crate::events::function_name(Api::Hip, 0));
    let counted_only = format!("function=\"{}\"", crate::events::function_name(Api::Hip, 1));
    let sample = |prefix: &str, function: &str| {
        text.lines()
            .find(|l| l.starts_with(prefix) && l.contains(function))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    let calls = "canaryscope_gpu_api_calls_total{";
    assert_eq!(sample(calls, &timed_function), Some(8.0), "one series, both counts: {text}");
    assert_eq!(text.lines().filter(|l| l.starts_with(calls)).count(), 2, "{text}");
    assert_eq!(sample(calls, &counted_only), Some(5.0), "{text}");
    let durations = "canaryscope_gpu_api_call_duration_seconds_count{";
    // Scraped, durations are per tier: the timed calls alone.
    assert_eq!(sample(durations, "tier=\"cold\""), Some(3.0), "timed calls only: {text}");
    let per_pod = m.render_text_in(View::PerPod);
    let sample = |prefix: &str, function: &str| {
        per_pod
            .lines()
            .find(|l| l.starts_with(prefix) && l.contains(function))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    assert_eq!(sample(durations, &timed_function), Some(3.0), "timed calls only: {per_pod}");
    // A function only counted has no duration series: an empty one would
    // read as a function that was never called.
    assert_eq!(sample(durations, &counted_only), None, "{per_pod}");
}

#[test]
fn decode_errors_are_a_node_counter() {
    let mut m = Metrics::new(10);
    m.node.decode_errors = 3;
    let text = m.render_text();
    assert!(
        text.contains(
            "# HELP canaryscope_decode_errors_total Ring-buffer records that could not be decoded \
             (a kernel/userspace layout mismatch); their events are lost.\n\
             # TYPE canaryscope_decode_errors_total counter\n\
             canaryscope_decode_errors_total 3\n"
        ),
        "{text}"
    );
}

#[test]
fn vram_is_per_container_and_what_a_death_left_per_revision() {
    let mut m = Metrics::new(10);
    m.set_vram(vec![(1, 48879, 2 << 30), (1, 1234, 0)]);
    refresh(&mut m, Duration::from_secs(60), labelled);
    let text = m.render_text();
    let pod =
        r#"namespace="ml",pod="pod-1",container="worker",workload="infer",revision="abc",track="canary""#;
    assert!(
        text.contains(&format!("canaryscope_gpu_vram_bytes{{{pod},gpu=\"48879\"}} 2147483648\n")),
        "{text}"
    );
    assert!(!text.contains("gpu=\"1234\""), "a GPU it never held memory on has no series: {text}");
    // Freed: the series stays at 0 while the container lives.
    m.set_vram(vec![(1, 1234, 0)]);
    assert!(m.take_changed());
    assert!(m.render_text().contains(&format!("canaryscope_gpu_vram_bytes{{{pod},gpu=\"48879\"}} 0\n")));
    m.record(&event(1, stranded(true)));
    m.record(&event(1, stranded(true)));
    m.record(&event(1, stranded(false)));
    m.record(&event(9, stranded(true)));
    let text = m.render_text();
    let revision = r#"namespace="ml",workload="infer",revision="abc",track="canary""#;
    assert!(
        text.contains(&format!("canaryscope_gpu_vram_stranded_bytes_total{{{revision}}} 2147483648\n")),
        "{text}"
    );
    // Put on no pod, and a cgroup whose labels are unknown.
    assert!(
        text.contains("canaryscope_node_gpu_vram_stranded_unattributed_bytes_total 2147483648\n"),
        "{text}"
    );
    m.set_vram_stranded(vec![(48879, 3 << 30)]);
    assert!(m.render_text().contains("canaryscope_node_gpu_vram_stranded_bytes{gpu=\"48879\"} 3221225472\n"));
    refresh(&mut m, Duration::ZERO, gone);
    refresh(&mut m, Duration::ZERO, gone);
    let text = m.render_text();
    assert!(!text.contains("canaryscope_gpu_vram_bytes{"), "gone with its cgroup: {text}");
    assert!(!text.contains("canaryscope_gpu_vram_stranded_bytes_total{"), "gone with its revision: {text}");
}

#[test]
fn the_stranded_familys_help_names_the_settle_time() {
    let settle = format!("{} s after", crate::pipeline::vram::SETTLE.as_secs());
    assert!(GPU_VRAM_STRANDED.help.contains(&settle), "{}", GPU_VRAM_STRANDED.help);
}
