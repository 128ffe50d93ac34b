//! `canaryscope top` as a person and a script see it: the full-screen view
//! in a real terminal (a tmux pane) on the real probes, and `--once --json`
//! against the real daemon's `/metrics`.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Output, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use test_support::{
    assert_root, canaryscope, fixture, metric_value, random_hex, random_pod_uid, Daemon, PodCgroup,
};

/// A tmux server of its own (its own socket and an empty config), so the
/// test neither sees nor disturbs anyone else's sessions.
struct Tmux {
    /// The server's socket, in `dir`, so nothing is left behind in
    /// tmux's shared socket directory.
    socket: PathBuf,
    dir: PathBuf,
}

impl Tmux {
    /// Starts `command` in a detached session of `cols` x `rows`. The pane
    /// stays after the command exits, so what it printed last can be read.
    fn start(command: &str, cols: u16, rows: u16) -> Self {
        let dir = std::env::temp_dir().join(format!("canaryscope-top-{}", random_hex(8)));
        let socket = dir.join("socket");
        fs::create_dir_all(&dir).expect("scratch dir");
        // remain-on-exit only: tmux 3.3 dies on `window-size` in a config
        // read before the first session, and resize-window makes the
        // size manual for its window anyway.
        fs::write(dir.join("tmux.conf"), "set -g remain-on-exit on\n").expect("conf");
        let t = Self { socket, dir };
        let out = t
            .cmd(&["-f", &t.dir.join("tmux.conf").display().to_string(), "new-session", "-d", "-s", "top"])
            .args(["-x", &cols.to_string(), "-y", &rows.to_string(), command])
            .output()
            .expect("tmux (scripts/setup.sh installs it)");
        assert!(out.status.success(), "tmux new-session: {out:?}");
        t
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S").arg(&self.socket).args(args).env("TERM", "xterm-256color");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        let out = self.cmd(args).output().expect("tmux");
        assert!(out.status.success(), "tmux {args:?}: {out:?}");
        out
    }

    /// The pane's lines as shown now.
    fn screen(&self) -> Vec<String> {
        let out = self.run(&["capture-pane", "-p", "-t", "top"]);
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }

    /// The pane's lines including those scrolled off the top (the exit
    /// status can scroll away under `stty -a` on a short pane).
    fn history(&self) -> Vec<String> {
        let out = self.run(&["capture-pane", "-p", "-J", "-S", "-", "-t", "top"]);
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }

    fn format(&self, f: &str) -> String {
        String::from_utf8_lossy(&self.run(&["display-message", "-p", "-t", "top", f]).stdout)
            .trim()
            .to_string()
    }

    /// Polls the pane until `pred` holds; returns that screen and how long it took.
    fn wait(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&[String]) -> bool,
    ) -> (Vec<String>, Duration) {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return (screen, start.elapsed());
            }
            assert!(
                start.elapsed() < timeout,
                "{what} not on screen within {timeout:?}:\n{}",
                screen.join("\n")
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // A top that failed the test may still run (with its probes): the
        // pane's shell leads the process group both are in.
        if let Ok(out) = self.cmd(&["display-message", "-p", "-t", "top", "#{pane_pid}"]).output() {
            if let Ok(pid) = String::from_utf8_lossy(&out.stdout).trim().parse::<i32>() {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
        }
        let _ = self.cmd(&["kill-server"]).output();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The FAIL column of a row: after the name, and the track when there is one.
fn failures(line: &str) -> Option<u64> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    // Without Kubernetes a row has no track: name, CALLS/s, FAIL, ...
    fields.get(2)?.parse().ok()
}

#[test]
#[ignore = "needs root and tmux; run by `cargo xtask test`"]
fn the_screen_shows_a_failing_cgroup_redraws_on_resize_and_q_restores_the_terminal() {
    assert_root();
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let uid = pod
        .rel
        .split("-pod")
        .nth(1)
        .and_then(|s| s.split('.').next())
        .expect("pod uid in the path")
        .replace('_', "-");
    let bin = canaryscope();
    let command = format!("'{}' top; echo exit=$?; stty -a", bin.display());
    let tmux = Tmux::start(&command, 140, 40);
    // Probes attached: the screen is up with its footer on the last line.
    tmux.wait("the view", Duration::from_secs(60), |s| {
        s.first().is_some_and(|l| l.contains("canaryscope top"))
            && s.get(39).is_some_and(|l| l.contains("q quit"))
    });
    assert_eq!(tmux.format("#{alternate_on}"), "1", "the view takes the alternate screen");

    let out = pod.command(&fixture("hip_probe")).output().expect("hip_probe");
    assert!(out.status.success(), "{out:?}");
    // How soon it shows is a figure for the bench, not a test's assertion.
    let (screen, _) = tmux.wait("the failing cgroup's row", Duration::from_secs(10), |s| {
        s.iter().any(|l| l.contains(&uid) && failures(l).is_some_and(|n| n >= 1))
    });
    // For docs/top.md, on request: the screen as a person saw it.
    if let Some(out) = std::env::var_os("CANARYSCOPE_TOP_SCREEN") {
        fs::write(out, screen.join("\n") + "\n").expect("screen capture");
    }

    // A smaller terminal: the footer moves to its new last line.
    tmux.run(&["resize-window", "-t", "top", "-x", "100", "-y", "25"]);
    let (screen, _) = tmux
        .wait("the redraw at 100x25", Duration::from_secs(5), |s| s.len() == 25 && s[24].contains("q quit"));
    assert!(screen.iter().all(|l| l.chars().count() <= 100), "{}", screen.join("\n"));

    tmux.run(&["send-keys", "-t", "top", "q"]);
    // The shell reports top's status, then stty lists the terminal's modes;
    // the pane stays (remain-on-exit) so both can be read.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tmux.format("#{pane_dead}") != "1" {
        assert!(Instant::now() < deadline, "top still running after q:\n{}", tmux.screen().join("\n"));
        thread::sleep(Duration::from_millis(50));
    }
    let text = tmux.history().join("\n");
    assert!(text.contains("exit=0"), "q exits 0:\n{text}");
    assert_eq!(tmux.format("#{alternate_on}"), "0", "back on the main screen:\n{text}");
    // Raw mode is off again: the line discipline echoes and edits lines.
    let words: Vec<&str> = text.split_whitespace().collect();
    for flag in ["icanon", "echo", "isig"] {
        assert!(words.contains(&flag), "stty shows {flag} on after top:\n{text}");
    }
}

