//! Who ended a process: real signals between real processes in real
//! cgroups. An exit by SIGKILL alone says nothing; the cause and the
//! sender's place (same container, another pod, the host) decide whether a
//! canary failed.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use test_support::{assert_root, child_pid, fixture, out_pid, random_hex, random_pod_uid, PodCgroup, Tracer};

const PYTHON: &str = "/usr/bin/python3";

/// A prefix every test pod's cgroup path has, for a tracer that sees them all.
const PODS: &str = "/kubepods.slice";

/// Starts `program args` in `pod` and reads the first line it prints
/// (`pid=N` or `ready`), so the caller knows it is running.
fn start_in(pod: &PodCgroup, program: &Path, args: &[&str]) -> (std::process::Child, String) {
    let mut child = pod
        .command(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("stdout")).read_line(&mut line).expect("first line");
    (child, line.trim().to_string())
}

fn exit_of(tracer: &Tracer, pid: u64) -> Value {
    tracer.wait_for(&format!("exit of {pid}"), Duration::from_secs(5), |e| {
        e["kind"] == "exit" && e["pid"] == pid
    })
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_wrappers_timeout_kill_is_sent_from_the_same_container_by_python3() {
    assert_root();
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let tracer = Tracer::start(&["--cgroup", &pod.rel]);
    // The solver runbook's wrapper: subprocess.run(timeout=...) SIGKILLs a
    // child that runs too long (Lib/subprocess.py, run -> process.kill()).
    let script = r#"
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "print(__import__('os').getpid(), flush=True)\nwhile True: pass"], stdout=subprocess.PIPE)
print("child", child.stdout.readline().decode().strip(), flush=True)
try:
    child.communicate(timeout=1)
except subprocess.TimeoutExpired:
    child.kill()
    child.wait()
try:
    subprocess.run([sys.executable, "-c", "while True: pass"], timeout=1)
except subprocess.TimeoutExpired:
    print("timed out", flush=True)
