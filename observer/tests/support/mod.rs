//! Shared pieces of the root integration tests: a tracer child process, real
//! cgroups laid out as kubelet + containerd do, and the fixture programs.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod dashboard;
pub mod k8s;
pub mod shape;

use std::{
    fs,
    io::{BufRead, BufReader, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::ChildStdin,
    process::{Child, Command, Stdio},
    sync::mpsc::{channel, Receiver},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

/// The binary under test; CANARYSCOPE_BIN points at a copy (the VM runs
/// one so that a rebuild on the host cannot change it mid-run).
pub fn canaryscope() -> PathBuf {
    std::env::var_os("CANARYSCOPE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_canaryscope")))
}

/// Whether the tests run inside the software-emulated VM, where everything
/// takes several times longer.
pub fn in_vm() -> bool {
    std::env::var_os("CANARYSCOPE_IN_VM").is_some()
}

/// Says that `test` did not run here and why: on stderr, and as a line of
/// the file `cargo xtask test` names in `CANARYSCOPE_SKIPS`, whose summary
/// lists every skip with the kernel it happened on. A test that returns
/// early must call this, so that a pass is never a silent skip.
pub fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
    let Some(file) = std::env::var_os("CANARYSCOPE_SKIPS").filter(|f| !f.is_empty()) else { return };
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let line = format!("{} {test}: {why}\n", kernel.trim());
    let appended = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    appended.unwrap_or_else(|e| panic!("cannot note the skip in {}: {e}", file.to_string_lossy()));
}

/// How long a tracer or daemon may take to load and attach its probes.
fn startup_timeout() -> Duration {
    Duration::from_secs(if in_vm() { 120 } else { 30 })
}

pub fn fixtures_dir() -> PathBuf {
    std::env::var_os("CANARYSCOPE_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fixtures"))
}

/// Path of a built fixture; builds them when missing so a lone `cargo test` works too.
pub fn fixture(name: &str) -> PathBuf {
    let path = fixtures_dir().join(name);
    if !path.exists() {
        let status = Command::new("make")
            .arg("-s")
            .arg("-C")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"))
            .arg(format!("OUT={}", fixtures_dir().display()))
            .status()
            .expect("make runs");
        assert!(status.success(), "building fixtures failed");
    }
    assert!(path.exists(), "fixture {name} missing after build");
    path
}

pub fn assert_root() {
    // SAFETY: no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "integration tests need root: run `cargo xtask test`");
}

/// The field the harness adds to each collected line: the Unix ns at which
/// it was read from the tracer's output.
pub const READ_AT: &str = "read_at_ns";

fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

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
        let mut child = Command::new(canaryscope())
            .arg("trace")
            .arg("--json")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start canaryscope");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
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
        let err = child.stderr.take().expect("stderr");
        let err_sink = stderr.clone();
        let stderr_reader = thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[canaryscope] {line}");
                let mut s = err_sink.lock().expect("lock");
                s.push_str(&line);
                s.push('\n');
            }
        });
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

pub fn cgroup2_root() -> PathBuf {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            left.split_whitespace().nth(4).map(PathBuf::from)
        })
        .expect("a cgroup2 mount")
}

/// How the kubelet's cgroup driver and the container runtime name a
/// container's cgroup (see observer/src/attribution/cgroup_path.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// systemd driver, containerd: `.../kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope`.
    SystemdContainerd,
    /// systemd driver, CRI-O: `.../kubepods-burstable-pod<uid_>.slice/crio-<id>.scope`.
    SystemdCrio,
    /// cgroupfs driver, containerd: `/kubepods/burstable/pod<uid>/<id>`.
    CgroupfsContainerd,
    /// cgroupfs driver, CRI-O: `/kubepods/burstable/pod<uid>/crio-<id>`.
    CgroupfsCrio,
}