#[test]
#[ignore = "needs root; run by `cargo xtask test`"]
fn once_json_from_a_daemon_matches_its_metrics_and_needs_no_root() {
    assert_root();
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let mut pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    pod.limit_memory(50 << 20);
    let uid =
        pod.rel.split("-pod").nth(1).and_then(|s| s.split('.').next()).expect("pod uid").replace('_', "-");
    let out = pod.command(&fixture("hip_probe")).output().expect("hip_probe");
    assert!(out.status.success(), "{out:?}");
    // Something in every column top counts: a crash, an abort and an OOM
    // kill in the 50 MiB limit, so that a column stuck at zero shows.
    for (program, args) in [("segv_app", &[][..]), ("abort_app", &[]), ("oom_hog", &["200"])] {
        let out = pod.command(&fixture(program)).args(args).stdout(Stdio::null()).output().expect(program);
        assert!(!out.status.success(), "{program} is meant to die: {out:?}");
    }
    let pod_label = format!("pod=\"{uid}\"");
    // The kernel's counts of the process, after it ended (read each second).
    daemon.wait_metric("the pod's failed calls", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_gpu_api_call_failures_total{")
            && l.contains(&pod_label)
            && l.contains("function=\"hipGetDeviceCount\"")
    });
    daemon.wait_metric("the pod's OOM kill", Duration::from_secs(10), |l| {
        l.starts_with("canaryscope_oom_kills_total{") && l.contains(&pod_label)
    });
    let url = format!("http://127.0.0.1:{}/metrics", daemon.port);
    // As nobody: reading a daemon needs no privilege.
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(canaryscope())
        .args(["top", "--from", &url, "--once", "--json", "--filter", &uid])
        .output()
        .expect("setpriv (util-linux)");
    // What top reads: the same exporter's per-pod view.
    let metrics = daemon.pod_metrics();
    assert!(out.status.success(), "top --once --json as nobody: {out:?}");
    let snapshot: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let rows = snapshot["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "the filter keeps the one pod: {snapshot}");
    let row = &rows[0];
    assert_eq!(row["name"], uid.as_str());
    let interval = snapshot["interval_s"].as_f64().expect("interval");
    assert!((0.9..2.0).contains(&interval), "rates over about one second: {interval}");

    // The same moment in the exposition: the process has ended, so the
    // counters no longer move.
    let sum = |family: &str, keep: &dyn Fn(&str) -> bool| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(&pod_label) && keep(l))
            .map(|l| metric_value(l) as u64)
            .sum()
    };
    let failed = sum("canaryscope_gpu_api_calls_total", &|l| {
        !l.contains("result=\"hipSuccess\"") && !l.contains("result=\"CUDA_SUCCESS\"")
    });
    assert!(failed >= 1, "the exposition has the failures: {metrics}");
    assert_eq!(row["gpu_failures"], failed, "{row}");
    assert_eq!(row["gpu_calls_per_s"], 0.0, "no calls during the window: {row}");
    let (crashes, ooms, exits) = (
        sum("canaryscope_native_crashes_total", &|_| true),
        sum("canaryscope_oom_kills_total", &|_| true),
        sum("canaryscope_abnormal_exits_total", &|_| true),
    );
    // SIGSEGV and SIGABRT are native crashes; with the OOM kill, three
    // abnormal exits.
    assert!(crashes >= 2 && ooms >= 1 && exits >= 3, "{crashes} {ooms} {exits}: {metrics}");
    assert_eq!(row["crashes"], crashes, "{row}");
    assert_eq!(row["oom_kills"], ooms, "{row}");
    assert_eq!(row["abnormal_exits"], exits, "{row}");
    // Stalls are calls in flight now: none once the processes are gone.
    assert_eq!(row["gpu_stalls"], sum("canaryscope_gpu_api_stalled_calls", &|_| true), "{row}");
}
