//! Decoding ring-buffer records into events userspace can render, filter
//! and count. Field names here are the `trace --json` contract.
use observer_common::{
    comm_str,
    discovery::LibraryMapEvent,
    discovery::{ExecEvent, GpuMapEvent},
    exit::ExitEvent,
    gpu::{Api, GpuCallEvent},
    kfd::{eviction_trigger_name, HwArg, HwKind, HW_HOOKS},
    kfd::{HwEvent, KfdIoctlEvent},
    memlimit::{MemLimit, MemLimitEvent, MemSyscall},
    oom::OomVictimEvent,
    runs::RunExecEvent,
    EventHeader, EventKind,
};

use crate::{
    exit_cause::{Cause, KillReason, RunEnding, Sender},
    names,
};

mod json;

/// Where an event happened: process, thread and cgroup.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Origin {
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub cgroup_id: u64,
    /// Path below the cgroup2 root; `None` when the cgroup is already gone.
    pub cgroup: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Detail {
    GpuCall {
        api: Api,
        library: String,
        function: String,
        result: i32,
        /// `None` for a hot call counted at its return only (`--hot-detail counts`).
        duration_ns: Option<u64>,
        /// The CUDA version the driver last reported to this process
        /// (`cuDriverGetVersion`, `cudaDriverGetVersion`), for calls of the
        /// CUDA driver API and runtime.
        driver_version: Option<i32>,
    },
    GpuStall {
        api: Api,
        library: String,
        function: String,
        elapsed_ns: u64,
    },
    /// A process died of a fault or abort in native code.
    Crash {
        signal: i32,
        si_code: i32,
        addr: u64,
        ip: u64,
        /// Object holding the faulting instruction (`None`: anonymous memory or unknown).
        library: Option<String>,
        /// Offset of the instruction in that object's file.
        library_offset: Option<u64>,
        /// GPU function the faulting thread was inside, if any.
        in_call: Option<String>,
        crash_tid: u32,
    },
    /// The OOM killer ended this process.
    OomKill {
        scope: &'static str,
        anon_rss_bytes: Option<u64>,
        /// Processes this kill ended: more than 1 for a group kill
        /// (`memory.oom.group`), where the event is about the chosen victim.
        victims: u32,
    },
    /// A process died by a signal or with status 137.
    Exit {
        signal: i32,
        exit_code: i32,
        core_dumped: bool,
        cause: Cause,
        /// For [`Cause::Sent`]: who sent the fatal signal.
        sender: Option<Sender>,
        /// For a kill by the host of a pod's container, with Kubernetes.
        kill_reason: Option<KillReason>,
        /// What the process held per GPU (KFD's gpu_id, bytes) when it
        /// died; `None` when it had no `/dev/kfd` open, empty when it had
        /// no GPU device.
        vram: Option<Vec<(u32, u64)>>,
    },
    /// VRAM still held on a GPU past the settle time after a process that
    /// held it left, beyond the GPU's baseline (see `pipeline::vram`). The
    /// origin is that process, as its exit event named it.
    GpuVramStranded {
        /// KFD's gpu_id.
        gpu: u32,
        bytes: u64,
        /// What the process held on that GPU at its last reading.
        held_bytes: u64,
        /// The cause of its abnormal death; `None` when it left without one.
        cause: Option<Cause>,
        /// Whether the bytes are put on the origin's pod: an abnormal death
        /// of a process whose cgroup is known.
        attributed: bool,
    },
    /// mmap, mremap or brk refused because of RLIMIT_AS or RLIMIT_DATA
    /// (the first refusal of the process in a second; the metric counts all).
    MemoryLimitRefusal {
        limit: MemLimit,
        syscall: MemSyscall,
        requested_bytes: u64,
        limit_bytes: u64,
    },
    /// A KFD ioctl that failed.
    KfdIoctl {
        nr: u32,
        cmd: u32,
        result: i32,
        duration_ns: u64,
        via: &'static str,
    },
    /// A GPU memory fault, reset or queue eviction seen in the driver.
    GpuHardware {
        kind: HwKind,
        function: &'static str,
        detail: String,
        /// Whether the origin is the process the event belongs to (found
        /// by its pasid or pid), rather than the driver's context.
        attributed: bool,
    },
    /// A cgroup was throttled in consecutive samples.
    CpuThrottle {
        throttled_ns: u64,
        periods: u64,
        total_periods: u64,
    },
    /// A cgroup held more runnable threads than its quota has cores.
    CpuOversubscribed {
        runnable_threads: u32,
        quota_cores: f64,
    },
    /// A `dlopen`/`dlmopen` of a GPU library, or of one that needs a GPU
    /// library, failed: `library` is what the process asked for (base
    /// name), `missing` the file its loader could not find (base name;
    /// `unknown` when every file was found and the load failed otherwise).
    LibraryLoadFailed {
        library: String,
        missing: String,
        /// The full name asked for, and the path it resolved to.
        requested: String,
        path: Option<String>,
        /// Which GPU library it is, or needs.
        gpu_library: String,
    },
    /// canaryscope started probing a GPU runtime library file, and why it
    /// chose that file (the origin is the process that led to it, if any).
    LibraryProbed {
        library: String,
        flavor: &'static str,
        functions: usize,
        reason: String,
        /// How long the process that mapped it was held, when it was.
        held_ns: Option<u64>,
        /// From the record that revealed the file (an exec, a mapping) to
        /// its probes existing: its init functions' (attached first), and
        /// all of them. `None` for what was found at start.
        probes_after: Option<ProbesAfter>,
    },
    /// A pod's server answered an HTTP/1.x request, or its connection ended
    /// under it (the origin's pid is 0: a socket has no one process).
    HttpRequest {
        method: &'static str,
        /// The response's status; `None` when the connection ended first.
        status: Option<u16>,
        /// `2xx`..`5xx`, `1xx`, or `closed`.
        class: &'static str,
        /// From the request's first byte in to the response's last byte out.
        duration_ns: u64,
        /// kubelet's probe (`User-Agent: kube-probe/`).
        probe: bool,
    },
    /// A pod's server took a connection it speaks a protocol on that is not
    /// followed (`h2` with prior knowledge, `tls`).
    HttpUnparsed {
        protocol: &'static str,
    },
    /// A run ended: a program a pod's process started, from its exec to its
    /// exit (see `pipeline::runs`).
    RunEnded {
        /// The executable's base name.
        executable: String,
        duration_ns: u64,
        ending: RunEnding,
        /// Its exit status; 0 for a death by signal.
        exit_code: i32,
    },
}