impl Layout {
    /// The directories from the cgroup2 root down to the container's.
    fn parts(self, pod_uid: &str, container_id: &str) -> Vec<String> {
        let systemd_uid = pod_uid.replace('-', "_");
        let systemd_pod = [
            "kubepods.slice".to_string(),
            "kubepods-burstable.slice".to_string(),
            format!("kubepods-burstable-pod{systemd_uid}.slice"),
        ];
        let cgroupfs_pod = ["kubepods".to_string(), "burstable".to_string(), format!("pod{pod_uid}")];
        let (pod, container) = match self {
            Self::SystemdContainerd => (systemd_pod, format!("cri-containerd-{container_id}.scope")),
            Self::SystemdCrio => (systemd_pod, format!("crio-{container_id}.scope")),
            Self::CgroupfsContainerd => (cgroupfs_pod, container_id.to_string()),
            Self::CgroupfsCrio => (cgroupfs_pod, format!("crio-{container_id}")),
        };
        pod.into_iter().chain([container]).collect()
    }

    /// The `containerID` the kubelet reports for this runtime.
    pub fn container_id_uri(self, container_id: &str) -> String {
        match self {
            Self::SystemdContainerd | Self::CgroupfsContainerd => format!("containerd://{container_id}"),
            Self::SystemdCrio | Self::CgroupfsCrio => format!("cri-o://{container_id}"),
        }
    }
}

/// A cgroup2 directory shaped like a kubelet + container runtime container
/// (systemd driver and containerd unless told otherwise), removed on drop.
/// Directories above it that another `PodCgroup` made stay theirs: a pod's
/// second container must be dropped before its first.
pub struct PodCgroup {
    /// Path below the cgroup2 root, as canaryscope reports it.
    pub rel: String,
    pub dir: PathBuf,
    layout: Layout,
    pod_uid: String,
    container_id: String,
    created: Vec<PathBuf>,
    v1_dirs: Vec<PathBuf>,
    created_v1: Vec<PathBuf>,
}

impl PodCgroup {
    pub fn new(pod_uid: &str, container_id: &str) -> Self {
        Self::with_layout(Layout::SystemdContainerd, pod_uid, container_id)
    }

    /// The container's cgroup as `layout` names it.
    pub fn with_layout(layout: Layout, pod_uid: &str, container_id: &str) -> Self {
        let parts = layout.parts(pod_uid, container_id);
        let mut dir = cgroup2_root();
        let mut created = Vec::new();
        for p in &parts {
            dir.push(p);
            match fs::create_dir(&dir) {
                Ok(()) => created.push(dir.clone()),
                // A parent another test pod made (concurrently) stays theirs.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => panic!("mkdir {}: {e}", dir.display()),
            }
        }
        Self {
            rel: format!("/{}", parts.join("/")),
            dir,
            layout,
            pod_uid: pod_uid.to_string(),
            container_id: container_id.to_string(),
            created,
            v1_dirs: Vec::new(),
            created_v1: Vec::new(),
        }
    }

