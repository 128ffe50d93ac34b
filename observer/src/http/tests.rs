//! The tracker on the shapes real servers and clients give it, segment by
//! segment as the kernel copies them.
use super::*;

const COPY: usize = observer_common::http::HTTP_HEAD_BYTES;

/// One connection's two byte streams, cut into segments as a test says.
struct Wire {
    tracker: Tracker,
    cookie: u64,
    seq: [u32; 2],
    ts_ns: u64,
    found: Vec<Found>,
}

impl Wire {
    fn new() -> Self {
        Self { tracker: Tracker::default(), cookie: 7, seq: [1000, 90_000], ts_ns: 0, found: Vec::new() }
    }

    /// `ms` later, one segment of `payload` in that direction, copied as
    /// the kernel copies it (its first `COPY` bytes and its last eight).
    fn send(&mut self, ingress: bool, payload: &[u8], ms: u64) {
        self.segment(ingress, payload, ms, false, false, None);
    }

    fn segment(&mut self, ingress: bool, payload: &[u8], ms: u64, fin: bool, rst: bool, seq: Option<u32>) {
        self.ts_ns += ms * 1_000_000;
        let d = usize::from(!ingress);
        let seq = seq.unwrap_or(self.seq[d]);
        let head = &payload[..payload.len().min(COPY)];
        let tail = if payload.len() > COPY { &payload[payload.len() - 8..] } else { &[][..] };
        let s = Segment {
            ts_ns: self.ts_ns,
            cookie: self.cookie,
            cgroup_id: 42,
            seq,
            len: payload.len() as u32,
            ingress,
            fin,
            rst,
            head,
            tail,
        };
        self.tracker.segment(&s, &mut self.found);
        self.seq[d] = self.seq[d].max(seq.wrapping_add(payload.len() as u32) + u32::from(fin));
    }

    fn request(&mut self, payload: &[u8], ms: u64) {
        self.send(true, payload, ms);
    }

    fn response(&mut self, payload: &[u8], ms: u64) {
        self.send(false, payload, ms);
    }

    /// (method, outcome, duration in ms) of what completed so far.
    fn done(&mut self) -> Vec<(&'static str, Outcome, u64)> {
        std::mem::take(&mut self.found)
            .into_iter()
            .filter_map(|f| match f {
                Found::Request(r) => Some((r.method, r.outcome, r.duration_ns / 1_000_000)),
                Found::Unparsed { .. } => None,
            })
            .collect()
    }
}

const GET: &[u8] = b"GET /v1/models HTTP/1.1\r\nHost: infer\r\nUser-Agent: wrk\r\n\r\n";
const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";

