//! Recorded series for the judge's tests: samples written as OpenMetrics,
//! made into blocks by `promtool tsdb create-blocks-from openmetrics`,
//! served by a real Prometheus, and `canaryscope judge` asking it.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{canaryscope, free_port, k8s::Proc};

/// One recorded series: its family (as `# TYPE` names it, with its type),
/// the sample's name, its labels and its samples `(Unix seconds, value)`.
pub struct Rec {
    pub family: &'static str,
    pub kind: &'static str,
    pub name: String,
    pub labels: String,
    pub samples: Vec<(i64, f64)>,
}

/// OpenMetrics text of `recs`, each family's series together.
pub fn openmetrics(recs: &[Rec]) -> String {
    let mut by_family: BTreeMap<(&str, &str), Vec<&Rec>> = BTreeMap::new();
    for r in recs {
        by_family.entry((r.family, r.kind)).or_default().push(r);
    }
    let mut text = String::new();
    for ((family, kind), recs) in by_family {
        let _ = writeln!(text, "# TYPE {family} {kind}");
        for r in recs {
            for (t, value) in &r.samples {
                let _ = writeln!(text, "{}{{{}}} {value} {t}", r.name, r.labels);
            }
        }
    }
    text.push_str("# EOF\n");
    text
}

/// A real Prometheus over blocks made from recorded series, stopped and
/// its files removed when dropped.
pub struct Blocks {
    pub port: u16,
    _prometheus: Proc,
    dir: PathBuf,
}

impl Drop for Blocks {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Blocks {
    pub fn new(name: &str, recs: &[Rec]) -> Self {
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("canaryscope-{name}-{}-{run}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        let prometheus = start_prometheus(&dir, recs);
        Blocks { port: prometheus.1, _prometheus: prometheus.0, dir }
    }
}

fn start_prometheus(dir: &Path, recs: &[Rec]) -> (Proc, u16) {
    let input = dir.join("recorded.om");
    fs::write(&input, openmetrics(recs)).expect("openmetrics");
    let tsdb = dir.join("tsdb");
    let out = Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&input)
        .arg(&tsdb)
        .output()
        .expect("promtool (Debian's prometheus package)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let port = free_port();
    let config = dir.join("prometheus.yml");
    fs::write(&config, "global:\n  scrape_interval: 15s\n").expect("config");
    let prometheus = Proc(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", tsdb.display()))
            .arg("--storage.tsdb.retention.time=100y")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while http(port, "GET", "/api/v1/query?query=vector(1)", "").is_none_or(|(c, _)| c != 200) {
        assert!(Instant::now() < deadline, "Prometheus did not start over the recorded blocks");
        thread::sleep(Duration::from_millis(100));
    }
    (prometheus, port)
}

/// `canaryscope judge` on a free port, asking the Prometheus on `prom_port`.
pub fn start_judge(prom_port: u16, extra: &[&str]) -> (Proc, u16) {
    let port = free_port();
    let judge = Proc(
        Command::new(canaryscope())
            .args(["judge", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--prometheus", &format!("http://127.0.0.1:{prom_port}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("canaryscope judge"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while http(port, "GET", "/healthz", "").is_none_or(|(c, _)| c != 200) {
        assert!(Instant::now() < deadline, "the judge never answered /healthz");
        thread::sleep(Duration::from_millis(50));
    }
    (judge, port)
}

/// (status, body) of one HTTP/1.0 request.
pub fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let head = format!("{method} {path} HTTP/1.0\r\nHost: t\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body.as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let code = answer.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}
