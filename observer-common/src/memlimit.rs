//! Memory-limit refusals: an address-space-growing call (`mmap`, `mremap`,
//! `brk`) refused because of the process's RLIMIT_AS or RLIMIT_DATA. No
//! signal follows such a refusal (the allocator returns NULL, Python raises
//! MemoryError), so it is seen at the syscall or not at all.

/// Per-CPU count of refused calls, keyed by [`MemLimitKey`]. The counter
/// counts every call; the ring carries at most one record per process per
/// [`RECORD_EVERY_NS`].
pub const MEM_LIMIT_MAP: &str = "MEM_LIMIT_REFUSALS";
pub const MAX_MEM_LIMIT_KEYS: u32 = 4096;
/// Calls in flight of processes with a finite limit (tid -> [`MemPending`]).
pub const MAX_MEM_PENDING: u32 = 16384;
/// Processes with a recent record (tgid -> boot ns of that record).
pub const MAX_MEM_RECORDED: u32 = 8192;
/// At most one ring record per process this often: a process that retries
/// in a tight loop must not flood the ring; the counter still sees every call.
pub const RECORD_EVERY_NS: u64 = 1_000_000_000;

/// Indices into `signal_struct::rlim`.
pub const RLIMIT_DATA: u32 = 2;
pub const RLIMIT_AS: u32 = 9;
/// `-ENOMEM`: what mmap and mremap return when a limit refuses them.
pub const ENOMEM: i64 = -12;
/// `PROT_WRITE` and `MAP_SHARED` (bit 0, also set in `MAP_SHARED_VALIDATE`):
/// only private writable mappings count against RLIMIT_DATA
/// (`is_data_mapping` in the kernel).
pub const PROT_WRITE: u64 = 2;
pub const MAP_SHARED: u64 = 1;

wire_enum! {
    /// Which limit refused the call.
    pub enum MemLimit {
        As = 1,
        Data = 2,
    }
}

impl MemLimit {
    /// The `limit` field and label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::As => "as",
            Self::Data => "data",
        }
    }
}

wire_enum! {
    /// The refused system call.
    pub enum MemSyscall {
        Mmap = 1,
        Mremap = 2,
        Brk = 3,
    }
}

impl MemSyscall {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mmap => "mmap",
            Self::Mremap => "mremap",
            Self::Brk => "brk",
        }
    }
}

/// What a call asked for, kept from its entry to its return.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemPending {
    /// A [`MemSyscall`] as a number.
    pub syscall: u32,
    /// Non-zero when the new memory would count against RLIMIT_DATA.
    pub data: u32,
    /// Bytes the address space grows by (mmap: the length; mremap: new
    /// minus old length). For brk: the requested break, since the growth is
    /// only known from the old break, which the failed call returns.
    pub requested: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemLimitKey {
    pub cgroup_id: u64,
    /// A [`MemLimit`] as a number.
    pub limit: u32,
    pub _pad: u32,
}

/// One refused call (the first of its process in a second).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MemLimitEvent {
    pub header: crate::EventHeader,
    /// A [`MemLimit`] as a number.
    pub limit: u32,
    /// A [`MemSyscall`] as a number.
    pub syscall: u32,
    /// Bytes the call would have added to the address space (page-rounded).
    pub requested_bytes: u64,
    /// The soft limit that refused it.
    pub limit_bytes: u64,
}

/// Rounds up to whole pages, as the kernel accounts mappings.
pub const fn page_align(bytes: u64) -> u64 {
    (bytes.saturating_add(crate::crash::PAGE_SIZE - 1)) & !(crate::crash::PAGE_SIZE - 1)
}

/// Which limit refused a call that failed, if one did: the address space
/// (`total_vm` pages) or the data size (`data_vm` pages) plus the growth
/// exceeds a finite soft limit. `None`: the call failed for another reason.
pub const fn refused_by(
    total_vm_pages: u64,
    data_vm_pages: u64,
    growth: u64,
    data: bool,
    as_limit: u64,
    data_limit: u64,
) -> Option<(MemLimit, u64)> {
    let page = crate::crash::PAGE_SIZE;
    let growth = page_align(growth);
    if as_limit != crate::exit::RLIM_INFINITY
        && total_vm_pages.saturating_mul(page).saturating_add(growth) > as_limit
    {
        return Some((MemLimit::As, as_limit));
    }
    if data
        && data_limit != crate::exit::RLIM_INFINITY
        && data_vm_pages.saturating_mul(page).saturating_add(growth) > data_limit
    {
        return Some((MemLimit::Data, data_limit));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::RLIM_INFINITY;

    #[test]
    fn the_limit_that_would_be_exceeded_is_named() {
        let mib = 1 << 20;
        // 100 MiB mapped, 256 MiB allowed, 1 GiB asked: RLIMIT_AS.
        let r = refused_by(100 * mib / 4096, 10, 1 << 30, true, 256 * mib, RLIM_INFINITY);
        assert_eq!(r, Some((MemLimit::As, 256 * mib)));
        // Fits in the address space: not the limit's doing.
        assert_eq!(refused_by(100 * mib / 4096, 10, mib, true, 256 * mib, RLIM_INFINITY), None);
        // RLIMIT_DATA only for data mappings.
        assert_eq!(
            refused_by(10, 1000, 64 * mib, true, RLIM_INFINITY, 32 * mib),
            Some((MemLimit::Data, 32 * mib))
        );
        assert_eq!(refused_by(10, 1000, 64 * mib, false, RLIM_INFINITY, 32 * mib), None);
        // No finite limit, nothing to blame.
        assert_eq!(refused_by(u64::MAX / 8192, u64::MAX, u64::MAX, true, RLIM_INFINITY, RLIM_INFINITY), None);
        assert_eq!(page_align(1), 4096);
        assert_eq!(page_align(8192), 8192);
    }

    #[test]
    fn records_have_no_implicit_padding() {
        assert_eq!(core::mem::size_of::<MemPending>(), 4 + 4 + 8);
        assert_eq!(core::mem::size_of::<MemLimitKey>(), 8 + 4 + 4);
        assert_eq!(
            core::mem::size_of::<MemLimitEvent>(),
            core::mem::size_of::<crate::EventHeader>() + 4 + 4 + 8 + 8
        );
        for l in [MemLimit::As, MemLimit::Data] {
            assert_eq!(MemLimit::from_u32(l as u32), Some(l));
        }
    }
}
