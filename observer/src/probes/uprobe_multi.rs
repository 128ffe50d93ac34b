//! One uprobe link per program per library file, where the kernel has
//! `uprobe_multi` links (Linux 6.6 and later).
//!
//! A perf-event uprobe is one link per probed function and program: a
//! runtime file with 35 functions costs 70 registrations, and as many
//! releases of a grace period each, one at a time (about 0.1 s apiece,
//! seconds per file). A `uprobe_multi` link registers every offset of a
//! file for one program at once and is released with one grace period.
//!
//! aya 0.14 cannot load a program with the expected attach type these
//! links require, nor create them. So the GPU programs are loaded a second
//! time here, with raw `bpf()` calls beside aya: the object is parsed and
//! relocated by `aya-obj` (the library aya itself uses), against the maps
//! aya already created, so both copies of a program share every map.
//! Where any of this fails, probing falls back to perf-event links.
use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    io,
    os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use aya::{maps::Map, Ebpf};
use aya_obj::generated::bpf_insn;

/// `BPF_PROG_LOAD` and `BPF_LINK_CREATE` of the `bpf(2)` command set.
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
/// `BPF_TRACE_UPROBE_MULTI` in `enum bpf_attach_type`.
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
/// The link's probes fire at function return.
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;

/// The kernel function behind these links: present in kallsyms exactly
/// where the kernel can make them (see `KernelFunctions::has_uprobe_multi`).
pub const KERNEL_FUNCTION: &str = "bpf_uprobe_multi_link_attach";

/// The leading fields of `union bpf_attr` for `BPF_PROG_LOAD`; the kernel
/// takes a shorter attribute as zeros beyond it.
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

/// `union bpf_attr` for `BPF_LINK_CREATE` of a `uprobe_multi` link.
#[repr(C)]
#[derive(Default)]
struct UprobeMultiLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    /// Named so that it is zeroed: the kernel refuses (EINVAL) an attribute
    /// whose bytes past its last field are not zero, and the compiler's
    /// padding there would hold whatever the stack held.
    zero_tail: u32,
}

fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a live, initialised `repr(C)` prefix of `union
    // bpf_attr` of the size passed; the kernel reads no further.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, std::mem::size_of::<T>()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a successful PROG_LOAD or LINK_CREATE returns a new descriptor
    // that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The GPU programs, loaded for `uprobe_multi` links, by name.
#[derive(Debug)]
pub struct MultiPrograms {
    programs: HashMap<&'static str, OwnedFd>,
    pub pid_filter: PidFilter,
}

impl MultiPrograms {
    pub fn fd(&self, program: &str) -> Option<BorrowedFd<'_>> {
        self.programs.get(program).map(AsFd::as_fd)
    }
}

/// What a link's PID filter lets through. From 6.6 to 6.9 the check at
/// each hit compared the calling *thread* with the filter's task, so a
/// process's calls from worker threads (where frameworks launch GPU work)
/// were dropped; "bpf: fix multi-uprobe PID filtering logic" (6.10, sent
/// to the stable trees) made it compare the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PidFilter {
    /// Every thread of the process.
    Process,
    /// Its main thread alone: per-process probes take perf-event links.
    MainThreadOnly,
}

/// Overrides the guess from the kernel release: `thread` where a kernel
/// outside 6.6–6.9 carries the bug, `process` where one inside carries the
/// fix (a distribution's backport).
pub const PID_FILTER_VAR: &str = "CANARYSCOPE_UPROBE_MULTI_PID_FILTER";