    /// The container's cgroup id (what the kernel side keys by).
    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.dir).expect("cgroup").ino()
    }

    /// The kubelet's restart of this container: its cgroup is removed (its
    /// processes must have exited) and the new container's is made in the
    /// same pod, whose cgroup stays. The directories above pass to the new
    /// one, which removes them on drop.
    pub fn restarted(mut self, container_id: &str) -> Self {
        assert_eq!(self.created.last(), Some(&self.dir), "a container's cgroup made here");
        self.created.pop();
        remove_dir_waiting(&self.dir);
        assert!(!self.dir.exists(), "{} still there: its processes have not left", self.dir.display());
        let parts = self.layout.parts(&self.pod_uid, container_id);
        let name = parts.last().expect("a container's directory");
        let dir = self.dir.parent().expect("the pod's cgroup").join(name);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let mut created = std::mem::take(&mut self.created);
        created.push(dir.clone());
        Self {
            rel: format!("/{}", parts.join("/")),
            dir,
            layout: self.layout,
            pod_uid: self.pod_uid.clone(),
            container_id: container_id.to_string(),
            created,
            v1_dirs: Vec::new(),
            created_v1: Vec::new(),
        }
    }

    /// The container's full ID, as its runtime made it.
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// The 12-character container id the exporter labels series with.
    pub fn short_container_id(&self) -> String {
        self.container_id.chars().take(12).collect()
    }

    /// A command whose process joins this cgroup (and its v1 limit
    /// cgroups on hybrid hosts) before it execs.
    pub fn command(&self, program: &Path) -> Command {
        let mut files = vec![self.dir.join("cgroup.procs")];
        files.extend(self.v1_dirs.iter().map(|d| d.join("tasks")));
        let mut cmd = Command::new(program);
        // SAFETY: the closure only writes to files, which is fine for a test
        // child between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                for f in &files {
                    fs::write(f, b"0")?;
                }
                Ok(())
            });
        }
        cmd
    }

    /// Pure cgroup v2 hosts (the VM) put limits in the same directory;
    /// hybrid hosts in a v1 controller directory at
    /// the same relative path, as kubelet does.
    fn v1_dir(&mut self, controller: &str) -> Option<PathBuf> {
        let v2_has = fs::read_to_string(cgroup2_root().join("cgroup.controllers"))
            .map(|c| c.split_whitespace().any(|x| x == controller))
            .unwrap_or(false);
        if v2_has {
            // Enable the controller for children along the path.
            let mut dir = cgroup2_root();
            for part in self.rel.trim_start_matches('/').split('/') {
                let _ = fs::write(dir.join("cgroup.subtree_control"), format!("+{controller}"));
                dir.push(part);
            }
            return None;
        }
        let mut dir = PathBuf::from("/sys/fs/cgroup").join(controller);
        for part in self.rel.trim_start_matches('/').split('/') {
            dir.push(part);
            if !dir.exists() {
                fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
                self.created_v1.push(dir.clone());
            }
        }
        self.v1_dirs.push(dir.clone());
        Some(dir)
    }

    pub fn limit_cpu(&mut self, cores: f64) {
        let period = 100_000u64;
        let quota = (cores * period as f64) as u64;
        match self.v1_dir("cpu") {
            Some(d) => {
                fs::write(d.join("cpu.cfs_period_us"), period.to_string()).expect("cfs_period_us");
                fs::write(d.join("cpu.cfs_quota_us"), quota.to_string()).expect("cfs_quota_us");
            }
            None => fs::write(self.dir.join("cpu.max"), format!("{quota} {period}")).expect("cpu.max"),
        }
    }

    pub fn limit_memory(&mut self, bytes: u64) {
        match self.v1_dir("memory") {
            Some(d) => {
                fs::write(d.join("memory.limit_in_bytes"), bytes.to_string()).expect("limit_in_bytes");
                let _ = fs::write(d.join("memory.memsw.limit_in_bytes"), bytes.to_string());
            }
            None => {
                fs::write(self.dir.join("memory.max"), bytes.to_string()).expect("memory.max");
                let _ = fs::write(self.dir.join("memory.swap.max"), "0");
            }
        }
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        for dir in self.created.iter().rev().chain(self.created_v1.iter().rev()) {
            remove_dir_waiting(dir);
        }
    }
}

/// Removes an empty cgroup directory, giving the processes that exited
/// in it a second to leave.
fn remove_dir_waiting(dir: &Path) {
    for _ in 0..50 {
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A cgroup outside the kubepods hierarchy, as a system service's; removed
/// on drop.
pub struct SystemCgroup {
    pub rel: String,
    pub dir: PathBuf,
}

impl SystemCgroup {
    pub fn new() -> Self {
        let rel = format!("/canaryscope-test-{}.slice", random_hex(8));
        let dir = cgroup2_root().join(&rel[1..]);
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Self { rel, dir }
    }

    /// The cgroup id (what the kernel side keys by).
    pub fn id(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(&self.dir).expect("cgroup").ino()
    }

    /// A command whose process joins this cgroup before it execs.
    pub fn command(&self, program: &Path) -> Command {
        command_in(&self.dir, program)
    }
}

/// A command whose process joins the cgroup2 directory `dir` before it execs.
pub fn command_in(dir: &Path, program: &Path) -> Command {
    let procs = dir.join("cgroup.procs");
    let mut cmd = Command::new(program);
    // SAFETY: only a file write between fork and exec.
    unsafe { cmd.pre_exec(move || fs::write(&procs, b"0")) };
    cmd
}

impl Drop for SystemCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

pub fn random_hex(len: usize) -> String {
    let mut bytes = vec![0u8; len.div_ceil(2)];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .expect("urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()[..len].to_string()
}

pub fn random_pod_uid() -> String {
    let h = random_hex(32);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

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
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[canaryscope run] {line}");
                let mut s = sink.lock().expect("lock");
                s.push_str(&line);
                s.push('\n');
            }
        });
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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.to_ascii_lowercase().contains("chunked")
    });
    Some((code, if chunked { dechunk(body) } else { body.to_string() }))
}

