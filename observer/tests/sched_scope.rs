//! Run-queue accounting only where canaryscope reports: tasks of pod
//! cgroups (and `run --cgroup` prefixes) get histograms; a system service's
//! tasks leave nothing in the maps. The waits are the scheduler's own, to
//! the nanosecond. And a scrape is the same bytes for as long as nothing
//! changes.

use std::{
    os::unix::process::CommandExt,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use aya::maps::{HashMap, Map, MapData, PerCpuHashMap};
use observer_common::LatencyHistogram;
use test_support::{
    assert_root, command_in, fixture, metric_value, random_hex, random_pod_uid, Daemon, PodCgroup,
    SystemCgroup,
};

/// Spinning threads pinned to CPU 0: they preempt one another, so at any
/// moment some of them wait, runnable.
fn spin_on_cpu0(mut cmd: Command, threads: u32, seconds: u32) -> Child {
    // SAFETY: sched_setaffinity on the child itself between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.args([threads.to_string(), seconds.to_string()]).stdout(Stdio::piped()).spawn().expect("busy_threads")
}

/// The daemon's per-cgroup run-queue histograms (per CPU).
fn runq_latency(daemon: &Daemon) -> PerCpuHashMap<MapData, u64, LatencyHistogram> {
    PerCpuHashMap::try_from(Map::PerCpuHashMap(daemon.bpf_map("RUNQ_LATENCY"))).expect("RUNQ_LATENCY")
}

/// The kernel's own run-queue wait of every thread of a finished
/// `busy_threads`, from its last line.
fn kernel_run_delay_ns(child: Child) -> u64 {
    let out = child.wait_with_output().expect("busy_threads");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    text.lines()
        .find_map(|l| l.strip_prefix("run_delay_ns=")?.parse().ok())
        .unwrap_or_else(|| panic!("no run_delay_ns in {text:?}"))
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn only_tasks_of_reported_cgroups_pay_for_run_queue_accounting() {
    assert_root();
    let busy = fixture("busy_threads");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let reported: HashMap<MapData, u64, u8> =
        HashMap::try_from(Map::HashMap(daemon.bpf_map("RUNQ_CGROUPS"))).expect("RUNQ_CGROUPS");
    let latency = runq_latency(&daemon);

    // Made after the daemon started (the kubepods slice too, unless another
    // test's pod holds it): the kernel reports it from its creation on.
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let system = SystemCgroup::new();
    assert!(reported.get(&pod.id(), 0).is_ok(), "a new pod cgroup is reported at once");
    assert!(reported.get(&system.id(), 0).is_err(), "a system cgroup is not reported");

    let inside = spin_on_cpu0(pod.command(&busy), 2, 2);
    let outside = spin_on_cpu0(system.command(&busy), 2, 2);
    let (pod_waited_ns, system_waited_ns) = (kernel_run_delay_ns(inside), kernel_run_delay_ns(outside));
    // Four spinning threads share CPU 0: each side waited about half the time.
    assert!(
        pod_waited_ns > 500_000_000 && system_waited_ns > 500_000_000,
        "{pod_waited_ns} {system_waited_ns}"
    );
    let keys: Vec<u64> = latency.keys().flatten().collect();
    assert!(keys.contains(&pod.id()), "the pod cgroup has a histogram: {keys:?}");
    assert!(!keys.contains(&system.id()), "the system cgroup has none: {keys:?}");
    let container = format!("container=\"{}\"", pod.short_container_id());
    let count = daemon.wait_pod_metric("the pod's run-queue histogram", Duration::from_secs(5), |l| {
        l.starts_with("canaryscope_cpu_runqueue_latency_seconds_count{") && l.contains(&container)
    });
    assert!(metric_value(&count) > 0.0, "{count}");
}

/// The histogram holds the scheduler's own waits: over a process's whole
/// life in a new cgroup, its total is what the kernel counted as the run
/// delay of every one of its threads (/proc/PID/task/TID/schedstat). Both
/// start at the same enqueue and end at the same switch; what may differ is
/// a thread's last wait after it read its own, a few scheduler slices.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_cgroups_histogram_total_is_the_kernels_run_delay_of_its_threads() {
    assert_root();
    let busy = fixture("busy_threads");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let latency = runq_latency(&daemon);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let threads = 3;
    let kernel_ns = kernel_run_delay_ns(spin_on_cpu0(pod.command(&busy), threads, 2));
    let histogram = latency.get(&pod.id(), 0).expect("the pod's histogram").iter().fold(
        LatencyHistogram::default(),
        |mut sum, h| {
            sum.add(h);
            sum
        },
    );
    // Three threads on one CPU wait about two thirds of two seconds each.
    assert!(kernel_ns > 2_000_000_000, "the kernel counted {kernel_ns} ns of waiting");
    let slack_ns = kernel_ns / 50 + (threads as u64 + 1) * 20_000_000;
    assert!(
        histogram.total_ns.abs_diff(kernel_ns) <= slack_ns,
        "histogram total {} ns over {} waits, kernel run delay {kernel_ns} ns",
        histogram.total_ns,
        histogram.count
    );
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_cgroup_prefix_gets_run_queue_accounting_and_a_removed_cgroup_leaves_it() {
    assert_root();
    let busy = fixture("busy_threads");
    let solver = SystemCgroup::new();
    let daemon = Daemon::start(&["--no-kubernetes", "--cgroup", &solver.rel]);
    let reported: HashMap<MapData, u64, u8> =
        HashMap::try_from(Map::HashMap(daemon.bpf_map("RUNQ_CGROUPS"))).expect("RUNQ_CGROUPS");
    assert!(reported.get(&solver.id(), 0).is_ok(), "the prefix is reported");
    // A job cgroup made below it later is reported by the kernel at once.
    let job = solver.dir.join("job-1");
    std::fs::create_dir(&job).expect("mkdir job");
    let job_id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&job).expect("job"));
    assert!(reported.get(&job_id, 0).is_ok(), "a child of a reported cgroup is reported");
    kernel_run_delay_ns(spin_on_cpu0(command_in(&job, &busy), 2, 1));
    let latency = runq_latency(&daemon);
    let waits: u64 =
        latency.get(&job_id, 0).expect("the job cgroup's histogram").iter().map(|h| h.count).sum();
    assert!(waits > 0, "two threads on one CPU waited");
    std::fs::remove_dir(&job).expect("rmdir job");
    assert!(reported.get(&job_id, 0).is_err(), "a removed cgroup leaves the set");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn scrapes_are_the_same_bytes_while_nothing_changes() {
    assert_root();
    let busy = fixture("busy_threads");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    kernel_run_delay_ns(spin_on_cpu0(pod.command(&busy), 2, 1));
    let container = format!("container=\"{}\"", pod.short_container_id());
    daemon.wait_pod_metric("the pod's run-queue histogram", Duration::from_secs(5), |l| {
        l.starts_with("canaryscope_cpu_runqueue_latency_seconds_count{") && l.contains(&container)
    });
    // The finished process's last numbers arrive with a later refresh;
    // from then on nothing changes, and every scrape over several refreshes
    // must be the same bytes. A daemon whose output moves on its own never
    // gets that far. Only the node-wide record counters may move meanwhile
    // (any exec on the host is a record): then the text is new, and the
    // lines that differ must be theirs alone.
    let moved = |a: &str, b: &str| -> Vec<String> {
        let node_wide = |l: &&str| l.starts_with("canaryscope_ring_events_total{");
        let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
        b.iter().filter(|l| !node_wide(l) && !a.contains(l)).map(|l| l.to_string()).collect()
    };
    // Longer than the daemon's refresh of kernel aggregates (1 s).
    let quiet_for = Duration::from_millis(2500);
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut last, mut since) = (daemon.metrics(), Instant::now());
    while since.elapsed() < quiet_for {
        assert!(Instant::now() < deadline, "the scrape kept changing with nothing running:\n{last}");
        let now = daemon.metrics();
        if !moved(&last, &now).is_empty() {
            since = Instant::now();
        }
        last = now;
    }
    let until = Instant::now() + Duration::from_secs(2);
    let mut scrapes = 0;
    while Instant::now() < until {
        let again = daemon.metrics();
        if again != last {
            let changed = moved(&last, &again);
            assert!(changed.is_empty(), "a scrape changed while nothing happened: {changed:#?}");
            last = again;
        }
        scrapes += 1;
    }
    assert!(scrapes > 1);
    // The pod's histogram is in the scrape, kept for its revision (its own
    // cgroup, without Kubernetes).
    let revision = format!("workload=\"{}\"", pod.rel.rsplit_once('/').map(|(dir, _)| dir).expect("pod dir"));
    assert!(last.contains(&revision), "{revision} missing:\n{last}");
}