/// How long after a file was revealed its probes existed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbesAfter {
    pub init_ns: u64,
    pub all_ns: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub origin: Origin,
    pub detail: Detail,
}

/// Name of a GPU API result code in that API's own vocabulary.
pub fn result_name(api: Api, result: i32) -> Option<&'static str> {
    match api {
        Api::Hip => names::hip_error_name(result),
        Api::Cuda => names::cu_result_name(result),
        Api::Cudart => names::cuda_error_name(result),
    }
}

/// `GET_VERSION`, or `0x82` for numbers without a name.
pub fn kfd_ioctl_label(nr: u32) -> String {
    names::kfd_ioctl_name(nr).map(str::to_string).unwrap_or_else(|| format!("{nr:#04x}"))
}

/// What the hooked function's raw integer arguments mean.
pub fn hw_detail(ev: &HwEvent) -> (HwKind, &'static str, String) {
    let Some(hook) = HW_HOOKS.get(ev.hook as usize) else {
        return (HwKind::Reset, "unknown", String::new());
    };
    let detail = match hook.arg {
        // A pasid is 16 bits; the register holding it may carry more.
        HwArg::Pasid => format!("pasid {}", ev.arg1 & 0xffff),
        HwArg::Pid => format!("pid {} trigger {}", ev.arg1 as u32, eviction_trigger_name(ev.arg2 as u32)),
        HwArg::Trigger => format!("trigger {}", eviction_trigger_name(ev.arg1 as u32)),
        HwArg::None => String::new(),
    };
    (hook.kind, hook.function, detail)
}

/// Whose a hardware event is, where the hooked function says: a pasid or
/// a pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HwCulprit {
    Pasid(u32),
    Pid(u32),
}

