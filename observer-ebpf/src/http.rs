//! HTTP requests of pods' servers: every TCP segment with a payload, a FIN
//! or a RST that passes a pod's cgroup, in either direction, is copied to
//! the `HTTP_SEGMENTS` ring with the start and the end of its payload, in
//! a record sized to the start it copies.
//! Userspace follows the connections and parses HTTP/1.x.
//!
//! Attached as cgroup_skb programs to the pods' parent cgroups
//! (`kubepods.slice`, `kubepods`): they run for the sockets of processes in
//! pods only, so a node's other processes pay nothing, unlike the syscall
//! tracepoints of peers, which put every task on the syscall slow path. A
//! pure ACK returns after reading two headers. The programs never drop a
//! packet: they return 1 on every path.
use aya_ebpf::bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP};
use aya_ebpf::{
    helpers::{bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_skb_cgroup_id, bpf_skb_load_bytes},
    macros::{cgroup_skb, map},
    maps::{PerCpuArray, RingBuf},
    programs::SkBuffContext,
    EbpfContext,
};
use observer_common::http::{
    HttpRecord, HTTP_HEAD_BYTES, HTTP_HEAD_CLASSES, HTTP_RING_BYTES, HTTP_TAIL_BYTES, HTTP_WAKE_BYTES,
    SEGMENT_FIN, SEGMENT_INGRESS, SEGMENT_RST, SEGMENT_SYN,
};

#[map(name = "HTTP_SEGMENTS")] // observer_common::http::HTTP_RING_MAP
static HTTP_SEGMENTS: RingBuf = RingBuf::with_byte_size(HTTP_RING_BYTES, 0);

#[map(name = "HTTP_LOST")] // observer_common::http::HTTP_LOST_MAP
static HTTP_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

const IPPROTO_TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;

#[cgroup_skb(ingress)]
pub fn http_ingress(ctx: SkBuffContext) -> i32 {
    let _ = try_segment(&ctx, SEGMENT_INGRESS);
    1
}

#[cgroup_skb(egress)]
pub fn http_egress(ctx: SkBuffContext) -> i32 {
    let _ = try_segment(&ctx, 0);
    1
}

/// Where a TCP segment's header and payload start, and its TCP flags.
struct Tcp {
    header: usize,
    payload: usize,
    flags: u8,
}

/// The TCP header of an IPv4 or IPv6 packet; `None` for anything else
/// (IPv6 extension headers included: TCP follows them only rarely).
///
/// cgroup_skb programs see the packet from its network header on.
#[inline(always)]
fn tcp(ctx: &SkBuffContext) -> Option<Tcp> {
    let version: u8 = ctx.load(0).ok()?;
    let header = match version >> 4 {
        4 => {
            let protocol: u8 = ctx.load(9).ok()?;
            if protocol != IPPROTO_TCP {
                return None;
            }
            ((version & 0x0f) as usize) * 4
        }
        6 => {
            let next: u8 = ctx.load(6).ok()?;
            if next != IPPROTO_TCP {
                return None;
            }
            40
        }
        _ => return None,
    };
    // Data offset (high nibble of byte 12) and flags (byte 13).
    let offset_and_flags: [u8; 2] = ctx.load(header + 12).ok()?;
    let payload = header + ((offset_and_flags[0] >> 4) as usize) * 4;
    Some(Tcp { header, payload, flags: offset_and_flags[1] })
}

