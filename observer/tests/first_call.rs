//! No GPU call goes unseen: a runtime library file canaryscope has never
//! seen (a fresh copy, so a new inode, every run) is probed before the first
//! call of the first process that maps it. Nothing here names the library
//! with `--lib` or waits before the call.
//!
//! Default mode: files the process's loader can find by name (its
//! LD_LIBRARY_PATH, its run path, its root's ld.so.cache and standard
//! directories) are probed at exec. With `--hold`: any path, any timing;
//! the process is stopped at the mapping until its probes exist.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use test_support::{
    assert_root, fixture, fixtures_dir, in_vm, out_pid, random_hex, random_pod_uid, still_running, wait_gone,
    PodCgroup, Tracer,
};

const RUNS: usize = 10;
// Every tracer here runs with `--all`: with /dev/kfd (the VM) cuInit and
// hipInit succeed, and a first call is to be seen whatever it returns.
/// How long to wait for an event: generous, and more so in the VM, whose
/// software emulation makes every attach and release many times slower.
fn wait() -> Duration {
    Duration::from_secs(if in_vm() { 60 } else { 20 })
}
const HIP_RUNTIME: &str = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5";

/// A directory that exists for one run, removed on drop.
struct Fresh(PathBuf);

impl Fresh {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("canaryscope-first-call-{}", random_hex(12)));
        fs::create_dir_all(&dir).expect("mkdir");
        Self(dir)
    }

    /// A copy of `from` at `name` inside: a file no tracer has seen.
    fn copy(&self, from: &Path, name: &str) -> PathBuf {
        let to = self.0.join(name);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent).expect("mkdir");
        }
        fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
        to
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The minimal ZLUDA-shaped library (cuInit over the real HIP runtime):
/// every run probes a fresh copy, and releasing a uprobe costs the kernel
/// about 0.1 s, so one probed function keeps the suite's teardown short.
fn zluda() -> PathBuf {
    fixture("cuda_first");
    fixtures_dir().join("zluda-min/libcuda.so.1")
}

/// Runs a command in a new session (no controlling terminal: the hold never
/// stops a process a shell's job control could see) and returns its output.
fn run_detached(mut cmd: Command) -> Output {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let out = cmd.output().expect("run fixture");
    assert!(out.status.success(), "{out:?}");
    out
}

/// `sh -c SCRIPT` in a private mount namespace inside the pod's cgroup.
fn in_private_mounts(pod: &PodCgroup, script: &str) -> Command {
    let mut cmd = pod.command(Path::new("/usr/bin/unshare"));
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", script]);
    cmd
}

/// The announcement of `library`'s probes made after `mark`. Another
/// process of the same container (the `cp` or `mount` that prepared it) may
/// have led to the file first: the reason names whichever did.
fn probed_after(tracer: &Tracer, library: &str, mark: usize) -> Value {
    tracer.wait_for_after(mark, &format!("probes of {library}"), wait(), |e| {
        e["kind"] == "library_probed" && e["library"] == library
    })
}

/// The first call of `pid`, through the library at `library`; and the
/// announcement of that library's probes after `mark`.
fn first_call(tracer: &Tracer, pid: u64, function: &str, library: &str, mark: usize) -> (Value, Value) {
    let call = tracer.wait_for(&format!("{function} of pid {pid} via {library}"), wait(), |e| {
        e["kind"] == "gpu_call" && e["function"] == function && e["pid"] == pid
    });
    assert_eq!(call["library"], library, "{call}");
    (call, probed_after(tracer, library, mark))
}

/// Runs `script` in a private mount namespace of the pod and returns the
/// first call of the process it ends in, through `library` as that process
/// sees it, with the announcement of the library's probes.
fn first_call_in_private_mounts(
    tracer: &Tracer,
    pod: &PodCgroup,
    script: &str,
    function: &str,
    library: &str,
) -> (Value, Value) {
    let mark = tracer.mark();
    let pid = out_pid(&run_detached(in_private_mounts(pod, script)).stdout);
    first_call(tracer, pid, function, library, mark)
}

