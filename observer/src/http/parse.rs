//! The heads of HTTP/1.x messages as far as a segment's copied bytes show
//! them: a request line and the headers that decide where a message ends
//! and whose it is, a status line and the headers that decide where a
//! response ends. Header names are matched without regard to case
//! (RFC 9110, 5.1); values are trimmed.

/// Methods a request may start with (RFC 9110 and WebDAV's common ones).
const METHODS: [&str; 12] = [
    "GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "CONNECT", "TRACE", "PROPFIND", "MKCOL",
    "COPY",
];

/// What decides where a message's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Neither: a request has no body; a response's ends with the
    /// connection (RFC 9112, 6.3).
    Unframed,
}

/// A request's head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHead {
    pub method: &'static str,
    pub framing: Framing,
    /// `User-Agent: kube-probe/...`: kubelet's liveness, readiness or
    /// startup probe.
    pub probe: bool,
    /// Bytes from the method to the blank line, included.
    pub len: usize,
}

/// A response's head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    pub status: u16,
    pub framing: Framing,
    /// HTTP/1.0 without keep-alive, or `Connection: close`.
    pub closes: bool,
    pub len: usize,
}

/// What a slice that starts a message shows of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head<T> {
    Whole(T),
    /// The message starts here, but its head goes on past the bytes at hand
    /// (long headers, or a segment copied in part).
    Cut,
    /// Not the start of such a message.
    No,
}

/// The method `data` starts with, followed by a space.
pub fn method_at(data: &[u8]) -> Option<&'static str> {
    METHODS
        .iter()
        .find(|m| data.len() > m.len() && data.starts_with(m.as_bytes()) && data[m.len()] == b' ')
        .copied()
}

/// Whether `data` starts like a status line.
pub fn is_status_line(data: &[u8]) -> bool {
    data.starts_with(b"HTTP/1.")
}

/// Where the head ends (after its blank line), if within `data`.
fn head_end(data: &[u8]) -> Option<usize> {
    data.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The header lines of a head, after its first line, as (name, value).
fn headers(head: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    head.split(|b| *b == b'\n').skip(1).filter_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let colon = line.iter().position(|b| *b == b':')?;
        Some((&line[..colon], line[colon + 1..].trim_ascii()))
    })
}

/// The framing the headers give a body, and whether they ask to close.
fn framing(head: &[u8]) -> (Framing, bool, bool) {
    let (mut framing, mut close, mut keep_alive) = (Framing::Unframed, false, false);
    for (name, value) in headers(head) {
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Chunked is the last coding when present (RFC 9112, 6.1), and
            // it decides over a length.
            if value.to_ascii_lowercase().ends_with(b"chunked") {
                framing = Framing::Chunked;
            }
        } else if name.eq_ignore_ascii_case(b"content-length") && framing != Framing::Chunked {
            if let Some(n) = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok()) {
                framing = Framing::Length(n);
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            let value = value.to_ascii_lowercase();
            close |= value.windows(5).any(|w| w == b"close");
            keep_alive |= value.windows(10).any(|w| w == b"keep-alive");
        }
    }
    (framing, close, keep_alive)
}

/// A request head at the start of `data`.
pub fn request(data: &[u8]) -> Head<RequestHead> {
    let Some(method) = method_at(data) else { return Head::No };
    let Some(len) = head_end(data) else { return Head::Cut };
    let head = &data[..len];
    let (framing, _, _) = framing(head);
    let probe =
        headers(head).any(|(n, v)| n.eq_ignore_ascii_case(b"user-agent") && v.starts_with(b"kube-probe/"));
    Head::Whole(RequestHead { method, framing, probe, len })
}

