//! OOM kills: the OOM killer's victims, noted until they exit.
use aya_ebpf::{
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use observer_common::{
    oom::{OomVictimEvent, OomVictimInfo},
    EventKind,
};

use crate::{
    common::{current_header, emit},
    kernel::offsets,
};

/// Victims marked by the OOM killer, until they exit (tid -> info).
#[map(name = "OOM_VICTIMS")]
pub(crate) static OOM_VICTIMS: HashMap<u32, OomVictimInfo> = HashMap::with_max_entries(1024, 0);

/// match-proto: oom:mark_victim; `pid` at a tracefs-given offset, and on
/// 6.9+ (and recent 6.1.y) `anon_rss` (kB) too. Runs in the killer's context.
#[tracepoint(category = "oom", name = "mark_victim")]
pub fn oom_mark_victim(ctx: TracePointContext) -> u32 {
    try_oom_mark_victim(&ctx).unwrap_or(1)
}

fn try_oom_mark_victim(ctx: &TracePointContext) -> Result<u32, i64> {
    let o = offsets();
    // SAFETY: offsets come from the running kernel's tracefs format file.
    let victim: i32 = unsafe { ctx.read_at(o.mark_victim_pid as usize) }.map_err(|e| e as i64)?;
    let anon_rss_kb: u64 = if o.mark_victim_anon_rss != 0 {
        unsafe { ctx.read_at(o.mark_victim_anon_rss as usize) }.unwrap_or(0)
    } else {
        0
    };
    let header = current_header(EventKind::OomVictim as u32);
    let info = OomVictimInfo { anon_rss_kb };
    let victim = victim as u32;
    OOM_VICTIMS.insert(&victim, &info, 0).map_err(|e| e as i64)?;
    emit(&OomVictimEvent { header, victim_pid: victim, _pad: 0, anon_rss_kb });
    Ok(0)
}