/// Shell commands giving a private root its own ld.so.cache that names a
/// directory only it has (`/mnt/gpu`, holding a copy of `lib`).
fn own_ld_cache(lib: &Path) -> String {
    format!(
        "set -e; mount -t tmpfs none /mnt; mkdir /mnt/gpu; cp {lib} /mnt/gpu/libcuda.so.1; \
         echo /mnt/gpu > /mnt/ld.so.conf; ldconfig -C /mnt/ld.so.cache -f /mnt/ld.so.conf; \
         mount --bind /mnt/ld.so.cache /etc/ld.so.cache",
        lib = lib.display()
    )
}

/// A tracer holding every process at a new runtime file's mapping, and a
/// pod to run the processes in.
fn held_tracer_and_pod() -> (Tracer, PodCgroup) {
    (Tracer::start(&["--hold", "--all"]), PodCgroup::new(&random_pod_uid(), &random_hex(64)))
}

/// `loader` run in `pod` on `lib`, to its exit.
fn load_in(pod: &PodCgroup, loader: &Path, lib: &Path) -> Output {
    let mut cmd = pod.command(loader);
    cmd.arg(lib);
    run_detached(cmd)
}

fn reason(probed: &Value) -> &str {
    probed["reason"].as_str().unwrap_or_default()
}

// ---- default mode: everything the loader can find by name ----
//
// At exec, before the loader runs, each file the loader could load by name
// is probed. Attaching the first uprobe after a quiet spell costs the
// daemon one RCU grace period in the kernel (uprobe_register enters the
// dup_mmap_sem rcu_sync), measured at 7-95 ms here, so a first call made
// within that time of the exec that revealed the file needs the hold; its
// rate in the default mode is measured by `cargo xtask bench`.

