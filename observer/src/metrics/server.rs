//! The exporter's HTTP endpoint: `/metrics`, `/metrics/pods`, `/healthz`,
//! `/readyz`. A small
//! HTTP/1.1 responder is enough for Prometheus and kubelet probes and keeps
//! the daemon free of a web framework; every response closes the connection.
use std::{
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use log::debug;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

use super::{catalog::View, Metrics};

/// Readiness as the daemon loop last judged it.
#[derive(Default)]
pub struct Readiness {
    /// `None` when ready, else why not.
    pub not_ready: Option<String>,
}

pub type Shared = Arc<RwLock<Readiness>>;

/// The series, and their text as of the last scrape that found them
/// changed. Rendering happens on a scrape and only after a change: a node
/// with a thousand pods and execs every second (each one counted) renders
/// once per scrape, not once per event batch, and a quiet node's scrapes
/// return the same bytes without rendering.
pub struct Published {
    pub metrics: Metrics,
    /// Shared, not copied, by every scrape in flight: at a thousand pods
    /// the text is megabytes.
    text: bytes::Bytes,
}

impl Published {
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics, text: bytes::Bytes::new() }
    }

    /// The exposition, rendered anew only if a series changed since the
    /// last scrape.
    pub fn scrape(&mut self) -> bytes::Bytes {
        if self.metrics.take_changed() {
            // Sized from the last one, so the buffer is allocated once
            // rather than doubled up to twice the text's size; the last one
            // is let go first (responses still sending it hold their own
            // reference), so two texts are not alive at once.
            let size_hint = self.text.len();
            self.text = bytes::Bytes::new();
            self.text = self.metrics.render(View::Scrape, size_hint).into();
        }
        self.text.clone()
    }

    /// Every family per pod, for `top --from` and people: rendered on each
    /// request and not kept, since Prometheus does not scrape it.
    pub fn per_pod(&self) -> bytes::Bytes {
        self.metrics.render(View::PerPod, self.text.len()).into()
    }
}

pub type SharedMetrics = Arc<Mutex<Published>>;

/// Where the per-pod view is served (`top --from` reads it).
pub const PER_POD_PATH: &str = "/metrics/pods";

pub async fn serve(listener: TcpListener, shared: Shared, metrics: SharedMetrics) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let shared = shared.clone();
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    if let Err(e) = respond(stream, &shared, &metrics).await {
                        debug!("http {peer}: {e}");
                    }
                });
            }
            // Out of file descriptors or similar: back off instead of spinning.
            Err(e) => {
                debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Reads the request head (bounded in size and time) and returns the path.
async fn read_path(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let read = async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    match tokio::time::timeout(Duration::from_secs(5), read).await {
        Ok(r) => r?,
        Err(_) => return Ok(None),
    }
    let head = String::from_utf8_lossy(&buf);
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    if method != "GET" && method != "HEAD" {
        return Ok(Some(String::new()));
    }
    Ok(Some(target.split('?').next().unwrap_or("").to_string()))
}

async fn respond(mut stream: TcpStream, shared: &Shared, metrics: &SharedMetrics) -> std::io::Result<()> {
    let Some(path) = read_path(&mut stream).await? else { return Ok(()) };
    if path == "/metrics" || path == PER_POD_PATH {
        // A render of a thousand pods takes tens of milliseconds: off the
        // runtime's worker, under the lock the daemon loop counts under.
        let metrics = metrics.clone();
        let body = tokio::task::spawn_blocking(move || {
            let mut published = metrics.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if path == PER_POD_PATH {
                published.per_pod()
            } else {
                published.scrape()
            }
        })
        .await
        .map_err(std::io::Error::other)?;
        return send(stream, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body).await;
    }
    let (status, content_type, body) = {
        let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        match path.as_str() {
            "/healthz" => ("200 OK", "text/plain", bytes::Bytes::from_static(b"ok\n")),
            "/readyz" => match &state.not_ready {
                None => ("200 OK", "text/plain", bytes::Bytes::from_static(b"ready\n")),
                Some(why) => ("503 Service Unavailable", "text/plain", format!("not ready: {why}\n").into()),
            },
            "" => ("405 Method Not Allowed", "text/plain", bytes::Bytes::from_static(b"only GET\n")),
            _ => (
                "404 Not Found",
                "text/plain",
                bytes::Bytes::from_static(b"try /metrics, /metrics/pods, /healthz or /readyz\n"),
            ),
        }
    };
    send(stream, status, content_type, body).await
}

async fn send(
    mut stream: TcpStream,
    status: &str,
    content_type: &str,
    body: bytes::Bytes,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await
}
