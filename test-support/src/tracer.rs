//! A running `canaryscope trace --json` and the processes it watches.
use std::{
    fs,
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    canaryscope, collect_stderr, self_killing_marker, startup_timeout, unix_now_ns, PodCgroup, READ_AT,
};

/// A running `canaryscope trace --json`, collecting its output lines.
pub struct Tracer {
    child: Child,
    lines: Arc<Mutex<Vec<Value>>>,
    stderr: Arc<Mutex<String>>,
    /// The threads reading stdout and stderr: both end at end of file.
    readers: Vec<thread::JoinHandle<()>>,
}

impl Tracer {
    /// Starts the tracer and waits until it reports that probes are attached.
    pub fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// [`Self::start`] with variables set in the tracer's environment.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(canaryscope())
            .envs(env.iter().copied())
            .arg("trace")
            .arg("--json")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start canaryscope");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("stdout");
        let sink = lines.clone();
        let stdout_reader = thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut value: Value =
                    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}"));
                // When the line reached us, beside when the tracer says it
                // happened: a failed wait's dump then tells an event that
                // never came from one that came late.
                if let Some(fields) = value.as_object_mut() {
                    fields.insert(READ_AT.into(), Value::from(unix_now_ns()));
                }
                sink.lock().expect("lock").push(value);
            }
        });
        let (stderr, stderr_reader) = collect_stderr(&mut child, "canaryscope");
        let tracer = Self { child, lines, stderr, readers: vec![stdout_reader, stderr_reader] };
        tracer.wait_stderr("tracing;", startup_timeout());
        tracer
    }

    pub fn wait_stderr(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.stderr.lock().expect("lock").contains(needle) {
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!("canaryscope did not print {needle:?}; stderr:\n{}", self.stderr.lock().expect("lock"));
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The first line of stderr containing `needle`.
    pub fn stderr_line(&self, needle: &str) -> String {
        self.wait_stderr(needle, Duration::from_secs(5));
        let text = self.stderr.lock().expect("lock");
        text.lines().find(|l| l.contains(needle)).unwrap_or_default().to_string()
    }

    pub fn events(&self) -> Vec<Value> {
        self.lines.lock().expect("lock").clone()
    }

    /// Where the collected events end now: what [`Self::wait_for_after`]
    /// takes, to tell what came after without comparing two processes'
    /// clocks (a stepped wall clock moves one and not the other).
    pub fn mark(&self) -> usize {
        self.lines.lock().expect("lock").len()
    }

    /// Waits until `pred` holds for some collected event.
    pub fn wait_for(&self, what: &str, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_for_after(0, what, timeout, pred)
    }

    /// Waits until `pred` holds for at least `n` collected events; returns them.
    pub fn wait_for_n(
        &self,
        what: &str,
        n: usize,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let found: Vec<Value> = self.events().into_iter().filter(|e| pred(e)).collect();
            if found.len() >= n {
                return found;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{} of {n} events for {what} within {timeout:?}; events:\n{:#?}",
                    found.len(),
                    self.events()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `pred` holds for some event collected after `mark`.
    pub fn wait_for_after(
        &self,
        mark: usize,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = self.events().into_iter().skip(mark).find(|e| pred(e)) {
                return v;
            }
            if Instant::now() >= deadline {
                panic!("no event for {what} within {timeout:?}; events:\n{:#?}", self.events());
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every record the kernel wrote for `cg` so far has been
    /// read: a process there kills itself, and its exit record comes after
    /// all of them in the ring buffer. What an absence check needs, instead
    /// of a pause. Returns the marker's pid, whose exit a caller may skip.
    pub fn barrier(&self, cg: &PodCgroup) -> u64 {
        let marker = self_killing_marker(cg);
        self.wait_for("the barrier's own exit", startup_timeout(), |e| {
            e["kind"] == "exit" && e["pid"] == marker
        });
        marker
    }

    /// SIGKILL, without waiting for the exit: a killed observer's probes are
    /// released by the kernel as its descriptors close, which can take a
    /// while after many libraries.
    pub fn kill_without_waiting(self) -> u32 {
        let pid = self.child.id();
        let mut this = std::mem::ManuallyDrop::new(self);
        let _ = this.child.kill();
        // SAFETY: `this` is never used or dropped again; the child is moved
        // to a thread that reaps it.
        let mut child = unsafe { std::ptr::read(&this.child) };
        thread::spawn(move || {
            let _ = child.wait();
        });
        pid
    }

    /// SIGTERM, then the exit status and everything printed. The probes'
    /// release, which a stopped tracer leaves to a background process, is
    /// waited for too: the next test's tracer must not attach behind it.
    pub fn stop(self) -> (std::process::ExitStatus, Vec<Value>) {
        let (status, releaser, events) = self.signal_and_reap(libc::SIGTERM);
        if let Some(pid) = releaser {
            wait_gone(pid, Duration::from_secs(300));
        }
        (status, events)
    }

    /// Sends `signal`, reaps the tracer and reads its output to the end.
    /// Returns its exit status, the pid of the background process it named
    /// for its probes' release, and its events.
    pub fn signal_and_reap(mut self, signal: i32) -> (std::process::ExitStatus, Option<u32>, Vec<Value>) {
        // SAFETY: plain kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        let status = self.child.wait().expect("wait");
        for reader in std::mem::take(&mut self.readers) {
            let _ = reader.join();
        }
        let releaser = self.stderr.lock().expect("lock").lines().find_map(|l| {
            let (_, rest) = l.split_once("in the background (pid ")?;
            rest.trim_end_matches(')').parse::<u32>().ok()
        });
        (status, releaser, self.events())
    }
}

/// Whether process `pid` still runs: a zombie has released everything it
/// held, and one whose new parent never reaps it stays listed for good.
pub fn still_running(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // The state follows the parenthesised command name.
    stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// How many of process `pid`'s descriptors are `uprobe_multi` links, as
/// the kernel describes each in /proc/PID/fdinfo.
pub fn uprobe_multi_links(pid: u32) -> usize {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return 0 };
    dir.flatten()
        .filter(|entry| {
            fs::read_to_string(entry.path()).is_ok_and(|info| {
                // Newer kernels name the return kind `uretprobe_multi`.
                info.lines().any(|l| {
                    let mut words = l.split_whitespace();
                    words.next() == Some("link_type:")
                        && matches!(words.next(), Some("uprobe_multi" | "uretprobe_multi"))
                })
            })
        })
        .count()
}
/// Waits until process `pid` has exited, up to `limit`.
pub fn wait_gone(pid: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    while still_running(pid) {
        assert!(Instant::now() < deadline, "pid {pid} still there after {limit:?}");
        thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
