//! The exporter's HTTP endpoint: `/metrics`, `/metrics/pods`, `/healthz`,
//! `/readyz`, on hyper within `LIMITS` (see `web::server`), so that a slow
//! or hostile client cannot keep Prometheus or the kubelet's probes out.
use std::{
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

use bytes::Bytes;
use http::{
    header::{ACCEPT_ENCODING, CONTENT_ENCODING},
    HeaderMap, HeaderValue, Method, Request, StatusCode,
};
use tokio::net::TcpListener;

use super::{catalog::View, Metrics};
use crate::web::server::{self, answer, Answer, Limits};

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

/// What one client may take of the exporter. Prometheus, the kubelet's
/// probes and a few people's `top --from` need a handful of connections,
/// and each sends a head of a few hundred bytes at once and no body.
const LIMITS: Limits = Limits {
    connections: 128,
    head_timeout: Duration::from_secs(5),
    head_bytes: 16 * 1024,
    body_timeout: Duration::from_secs(5),
    body_bytes: 1024,
    // The per-pod view of a thousand pods is 20 MB.
    write_timeout: Duration::from_secs(30),
};

pub async fn serve(listener: TcpListener, shared: Shared, metrics: SharedMetrics) {
    server::serve(listener, LIMITS, move |request| respond(request, shared.clone(), metrics.clone())).await;
}

/// Whether the client takes gzip (`Accept-Encoding: gzip`, any q).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get_all(ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).any(|value| {
        value
            .split(',')
            .any(|coding| coding.split(';').next().is_some_and(|c| c.trim().eq_ignore_ascii_case("gzip")))
    })
}

async fn respond(request: Request<Bytes>, shared: Shared, metrics: SharedMetrics) -> Answer {
    const TEXT: &str = "text/plain";
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        return answer(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n");
    }
    let path = request.uri().path();
    if path == "/metrics" || path == PER_POD_PATH {
        return exposition(path == PER_POD_PATH, accepts_gzip(request.headers()), metrics).await;
    }
    let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    match path {
        "/healthz" => answer(StatusCode::OK, TEXT, "ok\n"),
        "/readyz" => match &state.not_ready {
            None => answer(StatusCode::OK, TEXT, "ready\n"),
            Some(why) => answer(StatusCode::SERVICE_UNAVAILABLE, TEXT, format!("not ready: {why}\n")),
        },
        _ => answer(StatusCode::NOT_FOUND, TEXT, "try /metrics, /metrics/pods, /healthz or /readyz\n"),
    }
}

/// The scrape, or the per-pod view.
async fn exposition(per_pod: bool, gzip: bool, metrics: SharedMetrics) -> Answer {
    // A render of a thousand pods takes tens of milliseconds: off the
    // runtime's worker, under the lock the daemon loop counts under.
    let rendered = tokio::task::spawn_blocking(move || {
        let mut published = metrics.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if per_pod {
            Body { bytes: published.per_pod(), gzip: false }
        } else {
            published.scrape(gzip)
        }
    })
    .await;
    match rendered {
        Ok(body) => {
            let mut exposition = answer(StatusCode::OK, EXPOSITION, body.bytes);
            if body.gzip {
                exposition.headers_mut().insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            }
            exposition
        }
        Err(e) => answer(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("rendering failed: {e}\n")),
    }
}

const EXPOSITION: &str = "text/plain; version=0.0.4; charset=utf-8";

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

    #[test]
    fn accept_encoding_is_read_from_the_request_head() {
        for (values, want) in [
            (&["gzip"][..], true),
            (&["identity, gzip;q=0.5"][..], true),
            (&["identity", "GZIP"][..], true),
            (&["gzipx"][..], false),
            (&[][..], false),
        ] {
            let mut headers = HeaderMap::new();
            for v in values {
                headers.append(ACCEPT_ENCODING, HeaderValue::from_static(v));
            }
            assert_eq!(accepts_gzip(&headers), want, "{values:?}");
        }
    }
}
