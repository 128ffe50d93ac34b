//! Server-side HTTP/1.x requests, followed connection by connection from
//! the TCP segments the kernel copies at the pods' cgroups (see
//! `observer-ebpf/src/http.rs`): each segment's sequence number, length,
//! flags and the first and last bytes of its payload.
//!
//! A request's duration runs from the segment that brought its first byte
//! into the pod to the segment that took its response's last byte out:
//! what the client waits for, less the network between them, including the
//! time the request waited in the socket before the server read it.
//!
//! What it follows, and how:
//! - keep-alive and pipelining: requests wait in order for their
//!   responses; several requests or responses in one segment are parsed
//!   one after another as far as the copied bytes reach;
//! - bodies by `Content-Length` (counted in sequence numbers, so a body
//!   split over any number of segments ends where it ends), by chunked
//!   coding (ended by `0\r\n\r\n` at a segment's end), or by the
//!   connection's end (HTTP/1.0, or no length);
//! - `100 Continue` and other interim responses answer nothing;
//! - a connection that ends (FIN or RST from the server, RST from the
//!   client) with a response unfinished or a request unanswered: an outcome
//!   of its own, never a status;
//! - retransmitted segments count once (sequence numbers);
//! - a head longer than the copied bytes: the message is counted, and the
//!   rest of its segment skipped; the next message is found at the start
//!   of a later segment;
//! - HTTP/2 with prior knowledge and TLS are recognised by their first
//!   bytes and counted as connections not parsed; an upgrade (`101`) ends
//!   the parsing of its connection;
//! - a connection first seen in the middle (the daemon started after it)
//!   is picked up at the first segment that starts a request.
pub mod parse;

use std::collections::{HashMap, VecDeque};

use parse::{Framing, Head};

/// One TCP segment as the kernel copied it.
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    pub ts_ns: u64,
    pub cookie: u64,
    pub cgroup_id: u64,
    pub seq: u32,
    pub len: u32,
    pub ingress: bool,
    pub fin: bool,
    pub rst: bool,
    /// The payload's first bytes (all of them for a short one).
    pub head: &'a [u8],
    /// The payload's last bytes when `head` does not reach them.
    pub tail: &'a [u8],
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Status(u16),
    /// The connection ended before the response was complete (or begun).
    Closed,
}

impl Outcome {
    /// The status class as a label: `2xx`..`5xx`, `1xx`, or `closed`.
    pub fn class(self) -> &'static str {
        match self {
            Self::Status(s) if s >= 500 => "5xx",
            Self::Status(s) if s >= 400 => "4xx",
            Self::Status(s) if s >= 300 => "3xx",
            Self::Status(s) if s >= 200 => "2xx",
            Self::Status(_) => "1xx",
            Self::Closed => "closed",
        }
    }

    /// A server error or a connection closed under the request.
    pub fn failed(self) -> bool {
        matches!(self, Self::Closed) || matches!(self, Self::Status(s) if s >= 500)
    }
}

/// Connections a server served that were not HTTP/1.x.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unparsed {
    Http2,
    Tls,
}

impl Unparsed {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http2 => "h2",
            Self::Tls => "tls",
        }
    }
}

/// What following a segment found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    Request(Request),
    Unparsed { cgroup_id: u64, protocol: Unparsed },
}

/// A request that was answered, or whose connection ended under it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub cgroup_id: u64,
    pub method: &'static str,
    pub outcome: Outcome,
    pub duration_ns: u64,
    /// kubelet's probe (`User-Agent: kube-probe/`): counted apart.
    pub probe: bool,
}

#[derive(Clone, Copy, Debug)]
struct Waiting {
    start_ns: u64,
    method: &'static str,
    probe: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// Bytes of the body still to come.
    Length(u64),
    Chunked,
    UntilClose,
}

#[derive(Clone, Copy, Debug)]
struct Answering {
    request: Waiting,
    status: u16,
    body: Body,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Nothing told yet (or picked up in the middle).
    Unknown,
    Server,
    /// The pod's process is the client, or the protocol is another: not
    /// followed.
    Ignored,
}

/// Where a direction's byte stream stands: the sequence number after the
/// last byte seen.
#[derive(Clone, Copy, Debug, Default)]
struct Stream {
    next: Option<u32>,
}

impl Stream {
    /// The offset of the segment's first new byte: `None` for a segment
    /// entirely seen before (a retransmission).
    fn fresh(&mut self, seq: u32, len: u32) -> Option<u32> {
        let end = seq.wrapping_add(len);
        let offset = match self.next {
            // Wrapping comparison: sequence numbers wrap at 2^32.
            Some(next) if (end.wrapping_sub(next) as i32) <= 0 && len > 0 => return None,
            Some(next) if (next.wrapping_sub(seq) as i32) > 0 => next.wrapping_sub(seq),
            _ => 0,
        };
        self.next = Some(end);
        Some(offset)
    }
}

