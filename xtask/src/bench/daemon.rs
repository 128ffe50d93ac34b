//! `canaryscope run` as the cases start it, and its Prometheus exporter.
//!
//! The cases read what the daemon saw from /metrics, the same text a
//! scraper gets, so a detection counts only once a user could see it.
use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};

use super::{
    process::{Proc, SIGTERM},
    Env,
};

pub(super) struct Daemon {
    proc: Proc,
    pub(super) addr: String,
}

impl Daemon {
    pub(super) fn start(env: &Env, name: &str, extra: &[&str]) -> Result<Daemon> {
        let port = free_port()?;
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(&env.bin);
        cmd.args(["run", "--listen", &addr, "--no-kubernetes"]).args(extra);
        let mut proc = Proc::spawn(env, name, &mut cmd, SIGTERM, Duration::from_secs(60))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = proc.exited() {
                bail!("canaryscope run exited during start-up ({s}); {}", proc.log_tail());
            }
            if let Ok((200, _)) = http_get(&addr, "/readyz") {
                break;
            }
            if Instant::now() >= deadline {
                bail!("canaryscope run not ready on http://{addr}/readyz after 60 s; {}", proc.log_tail());
            }
            sleep(Duration::from_millis(20));
        }
        Ok(Daemon { proc, addr })
    }

    pub(super) fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// What it printed so far.
    pub(super) fn output(&self) -> String {
        self.proc.output()
    }

    pub(super) fn metrics(&self) -> Result<String> {
        match http_get(&self.addr, "/metrics")? {
            (200, body) => Ok(body),
            (code, _) => bail!("/metrics answered {code}"),
        }
    }

    /// Polls /metrics until `pred` holds for the sum of `name` (filtered by
    /// labels); returns the sum seen last.
    pub(super) fn wait_metric(
        &self,
        name: &str,
        labels: &[(&str, &str)],
        timeout: Duration,
        pred: impl Fn(f64) -> bool,
    ) -> f64 {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.metrics().map(|t| metric_sum(&t, name, labels)).unwrap_or(0.0);
            if pred(v) || Instant::now() >= deadline {
                return v;
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM and wait (detaching the uprobes takes seconds); returns how long.
    pub(super) fn stop(mut self) -> Duration {
        let (took, killed) = self.proc.stop();
        if killed {
            eprintln!("    canaryscope had to be killed; {}", self.proc.log_tail());
        }
        took
    }
}

pub(super) fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("cannot bind a local port")?;
    Ok(l.local_addr()?.port())
}

/// One GET as Prometheus sends it (gzip accepted): the compressed
/// body's size. What a scrape costs the daemon, without decoding it here.
pub(super) fn scrape_gzip(addr: &str) -> Result<usize> {
    let buf = request(addr, "/metrics", "Accept-Encoding: gzip\r\n")?;
    let head_end =
        buf.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| anyhow!("malformed HTTP answer"))?;
    let head = String::from_utf8_lossy(&buf[..head_end]);
    if !head.starts_with("HTTP/1.1 200") || !head.to_ascii_lowercase().contains("content-encoding: gzip") {
        bail!("/metrics with gzip accepted answered {head:?}");
    }
    Ok(buf.len() - head_end - 4)
}

fn request(addr: &str, path: &str, extra_headers: &str) -> Result<Vec<u8>> {
    let sock = addr.parse().with_context(|| format!("bad address {addr}"))?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{extra_headers}Connection: close\r\n\r\n")?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    Ok(buf)
}

fn http_get(addr: &str, path: &str) -> Result<(u16, String)> {
    let buf = request(addr, path, "")?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| anyhow!("malformed HTTP answer"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("no HTTP status in {head:?}"))?;
    Ok((code, body.to_string()))
}

/// Sum of every sample of `name` whose labels include all of `labels`.
pub(super) fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter(|l| labels.iter().all(|(k, v)| l.contains(&format!("{k}=\"{v}\""))))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