#[inline(always)]
fn try_segment(ctx: &SkBuffContext, direction: u32) -> Option<()> {
    let tcp = tcp(ctx)?;
    let total = ctx.len() as usize;
    let len = total.checked_sub(tcp.payload)?;
    let mut flags = direction;
    if tcp.flags & TCP_FIN != 0 {
        flags |= SEGMENT_FIN;
    }
    if tcp.flags & TCP_RST != 0 {
        flags |= SEGMENT_RST;
    }
    if tcp.flags & TCP_SYN != 0 {
        flags |= SEGMENT_SYN;
    }
    // A pure ACK (or a SYN): nothing userspace follows.
    if len == 0 && flags & (SEGMENT_FIN | SEGMENT_RST) == 0 {
        return None;
    }
    let seq: [u8; 4] = ctx.load(tcp.header + 4).ok()?;
    let segment = Segment { payload: tcp.payload, total, len, seq: u32::from_be_bytes(seq), flags };
    // The smallest head class that holds the copy: a reservation's size
    // must be a constant, so each class is its own call.
    let [c64, c128, c256, _] = HTTP_HEAD_CLASSES;
    match len {
        0 => record::<0>(ctx, &segment),
        l if l <= c64 => record::<{ HTTP_HEAD_CLASSES[0] }>(ctx, &segment),
        l if l <= c128 => record::<{ HTTP_HEAD_CLASSES[1] }>(ctx, &segment),
        l if l <= c256 => record::<{ HTTP_HEAD_CLASSES[2] }>(ctx, &segment),
        _ => record::<{ HTTP_HEAD_CLASSES[3] }>(ctx, &segment),
    }
}

/// What a record says of a segment, read before its ring slot is taken.
struct Segment {
    payload: usize,
    total: usize,
    len: usize,
    seq: u32,
    flags: u32,
}

/// Reserves a record with an `N`-byte head (a power of two, or 0), fills
/// and submits it.
#[inline(always)]
fn record<const N: usize>(ctx: &SkBuffContext, s: &Segment) -> Option<()> {
    let Some(mut slot) = HTTP_SEGMENTS.reserve::<HttpRecord<N>>(0) else {
        count_lost();
        return None;
    };
    let record = slot.as_mut_ptr();
    // SAFETY: the slot is a reserved, exclusively owned HttpRecord; the
    // fields are written before it is submitted, and a failed copy leaves
    // head_len 0, which userspace reads as "not copied".
    unsafe {
        let segment = core::ptr::addr_of_mut!((*record).segment);
        (*segment).ts_ns = bpf_ktime_get_ns();
        (*segment).cookie = bpf_get_socket_cookie(ctx.as_ptr());
        (*segment).cgroup_id = bpf_skb_cgroup_id(ctx.skb.skb);
        (*segment).seq = s.seq;
        (*segment).len = s.len as u32;
        (*segment).flags = s.flags;
        (*segment).head_len = 0;
        (*segment).tail = [0; HTTP_TAIL_BYTES];
        if N > 0 && s.len > 0 {
            // 1 to N in a shape the verifier follows: LLVM turns a plain
            // `n > 0` test into one on other registers.
            let mut copied = 0u32;
            // Through memory LLVM must not see into, so the bounds below
            // are computed on the value the verifier tracks.
            core::ptr::write_volatile(&mut copied, s.len.min(N) as u32);
            let n = (core::ptr::read_volatile(&copied).wrapping_sub(1) & (N as u32 - 1)) + 1;
            let head = (*record).head.as_mut_ptr().cast();
            if bpf_skb_load_bytes(ctx.skb.skb.cast(), s.payload as u32, head, n) == 0 {
                (*segment).head_len = n;
            }
        }
        if s.len > HTTP_HEAD_BYTES {
            if let Ok(tail) = ctx.load::<[u8; HTTP_TAIL_BYTES]>(s.total - HTTP_TAIL_BYTES) {
                (*segment).tail = tail;
            }
        }
    }
    // The daemon drains on its tick; it is woken early only when a quarter
    // of the ring waits, so a busy server costs it one wake-up per batch,
    // not one per segment.
    let wake = if HTTP_SEGMENTS.query(BPF_RB_AVAIL_DATA as u64) >= HTTP_WAKE_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    slot.submit(wake as u64);
    Some(())
}

#[inline(always)]
fn count_lost() {
    if let Some(slot) = HTTP_LOST.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}