#[derive(Debug)]
struct Conn {
    cgroup_id: u64,
    role: Role,
    ingress: Stream,
    egress: Stream,
    /// Requests received, in order, not yet answered.
    waiting: VecDeque<Waiting>,
    /// Body bytes of the request being received still to come.
    request_body: u64,
    answering: Option<Answering>,
    last_ns: u64,
}

/// Connections followed at most: a node's pods rarely hold more open at
/// once, and a connection dropped for room is picked up again at its next
/// request.
const MAX_CONNECTIONS: usize = 65_536;
/// A connection silent this long is forgotten (a keep-alive connection is
/// picked up again at its next request).
pub const IDLE_NS: u64 = 300_000_000_000;
/// Requests waiting on one connection at most (pipelining depth).
const MAX_WAITING: usize = 256;

/// Every followed connection.
#[derive(Default)]
pub struct Tracker {
    conns: HashMap<u64, Conn>,
    /// Connections dropped for room (the cap), as a count.
    pub dropped: u64,
}

impl Tracker {
    /// Follows one segment; what it completes goes to `out`.
    pub fn segment(&mut self, s: &Segment, out: &mut Vec<Found>) {
        if !self.conns.contains_key(&s.cookie) {
            if s.head.is_empty() {
                // A FIN or RST of a connection never followed.
                return;
            }
            if self.conns.len() >= MAX_CONNECTIONS {
                self.dropped += 1;
                return;
            }
            self.conns.insert(s.cookie, Conn::new(s.cgroup_id));
        }
        let Some(conn) = self.conns.get_mut(&s.cookie) else { return };
        conn.last_ns = s.ts_ns;
        conn.cgroup_id = s.cgroup_id;
        if s.ingress {
            conn.ingress_segment(s, out);
        } else {
            conn.egress_segment(s, out);
        }
        if s.rst && s.ingress {
            // The client gave up (a timeout of its own, a cancelled call):
            // what it waited for is not the server's failure.
            self.conns.remove(&s.cookie);
        } else if s.rst || s.fin && !s.ingress {
            // The server's side closed or reset the connection (its process
            // exited, crashed or closed it).
            conn.ended(s.ts_ns, out);
            self.conns.remove(&s.cookie);
        }
    }

    /// Forgets connections silent since `IDLE_NS` before `now_ns`.
    pub fn expire(&mut self, now_ns: u64) {
        self.conns.retain(|_, c| now_ns.saturating_sub(c.last_ns) < IDLE_NS);
    }

    pub fn connections(&self) -> usize {
        self.conns.len()
    }
}

impl Conn {
    fn new(cgroup_id: u64) -> Self {
        Self {
            cgroup_id,
            role: Role::Unknown,
            ingress: Stream::default(),
            egress: Stream::default(),
            waiting: VecDeque::new(),
            request_body: 0,
            answering: None,
            last_ns: 0,
        }
    }

    fn ingress_segment(&mut self, s: &Segment, out: &mut Vec<Found>) {
        let Some(offset) = self.ingress.fresh(s.seq, s.len) else { return };
        if self.role == Role::Ignored || s.len == 0 {
            return;
        }
        let data = s.head.get(offset as usize..).unwrap_or_default();
        if self.role == Role::Unknown {
            let protocol = if parse::is_h2_preface(data) {
                Some(Unparsed::Http2)
            } else if parse::is_tls_client_hello(data) {
                Some(Unparsed::Tls)
            } else {
                None
            };
            if let Some(protocol) = protocol {
                self.role = Role::Ignored;
                out.push(Found::Unparsed { cgroup_id: self.cgroup_id, protocol });
                return;
            }
        }
        let mut new_bytes = u64::from(s.len - offset);
        let mut pos = 0usize;
        // The rest of a request body that began in an earlier segment.
        let skip = self.request_body.min(new_bytes);
        self.request_body -= skip;
        new_bytes -= skip;
        pos += skip as usize;
        while new_bytes > 0 {
            let at = data.get(pos..).unwrap_or_default();
            match parse::request(at) {
                Head::Whole(head) => {
                    self.role = Role::Server;
                    self.wait(s.ts_ns, head.method, head.probe);
                    let body = match head.framing {
                        Framing::Length(n) => n,
                        // A chunked request body is not followed: the rest
                        // of the segment is taken as it.
                        Framing::Chunked => new_bytes,
                        Framing::Unframed => 0,
                    };
                    let used = (head.len as u64 + body).min(new_bytes);
                    self.request_body = (head.len as u64 + body) - used;
                    new_bytes -= used;
                    pos += used as usize;
                }
                Head::Cut => {
                    let method = parse::method_at(at).unwrap_or("GET");
                    self.role = Role::Server;
                    // The rest of its head comes in segments that start no
                    // request, which are passed over.
                    self.wait(s.ts_ns, method, false);
                    return;
                }
                // The middle of something else: a body not followed, or a
                // connection picked up in the middle.
                Head::No => return,
            }
        }
    }

