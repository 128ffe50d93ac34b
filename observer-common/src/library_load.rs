//! GPU libraries that fail to load: libc's `dlopen` and `dlmopen` (glibc
//! 2.34+ keeps them in `libc.so.6`, older ones in `libdl.so.2`) that return
//! NULL. The kernel side sends the name the process asked for; userspace
//! tells, from the process's own view, whether it is a GPU library or
//! needs one, and which file could not be found.

use crate::EventHeader;

/// Longest library name (as passed to `dlopen`) a record carries, with its
/// NUL; a longer one is cut.
pub const LOAD_NAME_LEN: usize = 256;

/// Per-thread note of the name being loaded, from entry to return: LRU tid
/// -> the name's user address.
pub const LOADS_IN_FLIGHT_MAP: &str = "LOADS_IN_FLIGHT";
pub const MAX_LOADS_IN_FLIGHT: u32 = 4096;

/// The entry programs (the name is `dlopen`'s first argument and
/// `dlmopen`'s second) and the return program both share.
pub const DLOPEN_ENTER_PROGRAM: &str = "dlopen_enter";
pub const DLMOPEN_ENTER_PROGRAM: &str = "dlmopen_enter";
pub const DLOPEN_EXIT_PROGRAM: &str = "dlopen_exit";

/// Functions probed in a loader library, each with its entry program.
pub const LOADER_FUNCTIONS: [(&str, &str); 2] =
    [("dlopen", DLOPEN_ENTER_PROGRAM), ("dlmopen", DLMOPEN_ENTER_PROGRAM)];

/// A `dlopen`/`dlmopen` returned NULL.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LoadFailedEvent {
    pub header: EventHeader,
    /// The name asked for, NUL-terminated.
    pub name: [u8; LOAD_NAME_LEN],
}
