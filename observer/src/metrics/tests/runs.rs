//! Runs per revision and executable, and each pod's latest kill.
use super::*;
use crate::exit_cause::RunEnding;

fn run(executable: &str, ms: u64, ending: RunEnding) -> Detail {
    Detail::RunEnded { executable: executable.into(), duration_ns: ms * 1_000_000, ending, exit_code: 0 }
}

fn line_value(text: &str, starts: &str, contains: &[&str]) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(starts) && contains.iter().all(|c| l.contains(c)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn a_revisions_runs_share_one_histogram_per_executable_and_outlive_their_pod() {
    let mut m = Metrics::new(100);
    // Pods 2 and 3 are one revision (stable, abc).
    m.record(&event(2, run("z3", 120, RunEnding::ExitZero)));
    m.record(&event(3, run("z3", 300, RunEnding::RlimitCpu)));
    m.record(&event(3, run("z3", 5, RunEnding::SentOutside)));
    m.record(&event(3, run("cvc5", 40, RunEnding::Sent)));
    refresh(&mut m, Duration::from_secs(600), labelled);
    let text = m.render_text();
    let owner = r#"namespace="ml",workload="infer",revision="abc",track="stable""#;
    let count = |text: &str, exe: &str| {
        line_value(
            text,
            "canaryscope_run_duration_seconds_count{",
            &[owner, &format!("executable=\"{exe}\"")],
        )
    };
    assert_eq!(count(&text, "z3"), Some(2.0), "killed from outside, a run is no duration:\n{text}");
    assert_eq!(count(&text, "cvc5"), Some(1.0), "{text}");
    // 120 ms is above 10 ms x 1.25^11 (116 ms), at or below x 1.25^12.
    let le = |v: &str| {
        line_value(&text, "canaryscope_run_duration_seconds_bucket{", &[owner, "executable=\"z3\"", v])
    };
    let (below, above) = ("le=\"0.11641532182693481\"", "le=\"0.14551915228366852\"");
    assert_eq!((le(below), le(above)), (Some(0.0), Some(1.0)), "{text}");
    let ending = |text: &str, e: &str| {
        line_value(
            text,
            "canaryscope_run_endings_total{",
            &[owner, "executable=\"z3\"", &format!("ending=\"{e}\"")],
        )
    };
    assert_eq!(
        (ending(&text, "exit_zero"), ending(&text, "rlimit_cpu"), ending(&text, "sent_outside")),
        (Some(1.0), Some(1.0), Some(1.0))
    );
    assert!(
        !text.contains("pod=\"pod-3\"")
            || !text.contains("canaryscope_run_endings_total{namespace=\"ml\",pod=")
    );
    // Pod 3 goes: its runs stay with its revision while pod 2 is here.
    refresh(&mut m, Duration::ZERO, |c| if c == 3 { gone(3) } else { labelled(c) });
    let text = m.render_text();
    assert_eq!(count(&text, "z3"), Some(2.0), "{text}");
    assert_eq!(ending(&text, "rlimit_cpu"), Some(1.0), "{text}");
    // The per-pod view splits them by pod.
    let pods = m.render_text_in(View::PerPod);
    assert!(pods.contains(r#"canaryscope_run_endings_total{namespace="ml",pod="pod-2""#), "{pods}");
}

#[test]
fn a_pods_latest_kill_survives_a_restart_of_its_container() {
    let mut m = Metrics::new(100);
    let oom = |ts| Event {
        origin: Origin { cgroup_id: 4, ts_ns: ts, ..Default::default() },
        detail: Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 },
    };
    m.record(&oom(1_700_000_100_000_000_000));
    // The restarted container (cgroup 5) of the same pod crashes earlier
    // than the OOM kill's time would say nothing: the newest time wins.
    m.record(&Event {
        origin: Origin { cgroup_id: 5, ts_ns: 1_700_000_050_000_000_000, ..Default::default() },
        detail: Detail::Crash {
            signal: 11,
            si_code: 1,
            addr: 0,
            ip: 0,
            library: None,
            library_offset: None,
            in_call: None,
            crash_tid: 1,
        },
    });
    let same_pod = |_: u64| labelled(4);
    refresh(&mut m, Duration::from_secs(600), same_pod);
    let text = m.render_text();
    let kill = |text: &str, cause: &str| {
        line_value(
            text,
            "canaryscope_last_kill_timestamp_seconds{",
            &["pod=\"pod-4\"", &format!("cause=\"{cause}\"")],
        )
    };
    assert_eq!(kill(&text, "oom_kill"), Some(1_700_000_100.0), "{text}");
    assert_eq!(kill(&text, "crash"), Some(1_700_000_050.0), "{text}");
    // The first container's cgroup is purged: its kill stays with the pod.
    refresh(&mut m, Duration::ZERO, |c| if c == 4 { gone(4) } else { labelled(4) });
    let text = m.render_text();
    assert_eq!(kill(&text, "oom_kill"), Some(1_700_000_100.0), "{text}");
}
