//! One request per connection, parsed and answered by hyper, within limits
//! that keep a slow or hostile client from taking what scrapes and verdicts
//! need:
//!
//! - **Connections:** at most `connections` at once, far below the default
//!   soft `RLIMIT_NOFILE` of 1,024, so that sockets never take the
//!   descriptors the rest of the process opens. A connection past the cap
//!   closes the one that has waited longest for its request (or for its
//!   answer to be read) and is admitted once that one has closed; only
//!   while every connection is being answered is the newcomer closed
//!   instead. Idle connections by the thousand thus cost a client that
//!   sends its request at once nothing but a slot it takes back.
//! - **The head:** whole within `head_timeout` of the connection and
//!   `head_bytes`; hyper closes a head dribbled byte by byte at the timeout
//!   and answers 431 to a longer one without reading on.
//! - **The body:** within `body_bytes` (a longer declared length is
//!   refused unread) and `body_timeout`.
//! - **The answer:** read by the client within `write_timeout`.
//!
//! Every answer closes its connection, as a probe, a scrape or a webhook
//! expects; nothing waits for a second request.
use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use http::{header::CONTENT_TYPE, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::{body::Body as _, body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use log::debug;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
    sync::Notify,
};

/// What one server allows its clients (see the module's comment).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub connections: usize,
    pub head_timeout: Duration,
    pub head_bytes: usize,
    pub body_timeout: Duration,
    pub body_bytes: usize,
    pub write_timeout: Duration,
}

/// hyper's smallest read buffer; it holds the head, then the body's chunks.
const MIN_BUFFER: usize = 8192;

pub type Answer = Response<AnswerBody>;

/// An answer's body: held whole, or made a piece at a time as the client
/// reads it, so that a large one (an exposition unpacked for a client
/// without gzip) never sits in memory whole.
pub enum AnswerBody {
    Whole(Full<Bytes>),
    Pieces { pieces: Box<dyn Iterator<Item = Bytes> + Send + Sync>, length: Option<u64> },
}

impl hyper::body::Body for AnswerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Self::Whole(full) => std::pin::Pin::new(full).poll_frame(cx),
            Self::Pieces { pieces, .. } => {
                std::task::Poll::Ready(pieces.next().map(|piece| Ok(hyper::body::Frame::data(piece))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Whole(full) => full.is_end_stream(),
            Self::Pieces { .. } => false,
        }
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Self::Whole(full) => full.size_hint(),
            Self::Pieces { length: Some(length), .. } => hyper::body::SizeHint::with_exact(*length),
            Self::Pieces { length: None, .. } => hyper::body::SizeHint::default(),
        }
    }
}

