//! Finding GPU runtime library files before their first call: ahead of
//! time from what a process's loader could find (`ahead`, `ldcache`), at
//! the mapping of an unknown runtime file, and, opt-in, by holding the
//! mapping process until its probes exist (`hold`).
pub mod ahead;
pub mod hold;
pub mod ldcache;

use aya::{maps::HashMap as BpfHashMap, Ebpf};
use observer_common::discovery::{GpuFileKey, GPU_FILES_KNOWN_MAP};

/// Tells the kernel side that this file is handled, so mapping it neither
/// raises an event nor holds a process.
pub fn mark_known(ebpf: &mut Ebpf, key: GpuFileKey) {
    let Some(map) = ebpf.map_mut(GPU_FILES_KNOWN_MAP) else { return };
    let Ok(mut known) = BpfHashMap::<_, GpuFileKey, u32>::try_from(map) else { return };
    // A full map only costs a report (or hold) per mapping of a later file.
    if let Err(e) = known.insert(key, 1, 0) {
        log::debug!("{GPU_FILES_KNOWN_MAP}: {e}");
    }
}

/// The reverse, for a file whose probes were removed.
pub fn forget_known(ebpf: &mut Ebpf, key: GpuFileKey) {
    let Some(map) = ebpf.map_mut(GPU_FILES_KNOWN_MAP) else { return };
    let Ok(mut known) = BpfHashMap::<_, GpuFileKey, u32>::try_from(map) else { return };
    let _ = known.remove(&key);
}