impl PidFilter {
    /// This kernel's filter and why it is thought so.
    pub fn of_this_kernel() -> (Self, String) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let guessed = Self::of_release(release.trim());
        match std::env::var(PID_FILTER_VAR).ok().as_deref() {
            Some("thread") => (Self::MainThreadOnly, format!("{PID_FILTER_VAR}=thread")),
            Some("process") => (Self::Process, format!("{PID_FILTER_VAR}=process")),
            Some(other) => {
                log::warn!("{PID_FILTER_VAR}={other:?} is neither `thread` nor `process`: ignored");
                (guessed, format!("kernel {}", release.trim()))
            }
            None => (guessed, format!("kernel {}", release.trim())),
        }
    }

    /// From a release string such as `6.8.0-49-generic`.
    pub fn of_release(release: &str) -> Self {
        let mut numbers = release.split(|c: char| !c.is_ascii_digit()).map(|n| n.parse::<u32>().ok());
        match (numbers.next().flatten(), numbers.next().flatten()) {
            (Some(6), Some(minor)) if (6..10).contains(&minor) => Self::MainThreadOnly,
            _ => Self::Process,
        }
    }
}

/// The descriptor behind any of aya's map handles.
fn map_fd(map: &Map) -> BorrowedFd<'_> {
    let data = match map {
        Map::Array(d)
        | Map::ArrayOfMaps(d)
        | Map::BloomFilter(d)
        | Map::CgroupArray(d)
        | Map::CgroupStorage(d)
        | Map::CgrpStorage(d)
        | Map::CpuMap(d)
        | Map::DevMap(d)
        | Map::DevMapHash(d)
        | Map::HashMap(d)
        | Map::HashOfMaps(d)
        | Map::InodeStorage(d)
        | Map::LpmTrie(d)
        | Map::LruHashMap(d)
        | Map::PerCpuArray(d)
        | Map::PerCpuCgroupStorage(d)
        | Map::PerCpuHashMap(d)
        | Map::PerCpuLruHashMap(d)
        | Map::PerfEventArray(d)
        | Map::ProgramArray(d)
        | Map::Queue(d)
        | Map::ReusePortSockArray(d)
        | Map::RingBuf(d)
        | Map::SockHash(d)
        | Map::SockMap(d)
        | Map::SkStorage(d)
        | Map::Stack(d)
        | Map::StackTraceMap(d)
        | Map::Unsupported(d)
        | Map::XskMap(d) => d,
    };
    data.fd().as_fd()
}

/// Loads `names` from `object` for `uprobe_multi` links, relocated against
/// the maps aya created for `ebpf` (call it before any map is taken).
pub fn load(object: &[u8], ebpf: &Ebpf, names: &[&'static str]) -> Result<MultiPrograms, String> {
    let mut obj = aya_obj::Object::parse(object).map_err(|e| format!("parsing the object: {e}"))?;
    if obj.has_btf_relocations() {
        let btf = aya_obj::btf::Btf::from_sys_fs().map_err(|e| format!("kernel BTF: {e}"))?;
        obj.relocate_btf(&btf).map_err(|e| format!("BTF relocations: {e}"))?;
    }
    let created: HashMap<&str, RawFd> =
        ebpf.maps().map(|(name, map)| (name, map_fd(map).as_raw_fd())).collect();
    let maps: Vec<(String, aya_obj::Map)> = obj.maps.drain().collect();
    let mut with_fds = Vec::with_capacity(maps.len());
    for (name, map) in &maps {
        // A map aya left out (an unsupported data section) is one no GPU
        // program uses; relocating a use of it fails below, by name.
        if let Some(&fd) = created.get(name.as_str()) {
            with_fds.push((name.as_str(), fd, map));
        }
    }
    let text_sections: HashSet<usize> = obj.functions.keys().map(|(section, _)| *section).collect();
    obj.relocate_maps(with_fds.into_iter(), &text_sections).map_err(|e| format!("map relocations: {e}"))?;
    obj.relocate_calls(&text_sections).map_err(|e| format!("call relocations: {e}"))?;
    let mut programs = HashMap::new();
    for &name in names {
        let program = obj.programs.get(name).ok_or_else(|| format!("no program {name} in the object"))?;
        let function = obj
            .functions
            .get(&program.function_key())
            .ok_or_else(|| format!("program {name} has no code"))?;
        let fd = load_program(name, &function.instructions, &program.license, program.kernel_version)
            .map_err(|e| format!("loading {name} for uprobe_multi: {e}"))?;
        programs.insert(name, fd);
    }
    Ok(MultiPrograms { programs, pid_filter: PidFilter::of_this_kernel().0 })
}

fn load_program(
    name: &str,
    instructions: &[bpf_insn],
    license: &CString,
    kernel_version: Option<u32>,
) -> io::Result<OwnedFd> {
    let mut prog_name = [0u8; 16];
    for (slot, byte) in prog_name.iter_mut().take(15).zip(name.bytes()) {
        *slot = byte;
    }
    let mut attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_KPROBE,
        insn_cnt: instructions.len() as u32,
        insns: instructions.as_ptr() as u64,
        license: license.as_ptr() as u64,
        kern_version: kernel_version.unwrap_or(0),
        prog_name,
        expected_attach_type: BPF_TRACE_UPROBE_MULTI,
        ..Default::default()
    };
    bpf(BPF_PROG_LOAD, &mut attr)
}

