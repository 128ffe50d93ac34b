//! Recorded series for the judge's tests: samples written as OpenMetrics,
//! made into blocks by `promtool tsdb create-blocks-from openmetrics`,
//! served by a real Prometheus for `canaryscope judge` ([`crate::judge`]) to ask.
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::{free_port, http_request, k8s::Proc};

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
        Self::from_openmetrics(name, &openmetrics(recs))
    }

    /// As [`Blocks::new`], over series already written as OpenMetrics.
    pub fn from_openmetrics(name: &str, text: &str) -> Self {
        static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("canaryscope-{name}-{}-{run}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("scratch dir");
        let prometheus = start_prometheus(&dir, text);
        Blocks { port: prometheus.1, _prometheus: prometheus.0, dir }
    }
}

fn start_prometheus(dir: &Path, openmetrics: &str) -> (Proc, u16) {
    let input = dir.join("recorded.om");
    fs::write(&input, openmetrics).expect("openmetrics");
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
    while http_request(port, "GET", "/api/v1/query?query=vector(1)", "").is_none_or(|(c, _)| c != 200) {
        assert!(Instant::now() < deadline, "Prometheus did not start over the recorded blocks");
        thread::sleep(Duration::from_millis(100));
    }
    (prometheus, port)
}
