//! The HTTP bench's floor: two cgroup_skb programs that do nothing but let
//! the packet through (`r0 = 1; exit`), and its least hook, two that read
//! the clock first; each pair attached the way the daemon
//! attaches its request hooks (observer/src/probes/http.rs): an ingress and
//! an egress program, each by a BPF link on the same cgroup, with no flags
//! (link attachments always combine with others).
//!
//! Loaded with bpf(2) from here rather than from the observer's object, so
//! the production object carries no program that exists only for a bench.
//! Closing the descriptors (dropping the pair) detaches both: the links are
//! pinned nowhere.
use std::{
    ffi::c_long,
    fs::File,
    mem::size_of,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use anyhow::{anyhow, Context, Result};

const BPF_PROG_LOAD: c_long = 5;
const BPF_LINK_CREATE: c_long = 28;
const BPF_PROG_TYPE_CGROUP_SKB: u32 = 8;
const BPF_CGROUP_INET_INGRESS: u32 = 0;
const BPF_CGROUP_INET_EGRESS: u32 = 1;

/// The program names bpftool and fdinfo show for the pairs.
pub(super) const FLOOR_INGRESS: &str = "floor_ingress";
pub(super) const FLOOR_EGRESS: &str = "floor_egress";
pub(super) const LEAST_INGRESS: &str = "least_ingress";
pub(super) const LEAST_EGRESS: &str = "least_egress";

/// `struct bpf_insn`: opcode, dst/src registers, offset, immediate.
#[repr(C)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// `r0 = 1` (BPF_ALU64 | BPF_MOV | BPF_K), then `exit` (BPF_JMP | BPF_EXIT):
/// 1 lets the packet through.
const PASS: [Insn; 2] =
    [Insn { code: 0xb7, regs: 0, off: 0, imm: 1 }, Insn { code: 0x95, regs: 0, off: 0, imm: 0 }];

/// `BPF_FUNC_ktime_get_ns`.
const KTIME_GET_NS: i32 = 5;

/// The least a hook that times requests must do, and nothing else: read
/// the clock, then pass the packet. No header read, no copy, no map, not
/// even which socket it was. `call ktime_get_ns; r0 = 1; exit`
/// (BPF_JMP | BPF_CALL is 0x85).
const CLOCK_ONLY: [Insn; 3] = [
    Insn { code: 0x85, regs: 0, off: 0, imm: KTIME_GET_NS },
    Insn { code: 0xb7, regs: 0, off: 0, imm: 1 },
    Insn { code: 0x95, regs: 0, off: 0, imm: 0 },
];

/// What a pair of programs does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum SkbBody {
    /// Nothing: the floor.
    Empty,
    /// The clock alone: less than any hook that times requests does.
    Clock,
}

impl SkbBody {
    fn insns(self) -> &'static [Insn] {
        match self {
            SkbBody::Empty => &PASS,
            SkbBody::Clock => &CLOCK_ONLY,
        }
    }

    /// The ingress and egress programs' names.
    pub(super) fn names(self) -> [&'static str; 2] {
        match self {
            SkbBody::Empty => [FLOOR_INGRESS, FLOOR_EGRESS],
            SkbBody::Clock => [LEAST_INGRESS, LEAST_EGRESS],
        }
    }
}

/// The head of `union bpf_attr` for BPF_PROG_LOAD, up to
/// `expected_attach_type`; the kernel reads the fields past it as zero.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The head of `union bpf_attr` for BPF_LINK_CREATE.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
}

/// bpf(2): the new descriptor, or the errno.
fn bpf<T>(cmd: c_long, attr: &T) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, initialised bpf_attr head of the size
    // passed; the kernel reads no more than that and zero-fills the rest.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *const T, size_of::<T>() as u32) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a non-negative return of these commands is a new descriptor
    // that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn load(name: &str, body: SkbBody, attach_type: u32) -> Result<OwnedFd> {
    let license = b"GPL\0";
    let mut prog_name = [0u8; 16];
    prog_name[..name.len()].copy_from_slice(name.as_bytes());
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_CGROUP_SKB,
        insn_cnt: body.insns().len() as u32,
        insns: body.insns().as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name,
        expected_attach_type: attach_type,
        ..ProgLoadAttr::default()
    };
    bpf(BPF_PROG_LOAD, &attr).with_context(|| format!("BPF_PROG_LOAD of {name} ({body:?})"))
}

/// Two programs of one body attached to one cgroup; detached when dropped.
pub(super) struct SkbPair {
    /// Link and program descriptors; the links first, so they go first.
    _fds: Vec<OwnedFd>,
}

impl SkbPair {
    pub(super) fn attach(cgroup: &Path, body: SkbBody) -> Result<SkbPair> {
        let dir = File::open(cgroup).with_context(|| format!("cannot open {}", cgroup.display()))?;
        let mut links = Vec::new();
        let mut programs = Vec::new();
        let [ingress, egress] = body.names();
        for (name, attach_type) in [(ingress, BPF_CGROUP_INET_INGRESS), (egress, BPF_CGROUP_INET_EGRESS)] {
            let program = load(name, body, attach_type)?;
            let attr = LinkCreateAttr {
                prog_fd: program.as_raw_fd() as u32,
                target_fd: dir.as_raw_fd() as u32,
                attach_type,
                flags: 0,
            };
            let link = bpf(BPF_LINK_CREATE, &attr)
                .map_err(|e| anyhow!("BPF_LINK_CREATE of {name} on {}: {e}", cgroup.display()))?;
            links.push(link);
            programs.push(program);
        }
        links.extend(programs);
        Ok(SkbPair { _fds: links })
    }
}
