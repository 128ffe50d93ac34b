//! Native crashes: what was known when a fatal synchronous signal (a
//! fault, an abort) was raised in a process, down to the file and the GPU
//! call its instruction pointer was in. Sent with the process's exit.

use crate::{discovery::LIBRARY_NAME_LEN, gpu::Api};

/// Unit of [`CrashInfo::vma_pgoff`]: `vm_pgoff` counts pages, `PAGE_SIZE`
/// bytes each (4 KiB on x86-64, `arch/x86/include/asm/page_types.h`).
pub const PAGE_SIZE: u64 = 4096;

wire_enum! {
    /// What the kernel found at a crash's instruction pointer
    /// ([`CrashInfo::ip_mapping`]).
    pub enum IpMapping {
        /// Not looked up (no VMA offsets in BTF, or no instruction pointer), or
        /// no mapping holds the address.
        Unknown = 0,
        /// Anonymous memory (JIT code or a wild jump): `vma_start` and
        /// `vma_pgoff` are set, the file fields are not.
        Anonymous = 1,
        /// A file mapping: `vma_start`, `vma_pgoff`, `file_ino` and `file_name`
        /// are set.
        File = 2,
        /// The kernel has no lookup of mappings (before 5.17): userspace
        /// resolves `ip` against the process's code ranges it recorded.
        NotLookedUp = 3,
    }
}

/// [`CrashInfo::in_call_api`] for a call of `api` in flight; 0 means none.
#[inline(always)]
pub const fn in_call_api_code(api: Api) -> u32 {
    api as u32 + 1
}

/// The API of a [`CrashInfo::in_call_api`]: `None` when no call was in
/// flight (0) or for a number no [`Api`] has.
pub fn in_call_api(code: u32) -> Option<Api> {
    code.checked_sub(1).and_then(Api::from_u32)
}

/// What was known when a fatal synchronous signal was raised in a process.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CrashInfo {
    pub signal: i32,
    pub si_code: i32,
    /// `si_addr`: the faulting data address for SIGSEGV/SIGBUS, the
    /// instruction for SIGILL/SIGFPE.
    pub addr: u64,
    /// User instruction pointer of the faulting thread.
    pub ip: u64,
    pub tid: u32,
    /// GPU call in flight on that thread: [`in_call_api_code`] of its API
    /// (0 = none), and its function.
    pub in_call_api: u32,
    pub in_call_function: u32,
    /// An [`IpMapping`] as a number: what maps `ip`.
    pub ip_mapping: u32,
    pub vma_start: u64,
    /// In pages of [`PAGE_SIZE`] bytes.
    pub vma_pgoff: u64,
    pub file_ino: u64,
    /// Base name of the file backing the mapping holding `ip`.
    pub file_name: [u8; LIBRARY_NAME_LEN],
}

impl Default for CrashInfo {
    fn default() -> Self {
        Self {
            signal: 0,
            si_code: 0,
            addr: 0,
            ip: 0,
            tid: 0,
            in_call_api: 0,
            in_call_function: 0,
            ip_mapping: IpMapping::Unknown as u32,
            vma_start: 0,
            vma_pgoff: 0,
            file_ino: 0,
            file_name: [0; LIBRARY_NAME_LEN],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_encodings_round_trip() {
        for api in Api::ALL {
            assert_eq!(in_call_api(in_call_api_code(api)), Some(api));
        }
        assert_eq!(in_call_api(0), None);
        for m in [IpMapping::Unknown, IpMapping::Anonymous, IpMapping::File, IpMapping::NotLookedUp] {
            assert_eq!(IpMapping::from_u32(m as u32), Some(m));
        }
        assert_eq!(IpMapping::from_u32(4), None);
        assert_eq!(CrashInfo::default().ip_mapping, IpMapping::Unknown as u32);
    }

    #[test]
    fn crash_info_has_no_implicit_padding() {
        let c = CrashInfo::default();
        let explicit = 4 + 4 + 8 + 8 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + c.file_name.len();
        assert_eq!(core::mem::size_of::<CrashInfo>(), explicit);
    }
}
