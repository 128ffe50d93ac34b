//! What the integration tests of canaryscope share: the binary and its
//! fixtures, a tracer child process ([`tracer`]), real cgroups laid out as
//! kubelet and containerd do ([`cgroups`]), the exporter ([`daemon`]), plain
//! HTTP ([`http`]), fixture processes stepped through their probes
//! ([`ptrace`]), a stand-in Kubernetes API server ([`k8s`]) and the
//! readiness gate's condition it holds ([`gate`]), recorded
//! series served by a real Prometheus ([`recorded`]), and the judge run
//! and asked over it ([`judge`]). A test file imports what it uses.
pub mod cgroups;
pub mod daemon;
pub mod dashboard;
pub mod gate;
pub mod http;
pub mod judge;
pub mod k8s;
pub mod ptrace;
pub mod recorded;
pub mod shape;
pub mod tracer;

pub use cgroups::*;
pub use daemon::*;
pub use http::*;
pub use ptrace::*;
pub use tracer::*;

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::{Arc, Mutex},
    thread::{self, JoinHandle},
    time::Duration,
};

/// The binary under test; CANARYSCOPE_BIN points at a copy (the VM runs
/// one so that a rebuild on the host cannot change it mid-run).
pub fn canaryscope() -> PathBuf {
    std::env::var_os("CANARYSCOPE_BIN").map(PathBuf::from).unwrap_or_else(beside_the_test)
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

/// Echoes each line `child` writes to stderr on the test's own, after
/// `prefix`, and keeps it in the returned text, for waits on it and for
/// the message of a test that fails; the thread ends at end of file.
pub(crate) fn collect_stderr(
    child: &mut Child,
    prefix: &'static str,
) -> (Arc<Mutex<String>>, JoinHandle<()>) {
    let stderr = Arc::new(Mutex::new(String::new()));
    let err = child.stderr.take().expect("stderr");
    let sink = stderr.clone();
    let reader = thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[{prefix}] {line}");
            let mut s = sink.lock().expect("lock");
            s.push_str(&line);
            s.push('\n');
        }
    });
    (stderr, reader)
}

/// How long a tracer or daemon may take to load and attach its probes.
pub(crate) fn startup_timeout() -> Duration {
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

pub(crate) fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// `canaryscope` beside the test binary's own directory (`target/release/deps/..`),
/// where cargo builds it for the tests of the same build.
fn beside_the_test() -> PathBuf {
    let test = std::env::current_exe().expect("the test binary's path");
    let deps = test.parent().expect("the test binary's directory");
    deps.parent().unwrap_or(deps).join("canaryscope")
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