/// The file is probed at an exec, for the reason given: every run.
fn probed_at_exec(tracer: &Tracer, library: &str, mark: usize, reason_prefix: &str) {
    let probed = probed_after(tracer, library, mark);
    assert!(reason(&probed).starts_with(reason_prefix), "{probed}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn dt_needed_libraries_are_probed_at_exec_from_the_loaders_search_path() {
    assert_root();
    let needed = fixture("cuda_first");
    let app = fixture("cuda_first_rpath");
    let lib = zluda();
    let tracer = Tracer::start(&["--all"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    for run in 0..RUNS {
        let fresh = Fresh::new();
        // LD_LIBRARY_PATH in the process's environment.
        let copy = fresh.copy(&lib, "lib/libcuda.so.1");
        let mut cmd = pod.command(&needed);
        cmd.env("LD_LIBRARY_PATH", copy.parent().expect("dir")).args(["--linger", "200"]);
        run_detached(cmd);
        probed_at_exec(&tracer, copy.to_str().expect("utf8"), 0, "LD_LIBRARY_PATH of cuda_first");
        // The executable's run path ($ORIGIN/zluda).
        let exe = fresh.copy(&app, "app/cuda_first_rpath");
        let copy = fresh.copy(&lib, "app/zluda/libcuda.so.1");
        let mut cmd = pod.command(&exe);
        cmd.args(["--linger", "200"]);
        run_detached(cmd);
        probed_at_exec(&tracer, copy.to_str().expect("utf8"), 0, "run path of ");
        // A container root whose own ld.so.cache names a directory only it has.
        let script = format!("{}; exec {} --linger 200", own_ld_cache(&lib), needed.display());
        let mark = tracer.mark();
        run_detached(in_private_mounts(&pod, &script));
        probed_at_exec(&tracer, "/mnt/gpu/libcuda.so.1", mark, "ld.so.cache of ");
        eprintln!("run {run}: LD_LIBRARY_PATH, run path and ld.so.cache probed at exec");
    }
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_dlopen_50ms_after_exec_from_the_loaders_search_path_is_seen_from_its_first_call() {
    assert_root();
    let loader = fixture("gpu_dlopen");
    let lib = zluda();
    let tracer = Tracer::start(&["--all"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    for run in 0..RUNS {
        // By name, through LD_LIBRARY_PATH.
        let fresh = Fresh::new();
        let copy = fresh.copy(&lib, "lib/libcuda.so.1");
        let mut cmd = pod.command(&loader);
        cmd.env("LD_LIBRARY_PATH", copy.parent().expect("dir")).args(["--after", "50", "libcuda.so.1"]);
        let pid = out_pid(&run_detached(cmd).stdout);
        let (_, probed) = first_call(&tracer, pid, "cuInit", copy.to_str().expect("utf8"), 0);
        assert!(reason(&probed).starts_with("LD_LIBRARY_PATH of gpu_dlopen"), "run {run}: {probed}");
        // By name, through the container root's ld.so.cache.
        let script = format!("{}; exec {} --after 50 libcuda.so.1", own_ld_cache(&lib), loader.display());
        let (_, probed) =
            first_call_in_private_mounts(&tracer, &pod, &script, "cuInit", "/mnt/gpu/libcuda.so.1");
        assert!(reason(&probed).starts_with("ld.so.cache of "), "run {run}: {probed}");
        // By path, from ZLUDA's usual directory in the container root.
        let script = format!(
            "set -e; mount -t tmpfs none /opt; mkdir /opt/zluda; cp {lib} /opt/zluda/libcuda.so.1; \
             exec {loader} --after 50 /opt/zluda/libcuda.so.1",
            lib = lib.display(),
            loader = loader.display()
        );
        let (_, probed) =
            first_call_in_private_mounts(&tracer, &pod, &script, "cuInit", "/opt/zluda/libcuda.so.1");
        assert!(reason(&probed).starts_with("standard library directory of"), "run {run}: {probed}");
    }
}

/// A runtime file caught half-written (an image layer still unpacking, a
/// `cp` under way as the container's first processes start) is no runtime
/// yet; it is not written off, and the program that finally loads it
/// whole is seen from its first call.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_runtime_file_caught_half_written_is_looked_at_again_once_whole() {
    use std::os::unix::process::CommandExt;
    assert_root();
    let loader = fixture("gpu_dlopen");
    let lib = zluda();
    let tracer = Tracer::start(&["--all"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let fresh = Fresh::new();
    // The tracer's announcement of this copy, found at the exec of a
    // process that starts while the runtime is cut short, proves it looked
    // at the runtime in that state.
    let witness = fresh.copy(&lib, "witness/libcuda.so.1");
    let go = fresh.0.join("go");
    let made = Command::new("mkfifo").arg(&go).status().expect("mkfifo");
    assert!(made.success(), "mkfifo: {made}");
    let script = format!(
        "set -e; mount -t tmpfs none /opt; mkdir /opt/zluda; \
         head -c 4096 {lib} > /opt/zluda/libcuda.so.1; \
         env LD_LIBRARY_PATH={witness_dir} cat {go} > /dev/null; \
         cat {lib} > /opt/zluda/libcuda.so.1; \
         exec {loader} --after 50 /opt/zluda/libcuda.so.1",
        lib = lib.display(),
        witness_dir = witness.parent().expect("dir").display(),
        go = go.display(),
        loader = loader.display()
    );
    let mut cmd = in_private_mounts(&pod, &script);
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.stdout(Stdio::piped()).spawn().expect("start the script");
    let looked = probed_after(&tracer, witness.to_str().expect("utf8"), 0);
    assert!(reason(&looked).starts_with("LD_LIBRARY_PATH of cat"), "{looked}");
    fs::write(&go, b"go\n").expect("let the script finish the copy");
    let out = child.wait_with_output().expect("the script");
    assert!(out.status.success(), "{out:?}");
    let (_, probed) = first_call(&tracer, out_pid(&out.stdout), "cuInit", "/opt/zluda/libcuda.so.1", 0);
    assert!(reason(&probed).starts_with("standard library directory of"), "{probed}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_runtime_dlopened_right_after_another_library_is_not_hidden_by_coalescing() {
    assert_root();
    let loader = fixture("gpu_dlopen");
    let tracer = Tracer::start(&["--all"]);
    for run in 0..RUNS {
        let fresh = Fresh::new();
        // Any other library mapped just before opens the kernel's
        // coalescing window for this process.
        let other = fresh.copy(&zluda(), "other/libzl_other.so");
        let lib = fresh.copy(&zluda(), "rt/libcuda.so.1");
        let mut cmd = Command::new(&loader);
        cmd.arg("--preload").arg(&other).args(["--linger", "300"]).arg(&lib);
        run_detached(cmd);
        // Found from its own mapping, not hidden behind the other one's.
        let probed = probed_after(&tracer, lib.to_str().expect("utf8"), 0);
        assert!(reason(&probed).starts_with("mapped by gpu_dlopen"), "run {run}: {probed}");
    }
}

// ---- --hold: any path, any timing ----

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn held_dt_needed_program_calling_cu_init_first_is_seen() {
    assert_root();
    let app = fixture("cuda_first");
    let lib = zluda();
    let (tracer, pod) = held_tracer_and_pod();
    for run in 0..RUNS {
        let fresh = Fresh::new();
        let copy = fresh.copy(&lib, "lib/libcuda.so.1");
        let mut cmd = pod.command(&app);
        cmd.env("LD_LIBRARY_PATH", copy.parent().expect("dir"));
        let pid = out_pid(&run_detached(cmd).stdout);
        first_call(&tracer, pid, "cuInit", copy.to_str().expect("utf8"), 0);
        // The same in a private mount namespace.
        let script = format!(
            "set -e; mount -t tmpfs none /mnt; mkdir /mnt/lib; cp {lib} /mnt/lib/libcuda.so.1; cp {app} /mnt/; \
             LD_LIBRARY_PATH=/mnt/lib exec /mnt/cuda_first",
            lib = lib.display(),
            app = app.display()
        );
        let (call, _) =
            first_call_in_private_mounts(&tracer, &pod, &script, "cuInit", "/mnt/lib/libcuda.so.1");
        assert_eq!(call["cgroup"], pod.rel.as_str(), "run {run}");
    }
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn held_dlopen_of_any_path_then_an_immediate_call_is_seen_at_any_delay() {
    assert_root();
    let loader = fixture("gpu_dlopen");
    let lib = zluda();
    let (tracer, pod) = held_tracer_and_pod();
    for delay in ["0", "10", "50"] {
        for run in 0..RUNS {
            let fresh = Fresh::new();
            let copy = fresh.copy(&lib, "anywhere/libcuda.so.1");
            let mut cmd = pod.command(&loader);
            cmd.args(["--after", delay]).arg(&copy);
            let pid = out_pid(&run_detached(cmd).stdout);
            let (_, probed) = first_call(&tracer, pid, "cuInit", copy.to_str().expect("utf8"), 0);
            assert!(reason(&probed).ends_with("held until probed"), "delay {delay} run {run}: {probed}");
            assert!(probed["held_ns"].as_u64().is_some(), "{probed}");
            // In a private mount namespace, reached only through /proc/PID/root.
            let script = format!(
                "set -e; mount -t tmpfs none /mnt; cp {lib} /mnt/libcuda.so.1; exec {loader} --after {delay} /mnt/libcuda.so.1",
                lib = lib.display(),
                loader = loader.display()
            );
            let (_, probed) =
                first_call_in_private_mounts(&tracer, &pod, &script, "cuInit", "/mnt/libcuda.so.1");
            assert!(reason(&probed).ends_with("held until probed"), "delay {delay} run {run}: {probed}");
        }
    }
}

/// The hold once, for the kernels of the matrix CI boots with one test per
/// family: a process stopped at its mapping of a never-seen runtime file,
/// by the kernel side's signal, and resumed once the file is probed, has
/// its immediate first call seen. Its report, and the record the watchdog
/// reads, go through maps and signals whose support differs by kernel.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_held_process_has_its_immediate_first_call_seen() {
    assert_root();
    let loader = fixture("gpu_dlopen");
    let lib = zluda();
    let (tracer, pod) = held_tracer_and_pod();
    let fresh = Fresh::new();
    let copy = fresh.copy(&lib, "held/libcuda.so.1");
    let pid = out_pid(&load_in(&pod, &loader, &copy).stdout);
    let (call, probed) = first_call(&tracer, pid, "cuInit", copy.to_str().expect("utf8"), 0);
    assert!(reason(&probed).ends_with("held until probed"), "{probed}");
    assert!(probed["held_ns"].as_u64().is_some_and(|ns| ns > 0), "{probed}");
    assert_eq!(call["cgroup"], pod.rel.as_str(), "{call}");
}

/// A daemon that reads a mapping's report only after the process has
/// gone (it was busy, or the hold's deadline let the process run on) cannot
/// reach the file through that process. The file must stay news to the
/// kernel side, so that the next process mapping it is reported, and held,
/// again: a runbook's worker restarted after such a miss is seen from its
/// first call.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_runtime_whose_first_mapper_left_unread_is_held_at_its_next_mapping() {
    assert_root();
    let loader = fixture("gpu_dlopen");
    let lib = zluda();
    let (tracer, pod) = held_tracer_and_pod();
    let fresh = Fresh::new();
    let copy = fresh.copy(&lib, "missed/libcuda.so.1");
    let copy_path = copy.to_str().expect("utf8");
    let marker = fresh.copy(&lib, "marker/libcuda.so.1");
    // The daemon frozen: the first mapper is held, resumed by the watchdog's
    // deadline, calls and exits before its report is read.
    // SAFETY: plain signals to the tracer process this test started.
    assert_eq!(unsafe { libc::kill(tracer.pid() as i32, libc::SIGSTOP) }, 0);
    let first = load_in(&pod, &loader, &copy);
    assert_eq!(unsafe { libc::kill(tracer.pid() as i32, libc::SIGCONT) }, 0);
    // Reports are read in order: once a later file is announced, the first
    // mapper's report has been handled.
    load_in(&pod, &loader, &marker);
    probed_after(&tracer, marker.to_str().expect("utf8"), 0);
    let first_pid = out_pid(&first.stdout);
    assert!(
        !tracer
            .events()
            .iter()
            .any(|e| e["kind"] == "gpu_call" && e["pid"] == first_pid && e["library"] == copy_path),
        "the first mapper ran while the daemon was frozen: its calls into the copy went unseen"
    );
    let pid = out_pid(&load_in(&pod, &loader, &copy).stdout);
    let (_, probed) = first_call(&tracer, pid, "cuInit", copy_path, 0);
    assert!(reason(&probed).ends_with("held until probed"), "{probed}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn held_copy_of_the_real_hip_runtime_is_seen_from_its_first_call() {
    assert_root();
    let loader = fixture("gpu_dlopen");
    let (tracer, pod) = held_tracer_and_pod();
    let expected = if Path::new("/dev/kfd").exists() { 0 } else { 101 };
    // Half the runs in the pod's own mount namespace, half in a private one:
    // the real runtime has 16 probed functions, and each fresh copy's 32
    // links take the kernel about 3 s to release at the end.
    for run in 0..RUNS / 2 {
        let fresh = Fresh::new();
        let copy = fresh.copy(Path::new(HIP_RUNTIME), "hip/libamdhip64.so.5");
        let pid = out_pid(&load_in(&pod, &loader, &copy).stdout);
        let (call, _) = first_call(&tracer, pid, "hipInit", copy.to_str().expect("utf8"), 0);
        assert_eq!(call["result"], expected, "run {run}: {call}");
        let script = format!(
            "set -e; mount -t tmpfs none /mnt; cp {HIP_RUNTIME} /mnt/libamdhip64.so.5; exec {loader} /mnt/libamdhip64.so.5",
            loader = loader.display()
        );
        first_call_in_private_mounts(&tracer, &pod, &script, "hipInit", "/mnt/libamdhip64.so.5");
    }
}

// ---- the hold never leaves a process stopped ----

/// A burst of processes, each loading a library never seen before.
fn start_burst(loader: &Path, lib: &Path, fresh: &Fresh, count: usize) -> Vec<Child> {
    use std::os::unix::process::CommandExt;
    (0..count)
        .map(|i| {
            let copy = fresh.copy(lib, &format!("burst{i}/libcuda.so.1"));
            let mut cmd = Command::new(loader);
            cmd.arg(&copy).stdout(Stdio::null()).stderr(Stdio::null());
            // SAFETY: setsid is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                });
            }
            cmd.spawn().expect("spawn")
        })
        .collect()
}

fn state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().next()?.chars().next()
}

/// Waits for every child; fails naming any left stopped (and then frees it).
fn assert_all_finish(children: Vec<Child>, within: Duration) {
    let deadline = Instant::now() + within;
    let mut left = children;
    while !left.is_empty() && Instant::now() < deadline {
        left.retain_mut(|c| c.try_wait().ok().flatten().is_none());
        std::thread::sleep(Duration::from_millis(20));
    }
    let stuck: Vec<(u32, Option<char>)> = left.iter().map(|c| (c.id(), state(c.id()))).collect();
    for c in &mut left {
        // SAFETY: plain kill(2) of our own child, so the suite goes on.
        unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(stuck.is_empty(), "processes left unfinished (pid, state): {stuck:?}");
}

fn watchdog_pid(tracer: &Tracer) -> u32 {
    let line = tracer.stderr_line("watchdog pid");
    line.rsplit("watchdog pid ")
        .next()
        .and_then(|s| s.trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no watchdog pid in {line}"))
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn sigkilling_the_daemon_during_a_burst_leaves_no_process_stopped() {
    assert_root();
    let loader = fixture("gpu_dlopen");
    let lib = zluda();
    let mut killed = Vec::new();
    for round in 0..5 {
        let tracer = Tracer::start(&["--hold", "--all"]);
        let fresh = Fresh::new();
        let mut children = start_burst(&loader, &lib, &fresh, 8);
        // A random moment in the burst: before, during or after the holds.
        let delay = u64::from_str_radix(&random_hex(4), 16).unwrap_or(0) % 150;
        std::thread::sleep(Duration::from_millis(delay));
        // The worst moment: the daemon freezes with processes held (a late
        // pair maps its libraries after the freeze, so some always are),
        // then dies without resuming them; only the watchdog is left.
        // SAFETY: kill(2) of the tracer this test started.
        unsafe { libc::kill(tracer.pid() as i32, libc::SIGSTOP) };
        let late = Fresh::new();
        let held = start_burst(&loader, &lib, &late, 2);
        let deadline = Instant::now() + wait();
        while held.iter().any(|c| state(c.id()) != Some('T')) {
            assert!(Instant::now() < deadline, "the late pair was never held");
            std::thread::sleep(Duration::from_millis(10));
        }
        children.extend(held);
        killed.push(tracer.kill_without_waiting());
        assert_all_finish(children, Duration::from_secs(if in_vm() { 60 } else { 15 }));
        eprintln!("round {round}: daemon killed {delay} ms into the burst; every process finished");
    }
    // Cleanup only: the kernel releases a killed daemon's probes after the
    // test's assertions; later tests should not start while it still does.
    let deadline = Instant::now() + Duration::from_secs(300);
    while killed.iter().any(|pid| Path::new(&format!("/proc/{pid}")).exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_new_daemon_resumes_what_a_dead_one_left_held() {
    assert_root();
    let loader = fixture("gpu_dlopen");
    let lib = zluda();
    let tracer = Tracer::start(&["--hold", "--all"]);
    let watchdog = watchdog_pid(&tracer);
    // The worst case: the watchdog is gone and the daemon is frozen, so a
    // held process is resumed by neither.
    // SAFETY: kill(2) of processes this test started.
    unsafe {
        libc::kill(watchdog as i32, libc::SIGKILL);
        libc::kill(tracer.pid() as i32, libc::SIGSTOP);
    }
    let fresh = Fresh::new();
    let children = start_burst(&loader, &lib, &fresh, 3);
    let deadline = Instant::now() + wait();
    while children.iter().any(|c| state(c.id()) != Some('T')) {
        assert!(Instant::now() < deadline, "the burst was never held");
        std::thread::sleep(Duration::from_millis(20));
    }
    tracer.kill_without_waiting();
    std::thread::sleep(Duration::from_millis(700));
    assert!(children.iter().all(|c| state(c.id()) == Some('T')), "still held with no daemon");
    let next = Tracer::start(&["--hold", "--all"]);
    assert_all_finish(children, wait());
    next.wait_stderr("resumed 3 processes an earlier canaryscope left held", wait());
}

/// A person who stops `trace --hold` gets the prompt back while the kernel
/// still releases the probes, in a process the tracer names. That process
/// keeps no terminal or pipe of the tracer's open, sits in no session a
/// Ctrl-C reaches, holds nothing started meanwhile (the holding program
/// is gone before it is made), and ends once the release is done.
#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_stopped_tracer_leaves_the_release_behind_and_holds_nothing_meanwhile() {
    assert_root();
    let loader = fixture("gpu_dlopen");
    let lib = zluda();
    let tracer = Tracer::start(&["--hold"]);
    let watchdog = watchdog_pid(&tracer);
    let fresh = Fresh::new();
    // Files probed besides the host's HIP runtime: links to release.
    assert_all_finish(start_burst(&loader, &lib, &fresh, 3), wait());
    for i in 0..3 {
        let copy = fresh.0.join(format!("burst{i}/libcuda.so.1"));
        probed_after(&tracer, copy.to_str().expect("utf8"), 0);
    }
    // Ctrl-C, as a person stops it: the readers reach the end of the
    // tracer's stdout and stderr, so nothing else holds them open.
    let (status, releaser, _) = tracer.signal_and_reap(libc::SIGINT);
    assert!(status.success(), "Ctrl-C ends the tracer cleanly: {status:?}");
    let releaser = releaser.expect("the tracer names the process releasing its probes");
    // The watchdog sweeps a moment after the tracer goes; once it is gone,
    // a process stopped now would stay stopped.
    wait_gone(watchdog, wait());
    assert!(
        still_running(releaser),
        "the release ended with the watchdog's last sweep: nothing left to check it against"
    );
    for fd in 0..3 {
        let link = fs::read_link(format!("/proc/{releaser}/fd/{fd}"));
        assert!(link.is_err(), "the releaser keeps fd {fd} open: {link:?}");
    }
    let stat = fs::read_to_string(format!("/proc/{releaser}/stat")).expect("the releaser's stat");
    let session =
        stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(3)?.parse::<u32>().ok());
    assert_eq!(session, Some(releaser), "the releaser leads its own session: {stat}");
    // A GPU runtime file never seen, mapped while the release goes on.
    let later = Fresh::new();
    assert_all_finish(start_burst(&loader, &lib, &later, 2), wait());
    assert!(still_running(releaser), "the release ended before the late pair mapped its files");
    wait_gone(releaser, Duration::from_secs(300));
}
