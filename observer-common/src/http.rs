//! HTTP requests of pods' servers, seen as TCP segments at the pods'
//! cgroup. The kernel side only copies: each TCP segment with a payload, a
//! FIN or a RST, of a socket in a pod, goes to userspace with the start of
//! its payload; userspace follows every connection and parses HTTP/1.x.

/// Ring buffer of [`HttpSegment`]s, apart from the rare-events ring: a busy
/// server's segments must never crowd out a crash or an OOM kill.
pub const HTTP_RING_MAP: &str = "HTTP_SEGMENTS";
/// Per-CPU count of segments the ring had no room for.
pub const HTTP_LOST_MAP: &str = "HTTP_LOST";
/// 8 MiB: some 14,000 segments between two drains (one tick). A server
/// answering 20,000 requests a second sends about 40,000 segments a second.
pub const HTTP_RING_BYTES: u32 = 8 << 20;
/// Payload bytes copied from the start of a segment: a request line and
/// the headers userspace reads (method, status, Content-Length,
/// Transfer-Encoding, Connection, User-Agent) of a typical request, or a
/// few pipelined ones.
pub const HTTP_HEAD_BYTES: usize = 512;
/// Payload bytes copied from the end of a segment: the end of a chunked
/// body (`0\r\n\r\n`, with room for a trailing CRLF of the last chunk).
pub const HTTP_TAIL_BYTES: usize = 8;

/// The segment came into the pod's socket.
pub const SEGMENT_INGRESS: u32 = 1;
/// TCP flags of the segment.
pub const SEGMENT_FIN: u32 = 1 << 1;
pub const SEGMENT_RST: u32 = 1 << 2;
pub const SEGMENT_SYN: u32 = 1 << 3;

/// One TCP segment of a socket in a pod.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HttpSegment {
    /// `bpf_ktime_get_ns()` as the segment passed the cgroup's hook.
    pub ts_ns: u64,
    /// The socket's cookie: one connection, for the socket's life.
    pub cookie: u64,
    /// The socket's cgroup2 id (the pod's container).
    pub cgroup_id: u64,
    /// TCP sequence number of the first payload byte, as sent.
    pub seq: u32,
    /// Payload bytes in the segment.
    pub len: u32,
    /// `SEGMENT_*` bits.
    pub flags: u32,
    /// How many of `head`'s bytes are the payload's.
    pub head_len: u32,
    /// The payload's last bytes (fewer when the payload is shorter: then
    /// `head` has them all).
    pub tail: [u8; HTTP_TAIL_BYTES],
    pub head: [u8; HTTP_HEAD_BYTES],
}