/// The body of a chunked HTTP/1.1 answer (a large Prometheus answer is one).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else { break };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// The value of a metric line (`name{labels} value`).
pub fn metric_value(line: &str) -> f64 {
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// The `pid=N` a fixture program prints about itself.
pub fn out_pid(stdout: &[u8]) -> u64 {
    let text = String::from_utf8_lossy(stdout);
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("pid=")?.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {text}"))
}

/// The pid a fixture or script prints after the word `child`.
pub fn child_pid(text: &str) -> u64 {
    text.split_whitespace()
        .skip_while(|w| *w != "child")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no child pid in {text}"))
}

/// What a uprobe writes over the first byte of a probed instruction.
pub const BREAKPOINT: u8 = 0xcc;

/// A fixture process driven phase by phase (`--pause-before`).
pub struct Stepped {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Stepped {
    pub fn spawn(mut command: Command) -> Self {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("spawn fixture");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Self { child, stdin, lines, seen: Vec::new() }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line starting with `prefix` (the ones before it are kept).
    pub fn wait_line(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(_) => panic!("no line starting {prefix:?}; output so far: {:?}", self.seen),
            }
        }
    }

    /// Lets the process run its next phase.
    pub fn go(&mut self) {
        let stdin = self.stdin.as_mut().expect("stdin");
        stdin.write_all(b"\n").and_then(|_| stdin.flush()).expect("resume the fixture");
    }

    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait")
    }
}

impl Drop for Stepped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `name=value` out of a fixture's line.
pub fn field(line: &str, name: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line}"))
        .to_string()
}

/// The first byte of `symbol` in the file whose name starts with `library`, as process
/// `pid` has it in memory now, and as the file has it on disk.
pub fn entry_bytes(pid: u32, library: &str, symbol: &str) -> (u8, u8) {
    use object::{Object, ObjectSegment, ObjectSymbol};
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let (base, path) = maps
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = *f.get(5)?;
            let name = path.rsplit('/').next()?;
            if !name.starts_with(library) || u64::from_str_radix(f[2], 16).ok()? != 0 {
                return None;
            }
            Some((u64::from_str_radix(f[0].split('-').next()?, 16).ok()?, path.to_string()))
        })
        .unwrap_or_else(|| panic!("pid {pid} does not map {library}"));
    let data = std::fs::read(&path).expect("read the library");
    let file = object::File::parse(&*data).expect("ELF");
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok(symbol) && s.is_definition())
        .unwrap_or_else(|| panic!("{symbol} not in {path}"));
    // Shared objects built here load their first segment at address 0, so a
    // symbol's address is its offset from the mapping at file offset 0.
    let first_segment = ObjectSegment::address(&file.segments().next().expect("a segment"));
    assert_eq!(first_segment, 0, "{path}: first segment not at 0");
    let on_disk = {
        use object::ObjectSection;
        let section = file.section_by_index(sym.section_index().expect("section")).expect("section");
        let (offset, _) = section.file_range().expect("file range");
        data[(offset + sym.address() - section.address()) as usize]
    };
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("open /proc/PID/mem");
    mem.seek(SeekFrom::Start(base + sym.address())).expect("seek");
    let mut byte = [0u8; 1];
    mem.read_exact(&mut byte).expect("read process memory");
    (byte[0], on_disk)
}

/// Polls until process `pid`'s `cuLaunchKernel` is (or is not) trapped.
pub fn wait_trapped(pid: u32, trapped: bool, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (byte, _) = entry_bytes(pid, "libcuda.so.1", "cuLaunchKernel");
        if (byte == BREAKPOINT) == trapped {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "pid {pid}: cuLaunchKernel {} within {within:?} (first byte {byte:#x})",
            if trapped { "not trapped" } else { "still trapped" }
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a shell in `cg` that SIGKILLs itself; returns its pid. Its exit is
/// recorded after everything the cgroup did before (see `Tracer::barrier`).
pub fn self_killing_marker(cg: &PodCgroup) -> u64 {
    let out =
        cg.command(Path::new("/bin/sh")).args(["-c", "echo pid=$$; kill -KILL $$"]).output().expect("sh");
    out_pid(&out.stdout)
}
