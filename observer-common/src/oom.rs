//! OOM kills: the OOM killer's choice of a victim, sent in the killer's
//! context and kept until the victim exits.

/// The OOM killer chose a victim (sent in the killer's context).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OomVictimEvent {
    pub header: crate::EventHeader,
    pub victim_pid: u32,
    pub _pad: u32,
    pub anon_rss_kb: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OomVictimInfo {
    pub anon_rss_kb: u64,
}
