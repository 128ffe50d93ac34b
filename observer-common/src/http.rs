//! HTTP requests of pods' servers, seen as TCP segments at the pods'
//! cgroup. The kernel side only copies: each TCP segment with a payload, a
//! FIN or a RST, of a socket in a pod, goes to userspace with the start of
//! its payload; userspace follows every connection and parses HTTP/1.x.

/// Ring buffer of [`HttpRecord`]s, apart from the rare-events ring: a busy
/// server's segments must never crowd out a crash or an OOM kill.
pub const HTTP_RING_MAP: &str = "HTTP_SEGMENTS";
/// Per-CPU count of segments the ring had no room for.
pub const HTTP_LOST_MAP: &str = "HTTP_LOST";
/// 2 MiB. A record is the 48 fixed bytes of [`HttpSegment`], the copied
/// head (a size class of [`HTTP_HEAD_CLASSES`]) and the ring's 8-byte
/// header: 56 bytes for a FIN or RST without payload, 120/184/312/568 for
/// heads up to 64/128/256/512 bytes. At a typical 312 bytes a record, the
/// ring holds some 6,700 segments; the programs wake the daemon when a
/// quarter of it (about 1,700 segments) waits, and the tick drains it
/// every 100 ms besides, so a server sending 40,000 segments a second
/// (20,000 requests) fills a quarter in 40 ms and the rest of the ring
/// covers the daemon's reaction time. Userspace maps a ring's data pages
/// twice in a row, and the kernel maps them all at once: 4 MiB of the
/// daemon's RSS, against 16 MiB for the 8 MiB ring of fixed 568-byte
/// records this replaced.
pub const HTTP_RING_BYTES: u32 = 2 << 20;
/// Data waiting in the ring past which a submit wakes the daemon at once
/// (below it the programs submit without a wake-up and the daemon's tick
/// drains): a quarter of the ring.
pub const HTTP_WAKE_BYTES: u64 = HTTP_RING_BYTES as u64 / 4;
/// Payload bytes copied from the start of a segment: a request line and
/// the headers userspace reads (method, status, Content-Length,
/// Transfer-Encoding, Connection, User-Agent) of a typical request, or a
/// few pipelined ones.
pub const HTTP_HEAD_BYTES: usize = 512;
/// Payload bytes copied from the end of a segment: the end of a chunked
/// body (`0\r\n\r\n`, with room for a trailing CRLF of the last chunk).
pub const HTTP_TAIL_BYTES: usize = 8;
/// Head sizes a record reserves: the smallest that holds the segment's
/// head, so a 200-byte request takes 256 bytes of ring, not 512. A ring
/// reservation's size must be a constant to the verifier, hence classes.
pub const HTTP_HEAD_CLASSES: [usize; 4] = [64, 128, 256, HTTP_HEAD_BYTES];

/// The segment came into the pod's socket.
pub const SEGMENT_INGRESS: u32 = 1;
/// TCP flags of the segment.
pub const SEGMENT_FIN: u32 = 1 << 1;
pub const SEGMENT_RST: u32 = 1 << 2;
pub const SEGMENT_SYN: u32 = 1 << 3;

/// One TCP segment of a socket in a pod: the fixed start of a record in
/// the ring; `head_len` bytes of payload follow it in the record (the
/// record may be longer: its head is a size class).
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
    /// How many payload bytes follow in the record: 0 when none were
    /// copied (no payload, or the copy failed).
    pub head_len: u32,
    /// The payload's last bytes, when the payload is longer than
    /// [`HTTP_HEAD_BYTES`] (a shorter one is all in the head).
    pub tail: [u8; HTTP_TAIL_BYTES],
}

/// A record in the ring: a segment and a head of `N` bytes (a size class
/// of [`HTTP_HEAD_CLASSES`], or 0 for a segment without payload).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HttpRecord<const N: usize> {
    pub segment: HttpSegment,
    pub head: [u8; N],
}
