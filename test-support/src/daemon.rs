//! A running `canaryscope run` exporter.
use std::{
    fs,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use crate::{
    canaryscope, collect_stderr, free_port, http_get,
    k8s::{start_apiserver, write_kubeconfig, Proc},
    startup_timeout,
};

/// A running `canaryscope run` exporter on a free loopback port.
pub struct Daemon {
    child: Child,
    pub port: u16,
    stderr: Arc<Mutex<String>>,
}

impl Daemon {
    pub fn start(extra: &[&str]) -> Self {
        let port = free_port();
        let mut child = Command::new(canaryscope())
            .arg("run")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start canaryscope run");
        let (stderr, _reader) = collect_stderr(&mut child, "canaryscope run");
        let d = Self { child, port, stderr };
        let deadline = Instant::now() + startup_timeout();
        while Instant::now() < deadline {
            if d.get("/readyz").is_some_and(|(code, _)| code == 200) {
                return d;
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("daemon not ready; stderr:\n{}", d.stderr.lock().expect("lock"));
    }

    /// The daemon as the DaemonSet runs it on `node-a`, against the
    /// stand-in API server of `kubeconfig`, with `extra` arguments.
    pub fn on_node(kubeconfig: &Path, extra: &[&str]) -> Self {
        let mut args = vec!["--kubeconfig", kubeconfig.to_str().expect("utf8"), "--node-name", "node-a"];
        args.extend_from_slice(extra);
        Self::start(&args)
    }

    /// A stand-in API server with no pods, its kubeconfig written in
    /// `dir`, and the daemon on node-a watching it, started in that order
    /// as on a node: the server's process and port, and the daemon.
    pub fn with_apiserver(dir: &Path, extra: &[&str]) -> (Proc, u16, Self) {
        let (api, api_port) = start_apiserver(dir, None);
        let kubeconfig = write_kubeconfig(dir, api_port);
        (api, api_port, Self::on_node(&kubeconfig, extra))
    }

    /// (status code, body) of a GET, or None when nothing answers.
    /// The first line the daemon printed to stderr that contains `needle`,
    /// waiting up to `timeout` for it.
    pub fn wait_stderr_line(&self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.stderr.lock().expect("lock").lines().find(|l| l.contains(needle)) {
                return line.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not print {needle:?}; stderr:\n{}",
                self.stderr.lock().expect("lock")
            );
            thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    /// What Prometheus scrapes: successful calls and latencies per
    /// revision, failures per pod.
    pub fn metrics(&self) -> String {
        self.get("/metrics").map(|(_, b)| b).unwrap_or_default()
    }

    /// The per-pod view `top --from` reads: every family per pod.
    pub fn pod_metrics(&self) -> String {
        self.get("/metrics/pods").map(|(_, b)| b).unwrap_or_default()
    }

    /// Waits until some /metrics line satisfies `pred`; returns that line.
    pub fn wait_metric(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        self.wait_line("/metrics", what, timeout, pred)
    }

    /// Waits until some /metrics/pods line satisfies `pred`; returns that line.
    pub fn wait_pod_metric(&self, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        self.wait_line("/metrics/pods", what, timeout, pred)
    }

    fn wait_line(&self, path: &str, what: &str, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.get(path).map(|(_, b)| b).unwrap_or_default();
            if let Some(line) = text.lines().find(|l| !l.starts_with('#') && pred(l)) {
                return line.to_string();
            }
            if Instant::now() >= deadline {
                panic!("no metric for {what} within {timeout:?}; {path}:\n{text}");
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().expect("wait")
    }

    /// SIGTERM, and the exit status once it has stopped; a daemon still
    /// running after `limit` is a hang the test reports (with what it said)
    /// rather than waits out.
    pub fn stop_within(mut self, limit: Duration) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let said = self.stderr.lock().map(|s| s.clone()).unwrap_or_default();
                panic!("the daemon did not stop within {limit:?} of SIGTERM:\n{said}");
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Events its kernel side dropped so far for want of ring-buffer room,
    /// from its own counter map: readable while the daemon is frozen.
    pub fn kernel_lost(&self) -> u64 {
        use aya::maps::{Map, PerCpuArray};
        let lost = PerCpuArray::<_, u64>::try_from(Map::PerCpuArray(self.bpf_map("EVENTS_LOST")))
            .expect("EVENTS_LOST");
        lost.get(&0, 0).map(|per_cpu| per_cpu.iter().sum()).unwrap_or(0)
    }

    /// Freezes the daemon (SIGSTOP) and waits until, unread, its ring
    /// buffer has overflowed under a flood the caller runs; it stays frozen.
    pub fn freeze_until_ring_overflows(&self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.pid() as i32, libc::SIGSTOP) };
        let before = self.kernel_lost();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.kernel_lost() == before {
            if Instant::now() >= deadline {
                // SAFETY: as above.
                unsafe { libc::kill(self.pid() as i32, libc::SIGCONT) };
                panic!("the ring buffer never overflowed in 10 s");
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// As [`Self::freeze_until_ring_overflows`], then runs it again.
    pub fn overflow_ring_while_frozen(&self) {
        self.freeze_until_ring_overflows();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.pid() as i32, libc::SIGCONT) };
    }

    /// One of the daemon's eBPF maps, by name, found through the map fds it
    /// holds (another canaryscope may run beside it).
    pub fn bpf_map(&self, name: &str) -> aya::maps::MapData {
        let dir = format!("/proc/{}/fdinfo", self.pid());
        for entry in fs::read_dir(&dir).expect("fdinfo").flatten() {
            let info = fs::read_to_string(entry.path()).unwrap_or_default();
            let Some(id) = info.lines().find_map(|l| l.strip_prefix("map_id:")) else { continue };
            let Ok(id) = id.trim().parse::<u32>() else { continue };
            let Ok(map) = aya::maps::MapData::from_id(id) else { continue };
            if map.info().ok().and_then(|i| i.name_as_str().map(str::to_string)).as_deref() == Some(name) {
                return map;
            }
        }
        panic!("canaryscope run (pid {}) holds no map named {name}", self.pid());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