pub fn hw_culprit(ev: &HwEvent) -> Option<HwCulprit> {
    match HW_HOOKS.get(ev.hook as usize)?.arg {
        HwArg::Pasid => Some(HwCulprit::Pasid((ev.arg1 & 0xffff) as u32)),
        HwArg::Pid => Some(HwCulprit::Pid(ev.arg1 as u32)),
        HwArg::Trigger | HwArg::None => None,
    }
}

/// `SIGSEGV`, or `SIG<n>` for numbers without a name.
pub fn signal_label(signal: i32) -> String {
    names::signal_name(signal).map(str::to_string).unwrap_or_else(|| format!("SIG{signal}"))
}

pub fn function_name(api: Api, index: u32) -> String {
    api.functions().get(index as usize).map(|f| f.name.to_string()).unwrap_or_else(|| format!("fn#{index}"))
}

/// A raw record as it left the kernel, before paths and names are attached.
pub enum Raw {
    GpuCall(GpuCallEvent),
    Exit(Box<ExitEvent>),
    KfdIoctl(KfdIoctlEvent),
    GpuHardware(HwEvent),
    OomVictim(OomVictimEvent),
    LibraryMap(LibraryMapEvent),
    Exec(ExecEvent),
    GpuMap(GpuMapEvent),
    MemoryLimitRefusal(MemLimitEvent),
    LibraryLoadFailed(Box<observer_common::library_load::LoadFailedEvent>),
    RunExec(Box<RunExecEvent>),
}

impl Raw {
    /// The record kind, as `canaryscope_ring_events_total` labels it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::GpuCall(_) => "gpu_call",
            Self::LibraryMap(_) => "library_map",
            Self::OomVictim(_) => "oom_victim",
            Self::Exit(_) => "exit",
            Self::KfdIoctl(_) => "kfd_ioctl",
            Self::GpuHardware(_) => "gpu_hardware",
            Self::Exec(_) => "exec",
            Self::GpuMap(_) => "gpu_map",
            Self::MemoryLimitRefusal(_) => "memory_limit_refusal",
            Self::LibraryLoadFailed(_) => "library_load_failed",
            Self::RunExec(_) => "run_exec",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("record of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
    #[error("{kind:?} record of {len} bytes, expected {expected}")]
    Size { kind: EventKind, len: usize, expected: usize },
}

fn read<T: Copy>(data: &[u8], kind: EventKind) -> Result<T, DecodeError> {
    let expected = core::mem::size_of::<T>();
    if data.len() < expected {
        return Err(DecodeError::Size { kind, len: data.len(), expected });
    }
    // SAFETY: length checked above; T is a plain #[repr(C)] integer struct
    // for which every bit pattern is valid; read_unaligned copes with the
    // ring buffer's 8-byte alignment.
    Ok(unsafe { core::ptr::read_unaligned(data.as_ptr().cast::<T>()) })
}

pub fn decode(data: &[u8]) -> Result<Raw, DecodeError> {
    if data.len() < core::mem::size_of::<EventHeader>() {
        return Err(DecodeError::Short(data.len()));
    }
    let kind_raw = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]);
    let kind = EventKind::from_u32(kind_raw).ok_or(DecodeError::UnknownKind(kind_raw))?;
    match kind {
        EventKind::GpuCall => Ok(Raw::GpuCall(read(data, kind)?)),
        EventKind::Exit => Ok(Raw::Exit(Box::new(read(data, kind)?))),
        EventKind::OomVictim => Ok(Raw::OomVictim(read(data, kind)?)),
        EventKind::LibraryMap => Ok(Raw::LibraryMap(read(data, kind)?)),
        EventKind::KfdIoctl => Ok(Raw::KfdIoctl(read(data, kind)?)),
        EventKind::GpuHardware => Ok(Raw::GpuHardware(read(data, kind)?)),
        EventKind::Exec => Ok(Raw::Exec(read(data, kind)?)),
        EventKind::GpuMap => Ok(Raw::GpuMap(read(data, kind)?)),
        EventKind::MemoryLimitRefusal => Ok(Raw::MemoryLimitRefusal(read(data, kind)?)),
        EventKind::LibraryLoadFailed => Ok(Raw::LibraryLoadFailed(Box::new(read(data, kind)?))),
        EventKind::RunExec => Ok(Raw::RunExec(Box::new(read(data, kind)?))),
    }
}

/// A live thread's name (empty once it is gone), for what the kernel
/// record did not carry.
pub fn thread_comm(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_default()
}

