//! A node agent must leave nothing behind and keep its numbers exact under
//! load: programs and maps are gone after SIGTERM and after SIGKILL; a flood
//! of failing GPU calls keeps aggregated counters exact and /metrics up; a
//! thousand short-lived pods leave no series, kernel entries or memory behind.

use std::{
    process::Command,
    time::{Duration, Instant},
};
use test_support::{
    assert_root, canaryscope, fixture, fixtures_dir, metric_value, random_hex, random_pod_uid, Daemon,
    PodCgroup,
};

/// Every program and map of canaryscope's eBPF object, taken from the
/// object the binary embeds, with the names the kernel keeps (at most 15
/// characters). The maps aya makes for `.rodata`/`.bss` are left out: their
/// names are the section's, shared with any other loader's.
fn object_names() -> (Vec<String>, Vec<String>) {
    use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
    let file = object::File::parse(observer::probes::EBPF_OBJECT).expect("the embedded eBPF object parses");
    let (mut programs, mut maps) = (Vec::new(), Vec::new());
    for symbol in file.symbols().filter(|s| s.is_global()) {
        let Some(section) = symbol.section_index().and_then(|i| file.section_by_index(i).ok()) else {
            continue;
        };
        let (Ok(name), Ok(section)) = (symbol.name(), section.name()) else { continue };
        let kernel_name: String = name.chars().take(15).collect();
        match symbol.kind() {
            SymbolKind::Text if section != ".text" => programs.push(kernel_name),
            SymbolKind::Data if section == "maps" || section == ".maps" => maps.push(kernel_name),
            _ => {}
        }
    }
    assert!(programs.len() >= 20 && maps.len() >= 10, "object lists {programs:?} and {maps:?}");
    (programs, maps)
}

/// How many of canaryscope's programs and maps are loaded in the kernel now.
fn loaded() -> (usize, usize) {
    let (programs, maps) = object_names();
    let count = |kind: &str, names: &[String]| {
        let out =
            Command::new("bpftool").args(["-j", kind, "show"]).output().expect("bpftool (Debian package)");
        assert!(out.status.success(), "bpftool {kind} show: {out:?}");
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
        let listed = listed.as_array().unwrap_or_else(|| panic!("bpftool {kind} show: not a list: {listed}"));
        listed.iter().filter(|p| p["name"].as_str().is_some_and(|n| names.iter().any(|w| w == n))).count()
    };
    (count("prog", &programs), count("map", &maps))
}

