//! GPU libraries that fail to load: an entry probe on libc's `dlopen` and
//! `dlmopen` notes the name asked for, and the return probe sends it when
//! the call returned NULL. Loads that succeed cost a map update each and
//! send nothing; userspace decides which failures concern a GPU.
use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user_str_bytes},
    macros::{map, uprobe, uretprobe},
    maps::LruHashMap,
    programs::{ProbeContext, RetProbeContext},
};
use observer_common::{
    library_load::{LoadFailedEvent, LOAD_NAME_LEN, MAX_LOADS_IN_FLIGHT},
    EventKind,
};

use crate::common::{count_lost, current_header, EVENTS};

/// tid -> user address of the name being loaded.
#[map(name = "LOADS_IN_FLIGHT")] // observer_common::library_load::LOADS_IN_FLIGHT_MAP
static LOADS_IN_FLIGHT: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_LOADS_IN_FLIGHT, 0);

/// match-proto: void *dlopen(const char *filename, int flags);
#[uprobe]
pub fn dlopen_enter(ctx: ProbeContext) -> u32 {
    note(ctx.arg::<u64>(0).unwrap_or(0));
    0
}

/// match-proto: void *dlmopen(Lmid_t lmid, const char *filename, int flags);
#[uprobe]
pub fn dlmopen_enter(ctx: ProbeContext) -> u32 {
    note(ctx.arg::<u64>(1).unwrap_or(0));
    0
}

#[inline(always)]
fn note(name: u64) {
    // dlopen(NULL) opens the program itself: nothing to name.
    if name == 0 {
        return;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = LOADS_IN_FLIGHT.insert(&tid, &name, 0);
}

/// The return of either: a NULL handle is a failed load.
#[uretprobe]
pub fn dlopen_exit(ctx: RetProbeContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: read-only map lookup; the value is copied out before removal.
    let Some(name) = (unsafe { LOADS_IN_FLIGHT.get(&tid) }).copied() else {
        return 0;
    };
    let _ = LOADS_IN_FLIGHT.remove(&tid);
    let handle: u64 = ctx.ret();
    if handle != 0 {
        return 0;
    }
    let Some(mut slot) = EVENTS.reserve::<LoadFailedEvent>(0) else {
        count_lost();
        return 0;
    };
    let ev = slot.as_mut_ptr();
    // SAFETY: `ev` points at reserved ring-buffer memory of the right size,
    // written whole before it is submitted; the name is read from the
    // calling process's memory, which the helper checks.
    unsafe {
        (*ev).header = current_header(EventKind::LibraryLoadFailed as u32);
        (*ev).name = [0; LOAD_NAME_LEN];
        let _ = bpf_probe_read_user_str_bytes(name as *const u8, &mut (*ev).name);
    }
    slot.submit(0);
    0
}