/// An answer of `status` with `body` as `content_type`.
pub fn answer(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Answer {
    with_body(status, content_type, AnswerBody::Whole(Full::new(body.into())))
}

/// An answer of `status` whose body comes in `pieces`; `length`, where
/// known, is their total, sent as the `Content-Length` (chunked otherwise).
pub fn answer_in_pieces(
    status: StatusCode,
    content_type: &'static str,
    pieces: impl Iterator<Item = Bytes> + Send + Sync + 'static,
    length: Option<u64>,
) -> Answer {
    with_body(status, content_type, AnswerBody::Pieces { pieces: Box::new(pieces), length })
}

fn with_body(status: StatusCode, content_type: &'static str, body: AnswerBody) -> Answer {
    let mut answer = Response::new(body);
    *answer.status_mut() = status;
    answer.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    answer
}

/// Accepts connections for ever, each answered by `handler` on a task of
/// its own.
pub async fn serve<H, F>(listener: TcpListener, limits: Limits, handler: H)
where
    H: Fn(Request<Bytes>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let connections = Connections::new(limits.connections);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of file descriptors or similar: back off instead of spinning.
            Err(e) => {
                debug!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        match connections.admit().await {
            Some(slot) => {
                tokio::spawn(answer_connection(stream, slot, limits, handler.clone()));
            }
            None => debug!(
                "http {peer}: closed at once: all {} connections are being answered",
                limits.connections
            ),
        }
    }
}

/// One connection's request and answer, over any byte stream (a test or a
/// fuzz target drives it in memory), until it closes, is closed to make
/// room, or leaves its answer unread past `write_timeout`.
pub async fn answer_connection<IO, H, F>(io: IO, slot: Slot, limits: Limits, handler: H)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(Request<Bytes>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let slot = Arc::new(slot);
    let answered = Arc::new(Notify::new());
    let service = {
        let (slot, answered) = (slot.clone(), answered.clone());
        service_fn(move |request: Request<Incoming>| {
            let (slot, answered, handler) = (slot.clone(), answered.clone(), handler.clone());
            async move {
                let answer = match read_body(request, &limits).await {
                    Ok(request) => {
                        // Being answered: not a connection to close for room.
                        slot.set_waiting(false);
                        handler(request).await
                    }
                    Err(refusal) => refusal.answer(),
                };
                slot.set_waiting(true);
                answered.notify_one();
                Ok::<_, Infallible>(answer)
            }
        })
    };
    let connection = builder(&limits).serve_connection(TokioIo::new(io), service);
    let unread = async {
        answered.notified().await;
        tokio::time::sleep(limits.write_timeout).await;
    };
    tokio::select! {
        done = connection => {
            if let Err(e) = done {
                debug!("http: {e}");
            }
        }
        () = slot.evicted() => debug!("http: closed a waiting connection to make room for a newer one"),
        () = unread => debug!("http: the answer was not read within {:?}", limits.write_timeout),
    }
}

fn builder(limits: &Limits) -> http1::Builder {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_header_size(limits.head_bytes)
        .max_buf_size(limits.head_bytes.max(MIN_BUFFER))
        .keep_alive(false)
        // A client that shuts its side after the request still gets the answer.
        .half_close(true);
    builder
}

/// Why a request was not handed on; each answers one line.
enum Refusal {
    TooLarge(usize),
    Slow(Duration),
    Unreadable(String),
}

impl Refusal {
    fn answer(self) -> Answer {
        let (status, line) = match self {
            Self::TooLarge(limit) => {
                (StatusCode::BAD_REQUEST, format!("request body larger than {limit} bytes"))
            }
            Self::Slow(limit) => {
                (StatusCode::REQUEST_TIMEOUT, format!("request body not received within {limit:?}"))
            }
            Self::Unreadable(e) => (StatusCode::BAD_REQUEST, format!("request body unreadable: {e}")),
        };
        answer(status, "text/plain", format!("{}\n", line.replace('\n', " ")))
    }
}

/// The request with its whole body, within the body's limits.
async fn read_body(request: Request<Incoming>, limits: &Limits) -> Result<Request<Bytes>, Refusal> {
    let (head, body) = request.into_parts();
    // A declared length past the limit is refused before any of it is read.
    if body.size_hint().lower() > limits.body_bytes as u64 {
        return Err(Refusal::TooLarge(limits.body_bytes));
    }
    let read = Limited::new(body, limits.body_bytes).collect();
    let collected = match tokio::time::timeout(limits.body_timeout, read).await {
        Err(_) => return Err(Refusal::Slow(limits.body_timeout)),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return Err(Refusal::TooLarge(limits.body_bytes))
        }
        Ok(Err(e)) => return Err(Refusal::Unreadable(e.to_string())),
        Ok(Ok(collected)) => collected,
    };
    Ok(Request::from_parts(head, collected.to_bytes()))
}

/// The connections of one server, and which of them wait for their client.
#[derive(Clone)]
pub struct Connections {
    registry: Arc<Mutex<Registry>>,
    /// Told when a connection closes.
    room: Arc<Notify>,
}

struct Registry {
    cap: usize,
    /// Connection ids and waiting stamps, from one increasing count.
    next: u64,
    /// Every connection whose socket is open, those told to close included.
    open: HashMap<u64, Tracked>,
}