    fn wait(&mut self, start_ns: u64, method: &'static str, probe: bool) {
        if self.waiting.len() < MAX_WAITING {
            self.waiting.push_back(Waiting { start_ns, method, probe });
        }
    }

    fn egress_segment(&mut self, s: &Segment, out: &mut Vec<Found>) {
        let Some(offset) = self.egress.fresh(s.seq, s.len) else { return };
        if s.len == 0 {
            return;
        }
        if self.role == Role::Unknown && parse::method_at(s.head).is_some() {
            // The pod's process sends requests: a client connection.
            self.role = Role::Ignored;
        }
        if self.role != Role::Server {
            return;
        }
        let data = s.head.get(offset as usize..).unwrap_or_default();
        let copied_all = s.head.len() as u32 == s.len;
        let mut new_bytes = u64::from(s.len - offset);
        let mut pos = 0usize;
        loop {
            if let Some(answering) = &mut self.answering {
                match answering.body {
                    Body::Length(left) => {
                        let used = left.min(new_bytes);
                        answering.body = Body::Length(left - used);
                        new_bytes -= used;
                        pos += used as usize;
                        if left == used {
                            self.answered(s.ts_ns, out);
                            continue;
                        }
                        return;
                    }
                    Body::Chunked => {
                        let end = if copied_all { s.head } else { s.tail };
                        if parse::ends_chunked(end) {
                            self.answered(s.ts_ns, out);
                        }
                        return;
                    }
                    Body::UntilClose => return,
                }
            }
            if new_bytes == 0 {
                return;
            }
            let at = data.get(pos..).unwrap_or_default();
            match parse::response(at) {
                Head::Whole(head) => {
                    let used = (head.len as u64).min(new_bytes);
                    new_bytes -= used;
                    pos += used as usize;
                    if !self.respond(head, s.ts_ns, out) {
                        return;
                    }
                }
                Head::Cut => {
                    // Its head goes past the copy: answered with this
                    // segment, as far as can be told; its body, if any, is
                    // skipped until a segment starts a response.
                    if let Some(status) = status_of(at) {
                        if let Some(request) = self.waiting.pop_front() {
                            self.answering = None;
                            out.push(self.found(request, Outcome::Status(status), s.ts_ns));
                        }
                    }
                    return;
                }
                Head::No => return,
            }
        }
    }

    /// A response head was sent: starts answering the oldest waiting
    /// request; whether parsing the segment goes on.
    fn respond(&mut self, head: parse::ResponseHead, ts_ns: u64, out: &mut Vec<Found>) -> bool {
        if head.status == 101 {
            // Switched to another protocol: the connection is not HTTP/1.x
            // from here on.
            if let Some(request) = self.waiting.pop_front() {
                out.push(self.found(request, Outcome::Status(101), ts_ns));
            }
            self.role = Role::Ignored;
            return false;
        }
        if head.status < 200 {
            // 100 Continue and other interim responses answer nothing.
            return true;
        }
        let Some(request) = self.waiting.pop_front() else {
            // A response to a request not seen (picked up in the middle).
            return true;
        };
        let bodiless = request.method == "HEAD" || head.status == 204 || head.status == 304;
        let body = match head.framing {
            _ if bodiless => Body::Length(0),
            Framing::Length(n) => Body::Length(n),
            Framing::Chunked => Body::Chunked,
            Framing::Unframed => Body::UntilClose,
        };
        self.answering = Some(Answering { request, status: head.status, body });
        true
    }

    fn answered(&mut self, ts_ns: u64, out: &mut Vec<Found>) {
        if let Some(a) = self.answering.take() {
            out.push(self.found(a.request, Outcome::Status(a.status), ts_ns));
        }
    }

    /// The connection ends: a response that ends with it is complete;
    /// every other unfinished one, and every request still waiting, ends
    /// closed.
    fn ended(&mut self, ts_ns: u64, out: &mut Vec<Found>) {
        if let Some(a) = self.answering.take() {
            let outcome =
                if a.body == Body::UntilClose { Outcome::Status(a.status) } else { Outcome::Closed };
            out.push(self.found(a.request, outcome, ts_ns));
        }
        while let Some(request) = self.waiting.pop_front() {
            out.push(self.found(request, Outcome::Closed, ts_ns));
        }
    }

    fn found(&self, request: Waiting, outcome: Outcome, ts_ns: u64) -> Found {
        Found::Request(Request {
            cgroup_id: self.cgroup_id,
            method: request.method,
            outcome,
            duration_ns: ts_ns.saturating_sub(request.start_ns),
            probe: request.probe,
        })
    }
}

/// The status of a status line, even when the head is cut.
fn status_of(data: &[u8]) -> Option<u16> {
    let status: u16 = std::str::from_utf8(data.get(9..12)?).ok()?.parse().ok()?;
    (100..600).contains(&status).then_some(status)
}

#[cfg(test)]
mod tests;