"#;
    let out = pod.command(Path::new(PYTHON)).args(["-c", script]).output().expect("python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("timed out"), "{text}");
    let child: u64 = child_pid(&text);
    let exit = exit_of(&tracer, child);
    assert_eq!(exit["signal"], "SIGKILL", "{exit}");
    assert_eq!(exit["cause"], "sent", "{exit}");
    assert_eq!(exit["sender_scope"], "same_container", "{exit}");
    assert_eq!(exit["sender_comm"], "python3", "{exit}");
    assert_eq!(exit["sender_cgroup"], pod.rel.as_str(), "{exit}");
    assert_ne!(exit["sender_pid"], child, "{exit}");
    assert_eq!(exit["kill_reason"], Value::Null, "no Kubernetes here: {exit}");
    // subprocess.run's own kill is the same story, for a second child.
    let marker = tracer.barrier(&pod);
    let (_, events) = tracer.stop();
    let sent: Vec<&Value> =
        events.iter().filter(|e| e["kind"] == "exit" && e["cause"] == "sent" && e["pid"] != marker).collect();
    assert_eq!(sent.len(), 2, "{events:#?}");
    assert!(sent.iter().all(|e| e["sender_comm"] == "python3" && e["sender_scope"] == "same_container"));
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn kill_9_from_elsewhere_names_the_senders_scope() {
    assert_root();
    let uid = random_pod_uid();
    let target_pod = PodCgroup::new(&uid, &random_hex(64));
    let sibling = PodCgroup::new(&uid, &random_hex(64));
    let other_pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let tracer = Tracer::start(&["--cgroup", PODS]);
    let sleeper = fixture("segv_app"); // sleeps before it would crash: long enough to be killed
    let kill = Path::new("/bin/kill");
    let cases: [(&str, Option<&PodCgroup>); 3] =
        [("same_pod", Some(&sibling)), ("other_pod", Some(&other_pod)), ("host", None)];
    for (scope, from) in cases {
        let (mut child, line) = start_in(&target_pod, &sleeper, &["--sleep-before", "30000"]);
        let pid = out_pid(line.as_bytes());
        let mut cmd = match from {
            Some(pod) => pod.command(kill),
            None => Command::new(kill), // the test's own cgroup: outside every pod
        };
        let status = cmd.args(["-9", &pid.to_string()]).status().expect("kill");
        assert!(status.success());
        let _ = child.wait();
        let exit = exit_of(&tracer, pid);
        assert_eq!(exit["cause"], "sent", "{exit}");
        assert_eq!(exit["sender_scope"], scope, "{exit}");
        assert_eq!(exit["sender_comm"], "kill", "{exit}");
        if let Some(pod) = from {
            assert_eq!(exit["sender_cgroup"], pod.rel.as_str(), "{exit}");
        }
    }
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn a_signal_whose_sender_has_exited_is_still_sent_by_it() {
    assert_root();
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let tracer = Tracer::start(&["--cgroup", &pod.rel]);
    // The target blocks SIGTERM, so the signal waits until the sender is
    // gone, then unblocks it and dies of it.
    let script = r#"
import os, signal, subprocess, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
sender = subprocess.run(["/bin/sh", "-c", "kill -TERM %d; echo $$" % os.getpid()], capture_output=True, text=True)
print("sender", sender.stdout.strip(), "target", os.getpid(), flush=True)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
time.sleep(5)
"#;
    let out = pod.command(Path::new(PYTHON)).args(["-c", script]).output().expect("python3");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let word = |w: &str| -> u64 {
        text.split_whitespace()
            .skip_while(|x| *x != w)
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no {w} in {text}"))
    };
    let (sender, target) = (word("sender"), word("target"));
    assert!(!Path::new(&format!("/proc/{sender}")).exists(), "the sender is gone before its signal acts");
    let exit = exit_of(&tracer, target);
    assert_eq!(exit["signal"], "SIGTERM", "{exit}");
    assert_eq!(exit["cause"], "sent", "{exit}");
    assert_eq!(exit["sender_pid"], sender, "{exit}");
    assert_eq!(exit["sender_comm"], "sh", "{exit}");
    assert_eq!(exit["sender_scope"], "same_container", "{exit}");
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn own_faults_and_aborts_are_fault_and_abort_and_a_wrapped_137_is_wrapped() {
    assert_root();
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let tracer = Tracer::start(&["--cgroup", &pod.rel]);
    for (fixture_name, signal, cause) in [("segv_app", "SIGSEGV", "fault"), ("abort_app", "SIGABRT", "abort")]
    {
        let out = pod.command(&fixture(fixture_name)).output().expect(fixture_name);
        let exit = exit_of(&tracer, out_pid(&out.stdout));
        assert_eq!(exit["signal"], signal, "{exit}");
        assert_eq!(exit["cause"], cause, "{exit}");
        assert_eq!(exit["sender_scope"], Value::Null, "{exit}");
    }
    // A SIGSEGV sent by another process is no fault of the target's code.
    let (mut child, line) = start_in(&pod, &fixture("segv_app"), &["--sleep-before", "30000"]);
    let pid = out_pid(line.as_bytes());
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(pid as i32, libc::SIGSEGV) };
    let _ = child.wait();
    let exit = exit_of(&tracer, pid);
    assert_eq!(
        (&exit["signal"], &exit["cause"], &exit["sender_scope"]),
        (&"SIGSEGV".into(), &"sent".into(), &"host".into()),
        "{exit}"
    );

    let out = pod.command(&fixture("solver_child")).arg("exit137").output().expect("solver exit137");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let child: u64 = child_pid(&text);
    let exit = exit_of(&tracer, child);
    assert_eq!((&exit["exit_code"], &exit["cause"]), (&137.into(), &"wrapped".into()), "{exit}");
}