pub fn origin_of(h: &EventHeader, clock: crate::clock::BootClock) -> Origin {
    Origin {
        ts_ns: clock.to_unix_ns(h.ts_boot_ns),
        pid: h.pid,
        tid: h.tid,
        comm: comm_str(&h.comm).to_string(),
        cgroup_id: h.cgroup_id,
        cgroup: None,
    }
}

impl Event {
    pub fn kind(&self) -> &'static str {
        match self.detail {
            Detail::GpuCall { .. } => "gpu_call",
            Detail::GpuStall { .. } => "gpu_stall",
            Detail::Crash { .. } => "crash",
            Detail::OomKill { .. } => "oom_kill",
            Detail::Exit { .. } => "exit",
            Detail::MemoryLimitRefusal { .. } => "memory_limit_refusal",
            Detail::KfdIoctl { .. } => "kfd_ioctl",
            Detail::GpuHardware { kind: HwKind::MemoryFault, .. } => "gpu_memory_fault",
            Detail::GpuHardware { kind: HwKind::Reset, .. } => "gpu_reset",
            Detail::GpuHardware { kind: HwKind::QueueEviction, .. } => "gpu_queue_eviction",
            Detail::CpuThrottle { .. } => "cpu_throttle",
            Detail::CpuOversubscribed { .. } => "cpu_oversubscribed",
            Detail::LibraryProbed { .. } => "library_probed",
            Detail::LibraryLoadFailed { .. } => "gpu_library_load_failed",
            Detail::GpuVramStranded { .. } => "gpu_vram_stranded",
            Detail::HttpRequest { .. } => "http_request",
            Detail::HttpUnparsed { .. } => "http_unparsed",
            Detail::RunEnded { .. } => "run",
        }
    }

    /// Whether this event is a failure (as opposed to an `--all` success).
    pub fn is_failure(&self) -> bool {
        match &self.detail {
            Detail::GpuCall { result, .. } => *result != 0,
            Detail::KfdIoctl { result, .. } => *result < 0,
            // A run's death is an `exit` event too: the run is what ran.
            Detail::LibraryProbed { .. } | Detail::HttpUnparsed { .. } | Detail::RunEnded { .. } => false,
            Detail::HttpRequest { status, .. } => status.is_none_or(|s| s >= 500),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_record(result: i32) -> Vec<u8> {
        let ev = GpuCallEvent {
            header: EventHeader { kind: EventKind::GpuCall as u32, pid: 42, tid: 43, ..Default::default() },
            api: Api::Hip as u32,
            function: 0,
            result,
            library: 0,
            duration_ns: 1500,
        };
        // SAFETY: plain #[repr(C)] struct viewed as bytes for the test.
        unsafe {
            core::slice::from_raw_parts(
                (&ev as *const GpuCallEvent).cast::<u8>(),
                core::mem::size_of_val(&ev),
            )
        }
        .to_vec()
    }

    #[test]
    fn decodes_a_gpu_call_record() {
        let Ok(Raw::GpuCall(ev)) = decode(&gpu_record(101)) else { panic!("decodes") };
        assert_eq!((ev.header.pid, ev.header.tid, ev.result, ev.duration_ns), (42, 43, 101, 1500));
    }

    #[test]
    fn rejects_short_and_unknown_records() {
        assert_eq!(decode(&[0u8; 3]).err(), Some(DecodeError::Short(3)));
        let mut rec = gpu_record(0);
        rec[0] = 99;
        assert_eq!(decode(&rec).err(), Some(DecodeError::UnknownKind(99)));
        let rec = gpu_record(0);
        assert!(matches!(decode(&rec[..60]), Err(DecodeError::Size { .. })));
    }

    #[test]
    fn hardware_hook_arguments_decode_by_prototype() {
        let ev = |hook, arg1, arg2| HwEvent { hook, arg1, arg2, ..Default::default() };
        // kfd_smi_event_update_vmfault(node, pasid): pasid is 16 bits.
        assert_eq!(
            hw_detail(&ev(0, 0x1_0042, 0)),
            (HwKind::MemoryFault, "kfd_smi_event_update_vmfault", "pasid 66".into())
        );
        // kfd_smi_event_queue_eviction(node, pid, trigger)
        assert_eq!(
            hw_detail(&ev(4, 4242, 2)),
            (HwKind::QueueEviction, "kfd_smi_event_queue_eviction", "pid 4242 trigger TTM".into())
        );
        // kfd_process_evict_queues(process, trigger)
        assert_eq!(hw_detail(&ev(5, 3, 0)).2, "trigger SUSPEND");
        assert_eq!(hw_detail(&ev(2, 0, 0)).0, HwKind::Reset);
        // Whose event it is: the faulting pasid, the evicted pid, or nobody.
        assert_eq!(hw_culprit(&ev(0, 0x1_0042, 0)), Some(HwCulprit::Pasid(0x42)));
        assert_eq!(hw_culprit(&ev(4, 4242, 2)), Some(HwCulprit::Pid(4242)));
        assert_eq!(hw_culprit(&ev(5, 3, 0)), None);
        assert_eq!(hw_culprit(&ev(2, 0, 0)), None);
        assert_eq!(hw_culprit(&ev(99, 1, 1)), None);
        assert_eq!(kfd_ioctl_label(0x21), "SET_XNACK_MODE");
        assert_eq!(kfd_ioctl_label(0xfe), "0xfe");
    }

    #[test]
    fn json_follows_the_contract() {
        let ev = Event {
            origin: Origin {
                ts_ns: 1,
                pid: 10,
                tid: 11,
                comm: "hip_probe".into(),
                cgroup_id: 77,
                cgroup: Some("/kubepods.slice/x.scope".into()),
            },
            detail: Detail::GpuCall {
                api: Api::Hip,
                library: "/usr/lib/libamdhip64.so.5".into(),
                function: "hipInit".into(),
                result: 101,
                duration_ns: Some(900),
                driver_version: None,
            },
        };
        let v = ev.to_json();
        assert_eq!(v["kind"], "gpu_call");
        assert_eq!(v["api"], "hip");
        assert_eq!(v["function"], "hipInit");
        assert_eq!(v["result"], 101);
        assert_eq!(v["result_name"], "hipErrorInvalidDevice");
        assert_eq!(v["cgroup"], "/kubepods.slice/x.scope");
        assert_eq!(v["cgroup_id"], 77);
        for field in ["ts_ns", "pid", "tid", "comm", "library", "duration_ns"] {
            assert!(v.get(field).is_some(), "{field} missing");
        }
        let cuda = Event {
            detail: Detail::GpuCall {
                api: Api::Cuda,
                library: "libcuda.so.1".into(),
                function: "cuInit".into(),
                result: 100,
                duration_ns: None,
                driver_version: None,
            },
            ..ev
        };
        assert_eq!(cuda.to_json()["result_name"], "CUDA_ERROR_NO_DEVICE");
        // A hot call counted at its return has no duration, not a zero one.
        assert!(cuda.to_json()["duration_ns"].is_null(), "{}", cuda.to_json());
    }

    /// One event of every kind, with the values that exercise each field's
    /// encoding (hex, labels, absent values).
    fn one_of_each_kind() -> Vec<Event> {
        let origin = Origin {
            ts_ns: 1_700_000_000_123_456_789,
            pid: 42,
            tid: 43,
            comm: "python3".into(),
            cgroup_id: 77,
            cgroup: Some("/kubepods.slice/pod-a".into()),
        };
        let sender = Sender {
            pid: 9,
            comm: "kubelet".into(),
            cgroup_id: 1,
            cgroup: None,
            scope: crate::exit_cause::SenderScope::Host,
        };
        let details = vec![
            Detail::GpuCall {
                api: Api::Cuda,
                library: "libcuda.so.1".into(),
                function: "cuInit".into(),
                result: 100,
                duration_ns: Some(1500),
                driver_version: Some(12040),
            },
            Detail::GpuCall {
                api: Api::Hip,
                library: "libamdhip64.so.5".into(),
                function: "hipLaunchKernel".into(),
                result: 0,
                duration_ns: None,
                driver_version: None,
            },
            Detail::GpuStall {
                api: Api::Cudart,
                library: "libcudart.so.12".into(),
                function: "cudaDeviceSynchronize".into(),
                elapsed_ns: 12_000_000_000,
            },
            Detail::Crash {
                signal: 11,
                si_code: 1,
                addr: 0xdead,
                ip: 0x7f00_1234,
                library: Some("libcuda.so.1".into()),
                library_offset: Some(0x1234),
                in_call: Some("cuMemcpyHtoD_v2".into()),
                crash_tid: 44,
            },
            Detail::Crash {
                signal: 6,
                si_code: -6,
                addr: 0,
                ip: 0,
                library: None,
                library_offset: None,
                in_call: None,
                crash_tid: 42,
            },
            Detail::OomKill { scope: "cgroup", anon_rss_bytes: Some(1 << 30), victims: 2 },
            Detail::Exit {
                signal: 9,
                exit_code: 137,
                core_dumped: false,
                cause: Cause::Sent,
                sender: Some(sender),
                kill_reason: Some(KillReason::ContainerRestart),
                vram: None,
            },
            Detail::Exit {
                signal: 0,
                exit_code: 137,
                core_dumped: false,
                cause: Cause::Wrapped,
                sender: None,
                kill_reason: None,
                vram: None,
            },
            Detail::MemoryLimitRefusal {
                limit: MemLimit::As,
                syscall: MemSyscall::Mmap,
                requested_bytes: 1 << 20,
                limit_bytes: 1 << 19,
            },
            Detail::KfdIoctl { nr: 0x18, cmd: 0xc018_4b18, result: -12, duration_ns: 900, via: "kprobe" },
            Detail::GpuHardware {
                kind: HwKind::MemoryFault,
                function: "kfd_signal_vm_fault_event",
                detail: "address 0x1000".into(),
                attributed: true,
            },
            Detail::GpuHardware {
                kind: HwKind::Reset,
                function: "amdgpu_device_gpu_recover",
                detail: String::new(),
                attributed: false,
            },
            Detail::GpuHardware {
                kind: HwKind::QueueEviction,
                function: "kfd_smi_event_queue_eviction",
                detail: "trigger svm".into(),
                attributed: true,
            },
            Detail::CpuThrottle { throttled_ns: 5_000_000, periods: 3, total_periods: 10 },
            Detail::CpuOversubscribed { runnable_threads: 32, quota_cores: 2.5 },
            Detail::LibraryProbed {
                library: "/usr/lib/libcuda.so.1".into(),
                flavor: "nvidia_cuda",
                functions: 40,
                reason: "mapped by pid 42".into(),
                held_ns: Some(3_000_000),
                probes_after: Some(ProbesAfter { init_ns: 8_000_000, all_ns: 20_000_000 }),
            },
            Detail::LibraryProbed {
                library: "/lib/libamdhip64.so.5".into(),
                flavor: "hip",
                functions: 32,
                reason: "on the host".into(),
                held_ns: None,
                probes_after: None,
            },
            Detail::Exit {
                signal: 11,
                exit_code: 139,
                core_dumped: true,
                cause: Cause::Fault,
                sender: None,
                kill_reason: None,
                vram: Some(vec![(1234, 0), (48879, 2 << 30)]),
            },
            Detail::Exit {
                signal: 11,
                exit_code: 139,
                core_dumped: false,
                cause: Cause::Fault,
                sender: None,
                kill_reason: None,
                vram: Some(Vec::new()),
            },
            Detail::GpuVramStranded {
                gpu: 48879,
                bytes: 2 << 30,
                held_bytes: 2 << 30,
                cause: Some(Cause::Fault),
                attributed: true,
            },
            Detail::GpuVramStranded {
                gpu: 48879,
                bytes: 1 << 30,
                held_bytes: 3 << 30,
                cause: None,
                attributed: false,
            },
            Detail::RunEnded {
                executable: "z3".into(),
                duration_ns: 1_500_000_000,
                ending: crate::exit_cause::RunEnding::RlimitCpu,
                exit_code: 0,
            },
        ];
        details.into_iter().map(|detail| Event { origin: origin.clone(), detail }).collect()
    }

    #[test]
    fn json_of_every_kind_is_the_trace_contract() {
        let lines: Vec<String> = one_of_each_kind().iter().map(|e| e.to_json().to_string()).collect();
        let expected = include_str!("../../tests/data/trace-json-contract.jsonl");
        assert_eq!(lines.join("\n") + "\n", expected);
    }
}
