//! Hot GPU calls (launches, asynchronous copies) are trapped only in
//! selected processes, with per-process uprobes: a process nobody selected
//! keeps its original first instruction (no breakpoint), while its cold
//! calls (cuInit) are still counted; `trace --pid` selects its process and
//! every thread of it; under the daemon a GPU failure selects the cgroup
//! within a second, later processes of that cgroup are probed before their
//! first launch, and the probes go once the window passes quietly. The
//! daemon counts a selected process's hot calls at return (no durations)
//! unless told to time them; `trace` times them unless told to count.

use std::{
    fs,
    process::Command,
    time::{Duration, Instant},
};
use test_support::{
    assert_root, entry_bytes, field, fixture, in_vm, metric_value, random_hex, random_pod_uid,
    shape::KernelShape, uprobe_multi_links, wait_trapped, Daemon, PodCgroup, Stepped, Tracer, BREAKPOINT,
};

const WAIT: Duration = Duration::from_secs(20);

fn app(pod: Option<&PodCgroup>, args: &[&str]) -> Stepped {
    let program = fixture("cuda_app");
    let mut command = match pod {
        Some(pod) => pod.command(&program),
        None => Command::new(&program),
    };
    command.args(args);
    Stepped::spawn(command)
}

fn pod_lines<'a>(metrics: &'a str, pod_uid: &str, function: &str) -> Vec<&'a str> {
    let pod_label = format!("pod=\"{pod_uid}\"");
    let function_label = format!("function=\"{function}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("canaryscope_gpu_api_calls_total{"))
        .filter(|l| l.contains(&pod_label) && l.contains(&function_label))
        .collect()
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn an_unselected_process_takes_no_trap_and_its_failing_init_still_counts() {
    assert_root();
    let daemon = Daemon::start(&[]);
    let uid = random_pod_uid();
    let pod = PodCgroup::new(&uid, &random_hex(64));
    // Launches first, init last: nothing has failed in this cgroup while it
    // launches, so nothing may select it.
    let mut worker = app(
        Some(&pod),
        &["--init-last", "--launch-loop", "100000", "--pause-before", "init", "--pause-before", "exit"],
    );
    let done = worker.wait_line("launch_loop=");
    assert_eq!(field(&done, "failed"), "100000", "every launch ran into the real runtime: {done}");
    worker.wait_line("paused=init");
    let (in_memory, on_disk) = entry_bytes(worker.pid(), "libcuda.so.1", "cuLaunchKernel");
    assert_ne!(on_disk, BREAKPOINT);
    assert_eq!(in_memory, on_disk, "an unselected process carries no breakpoint on cuLaunchKernel");
    let (hip_in_memory, hip_on_disk) = entry_bytes(worker.pid(), "libamdhip64.so.5", "hipModuleLaunchKernel");
    assert_eq!(hip_in_memory, hip_on_disk, "nor on hipModuleLaunchKernel beneath it");

    worker.go();
    let init = worker.wait_line("cuInit=");
    assert_ne!(field(&init, "cuInit"), "0", "{init}");
    // The scrape that shows the cold call failing also shows everything
    // this cgroup did before it: the launches, had any been trapped.
    daemon.wait_pod_metric("the unselected process's cuInit failure", WAIT, |l| {
        l.starts_with("canaryscope_gpu_api_calls_total{")
            && l.contains(&format!("pod=\"{uid}\""))
            && l.contains("function=\"cuInit\"")
            && !l.contains("result=\"0\"")
    });
    let metrics = daemon.pod_metrics();
    let launches = pod_lines(&metrics, &uid, "cuLaunchKernel");
    assert!(launches.is_empty(), "launches of an unselected process were counted: {launches:?}");
    assert!(pod_lines(&metrics, &uid, "hipModuleLaunchKernel").is_empty());
    worker.go();
    assert!(worker.finish().success());
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn trace_pid_traps_every_thread_of_its_process_and_no_other_process() {
    traps_every_thread_and_no_other_process(&[]);
}

/// As on 6.6–6.9, whose `uprobe_multi` PID filter matched a process's main
/// thread alone: per-process probes take perf-event links there, and a
/// worker thread's launch is still seen.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn with_the_pid_filter_guard_a_worker_threads_launch_is_still_seen() {
    traps_every_thread_and_no_other_process(&[("CANARYSCOPE_UPROBE_MULTI_PID_FILTER", "thread")]);
}

/// Releases 6.6 to 6.9, whose `uprobe_multi` PID filter checked the thread.
fn main_thread_filter(release: &str) -> bool {
    let mut parts = release.trim().split('.');
    let major = parts.next().and_then(|p| p.parse::<u32>().ok());
    let minor = parts
        .next()
        .and_then(|p| p.chars().take_while(char::is_ascii_digit).collect::<String>().parse::<u32>().ok());
    major == Some(6) && minor.is_some_and(|m| (6..10).contains(&m))
}

fn traps_every_thread_and_no_other_process(env: &[(&str, &str)]) {
    assert_root();
    let mut selected = app(None, &["--launch", "--launch-thread", "--pause-before", "launch"]);
    let mut other = app(None, &["--launch", "--pause-before", "launch"]);
    selected.wait_line("paused=launch");
    other.wait_line("paused=launch");
    let pid = selected.pid();
    let other_pid = u64::from(other.pid());
    let tracer = Tracer::start_with_env(&["--pid", &pid.to_string()], env);
    // Probed before the tracer said it was tracing: the process was found
    // mapping the runtime at start.
    assert_eq!(entry_bytes(pid, "libcuda.so.1", "cuLaunchKernel").0, BREAKPOINT);
    if !env.is_empty() {
        // The same process traced without the guard beside it: where the
        // kernel's filter matches every thread, that tracer holds its
        // per-process probes on uprobe_multi links, and the guarded one
        // holds those on perf-event links instead.
        let unguarded = Tracer::start(&["--pid", &pid.to_string()]);
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").expect("release");
        let (with, without) = (uprobe_multi_links(unguarded.pid()), uprobe_multi_links(tracer.pid()));
        if KernelShape::declared().uprobe_multi && !main_thread_filter(&release) {
            assert!(with > without, "uprobe_multi links: {with} unguarded, {without} guarded");
        }
    }
    let (other_byte, other_on_disk) = entry_bytes(other.pid(), "libcuda.so.1", "cuLaunchKernel");
    assert_eq!(other_byte, other_on_disk, "the other process carries no breakpoint");

    other.go();
    let other_launch = other.wait_line("cuLaunchKernel=");
    assert_ne!(field(&other_launch, "cuLaunchKernel"), "0");
    selected.go();
    let launched = selected.wait_line("launch_tid=");
    let tid: u64 = field(&launched, "launch_tid").parse().expect("tid");
    assert_ne!(tid, u64::from(pid), "the launch ran on a worker thread");
    let event = tracer.wait_for("the worker thread's launch failure", WAIT, |e| {
        e["function"] == "cuLaunchKernel" && e["pid"] == u64::from(pid)
    });
    assert_eq!(event["tid"], tid, "{event}");
    assert_ne!(event["result"], 0, "{event}");
    assert!(selected.finish().success());
    assert!(other.finish().success());
    let (_, events) = tracer.stop();
    let stray: Vec<_> =
        events.iter().filter(|e| e["function"] == "cuLaunchKernel" && e["pid"] == other_pid).collect();
    assert!(stray.is_empty(), "another process's launch was reported: {stray:?}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn gpu_trouble_selects_the_cgroup_within_a_second_and_the_quiet_window_lets_go() {
    assert_root();
    let window = Duration::from_secs(3);
    let daemon = Daemon::start(&["--hold", "--hot-window", "3s"]);
    let uid = random_pod_uid();
    let pod = PodCgroup::new(&uid, &random_hex(64));
    // cuInit fails through the real runtime: trouble in this cgroup.
    let mut first = app(Some(&pod), &["--pause-before", "exit"]);
    let init = first.wait_line("cuInit=");
    assert_ne!(field(&init, "cuInit"), "0", "{init}");
    // Within a second on a real machine; the emulated VM runs everything
    // several times slower.
    let within = Duration::from_secs(if in_vm() { 5 } else { 1 });
    let took = wait_trapped(first.pid(), true, within);
    eprintln!("selected {took:?} after its cuInit failed");
    daemon.wait_metric("one process selected for GPU trouble", WAIT, |l| {
        l.starts_with("canaryscope_gpu_hot_probed_processes{reason=\"gpu_trouble\"}")
            && metric_value(l) >= 1.0
    });

    // A process started later in the selected cgroup is probed before its
    // first launch (the hold keeps it until then), so its launch failure
    // is counted.
    let mut second = app(Some(&pod), &["--launch"]);
    let launched = second.wait_line("cuLaunchKernel=");
    assert_ne!(field(&launched, "cuLaunchKernel"), "0", "{launched}");
    assert!(second.finish().success());
    let quiet_from = Instant::now();
    daemon.wait_pod_metric("the later process's launch failure", WAIT, |l| {
        l.starts_with("canaryscope_gpu_api_calls_total{")
            && l.contains(&format!("pod=\"{uid}\""))
            && l.contains("function=\"cuLaunchKernel\"")
            && !l.contains("result=\"0\"")
    });

    // Nothing fails any more: once the window has passed, the probes go.
    wait_trapped(first.pid(), false, window + Duration::from_secs(5));
    assert!(
        quiet_from.elapsed() + Duration::from_millis(500) >= window,
        "probes removed {:?} into a {window:?} window",
        quiet_from.elapsed()
    );
    daemon.wait_metric("nothing selected any more", WAIT, |l| {
        l.starts_with("canaryscope_gpu_hot_probed_processes{reason=\"gpu_trouble\"}")
            && metric_value(l) == 0.0
    });
    first.go();
    assert!(first.finish().success());
}

/// The daemon with every process selected (`--hot-calls all`) and `extra`;
/// one process of a pod of its own makes `LAUNCHES` launches through the
/// real runtime (each fails without a GPU). Returns the pod's
/// cuLaunchKernel calls and durations from one scrape, once the calls are
/// all counted.
fn launches_seen(extra: &[&str]) -> (f64, f64) {
    const LAUNCHES: &str = "1000";
    let mut args = vec!["--hold", "--hot-calls", "all"];
    args.extend_from_slice(extra);
    let daemon = Daemon::start(&args);
    let uid = random_pod_uid();
    let pod = PodCgroup::new(&uid, &random_hex(64));
    let mut worker = app(Some(&pod), &["--launch-loop", LAUNCHES]);
    let done = worker.wait_line("launch_loop=");
    assert_eq!(field(&done, "failed"), LAUNCHES, "{done}");
    assert!(worker.finish().success());
    let pod_label = format!("pod=\"{uid}\"");
    let launch_series = |l: &str| l.contains(&pod_label) && l.contains("function=\"cuLaunchKernel\"");
    daemon.wait_pod_metric("every launch counted", WAIT, |l| {
        l.starts_with("canaryscope_gpu_api_calls_total{") && launch_series(l) && metric_value(l) >= 1000.0
    });
    let text = daemon.pod_metrics();
    let sum = |prefix: &str| -> f64 {
        text.lines().filter(|l| l.starts_with(prefix) && launch_series(l)).map(metric_value).sum()
    };
    let calls = sum("canaryscope_gpu_api_calls_total{");
    let timed = sum("canaryscope_gpu_api_call_duration_seconds_count{");
    assert!(daemon.stop().success());
    (calls, timed)
}

/// Before Linux 5.15 (no attach cookies) GPU functions are probed by a
/// program pair each, so hot calls are timed whatever was asked. The
/// matrix's declaration of the kernel says which, not the observer's tables.
fn pairs_only() -> bool {
    !KernelShape::declared().attach_cookies
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn the_daemon_counts_hot_calls_at_return_and_times_them_on_request() {
    assert_root();
    let pairs_only = pairs_only();
    // By default a return probe alone: every launch counted, none timed.
    let (calls, timed) = launches_seen(&[]);
    assert_eq!(calls, 1000.0);
    let expected = if pairs_only { 1000.0 } else { 0.0 };
    assert_eq!(timed, expected, "timed launches by default (program pairs only: {pairs_only})");
    // Timed: the same launches, each with a duration.
    let (calls, timed) = launches_seen(&["--hot-detail", "timed"]);
    assert_eq!(calls, 1000.0);
    assert_eq!(timed, 1000.0, "not every launch was timed under --hot-detail timed");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn trace_times_hot_calls_unless_told_to_count_them() {
    assert_root();
    let pairs_only = pairs_only();
    for (extra, timed) in [(&[][..], true), (&["--hot-detail", "counts"][..], pairs_only)] {
        let mut worker = app(None, &["--launch", "--pause-before", "launch"]);
        worker.wait_line("paused=launch");
        let pid = worker.pid();
        let mut args = vec!["--pid".to_string(), pid.to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let tracer = Tracer::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
        worker.go();
        let event = tracer.wait_for("the launch failure", WAIT, |e| {
            e["function"] == "cuLaunchKernel" && e["pid"] == u64::from(pid)
        });
        assert_ne!(event["result"], 0, "{event}");
        // Counted only: no duration rather than a made-up zero.
        assert_eq!(event["duration_ns"].is_u64(), timed, "{extra:?}: {event}");
        assert_eq!(event["duration_ns"].is_null(), !timed, "{extra:?}: {event}");
        assert!(worker.finish().success());
        tracer.stop();
    }
}