struct Tracked {
    /// When it began to wait for its client; `None` while being answered.
    waiting_since: Option<u64>,
    /// Told to close for room, and not yet closed.
    closing: bool,
    close: Arc<Notify>,
}

impl Registry {
    fn stamp(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Tells the longest-waiting connection to close, unless one already
    /// is; false when every connection is being answered.
    fn make_room(&mut self) -> bool {
        if self.open.values().any(|t| t.closing) {
            return true;
        }
        let waiting = self.open.iter_mut().filter_map(|(_, t)| t.waiting_since.map(|since| (since, t)));
        let Some((_, longest)) = waiting.min_by_key(|(since, _)| *since) else { return false };
        longest.closing = true;
        longest.close.notify_one();
        true
    }
}

impl Connections {
    pub fn new(cap: usize) -> Self {
        let registry = Registry { cap, next: 0, open: HashMap::new() };
        Self { registry: Arc::new(Mutex::new(registry)), room: Arc::new(Notify::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection. At the cap, the longest-waiting
    /// connection is told to close, and its socket closed, before the new
    /// one is admitted, so that no more than the cap are ever open; `None`
    /// when every open connection is being answered.
    pub async fn admit(&self) -> Option<Slot> {
        loop {
            {
                let mut registry = self.lock();
                if registry.open.len() < registry.cap {
                    let id = registry.stamp();
                    let close = Arc::new(Notify::new());
                    let tracked = Tracked { waiting_since: Some(id), closing: false, close: close.clone() };
                    registry.open.insert(id, tracked);
                    return Some(Slot { id, connections: self.clone(), close });
                }
                if !registry.make_room() {
                    return None;
                }
            }
            // A close after the check above leaves its notice for this wait.
            self.room.notified().await;
        }
    }

    /// How many connections are open.
    pub fn open(&self) -> usize {
        self.lock().open.len()
    }
}

/// One open connection's place among its server's; gone when dropped.
pub struct Slot {
    id: u64,
    connections: Connections,
    close: Arc<Notify>,
}

impl Slot {
    /// Waiting for its client (to send or to read), or being answered.
    fn set_waiting(&self, waiting: bool) {
        let mut registry = self.connections.lock();
        let stamp = registry.stamp();
        if let Some(tracked) = registry.open.get_mut(&self.id) {
            tracked.waiting_since = waiting.then_some(stamp);
        }
    }

    /// Resolves once the connection was closed to make room.
    async fn evicted(&self) {
        self.close.notified().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.connections.lock().open.remove(&self.id);
        self.connections.room.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn at_the_cap_the_longest_waiting_connection_makes_room_and_busy_ones_do_not() {
        let connections = Connections::new(2);
        let first = connections.admit().await.expect("room");
        let second = connections.admit().await.expect("room");
        // The first is being answered: the second, waiting, is told to
        // close, and the third admitted once it has.
        first.set_waiting(false);
        let third = tokio::spawn({
            let connections = connections.clone();
            async move { connections.admit().await }
        });
        second.close.notified().await;
        assert_eq!(connections.open(), 2, "no more than the cap while the second closes");
        drop(second);
        let third = third.await.expect("admitted").expect("the second made room");
        assert_eq!(connections.open(), 2);
        // Both are being answered: a newcomer is refused.
        third.set_waiting(false);
        assert!(connections.admit().await.is_none());
        // An answer waiting to be read makes room again, and a closed
        // connection gives its slot back.
        first.set_waiting(true);
        let fourth = tokio::spawn({
            let connections = connections.clone();
            async move { connections.admit().await }
        });
        first.close.notified().await;
        drop(first);
        let fourth = fourth.await.expect("admitted").expect("the first made room");
        drop(third);
        assert_eq!(connections.open(), 1);
        drop(fourth);
        assert_eq!(connections.open(), 0);
    }
}