/// A response head at the start of `data`.
pub fn response(data: &[u8]) -> Head<ResponseHead> {
    if !is_status_line(data) {
        return Head::No;
    }
    let Some(len) = head_end(data) else { return Head::Cut };
    let head = &data[..len];
    // "HTTP/1.x NNN ..."
    let status = head.get(9..12).and_then(|s| std::str::from_utf8(s).ok()).and_then(|s| s.parse().ok());
    let Some(status) = status.filter(|s| (100..600).contains(s)) else { return Head::No };
    let http10 = head.starts_with(b"HTTP/1.0");
    let (framing, close, keep_alive) = framing(head);
    Head::Whole(ResponseHead { status, framing, closes: close || (http10 && !keep_alive), len })
}

/// Whether a chunked body ends with these bytes: the last chunk, `0`, and
/// the blank line after it (no trailer fields: servers rarely send them).
pub fn ends_chunked(end: &[u8]) -> bool {
    end.ends_with(b"\r\n0\r\n\r\n") || end == b"0\r\n\r\n"
}

/// The client preface of HTTP/2 with prior knowledge (h2c, gRPC).
pub fn is_h2_preface(data: &[u8]) -> bool {
    data.starts_with(b"PRI * HTTP/2.0")
}

/// A TLS handshake record holding a ClientHello.
pub fn is_tls_client_hello(data: &[u8]) -> bool {
    data.len() >= 6 && data[0] == 0x16 && data[1] == 0x03 && data[5] == 0x01
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_head_gives_method_framing_and_probe() {
        let get = b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.33\r\n\r\nGET / HTTP/1.1";
        let Head::Whole(head) = request(get) else { panic!("a whole head") };
        assert_eq!((head.method, head.framing, head.probe), ("GET", Framing::Unframed, true));
        assert_eq!(&get[head.len..head.len + 3], b"GET");
        let post = b"POST /v1 HTTP/1.1\r\ncontent-LENGTH: 12\r\n\r\n{\"x\": 1}";
        assert!(matches!(
            request(post),
            Head::Whole(RequestHead { framing: Framing::Length(12), probe: false, .. })
        ));
        assert_eq!(request(b"POST /v1 HTTP/1.1\r\nHost: x\r\n"), Head::Cut);
        assert_eq!(request(b"GETX / HTTP/1.1\r\n\r\n"), Head::No);
        assert_eq!(request(b"\x16\x03\x01\x02\x00\x01"), Head::No);
    }

    #[test]
    fn a_response_head_gives_status_framing_and_close() {
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 5\r\n\r\n";
        assert!(matches!(
            response(chunked),
            Head::Whole(ResponseHead { status: 200, framing: Framing::Chunked, closes: false, .. })
        ));
        let old = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n";
        assert!(matches!(response(old), Head::Whole(ResponseHead { status: 503, closes: true, .. })));
        let kept = b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok";
        assert!(matches!(response(kept), Head::Whole(ResponseHead { closes: false, .. })));
        let close = b"HTTP/1.1 404 Not Found\r\nConnection: close\r\n\r\n";
        assert!(matches!(
            response(close),
            Head::Whole(ResponseHead { status: 404, framing: Framing::Unframed, closes: true, .. })
        ));
        assert_eq!(response(b"HTTP/1.1 200 OK\r\nServer: x"), Head::Cut);
        assert_eq!(response(b"HTTP/1.1 2x0 OK\r\n\r\n"), Head::No);
        assert_eq!(response(b"SSH-2.0-OpenSSH\r\n\r\n"), Head::No);
    }

    #[test]
    fn protocols_it_does_not_parse_are_told_by_their_first_bytes() {
        assert!(is_h2_preface(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"));
        assert!(method_at(b"PRI * HTTP/2.0\r\n").is_none(), "never read as a request");
        assert!(is_tls_client_hello(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]));
        assert!(!is_tls_client_hello(b"GET / HTTP/1.1\r\n"));
        assert!(
            ends_chunked(b"hello\r\n0\r\n\r\n") && ends_chunked(b"0\r\n\r\n") && !ends_chunked(b"10\r\n\r\n")
        );
    }
}
