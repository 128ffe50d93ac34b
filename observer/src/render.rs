//! How an event reads for a person: `trace`'s aligned lines, readable at a
//! glance (the full record is one `--json` away), and the daemon's log line
//! for a newly probed library.
use observer_common::gpu::Api;

use crate::{
    events::{result_name, Detail, Event},
    exit_cause::{Cause, KillReason, Sender},
};

pub const HEADER: &str =
    "TIME (UTC)    PID      COMM             CGROUP                          EVENT       DETAIL";

/// `HH:MM:SS.mmm` of a Unix timestamp in ns (UTC; avoids reading the local
/// time zone database on minimal node images).
pub fn clock_time(ts_ns: u64) -> String {
    let ms_of_day = (ts_ns / 1_000_000) % 86_400_000;
    let (h, rest) = (ms_of_day / 3_600_000, ms_of_day % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    format!("{h:02}:{m:02}:{:02}.{:03}", rest / 1000, rest % 1000)
}

/// Keeps the start and the end (where the container id lives) of long paths.
pub fn shorten(s: &str, width: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= width || width < 5 {
        return s.to_string();
    }
    let keep_end = (width - 1) * 2 / 3;
    let keep_start = width - 1 - keep_end;
    let start: String = chars[..keep_start].iter().collect();
    let end: String = chars[chars.len() - keep_end..].iter().collect();
    format!("{start}…{end}")
}

pub fn duration(ns: u64) -> String {
    match ns {
        0..=999 => format!("{ns} ns"),
        1_000..=999_999 => format!("{:.1} µs", ns as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.1} ms", ns as f64 / 1e6),
        _ => format!("{:.2} s", ns as f64 / 1e9),
    }
}

/// 512 KiB, 300 MiB, 1.5 GiB: binary units, as GPU memory is sized.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{n} B"),
        _ if value >= 100.0 || value.fract() < 0.05 => format!("{value:.0} {}", UNITS[unit]),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

/// A run's end: what ran, how it ended and how long it took.
fn run(executable: &str, duration_ns: u64, ending: crate::exit_cause::RunEnding, exit_code: i32) -> String {
    format!(
        "run of {executable} ended ({}, status {exit_code}) after {}",
        ending.as_str(),
        duration(duration_ns)
    )
}

pub fn detail(event: &Event) -> String {
    match &event.detail {
        Detail::Crash { signal, addr, library, library_offset, in_call, .. } => {
            crash(*signal, *addr, library.as_deref(), *library_offset, in_call.as_deref())
        }
        Detail::OomKill { scope, anon_rss_bytes, victims } => {
            let rss = anon_rss_bytes.map(|b| format!(", {} MiB anonymous", b >> 20)).unwrap_or_default();
            let group = match victims {
                2.. => format!("; its group of {victims} processes killed"),
                _ => String::new(),
            };
            format!("killed by the OOM killer ({scope} limit{rss}{group})")
        }
        Detail::MemoryLimitRefusal { limit, syscall, requested_bytes, limit_bytes } => {
            let name = match limit {
                observer_common::memlimit::MemLimit::As => "RLIMIT_AS",
                observer_common::memlimit::MemLimit::Data => "RLIMIT_DATA",
            };
            format!(
                "{} of {} MiB refused by {name} ({} MiB)",
                syscall.as_str(),
                requested_bytes >> 20,
                limit_bytes >> 20
            )
        }
        Detail::KfdIoctl { nr, result, duration_ns, .. } => {
            let errno = crate::names::errno_name(-*result).unwrap_or("?");
            format!(
                "{} -> {result} {errno} in {}",
                crate::events::kfd_ioctl_label(*nr),
                duration(*duration_ns)
            )
        }
        Detail::GpuHardware { function, detail, .. } => format!("{function} {detail}"),
        Detail::CpuThrottle { throttled_ns, periods, total_periods } => {
            let pct = if *total_periods > 0 { 100 * periods / total_periods } else { 100 };
            format!(
                "throttled in {periods} of {total_periods} periods ({pct}%), {} lost",
                duration(*throttled_ns)
            )
        }
        Detail::CpuOversubscribed { runnable_threads, quota_cores } => {
            format!("{runnable_threads} runnable threads, quota {quota_cores:.1} cores")
        }
        Detail::Exit { signal, exit_code, core_dumped, cause, sender, kill_reason, vram } => {
            let line = exit(*signal, *exit_code, *core_dumped, cause, sender.as_ref(), *kill_reason);
            line + &vram.as_deref().map(held_vram).unwrap_or_default()
        }
        Detail::GpuVramStranded { gpu, bytes, held_bytes, cause, attributed } => {
            stranded(*gpu, *bytes, *held_bytes, *cause, *attributed)
        }
        Detail::GpuCall { api, library, function, result, duration_ns, driver_version } => {
            gpu_call(*api, library, function, *result, *duration_ns, *driver_version)
        }
        Detail::GpuStall { library, function, elapsed_ns, .. } => {
            let lib = library.rsplit('/').next().unwrap_or(library);
            format!("{function} still running after {} [{lib}]", duration(*elapsed_ns))
        }
        Detail::HttpRequest { method, status, duration_ns, probe, .. } => {
            let answer = match status {
                Some(s) => format!("-> {s}"),
                None => "-> connection closed before the response ended".to_string(),
            };
            let probe = if *probe { " (kubelet probe)" } else { "" };
            format!("{method} {answer} in {}{probe}", duration(*duration_ns))
        }
        Detail::HttpUnparsed { protocol } => format!("a {protocol} connection, not parsed (HTTP/1.x only)"),
        Detail::RunEnded { executable, duration_ns, ending, exit_code } => {
            run(executable, *duration_ns, *ending, *exit_code)
        }
        Detail::LibraryLoadFailed { .. } => load_failed(&event.detail),
        Detail::LibraryProbed { library, flavor, functions, reason, held_ns, probes_after } => {
            let held = held_ns.map(|ns| format!(", process held {}", duration(ns))).unwrap_or_default();
            let after = probes_after
                .map(|p| {
                    format!("; probed {} after (init functions {})", duration(p.all_ns), duration(p.init_ns))
                })
                .unwrap_or_default();
            format!("{library} ({flavor}, {functions} functions): {reason}{held}{after}")
        }
    }
}

/// A failed library load: what was asked for, and what its loader missed.
fn load_failed(detail: &Detail) -> String {
    let Detail::LibraryLoadFailed { library, missing, path, gpu_library, .. } = detail else {
        return String::new();
    };
    let at = path.as_deref().map(|p| format!(" ({p})")).unwrap_or_default();
    let needs =
        if gpu_library == library { String::new() } else { format!("; it needs GPU library {gpu_library}") };
    format!("dlopen of {library}{at} failed: {missing} cannot be found{needs}")
}

fn crash(
    signal: i32,
    addr: u64,
    library: Option<&str>,
    library_offset: Option<u64>,
    in_call: Option<&str>,
) -> String {
    let mut s = format!("{} at {addr:#x}", crate::events::signal_label(signal));
    match (library, library_offset) {
        (Some(lib), Some(off)) => s.push_str(&format!(" in {lib}+{off:#x}")),
        (Some(lib), None) => s.push_str(&format!(" in {lib}")),
        _ => s.push_str(" (code not in a file mapping)"),
    }
    if let Some(call) = in_call {
        s.push_str(&format!(" during {call}"));
    }
    s
}

fn exit(
    signal: i32,
    exit_code: i32,
    core_dumped: bool,
    cause: &Cause,
    sender: Option<&Sender>,
    kill_reason: Option<KillReason>,
) -> String {
    let how = if signal != 0 {
        let core = if core_dumped { " (core dumped)" } else { "" };
        format!("killed by {}{core}", crate::events::signal_label(signal))
    } else {
        format!("exited with status {exit_code}")
    };
    let mut why = format!("cause {}", cause.as_str());
    if let Some(s) = sender {
        why.push_str(&format!(" by {}[{}] {}", s.comm, s.pid, s.scope.as_str()));
    }
    if let Some(r) = kill_reason {
        why.push_str(&format!(", {}", r.as_str()));
    }
    format!("{how}: {why}")
}

/// VRAM a process left on a GPU, and whom it is put on.
fn stranded(gpu: u32, left: u64, held: u64, cause: Option<Cause>, attributed: bool) -> String {
    let whose = match (cause, attributed) {
        (Some(cause), true) => format!("put on its pod (cause {})", cause.as_str()),
        (Some(cause), false) => format!("its pod unknown (cause {}): put on the node", cause.as_str()),
        (None, _) => "it exited without an abnormal death: put on the node".to_string(),
    };
    let settle = crate::pipeline::vram::SETTLE.as_secs();
    format!(
        "{} of VRAM still held on GPU {gpu} {settle} s after the process left it (it held {}); {whose}",
        bytes(left),
        bytes(held)
    )
}

/// `; held VRAM: 2 GiB on GPU 48879` after an exit, or that it held none.
fn held_vram(vram: &[(u32, u64)]) -> String {
    let held: Vec<String> =
        vram.iter().filter(|(_, b)| *b > 0).map(|(gpu, b)| format!("{} on GPU {gpu}", bytes(*b))).collect();
    match held.is_empty() {
        true => "; held no VRAM".to_string(),
        false => format!("; held VRAM: {}", held.join(", ")),
    }
}

fn gpu_call(
    api: Api,
    library: &str,
    function: &str,
    result: i32,
    duration_ns: Option<u64>,
    driver_version: Option<i32>,
) -> String {
    let name = result_name(api, result).unwrap_or("unknown result");
    let lib = library.rsplit('/').next().unwrap_or(library);
    // What the driver told the process: beside a failure it tells
    // "runtime newer than the driver" from a missing device.
    let driver = driver_version
        .map(|v| format!(" (driver reports CUDA {})", crate::names::cuda_version(v)))
        .unwrap_or_default();
    match duration_ns {
        Some(ns) => format!("{function} -> {result} {name}{driver} in {} [{lib}]", duration(ns)),
        None => format!("{function} -> {result} {name}{driver} (counted, not timed) [{lib}]"),
    }
}

pub fn line(event: &Event) -> String {
    let o = &event.origin;
    // No process: the node's own finding (a library probed by the start-up
    // scan or from the host's directories), not one of a vanished cgroup.
    let (pid, cgroup) = match (o.pid, o.cgroup.as_deref()) {
        (0, _) => ("-".to_string(), "(node)"),
        (pid, cgroup) => (pid.to_string(), cgroup.unwrap_or("(gone)")),
    };
    format!(
        "{:<13} {:<8} {:<16} {:<31} {:<18} {}",
        clock_time(o.ts_ns),
        pid,
        shorten(&o.comm, 16),
        shorten(cgroup, 31),
        event.kind(),
        detail(event)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Origin;
    use observer_common::gpu::Api;

    #[test]
    fn times_and_durations_read_naturally() {
        assert_eq!(clock_time(((13 * 3600 + 5 * 60 + 9) * 1000 + 42) * 1_000_000), "13:05:09.042");
        assert_eq!(duration(950), "950 ns");
        assert_eq!(duration(1_500), "1.5 µs");
        assert_eq!(duration(12_300_000), "12.3 ms");
        assert_eq!(duration(12_000_000_000), "12.00 s");
    }

    #[test]
    fn long_cgroups_keep_both_ends() {
        let s = shorten("/kubepods.slice/kubepods-burstable.slice/cri-containerd-0123456789abcdef.scope", 31);
        assert_eq!(s.chars().count(), 31);
        assert!(s.starts_with("/kubepods"));
        assert!(s.ends_with("abcdef.scope"));
        assert_eq!(shorten("/short", 31), "/short");
    }

    #[test]
    fn a_failed_gpu_library_load_names_the_library_and_the_missing_file_in_the_table() {
        let ev = |library: &str, gpu_library: &str| Event {
            origin: Origin { comm: "python3".into(), pid: 7, ..Origin::default() },
            detail: Detail::LibraryLoadFailed {
                library: library.into(),
                missing: "libcublasLt.so.13".into(),
                requested: "libonnxruntime_providers_cuda.so".into(),
                path: Some("/app/capi/libonnxruntime_providers_cuda.so".into()),
                gpu_library: gpu_library.into(),
            },
        };
        let l = line(&ev("libonnxruntime_providers_cuda.so", "libcublasLt.so.13"));
        assert!(
            l.ends_with(
                "dlopen of libonnxruntime_providers_cuda.so (/app/capi/libonnxruntime_providers_cuda.so) \
                 failed: libcublasLt.so.13 cannot be found; it needs GPU library libcublasLt.so.13"
            ),
            "{l}"
        );
        assert!(l.contains("python3"), "{l}");
        let own = line(&ev("libcublasLt.so.13", "libcublasLt.so.13"));
        assert!(!own.contains("it needs"), "the library is the GPU library itself: {own}");
    }

    #[test]
    fn a_library_the_node_revealed_is_no_process_of_a_gone_cgroup() {
        let ev = Event {
            origin: Origin { ts_ns: 0, pid: 0, tid: 0, comm: String::new(), cgroup_id: 0, cgroup: None },
            detail: Detail::LibraryProbed {
                library: "/opt/rocm/lib/libamdhip64.so.6".into(),
                flavor: "hip",
                functions: 16,
                reason: "mapped by a running process".into(),
                held_ns: None,
                probes_after: None,
            },
        };
        let l = line(&ev);
        assert!(l.starts_with("00:00:00.000  -  "), "{l}");
        assert!(l.contains("(node)") && !l.contains("(gone)"), "{l}");
    }

    #[test]
    fn a_failed_call_line_names_function_and_error() {
        let ev = Event {
            origin: Origin {
                ts_ns: 0,
                pid: 7,
                tid: 7,
                comm: "hip_probe".into(),
                cgroup_id: 1,
                cgroup: Some("/".into()),
            },
            detail: Detail::GpuCall {
                api: Api::Hip,
                library: "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5".into(),
                function: "hipInit".into(),
                result: 101,
                duration_ns: Some(2_000_000),
                driver_version: None,
            },
        };
        let l = line(&ev);
        assert!(l.contains("hipInit -> 101 hipErrorInvalidDevice in 2.0 ms [libamdhip64.so.5]"), "{l}");
        assert!(l.starts_with("00:00:00.000  7 "), "{l}");
        // columns line up with the header
        assert_eq!(l.find("gpu_call"), HEADER.find("EVENT"));
        // A hot call counted at return only says so instead of a duration.
        let counted = Event {
            detail: Detail::GpuCall {
                api: Api::Cuda,
                library: "/opt/zluda/libcuda.so.1".into(),
                function: "cuLaunchKernel".into(),
                result: 1,
                duration_ns: None,
                driver_version: None,
            },
            ..ev
        };
        let l = line(&counted);
        assert!(
            l.contains("cuLaunchKernel -> 1 CUDA_ERROR_INVALID_VALUE (counted, not timed) [libcuda.so.1]"),
            "{l}"
        );
        // A runtime call of a process the driver told its version.
        let runtime = Event {
            detail: Detail::GpuCall {
                api: Api::Cudart,
                library: "/w/nvidia/cu13/lib/libcudart.so.13".into(),
                function: "cudaGetDeviceCount".into(),
                result: 35,
                duration_ns: Some(1_000),
                driver_version: Some(12020),
            },
            ..counted
        };
        let l = line(&runtime);
        assert!(
            l.contains(
                "cudaGetDeviceCount -> 35 cudaErrorInsufficientDriver (driver reports CUDA 12.2) in 1.0 µs [libcudart.so.13]"
            ),
            "{l}"
        );
    }

    #[test]
    fn an_exit_says_what_it_held_and_a_stranding_whom_it_is_put_on() {
        assert_eq!(
            (bytes(512), bytes(300 << 20), bytes(3 << 29), bytes(80 << 30)),
            ("512 B".to_string(), "300 MiB".to_string(), "1.5 GiB".to_string(), "80 GiB".to_string())
        );
        let exit = |vram| Event {
            origin: Origin::default(),
            detail: Detail::Exit {
                signal: 11,
                exit_code: 139,
                core_dumped: false,
                cause: Cause::Fault,
                sender: None,
                kill_reason: None,
                vram,
            },
        };
        assert_eq!(detail(&exit(None)), "killed by SIGSEGV: cause fault", "no /dev/kfd: as before");
        assert_eq!(detail(&exit(Some(vec![]))), "killed by SIGSEGV: cause fault; held no VRAM");
        assert_eq!(
            detail(&exit(Some(vec![(1234, 0), (48879, 2 << 30)]))),
            "killed by SIGSEGV: cause fault; held VRAM: 2 GiB on GPU 48879"
        );
        let stranded = Event {
            origin: Origin::default(),
            detail: Detail::GpuVramStranded {
                gpu: 48879,
                bytes: 1 << 30,
                held_bytes: 2 << 30,
                cause: Some(Cause::OomKill),
                attributed: true,
            },
        };
        assert_eq!(
            detail(&stranded),
            "1 GiB of VRAM still held on GPU 48879 30 s after the process left it (it held 2 GiB); \
             put on its pod (cause oom_kill)"
        );
        assert_eq!(stranded.kind(), "gpu_vram_stranded");
    }
}
