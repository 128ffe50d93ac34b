//! The `trace --json` object of an event: a serde view of it, tagged by
//! kind, with each value in the form a reader of the contract expects
//! (signal and ioctl names beside their numbers, addresses in hex).
//! `tests/data/trace-json-contract.jsonl` holds one line per kind.
use observer_common::kfd::HwKind;
use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::{kfd_ioctl_label, result_name, signal_label, Detail, Event};
use crate::{
    exit_cause::{KillReason, Sender},
    names,
};

#[derive(Serialize)]
struct JsonEvent<'a> {
    ts_ns: u64,
    pid: u32,
    tid: u32,
    comm: &'a str,
    cgroup_id: u64,
    cgroup: Option<&'a str>,
    #[serde(flatten)]
    detail: JsonDetail<'a>,
}

/// One variant per `kind`: a hardware event's kind is its own.
#[derive(Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum JsonDetail<'a> {
    GpuCall {
        api: &'static str,
        library: &'a str,
        function: &'a str,
        result: i32,
        result_name: Option<&'static str>,
        duration_ns: Option<u64>,
        driver_version: Option<i32>,
    },
    GpuStall {
        api: &'static str,
        library: &'a str,
        function: &'a str,
        elapsed_ns: u64,
    },
    Crash {
        signal: String,
        signal_number: i32,
        si_code: i32,
        addr: String,
        ip: String,
        library: Option<&'a str>,
        library_offset: Option<String>,
        in_call: Option<&'a str>,
        crash_tid: u32,
    },
    OomKill {
        scope: &'static str,
        anon_rss_bytes: Option<u64>,
        victims: u32,
    },
    Exit {
        signal: Option<String>,
        signal_number: i32,
        exit_code: i32,
        core_dumped: bool,
        cause: &'static str,
        sender_pid: Option<u32>,
        sender_comm: Option<&'a str>,
        sender_cgroup: Option<&'a str>,
        sender_scope: Option<&'static str>,
        kill_reason: Option<&'static str>,
        /// Absent for a process that had no `/dev/kfd` open, so the lines
        /// of every other exit read as before.
        #[serde(skip_serializing_if = "Option::is_none")]
        vram_bytes: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        vram_by_gpu: Option<BTreeMap<String, u64>>,
    },
    GpuVramStranded {
        gpu: u32,
        bytes: u64,
        held_bytes: u64,
        cause: Option<&'static str>,
        attributed: bool,
    },
    MemoryLimitRefusal {
        limit: &'static str,
        syscall: &'static str,
        requested_bytes: u64,
        limit_bytes: u64,
    },
    KfdIoctl {
        ioctl: String,
        nr: String,
        cmd: String,
        result: i32,
        errno: Option<&'static str>,
        duration_ns: u64,
        via: &'static str,
    },
    GpuMemoryFault(Hardware<'a>),
    GpuReset(Hardware<'a>),
    GpuQueueEviction(Hardware<'a>),
    CpuThrottle {
        throttled_ns: u64,
        periods: u64,
        total_periods: u64,
    },
    CpuOversubscribed {
        runnable_threads: u32,
        quota_cores: f64,
    },
    HttpRequest {
        method: &'static str,
        status: Option<u16>,
        class: &'static str,
        duration_ns: u64,
        probe: bool,
    },
    HttpUnparsed {
        protocol: &'static str,
    },
    Run {
        executable: &'a str,
        duration_ns: u64,
        ending: &'static str,
        exit_code: i32,
    },
    GpuLibraryLoadFailed {
        library: &'a str,
        missing: &'a str,
        requested: &'a str,
        path: Option<&'a str>,
        gpu_library: &'a str,
    },
    LibraryProbed {
        library: &'a str,
        flavor: &'static str,
        functions: usize,
        reason: &'a str,
        held_ns: Option<u64>,
        init_probes_after_ns: Option<u64>,
        probes_after_ns: Option<u64>,
    },
}

#[derive(Serialize)]
struct Hardware<'a> {
    function: &'static str,
    detail: &'a str,
    attributed: bool,
}

impl Event {
    /// The `trace --json` object.
    pub fn to_json(&self) -> Value {
        let o = &self.origin;
        let event = JsonEvent {
            ts_ns: o.ts_ns,
            pid: o.pid,
            tid: o.tid,
            comm: &o.comm,
            cgroup_id: o.cgroup_id,
            cgroup: o.cgroup.as_deref(),
            detail: JsonDetail::of(&self.detail),
        };
        // Plain data with string keys: serializing cannot fail.
        serde_json::to_value(event).unwrap_or(Value::Null)
    }
}

impl<'a> JsonDetail<'a> {
    fn of(detail: &'a Detail) -> Self {
        match detail {
            Detail::GpuCall { api, library, function, result, duration_ns, driver_version } => {
                Self::GpuCall {
                    api: api.as_str(),
                    library,
                    function,
                    result: *result,
                    result_name: result_name(*api, *result),
                    duration_ns: *duration_ns,
                    driver_version: *driver_version,
                }
            }
            Detail::GpuStall { api, library, function, elapsed_ns } => {
                Self::GpuStall { api: api.as_str(), library, function, elapsed_ns: *elapsed_ns }
            }
            Detail::Crash { .. } => Self::crash(detail),
            Detail::OomKill { scope, anon_rss_bytes, victims } => {
                Self::OomKill { scope, anon_rss_bytes: *anon_rss_bytes, victims: *victims }
            }
            Detail::Exit { signal, exit_code, core_dumped, cause, sender, kill_reason, vram } => {
                let (reason, vram) = (*kill_reason, vram.as_deref());
                Self::exit(*signal, *exit_code, *core_dumped, cause.as_str(), sender.as_ref(), reason, vram)
            }
            Detail::GpuVramStranded { gpu, bytes, held_bytes, cause, attributed } => {
                let (gpu, bytes, held_bytes, attributed) = (*gpu, *bytes, *held_bytes, *attributed);
                Self::GpuVramStranded { gpu, bytes, held_bytes, cause: cause.map(|c| c.as_str()), attributed }
            }
            Detail::MemoryLimitRefusal { limit, syscall, requested_bytes, limit_bytes } => {
                Self::MemoryLimitRefusal {
                    limit: limit.as_str(),
                    syscall: syscall.as_str(),
                    requested_bytes: *requested_bytes,
                    limit_bytes: *limit_bytes,
                }
            }
            Detail::KfdIoctl { nr, cmd, result, duration_ns, via } => Self::KfdIoctl {
                ioctl: kfd_ioctl_label(*nr),
                nr: format!("{nr:#04x}"),
                cmd: format!("{cmd:#010x}"),
                result: *result,
                errno: names::errno_name(-*result),
                duration_ns: *duration_ns,
                via,
            },
            Detail::GpuHardware { kind, function, detail, attributed } => {
                Self::hardware(*kind, Hardware { function, detail, attributed: *attributed })
            }
            Detail::CpuThrottle { throttled_ns, periods, total_periods } => Self::CpuThrottle {
                throttled_ns: *throttled_ns,
                periods: *periods,
                total_periods: *total_periods,
            },
            Detail::CpuOversubscribed { runnable_threads, quota_cores } => {
                Self::CpuOversubscribed { runnable_threads: *runnable_threads, quota_cores: *quota_cores }
            }
            Detail::HttpRequest { method, status, class, duration_ns, probe } => {
                Self::HttpRequest { method, status: *status, class, duration_ns: *duration_ns, probe: *probe }
            }
            Detail::HttpUnparsed { protocol } => Self::HttpUnparsed { protocol },
            Detail::RunEnded { executable, duration_ns, ending, exit_code } => Self::Run {
                executable,
                duration_ns: *duration_ns,
                ending: ending.as_str(),
                exit_code: *exit_code,
            },
            Detail::LibraryLoadFailed { .. } => Self::load_failed(detail),
            Detail::LibraryProbed { library, flavor, functions, reason, held_ns, probes_after } => {
                Self::LibraryProbed {
                    library,
                    flavor,
                    functions: *functions,
                    reason,
                    held_ns: *held_ns,
                    init_probes_after_ns: probes_after.map(|p| p.init_ns),
                    probes_after_ns: probes_after.map(|p| p.all_ns),
                }
            }
        }
    }

    /// A crash's fields, addresses in hex.
    fn crash(detail: &'a Detail) -> Self {
        let Detail::Crash { signal, si_code, addr, ip, library, library_offset, in_call, crash_tid } = detail
        else {
            // Called for crashes only; a default crash reads as no signal.
            return Self::Crash {
                signal: String::new(),
                signal_number: 0,
                si_code: 0,
                addr: String::new(),
                ip: String::new(),
                library: None,
                library_offset: None,
                in_call: None,
                crash_tid: 0,
            };
        };
        Self::Crash {
            signal: signal_label(*signal),
            signal_number: *signal,
            si_code: *si_code,
            addr: format!("{addr:#x}"),
            ip: format!("{ip:#x}"),
            library: library.as_deref(),
            library_offset: library_offset.map(|o| format!("{o:#x}")),
            in_call: in_call.as_deref(),
            crash_tid: *crash_tid,
        }
    }

    /// A failed library load (kept out of [`Self::of`], whose arms are many).
    fn load_failed(detail: &'a Detail) -> Self {
        match detail {
            Detail::LibraryLoadFailed { library, missing, requested, path, gpu_library } => {
                Self::GpuLibraryLoadFailed { library, missing, requested, path: path.as_deref(), gpu_library }
            }
            other => Self::of(other),
        }
    }

    /// A hardware event: its kind is its own.
    fn hardware(kind: HwKind, hardware: Hardware<'a>) -> Self {
        match kind {
            HwKind::MemoryFault => Self::GpuMemoryFault(hardware),
            HwKind::Reset => Self::GpuReset(hardware),
            HwKind::QueueEviction => Self::GpuQueueEviction(hardware),
        }
    }

    /// An exit, with its sender's fields flattened as the contract has them,
    /// and what it held on GPUs where it had `/dev/kfd` open.
    fn exit(
        signal: i32,
        exit_code: i32,
        core_dumped: bool,
        cause: &'static str,
        sender: Option<&'a Sender>,
        kill_reason: Option<KillReason>,
        vram: Option<&[(u32, u64)]>,
    ) -> Self {
        Self::Exit {
            signal: (signal != 0).then(|| signal_label(signal)),
            signal_number: signal,
            exit_code,
            core_dumped,
            cause,
            sender_pid: sender.map(|s| s.pid),
            sender_comm: sender.map(|s| s.comm.as_str()),
            sender_cgroup: sender.and_then(|s| s.cgroup.as_deref()),
            sender_scope: sender.map(|s| s.scope.as_str()),
            kill_reason: kill_reason.map(KillReason::as_str),
            vram_bytes: vram.map(|v| v.iter().map(|(_, b)| b).sum()),
            vram_by_gpu: vram.map(|v| v.iter().map(|(g, b)| (g.to_string(), *b)).collect()),
        }
    }
}
