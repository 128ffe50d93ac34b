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
pub enum Body {
    /// As held, for a client that takes gzip (Prometheus).
    Gzip(Bytes),
    /// Text held whole.
    Text(Bytes),
    /// The held gzip, unpacked a piece at a time as it is sent: at a
    /// thousand pods the text is 20 MB, which a `curl` must not make the
    /// daemon hold.
    Unpacked(Bytes),
}

/// Text unpacked per piece sent to a client that takes no gzip.
const UNPACKED_PIECE: usize = 64 * 1024;

/// The text of a gzip member, in pieces of at most `UNPACKED_PIECE`; it
/// ends early, logged, if the member is damaged (the daemon's own bytes:
/// a bug).
fn unpacked(gzip: Bytes) -> impl Iterator<Item = Bytes> + Send + Sync {
    use std::io::Read;
    let mut reader = flate2::read::GzDecoder::new(bytes::Buf::reader(gzip));
    std::iter::from_fn(move || {
        let mut piece = vec![0u8; UNPACKED_PIECE];
        let mut filled = 0;
        while filled < piece.len() {
            match reader.read(&mut piece[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::warn!("the held exposition does not unpack: {e}");
                    break;
                }
            }
        }
        piece.truncate(filled);
        (filled > 0).then(|| Bytes::from(piece))
    })
}

/// The length of a gzip member's text, from its trailer (`ISIZE`, the
/// length modulo 2^32; an exposition is far below that).
fn unpacked_length(gzip: &[u8]) -> Option<u64> {
    // A member has a 10-byte header and an 8-byte trailer at least.
    let trailer: [u8; 4] = gzip.get(gzip.len().checked_sub(4)?..)?.try_into().ok()?;
    (gzip.len() >= 18).then(|| u64::from(u32::from_le_bytes(trailer)))
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
        if self.gzip.is_empty() {
            // The compressor failed (a bug): render the text instead.
            return Body::Text(self.metrics.render(View::Scrape, 0).into());
        }
        if accepts_gzip {
            Body::Gzip(self.gzip.clone())
        } else {
            Body::Unpacked(self.gzip.clone())
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
            Body::Text(published.per_pod())
        } else {
            published.scrape(gzip)
        }
    })
    .await;
    match rendered {
        Ok(Body::Gzip(bytes)) => {
            let mut exposition = answer(StatusCode::OK, EXPOSITION, bytes);
            exposition.headers_mut().insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            exposition
        }
        Ok(Body::Text(bytes)) => answer(StatusCode::OK, EXPOSITION, bytes),
        Ok(Body::Unpacked(gzip)) => {
            let length = unpacked_length(&gzip);
            server::answer_in_pieces(StatusCode::OK, EXPOSITION, unpacked(gzip), length)
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
        let Body::Gzip(gzip) = published.scrape(true) else { panic!("gzip asked for, not given") };
        assert!(gzip.len() < text.len());
        let mut whole = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gzip[..]), &mut whole)
            .expect("valid gzip");
        assert_eq!(whole, text);
        let Body::Unpacked(held) = published.scrape(false) else { panic!("plain text not unpacked") };
        let pieces: Vec<Bytes> = unpacked(held.clone()).collect();
        assert_eq!(pieces.concat(), text);
        assert_eq!(unpacked_length(&held), Some(text.len() as u64));
        // Unchanged: the same bytes, not rendered again.
        let Body::Gzip(again) = published.scrape(true) else { panic!("gzip asked for, not given") };
        assert_eq!(again, gzip);
    }

    #[test]
    fn a_large_text_is_unpacked_in_bounded_pieces() {
        // Text of several pieces that compresses well, as an exposition does.
        let text: Vec<u8> =
            (0..40_000).flat_map(|i| format!("canaryscope_x{{pod=\"p{i}\"}} {i}\n").into_bytes()).collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &text).expect("compress");
        let gzip = Bytes::from(gz.finish().expect("compress"));
        let pieces: Vec<Bytes> = unpacked(gzip.clone()).collect();
        assert!(pieces.len() > 10, "{} pieces", pieces.len());
        assert!(pieces.iter().all(|p| p.len() <= UNPACKED_PIECE));
        assert_eq!(pieces.concat(), text);
        assert_eq!(unpacked_length(&gzip), Some(text.len() as u64));
        // A damaged member ends the text early instead of panicking.
        let mut damaged = gzip.to_vec();
        let middle = damaged.len() / 2;
        damaged[middle..].fill(0xff);
        assert!(unpacked(Bytes::from(damaged)).map(|p| p.len()).sum::<usize>() < text.len());
        assert_eq!(unpacked_length(b"short"), None);
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