/// What is loaded once the kernel has finished freeing what earlier tests'
/// daemons left (maps go asynchronously, after their last reference).
fn settled_baseline() -> (usize, usize) {
    let mut last = loaded();
    for _ in 0..30 {
        std::thread::sleep(Duration::from_secs(1));
        let now = loaded();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

fn wait_baseline(baseline: (usize, usize)) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let above = |l: (usize, usize)| l.0 > baseline.0 || l.1 > baseline.1;
    while above(loaded()) {
        assert!(Instant::now() < deadline, "still loaded: {:?} vs baseline {baseline:?}", loaded());
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn nothing_remains_loaded_after_sigterm_or_sigkill() {
    assert_root();
    let baseline = settled_baseline();
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let running = loaded();
    assert!(running.0 > baseline.0 && running.1 > baseline.1, "daemon loaded nothing? {running:?}");
    assert!(daemon.stop().success(), "SIGTERM ends the daemon cleanly");
    wait_baseline(baseline);

    let daemon = Daemon::start(&["--no-kubernetes"]);
    assert!(loaded().0 > baseline.0);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGKILL) };
    drop(daemon);
    wait_baseline(baseline);
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_flood_of_failing_calls_keeps_counts_exact_and_metrics_up() {
    assert_root();
    let hip_loop = fixture("hip_loop");
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let calls = 20_000;
    let mut child = pod.command(&hip_loop).args(["--fail", &calls.to_string()]).spawn().expect("hip_loop");
    // /metrics must answer promptly all through the flood.
    let mut slowest = Duration::ZERO;
    while child.try_wait().expect("wait").is_none() {
        let t = Instant::now();
        assert!(daemon.get("/metrics").is_some_and(|(c, _)| c == 200), "/metrics down during the flood");
        slowest = slowest.max(t.elapsed());
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("slowest /metrics during the flood: {slowest:?}");
    let short = pod.short_container_id();
    // hip_loop's own hipGetDeviceCount calls, plus none other in that cgroup.
    let line = daemon.wait_metric("exact failing-call count", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_gpu_api_call_failures_total{")
            && l.contains(&format!("container=\"{short}\""))
            && l.contains("function=\"hipGetDeviceCount\"")
            && metric_value(l) >= calls as f64
    });
    assert_eq!(metric_value(&line), calls as f64, "{line}");
    let lost = daemon.wait_metric("lost counter", Duration::from_secs(1), |l| {
        l.starts_with("canaryscope_events_lost_total")
    });
    let received = daemon.wait_metric("records", Duration::from_secs(1), |l| {
        l.starts_with("canaryscope_ring_events_total{kind=\"gpu_call\"}")
    });
    // Every failure is an event: what did not arrive must have been counted as lost.
    assert!(metric_value(&received) + metric_value(&lost) >= calls as f64, "{received} / {lost}");
}

/// The entries of a canaryscope map as bpftool dumps them.
fn map_entries(map_name: &str) -> Vec<serde_json::Value> {
    let out = Command::new("bpftool").args(["-j", "map", "show"]).output().expect("bpftool");
    let maps: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    let Some(id) =
        maps.as_array().and_then(|a| a.iter().find(|m| m["name"] == map_name)).and_then(|m| m["id"].as_u64())
    else {
        panic!("map {map_name} not loaded");
    };
    let out =
        Command::new("bpftool").args(["-j", "map", "dump", "id", &id.to_string()]).output().expect("dump");
    let entries: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool map dump JSON");
    entries.as_array().expect("entries").clone()
}

/// Cgroup ids present as keys of a canaryscope map (the first 8 key bytes
/// are the cgroup id).
fn map_cgroup_ids(map_name: &str) -> Vec<u64> {
    map_entries(map_name)
        .iter()
        .filter_map(|e| {
            let key = e["key"].as_array()?;
            let bytes: Vec<u8> = key
                .iter()
                .take(8)
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect();
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        })
        .collect()
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

fn open_fds(pid: u32) -> usize {
    fd_targets(pid).len()
}

/// What each open descriptor of `pid` names (a file, a socket, an anon
/// inode such as a BPF map or link), sorted: a leak's failure shows what.
fn fd_targets(pid: u32) -> Vec<String> {
    let mut targets: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .map(|e| std::fs::read_link(e.path()).map(|t| t.display().to_string()).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    targets.sort();
    targets
}

/// Runs `count` pods, each a real cgroup with a HIP process that fails to
/// initialise, two at a time; returns the cgroup ids they had.
fn churn(count: usize, tag: &str) -> Vec<u64> {
    let hip_probe = fixture("hip_probe");
    let run_one = |i: usize| {
        let uid = format!("{tag}{:04x}-0000-4000-8000-{}", i, random_hex(12));
        let pod = PodCgroup::new(&uid, &random_hex(64));
        let id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&pod.dir).expect("cgroup dir"));
        let out = pod.command(&hip_probe).output().expect("hip_probe");
        assert!(out.status.success(), "{out:?}");
        id
    };
    // The shared parent slices are made once, outside the two threads.
    let _parents = PodCgroup::new(&format!("{tag}ffff-0000-4000-8000-{}", random_hex(12)), &random_hex(64));
    std::thread::scope(|s| {
        let halves: Vec<_> =
            (0..2).map(|h| s.spawn(move || (h..count).step_by(2).map(run_one).collect::<Vec<_>>())).collect();
        halves.into_iter().flat_map(|h| h.join().expect("churn thread")).collect()
    })
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_thousand_short_lived_pods_leave_no_series_map_entries_or_memory_behind() {
    assert_root();
    let daemon = Daemon::start(&["--no-kubernetes", "--series-grace", "5s"]);
    let pid = daemon.pid();
    // Series of churned pods are recognised by their pod uid prefix.
    let count_series =
        |tag: &str| daemon.metrics().lines().filter(|l| l.contains(&format!("pod=\"{tag}"))).count();
    let in_maps = |ids: &[u64]| -> usize {
        ["GPU_STATS", "RUNQ_LATENCY"]
            .iter()
            .map(|m| map_cgroup_ids(m).iter().filter(|c| ids.contains(c)).count())
            .sum()
    };
    let settle = |tag: &str, ids: &[u64]| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while count_series(tag) > 0 || in_maps(ids) > 0 {
            assert!(
                Instant::now() < deadline,
                "{} series and {} kernel entries of removed cgroups remain",
                count_series(tag),
                in_maps(ids)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    };

    // Warm-up: allocator arenas, label caches and the like reach their
    // working size; the baseline is taken after they are purged again.
    let warm = churn(100, "c0f1");
    settle("c0f1", &warm);
    let (rss_before, fds_before) = (rss_kib(pid), open_fds(pid));
    let targets_before = fd_targets(pid);
    // Per-thread in-flight entries stay while a thread lives; those of
    // exited threads must go.
    let inflight_before = map_entries("GPU_INFLIGHT").len();

    let started = Instant::now();
    let ids = churn(1000, "c0f2");
    eprintln!("1,000 pods in {:.1?}", started.elapsed());
    // While they are fresh, their series and kernel entries exist: the
    // clean-up below has something to remove.
    let seen = count_series("c0f2");
    let entries = in_maps(&ids);
    eprintln!("right after the churn: {seen} series, {entries} kernel entries, RSS {} KiB", rss_kib(pid));
    assert!(seen > 0 && entries > 0, "{seen} series, {entries} entries");
    settle("c0f2", &ids);
    std::thread::sleep(Duration::from_secs(2));
    let (rss_after, fds_after) = (rss_kib(pid), open_fds(pid));
    let inflight_after = map_entries("GPU_INFLIGHT").len();
    assert!(
        inflight_after <= inflight_before,
        "in-flight entries of exited threads remain: {inflight_before} -> {inflight_after}"
    );
    eprintln!("RSS {rss_before} -> {rss_after} KiB; open fds {fds_before} -> {fds_after}");
    assert!(rss_after <= rss_before + 10 * 1024, "RSS grew from {rss_before} to {rss_after} KiB");
    let targets_after = fd_targets(pid);
    let added: Vec<&String> = targets_after.iter().filter(|t| !targets_before.contains(t)).collect();
    assert!(fds_after <= fds_before + 2, "file descriptors leaked: {fds_before} -> {fds_after}: {added:?}");
    assert!(daemon.stop().success());
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn the_exporter_shows_no_command_line_environment_or_process_name() {
    assert_root();
    use std::os::unix::process::CommandExt;
    let hip_loop = fixture("hip_loop");
    // The process name (comm) comes from the file name exec'd: a link
    // with a name of its own.
    let comm = format!("tok{}", random_hex(10));
    let link = fixtures_dir().join(&comm);
    std::os::unix::fs::symlink(&hip_loop, &link).expect("symlink");
    let (secret_env, secret_arg) =
        (format!("envsecret{}", random_hex(16)), format!("argsecret{}", random_hex(16)));
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let out = pod
        .command(&link)
        .arg0(&secret_arg)
        .args(["--fail", "5"])
        .env("API_TOKEN", &secret_env)
        .output()
        .expect("run");
    let _ = std::fs::remove_file(&link);
    assert!(out.status.success(), "{out:?}");
    let short = pod.short_container_id();
    // The workload's failures are there...
    daemon.wait_metric("the workload's failures", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_gpu_api_call_failures_total{")
            && l.contains(&short)
            && metric_value(l) >= 5.0
    });
    // ...and nothing of what the process carried.
    let text = daemon.metrics();
    for leaked in [&secret_env, &secret_arg, &comm] {
        assert!(!text.contains(leaked.as_str()), "{leaked} leaked into /metrics");
    }
}

/// A process's state letter from /proc/PID/stat ('T' while stopped).
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().next()?.chars().next()
}

/// A DaemonSet's rolling update or a node drain stops the daemon in the
/// middle of its work: a flood of GPU failures (over 1,000 events a second)
/// that has filled the ring buffer, processes held at a runtime file whose
/// mapping records the full ring lost (so nothing but the stop can resume
/// them before the hold's deadline), and scrapes in flight (one whose reply
/// is not read, one whose request never ends). It stops cleanly, every held
/// process runs on, and nothing stays loaded. How long the stop takes is
/// measured by `cargo xtask bench` (stop).
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn sigterm_under_load_resumes_every_held_process_and_leaves_nothing_loaded() {
    use std::{io::Write, net::TcpStream, os::unix::process::CommandExt};
    assert_root();
    let baseline = settled_baseline();
    let daemon = Daemon::start(&["--no-kubernetes", "--hold"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let _flood = test_support::k8s::Proc(
        pod.command(&fixture("hip_loop")).args(["--fail", "1000000000"]).spawn().expect("hip_loop"),
    );
    let received = || {
        daemon
            .metrics()
            .lines()
            .filter(|l| {
                l.starts_with("canaryscope_ring_events_total{")
                    || l.starts_with("canaryscope_events_lost_total")
            })
            .map(metric_value)
            .sum::<f64>()
    };
    let (first, t0) = (received(), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let rate = (received() - first) / t0.elapsed().as_secs_f64();
    assert!(rate >= 1000.0, "the flood gives {rate:.0} events a second");

    // Scrapes in flight: a reply nobody reads, and a request that never ends.
    let mut unread = TcpStream::connect(("127.0.0.1", daemon.port)).expect("connect");
    unread.write_all(b"GET /metrics/pods HTTP/1.1\r\nHost: x\r\n\r\n").expect("request");
    let mut unfinished = TcpStream::connect(("127.0.0.1", daemon.port)).expect("connect");
    unfinished.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").expect("half a request");

    // Frozen, the daemon reads nothing: the flood fills the ring buffer,
    // and the records of the mappings below are lost with the rest.
    fixture("cuda_first");
    let dir = test_support::k8s::scratch_dir();
    daemon.freeze_until_ring_overflows();
    let mut held = Vec::new();
    for i in 0..3 {
        let copy = dir.join(format!("copy-{i}/libcuda.so.1"));
        std::fs::create_dir_all(copy.parent().expect("dir")).expect("mkdir");
        std::fs::copy(fixtures_dir().join("zluda-min/libcuda.so.1"), &copy).expect("copy");
        let mut late = pod.command(&fixture("gpu_dlopen"));
        late.arg(&copy).stdout(std::process::Stdio::null());
        // SAFETY: setsid is async-signal-safe; without a controlling
        // terminal the process is holdable.
        unsafe {
            late.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        // Killed if the test fails: a stopped process would keep its pod's
        // cgroup from going.
        held.push(test_support::k8s::Proc(late.spawn().expect("gpu_dlopen")));
    }
    for process in &held {
        let deadline = Instant::now() + Duration::from_secs(5);
        while process_state(process.0.id()) != Some('T') {
            assert!(Instant::now() < deadline, "pid {} was never held", process.0.id());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // The stop is taken the moment the daemon runs again.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGTERM) };
    unsafe { libc::kill(daemon.pid() as i32, libc::SIGCONT) };
    let stopped = daemon.stop_within(Duration::from_secs(60));
    assert!(stopped.success(), "SIGTERM under load ends the daemon cleanly: {stopped}");
    for process in &mut held {
        let pid = process.0.id();
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = process.0.try_wait().expect("wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "pid {pid} is still {:?} after the daemon stopped",
                process_state(pid)
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "a process held at the stop ran on: {status}");
    }
    drop((unread, unfinished));
    wait_baseline(baseline);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The main thread's wait channel: where in the kernel it sleeps.
fn wchan(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default()
}

/// Ctrl-C pressed while `trace` is busy stops it: here the tracer prints a
/// flood of GPU failures into a pipe its reader has stopped draining (a
/// pager that is slow, a terminal on a slow link), so its loop sits in
/// write() when the signal comes, not waiting for it.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn ctrl_c_while_trace_is_busy_printing_stops_it() {
    use std::{io::Read, process::Stdio};
    assert_root();
    let baseline = settled_baseline();
    let flood = test_support::k8s::Proc(
        Command::new(fixture("hip_loop")).args(["--fail", "1000000000"]).spawn().expect("hip_loop"),
    );
    let mut tracer = Command::new(canaryscope())
        .args(["trace", "--json", "--pid", &flood.0.id().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("trace");
    let pid = tracer.id();
    // Nobody reads yet: the flood fills the pipe and the tracer blocks
    // writing the next event.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !wchan(pid).ends_with("pipe_write") {
        assert!(tracer.try_wait().expect("wait").is_none(), "the tracer ended before the pipe filled");
        assert!(Instant::now() < deadline, "the tracer never blocked on its full pipe: {}", wchan(pid));
        std::thread::yield_now();
    }
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    // Now drain, as the pager catching up does; the tracer must leave.
    let mut stdout = tracer.stdout.take().expect("stdout");
    let drain = std::thread::spawn(move || {
        let mut sink = [0u8; 1 << 16];
        while stdout.read(&mut sink).is_ok_and(|n| n > 0) {}
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = tracer.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = tracer.kill();
            let _ = tracer.wait();
            panic!("one Ctrl-C while trace was writing did not stop it within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = drain.join();
    assert!(status.success(), "Ctrl-C ends trace cleanly: {status}");
    wait_baseline(baseline);
}