/// Where a link's probes fire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fires {
    AtEntry,
    AtReturn,
}

/// Attaches `program` at every `(offset, cookie)` of the file at `path`,
/// in every process, or in process `pid` alone. The kernel registers the
/// offsets in order, so those listed first are live first. Closing the
/// returned descriptor removes them all.
pub fn attach(
    program: BorrowedFd<'_>,
    path: &Path,
    points: &[(u64, u64)],
    fires: Fires,
    pid: Option<u32>,
) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the library path"))?;
    let offsets: Vec<u64> = points.iter().map(|(offset, _)| *offset).collect();
    let cookies: Vec<u64> = points.iter().map(|(_, cookie)| *cookie).collect();
    let mut attr = UprobeMultiLinkAttr {
        prog_fd: program.as_raw_fd() as u32,
        attach_type: BPF_TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: points.len() as u32,
        multi_flags: match fires {
            Fires::AtEntry => 0,
            Fires::AtReturn => BPF_F_UPROBE_MULTI_RETURN,
        },
        pid: pid.unwrap_or(0),
        ..Default::default()
    };
    bpf(BPF_LINK_CREATE, &mut attr)
}

#[cfg(test)]
mod tests {
    use super::PidFilter;

    #[test]
    fn only_6_6_to_6_9_filter_by_the_main_thread() {
        for (release, filter) in [
            ("6.5.13", PidFilter::Process),
            ("6.6.0", PidFilter::MainThreadOnly),
            ("6.8.0-49-generic", PidFilter::MainThreadOnly),
            ("6.9.12-arch1-1", PidFilter::MainThreadOnly),
            ("6.10.0", PidFilter::Process),
            ("6.12.48+deb13-amd64", PidFilter::Process),
            ("7.0.1", PidFilter::Process),
            ("", PidFilter::Process),
        ] {
            assert_eq!(PidFilter::of_release(release), filter, "{release}");
        }
    }

    use super::*;

    #[test]
    fn attributes_have_the_kernels_layout() {
        // Offsets from include/uapi/linux/bpf.h.
        assert_eq!(std::mem::offset_of!(ProgLoadAttr, expected_attach_type), 68);
        assert_eq!(std::mem::offset_of!(UprobeMultiLinkAttr, path), 16);
        assert_eq!(std::mem::offset_of!(UprobeMultiLinkAttr, cnt), 48);
        assert_eq!(std::mem::offset_of!(UprobeMultiLinkAttr, pid), 56);
        // No padding the compiler could leave unset.
        assert_eq!(std::mem::size_of::<UprobeMultiLinkAttr>(), 64);
        assert_eq!(std::mem::size_of::<ProgLoadAttr>(), 72);
    }
}