#[test]
fn keep_alive_requests_each_take_their_own_time() {
    let mut w = Wire::new();
    w.request(GET, 0);
    w.response(OK, 5);
    w.request(GET, 100);
    w.response(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n", 30);
    assert_eq!(w.done(), vec![("GET", Outcome::Status(200), 5), ("GET", Outcome::Status(503), 30)]);
}

#[test]
fn pipelined_requests_in_one_segment_are_answered_in_order() {
    let mut w = Wire::new();
    w.request(&[GET, GET, GET].concat(), 0);
    w.response(&[OK, OK].concat(), 4);
    w.response(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found", 2);
    let done = w.done();
    assert_eq!(
        done,
        vec![
            ("GET", Outcome::Status(200), 4),
            ("GET", Outcome::Status(200), 4),
            ("GET", Outcome::Status(404), 6)
        ]
    );
}

#[test]
fn a_body_split_over_segments_ends_with_its_last_byte() {
    let mut w = Wire::new();
    let post = b"POST /v1/infer HTTP/1.1\r\nContent-Length: 2000\r\n\r\n";
    w.request(&[&post[..], &[b'x'; 1000][..]].concat(), 0);
    // The rest of the request body: no request in it.
    w.request(&[b'G'; 1000], 1);
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3000\r\n\r\n";
    w.response(&[&head[..], &[b'{'; 1000][..]].concat(), 10);
    assert!(w.done().is_empty(), "2,000 of 3,000 bytes to go");
    w.response(&[b'G'; 1500], 5);
    w.response(&[b'}'; 500], 5);
    assert_eq!(w.done(), vec![("POST", Outcome::Status(200), 21)]);
}

#[test]
fn a_chunked_body_ends_with_its_last_chunk() {
    let mut w = Wire::new();
    w.request(GET, 0);
    w.response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", 2);
    w.response(&[b"1000\r\n".as_slice(), &[b'a'; 4096], b"\r\n"].concat(), 3);
    assert!(w.done().is_empty());
    w.response(b"0\r\n\r\n", 4);
    assert_eq!(w.done(), vec![("GET", Outcome::Status(200), 9)]);
    // Small enough for one segment.
    w.request(GET, 10);
    w.response(
        b"HTTP/1.1 500 Internal Server Error\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nbad\r\n0\r\n\r\n",
        1,
    );
    assert_eq!(w.done(), vec![("GET", Outcome::Status(500), 1)]);
}

#[test]
fn http10_and_connection_close_end_with_the_connection() {
    let mut w = Wire::new();
    w.request(b"GET / HTTP/1.0\r\n\r\n", 0);
    w.response(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello", 3);
    assert!(w.done().is_empty(), "no length: the body ends with the connection");
    w.segment(false, b"", 2, true, false, None);
    assert_eq!(w.done(), vec![("GET", Outcome::Status(200), 5)]);
}

#[test]
fn a_connection_closed_mid_response_is_its_own_outcome() {
    let mut w = Wire::new();
    w.request(&[GET, GET].concat(), 0);
    w.response(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part", 3);
    // The server dies: its kernel closes the socket.
    w.segment(false, b"", 1, true, false, None);
    assert_eq!(w.done(), vec![("GET", Outcome::Closed, 4), ("GET", Outcome::Closed, 4)]);
    assert_eq!(Outcome::Closed.class(), "closed");
    assert!(Outcome::Closed.failed() && !Outcome::Status(404).failed());
}

#[test]
fn a_client_that_gives_up_fails_nothing() {
    let mut w = Wire::new();
    w.request(GET, 0);
    w.segment(true, b"", 1000, false, true, None);
    assert!(w.done().is_empty());
    assert_eq!(w.tracker.connections(), 0);
}

#[test]
fn continue_then_the_final_response() {
    let mut w = Wire::new();
    w.request(b"PUT /blob HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n", 0);
    w.response(b"HTTP/1.1 100 Continue\r\n\r\n", 1);
    w.request(b"data", 1);
    w.response(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n", 2);
    assert_eq!(w.done(), vec![("PUT", Outcome::Status(201), 4)]);
}

#[test]
fn a_retransmission_counts_once_and_head_has_no_body() {
    let mut w = Wire::new();
    let start = w.seq[0];
    w.request(GET, 0);
    w.segment(true, GET, 200, false, false, Some(start));
    let resp_start = w.seq[1];
    w.response(OK, 1);
    w.segment(false, OK, 200, false, false, Some(resp_start));
    assert_eq!(w.done(), vec![("GET", Outcome::Status(200), 201)]);
    w.request(b"HEAD / HTTP/1.1\r\n\r\n", 0);
    w.response(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n", 1);
    w.request(GET, 0);
    w.response(OK, 1);
    assert_eq!(w.done(), vec![("HEAD", Outcome::Status(200), 1), ("GET", Outcome::Status(200), 1)]);
}

#[test]
fn kubelets_probes_are_marked() {
    let mut w = Wire::new();
    w.request(b"GET /healthz HTTP/1.1\r\nUser-Agent: kube-probe/1.33\r\n\r\n", 0);
    w.response(OK, 1);
    let Some(Found::Request(r)) = w.found.pop() else { panic!("a request") };
    assert!(r.probe);
}

#[test]
fn h2_and_tls_are_counted_unparsed_and_never_read_as_requests() {
    let mut w = Wire::new();
    w.request(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00", 0);
    w.response(b"\x00\x00\x00\x04\x01\x00\x00\x00\x00", 1);
    w.request(b"\x00\x00\x0dGET / HTTP/1.1\r\n\r\n", 1);
    assert_eq!(w.found, vec![Found::Unparsed { cgroup_id: 42, protocol: Unparsed::Http2 }]);
    let mut t = Wire::new();
    t.request(&[0x16, 0x03, 0x01, 0x00, 0xf4, 0x01, 0x00], 0);
    assert_eq!(t.found, vec![Found::Unparsed { cgroup_id: 42, protocol: Unparsed::Tls }]);
}

#[test]
fn a_pods_own_outgoing_requests_are_not_its_server() {
    let mut w = Wire::new();
    w.response(GET, 0);
    w.request(OK, 3);
    assert!(w.done().is_empty());
}

#[test]
fn an_upgrade_ends_parsing_and_a_connection_picked_up_midway_waits_for_a_request() {
    let mut w = Wire::new();
    w.request(b"GET /chat HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", 0);
    w.response(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", 1);
    w.request(b"GET / HTTP/1.1\r\n\r\n", 1);
    w.response(OK, 1);
    assert_eq!(w.done(), vec![("GET", Outcome::Status(101), 1)]);
    let mut m = Wire::new();
    m.request(b"rest of an earlier body", 0);
    m.response(OK, 1);
    m.request(GET, 1);
    m.response(OK, 2);
    assert_eq!(m.done(), vec![("GET", Outcome::Status(200), 2)]);
}

#[test]
fn a_head_longer_than_the_copy_is_counted_and_its_body_passed_over() {
    let mut w = Wire::new();
    let cookie = format!("GET / HTTP/1.1\r\nCookie: {}\r\n\r\n", "c".repeat(2 * COPY));
    w.request(cookie.as_bytes(), 0);
    let big = format!(
        "HTTP/1.1 200 OK\r\nSet-Cookie: {}\r\nContent-Length: 10\r\n\r\n0123456789",
        "s".repeat(COPY)
    );
    w.response(big.as_bytes(), 3);
    w.request(GET, 1);
    w.response(OK, 1);
    assert_eq!(w.done(), vec![("GET", Outcome::Status(200), 3), ("GET", Outcome::Status(200), 1)]);
}
