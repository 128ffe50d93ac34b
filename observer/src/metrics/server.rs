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

/// The series, and their exposition as of the last scrape that found them
/// changed. Rendering happens on a scrape and only after a change: a node
/// with a thousand pods and execs every second (each one counted) renders
/// once per scrape, not once per event batch, and a quiet node's scrapes
/// return the same bytes without rendering.
pub struct Published {
    pub metrics: Metrics,
    /// The exposition gzip-compressed, as Prometheus asks for it: at a
    /// thousand pods the text is 20 MB and this under 1 MB, which is most
    /// of what the daemon would otherwise hold between scrapes. Shared,
    /// not copied, by every scrape in flight.
    gzip: bytes::Bytes,
}

/// The exposition in the encoding the client asked for.
pub struct Body {
    pub bytes: bytes::Bytes,
    pub gzip: bool,
}

impl Published {
    pub fn new(metrics: Metrics) -> Self {
        Self { metrics, gzip: bytes::Bytes::new() }
    }

    /// The exposition, rendered anew only if a series changed since the
    /// last scrape; as plain text for a client that takes no gzip.
    pub fn scrape(&mut self, accepts_gzip: bool) -> Body {
        if self.metrics.take_changed() || self.gzip.is_empty() {
            // The last one is let go first (responses still sending it hold
            // their own reference), so two are not alive at once.
            self.gzip = bytes::Bytes::new();
            self.gzip = self.metrics.render_gzip(View::Scrape).into();
            // The render's protos and text are megabytes, freed now; give
            // them back rather than keep them for the next render.
            // SAFETY: malloc_trim has no preconditions.
            unsafe { libc::malloc_trim(0) };
        }
        if accepts_gzip {
            return Body { bytes: self.gzip.clone(), gzip: true };
        }
        let mut text = Vec::new();
        match std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&self.gzip[..]), &mut text) {
            Ok(_) => Body { bytes: text.into(), gzip: false },
            // Our own bytes: a failure here is a bug; render the text instead.
            Err(_) => Body { bytes: self.metrics.render(View::Scrape, 0).into(), gzip: false },
        }
    }

    /// Every family per pod, for `top --from` and people: rendered on each
    /// request and not kept, since Prometheus does not scrape it.
    pub fn per_pod(&self) -> bytes::Bytes {
        self.metrics.render(View::PerPod, 0).into()
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

/// What a request asks: the path, and whether the client takes gzip.
struct Asked {
    path: String,
    gzip: bool,
}

/// Reads the request head (bounded in size and time).
async fn read_path(stream: &mut TcpStream) -> std::io::Result<Option<Asked>> {
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
        return Ok(Some(Asked { path: String::new(), gzip: false }));
    }
    let gzip = head.lines().skip(1).any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("accept-encoding")
                && value.split(',').any(|c| c.split(';').next().is_some_and(|c| c.trim() == "gzip"))
        })
    });
    Ok(Some(Asked { path: target.split('?').next().unwrap_or("").to_string(), gzip }))
}

async fn respond(mut stream: TcpStream, shared: &Shared, metrics: &SharedMetrics) -> std::io::Result<()> {
    let Some(Asked { path, gzip }) = read_path(&mut stream).await? else { return Ok(()) };
    if path == "/metrics" || path == PER_POD_PATH {
        // A render of a thousand pods takes tens of milliseconds: off the
        // runtime's worker, under the lock the daemon loop counts under.
        let metrics = metrics.clone();
        let body = tokio::task::spawn_blocking(move || {
            let mut published = metrics.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if path == PER_POD_PATH {
                Body { bytes: published.per_pod(), gzip: false }
            } else {
                published.scrape(gzip)
            }
        })
        .await
        .map_err(std::io::Error::other)?;
        let head = Head { status: "200 OK", content_type: EXPOSITION, gzip: body.gzip };
        return send(stream, head, body.bytes).await;
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
    send(stream, Head { status, content_type, gzip: false }, body).await
}

const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a response's head says.
struct Head<'a> {
    status: &'a str,
    content_type: &'a str,
    gzip: bool,
}

async fn send(mut stream: TcpStream, head: Head<'_>, body: bytes::Bytes) -> std::io::Result<()> {
    let Head { status, content_type, gzip } = head;
    let encoding = if gzip { "Content-Encoding: gzip\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n{encoding}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gzip_held_is_the_text_and_plain_clients_get_the_text() {
        let mut metrics = Metrics::new(10);
        metrics.node.events_lost = 3;
        let text = metrics.render(View::Scrape, 0);
        let mut published = Published::new(metrics);
        let gzip = published.scrape(true);
        assert!(gzip.gzip);
        assert!(gzip.bytes.len() < text.len());
        let mut unpacked = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gzip.bytes[..]), &mut unpacked)
            .expect("valid gzip");
        assert_eq!(unpacked, text);
        let plain = published.scrape(false);
        assert!(!plain.gzip);
        assert_eq!(&plain.bytes[..], &text[..]);
        // Unchanged: the same bytes, not rendered again.
        assert_eq!(published.scrape(true).bytes, gzip.bytes);
    }

    #[tokio::test]
    async fn accept_encoding_is_read_from_the_request_head() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        for (head, want) in [
            ("GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n\r\n", true),
            ("GET /metrics?x=1 HTTP/1.1\r\naccept-encoding: identity, gzip;q=0.5\r\n\r\n", true),
            ("GET /metrics HTTP/1.1\r\nAccept-Encoding: gzipx\r\n\r\n", false),
            ("GET /metrics HTTP/1.0\r\n\r\n", false),
        ] {
            let mut client = TcpStream::connect(addr).await.expect("connect");
            client.write_all(head.as_bytes()).await.expect("write");
            let (mut server, _) = listener.accept().await.expect("accept");
            let asked = read_path(&mut server).await.expect("read").expect("a request");
            assert_eq!((asked.path.as_str(), asked.gzip), ("/metrics", want), "{head:?}");
        }
    }
}
