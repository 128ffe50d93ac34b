//! `canaryscope check`: what this node offers and what the observer would
//! attach, for a person (table) or a machine (`--json`).
use std::{
    fs,
    path::{Path, PathBuf},
    process::ExitCode,
};

use serde::Serialize;

use crate::{
    attribution::{cgroups::cgroup2_root, vram_gpus},
    config::Families,
    discovery::hot::Policy,
    discovery::scan::host_libraries,
    error::CliError,
    gpu_library::{self, Flavor},
    metrics::{
        exposition::{self, Sample},
        fetch::Target,
    },
    pipeline::{Options, Pipeline},
    probes::ProbeStatus,
};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also look for this GPU runtime library; repeatable.
    #[arg(long = "lib", value_name = "PATH")]
    pub libs: Vec<PathBuf>,
    /// Exporter of the daemon on this node, asked which processes have
    /// hot-call probes and why.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9464")]
    pub daemon: String,
}

/// What the daemon on this node says of hot-call selection.
#[derive(Serialize, Debug)]
pub struct HotCalls {
    /// Where the daemon was asked.
    pub daemon: String,
    /// Whether it answered with the gauge.
    pub reachable: bool,
    /// Processes with hot-call probes, by reason (`canary`, `gpu_trouble`, `all`).
    pub selected: std::collections::BTreeMap<String, u64>,
}

/// What the daemon on this node says of the readiness gate.
#[derive(Serialize, Debug, Default, PartialEq)]
pub struct ReadinessGate {
    /// The condition type pods declare as a readiness gate.
    pub condition_type: &'static str,
    /// Whether the daemon keeps the condition; `None` when it did not say.
    pub enabled: Option<bool>,
    /// Pods of this node that declare the gate, by the condition the API
    /// server holds (`true`, `false`, `none`).
    pub pods: std::collections::BTreeMap<String, u64>,
}

impl ReadinessGate {
    /// Pods of this node that use the gate.
    pub fn pod_count(&self) -> u64 {
        self.pods.values().sum()
    }
}

#[derive(Serialize, Debug)]
pub struct Item {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

#[derive(Serialize, Debug)]
pub struct Library {
    pub path: String,
    pub flavor: Option<Flavor>,
    pub functions: usize,
    /// Exported names at an entry point probed under another name, as
    /// `alias=probed name`: one address takes one probe.
    pub aliases: Vec<String>,
    pub problem: Option<String>,
}

#[derive(Serialize, Debug)]
pub struct Report {
    pub kernel: String,
    pub facilities: Vec<Item>,
    pub gpu_libraries: Vec<Library>,
    /// Every probe as a trial load attached it (root only).
    pub probes: Vec<ProbeStatus>,
    /// Why the trial load failed, if it did.
    pub load_error: Option<String>,
    /// Whether anything at all can be observed.
    pub observable: bool,
    /// Which processes the running daemon traps hot GPU calls in, and why.
    pub hot_calls: HotCalls,
    /// Whether the daemon keeps the readiness gate, and for how many pods.
    pub readiness_gate: ReadinessGate,
}

fn item(name: &str, ok: bool, detail: impl Into<String>) -> Item {
    Item { name: name.into(), ok, detail: detail.into() }
}

/// How GPU runtime files are probed, and per process on which links.
fn uprobe_multi_detail(multi: bool) -> String {
    use crate::probes::uprobe_multi::{PidFilter, PID_FILTER_VAR};
    if !multi {
        return "no uprobe_multi links (before Linux 6.6): a perf-event link per GPU function, each \
                released in about 0.1 s when probing stops"
            .into();
    }
    match PidFilter::of_this_kernel() {
        (PidFilter::Process, why) => format!(
            "GPU runtime files probed with one uprobe_multi link per program, per process too: its PID \
             filter matches every thread ({why})"
        ),
        (PidFilter::MainThreadOnly, why) => format!(
            "GPU runtime files probed with one uprobe_multi link per program; per-process hot probes on \
             perf-event links, since this kernel's uprobe_multi PID filter matches a process's main thread \
             alone ({why}; set {PID_FILTER_VAR}=process where the fix is backported)"
        ),
    }
}

fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Tracefs is where tracepoint formats live; many distributions boot with
/// it unmounted, and root can mount it.
pub fn tracefs_dir() -> Option<&'static str> {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .into_iter()
        .find(|d| Path::new(d).join("events").is_dir())
}

fn kprobes_available() -> (bool, String) {
    if Path::new("/sys/bus/event_source/devices/kprobe").exists() {
        (true, "kprobe PMU present".into())
    } else {
        (false, "kernel built without CONFIG_KPROBES (no kprobe PMU); KFD ioctls fall back to syscall tracepoints".into())
    }
}

/// The readiness gate's series of an exposition.
fn parse_readiness_gate(samples: &[Sample]) -> ReadinessGate {
    use crate::metrics::catalog::{PREFIX, READINESS_GATE_ENABLED, READINESS_GATE_PODS};
    let enabled = format!("{PREFIX}{}", READINESS_GATE_ENABLED.name);
    let pods = format!("{PREFIX}{}", READINESS_GATE_PODS.name);
    let mut gate = ReadinessGate {
        condition_type: crate::attribution::kube::CONDITION_TYPE,
        ..ReadinessGate::default()
    };
    for sample in samples {
        if sample.name == enabled {
            gate.enabled = Some(sample.value == 1.0);
        } else if sample.name == pods {
            gate.pods.insert(sample.label("condition").to_string(), sample.value as u64);
        }
    }
    gate
}

/// Asks the daemon's exporter for `canaryscope_gpu_hot_probed_processes`.
fn daemon_hot_calls(address: &str, samples: Option<&[Sample]>) -> HotCalls {
    let selected = samples.map(parse_hot_counts);
    HotCalls {
        daemon: address.to_string(),
        reachable: selected.as_ref().is_some_and(|s| !s.is_empty()),
        selected: selected.unwrap_or_default(),
    }
}

/// The samples of the daemon's `/metrics`; `None` when nothing answers
/// there with an exposition.
fn scrape(address: &str) -> Option<Vec<Sample>> {
    let target = Target::parse(&format!("http://{address}/metrics")).ok()?;
    exposition::parse(&target.get().ok()?).ok()
}

/// `reason -> processes` from an exposition.
fn parse_hot_counts(samples: &[Sample]) -> std::collections::BTreeMap<String, u64> {
    let name = format!(
        "{}{}",
        crate::metrics::catalog::PREFIX,
        crate::metrics::catalog::GPU_HOT_PROBED_PROCESSES.name
    );
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| (s.label("reason").to_string(), s.value as u64))
        .collect()
}

pub fn collect(extra_libs: &[PathBuf], daemon: &str) -> Report {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let facilities = facilities(root);
    let gpu_libraries = gpu_libraries(extra_libs);
    // The real answer to "what will attach" is to attach: load everything
    // once, record each probe's outcome, and detach.
    let (probes, load_error) = if root { trial_load(extra_libs) } else { (Vec::new(), None) };
    let observable = probes.iter().any(|p| p.attached);
    let samples = scrape(daemon);
    let hot_calls = daemon_hot_calls(daemon, samples.as_deref());
    let readiness_gate = samples.as_deref().map(parse_readiness_gate).unwrap_or(ReadinessGate {
        condition_type: crate::attribution::kube::CONDITION_TYPE,
        ..ReadinessGate::default()
    });
    Report {
        kernel: kernel_release(),
        facilities,
        gpu_libraries,
        probes,
        load_error,
        observable,
        hot_calls,
        readiness_gate,
    }
}

/// What the kernel and the machine offer, each with what it means here.
fn facilities(root: bool) -> Vec<Item> {
    let mut facilities = vec![
        item("root", root, if root { "running as root" } else { "not root: eBPF programs cannot be loaded" }),
        item(
            "bpf",
            Path::new("/proc/sys/kernel/unprivileged_bpf_disabled").exists(),
            "bpf() syscall available",
        ),
        item(
            "btf",
            Path::new("/sys/kernel/btf/vmlinux").exists(),
            "kernel BTF at /sys/kernel/btf/vmlinux (field offsets for exits and scheduler probes)",
        ),
    ];
    let tracefs = tracefs_dir();
    facilities.push(item(
        "tracefs",
        tracefs.is_some() || root,
        match tracefs {
            Some(dir) => format!("mounted at {dir}"),
            None if root => "not mounted; canaryscope mounts it at /sys/kernel/tracing".into(),
            None => "not mounted (needs root to mount)".into(),
        },
    ));
    let uprobes = Path::new("/sys/bus/event_source/devices/uprobe").exists();
    facilities.push(item("uprobes", uprobes, if uprobes { "uprobe PMU present" } else { "no uprobe PMU" }));
    let (kprobes, kdetail) = kprobes_available();
    facilities.push(item("kprobes", kprobes, kdetail));
    let cgroup2 = cgroup2_root();
    let http = http_item(cgroup2.as_deref());
    facilities.push(item(
        "cgroup2",
        cgroup2.is_some(),
        cgroup2.map(|p| format!("mounted at {}", p.display())).unwrap_or_else(|| "not mounted".into()),
    ));
    facilities.push(http);
    let multi = crate::probes::KernelFunctions::read().has_uprobe_multi();
    facilities.push(item("uprobe_multi", multi, uprobe_multi_detail(multi)));
    let kfd = Path::new("/dev/kfd").exists();
    facilities.push(item(
        "amdgpu_kfd",
        kfd,
        if kfd { "/dev/kfd present" } else { "no /dev/kfd (amdgpu not loaded)" },
    ));
    facilities.extend(vram_items(&vram_gpus::survey(&vram_gpus::KfdPaths::default())));
    facilities
}

/// Where the HTTP family's programs attach here: the parent cgroups of
/// pods, under the cgroup2 mount.
fn http_item(cgroup2: Option<&Path>) -> Item {
    let Some(cgroup2) = cgroup2 else {
        return item("http", false, "no cgroup2 mount: pods' HTTP requests are not seen");
    };
    let roots: Vec<&str> = crate::pipeline::runq_scope::KUBEPODS_ROOTS
        .iter()
        .copied()
        .filter(|r| cgroup2.join(r.trim_start_matches('/')).is_dir())
        .collect();
    match roots.is_empty() {
        true => item(
            "http",
            false,
            "no /kubepods.slice or /kubepods under the cgroup2 mount yet: the request hooks attach when one \
             appears (and under run's --cgroup prefixes)",
        ),
        false => item(
            "http",
            true,
            format!("pods' HTTP/1.x requests seen at {} (cgroup_skb: pods' sockets only)", roots.join(", ")),
        ),
    }
}

/// What VRAM per pod and stranded VRAM read here, and what they cannot.
fn vram_items(survey: &vram_gpus::Survey) -> Vec<Item> {
    let per_pod = match survey {
        s if !s.kfd_proc => "no /sys/class/kfd/kfd/proc (amdgpu not loaded): no VRAM per pod".to_string(),
        s if s.processes == 0 => {
            "/sys/class/kfd/kfd/proc read each second; no process has /dev/kfd open now".into()
        }
        s => {
            let mut detail = format!(
                "/sys/class/kfd/kfd/proc read each second: {} processes, {} with vram_<gpu_id> files",
                s.processes, s.with_vram
            );
            if s.with_vram == 0 {
                detail.push_str(" (pasid only: no GPU device, so no VRAM)");
            }
            if s.unreadable > 0 {
                detail.push_str(&format!(", {} gone while read", s.unreadable));
            }
            detail
        }
    };
    let readable: Vec<String> = survey
        .gpus
        .iter()
        .map(|g| match &g.used {
            vram_gpus::UsedMemory::MemBank(p) | vram_gpus::UsedMemory::Amdgpu(p) => {
                format!("GPU {} from {}", g.gpu_id, p.display())
            }
            vram_gpus::UsedMemory::Unknown(why) => format!("GPU {}: not computed, {why}", g.gpu_id),
        })
        .collect();
    let any_used = survey.gpus.iter().any(|g| g.used.path().is_some());
    let stranded = match readable.is_empty() {
        true => "no GPU in /sys/class/kfd/kfd/topology/nodes: no stranded VRAM".to_string(),
        false => format!("used memory per GPU: {}", readable.join("; ")),
    };
    vec![item("kfd_vram", survey.kfd_proc, per_pod), item("vram_stranded", any_used, stranded)]
}

/// The GPU runtime files named and found on the host, each identified.
fn gpu_libraries(extra_libs: &[PathBuf]) -> Vec<Library> {
    let mut paths: Vec<(PathBuf, String)> =
        extra_libs.iter().map(|p| (p.clone(), p.display().to_string())).collect();
    paths.extend(host_libraries().into_iter().map(|p| {
        let d = p.display().to_string();
        (p, d)
    }));
    let mut seen = std::collections::HashSet::new();
    let mut gpu_libraries = Vec::new();
    for (path, display) in paths {
        match gpu_library::inspect(&path, &display) {
            Ok(lib) => {
                if seen.insert(lib.id) {
                    gpu_libraries.push(Library {
                        path: display,
                        flavor: Some(lib.flavor),
                        functions: lib.functions.len(),
                        aliases: lib
                            .aliases
                            .iter()
                            .map(|(alias, probed)| format!("{alias}={probed}"))
                            .collect(),
                        problem: None,
                    });
                }
            }
            Err(e) => gpu_libraries.push(Library {
                path: display,
                flavor: None,
                functions: 0,
                aliases: Vec::new(),
                problem: Some(e.to_string()),
            }),
        }
    }
    gpu_libraries
}

fn trial_load(extra_libs: &[PathBuf]) -> (Vec<ProbeStatus>, Option<String>) {
    // What the daemon would do by default (nothing is troubled yet), with
    // no stall threshold; the trial needs no seeded run-queue set.
    let options = Options::new(Families::ALL, u64::MAX, Policy::daemon_default()).libs(extra_libs.to_vec());
    match Pipeline::start(options) {
        // The same statuses the daemon exports, GPU library files included.
        Ok((pipeline, _ring)) => (pipeline.statuses(), None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    }
}

pub fn run(args: Args) -> Result<ExitCode, CliError> {
    let report = collect(&args.libs, &args.daemon);
    if args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| CliError::runtime(e.to_string()))?;
        println!("{text}");
    } else {
        println!("canaryscope check: kernel {}", report.kernel);
        for f in &report.facilities {
            println!("  {} {:<12} {}", if f.ok { "ok  " } else { "MISS" }, f.name, f.detail);
        }
        println!("GPU runtime libraries:");
        if report.gpu_libraries.is_empty() {
            println!("  none found (install libamdhip64 or ZLUDA, or pass --lib PATH)");
        }
        for l in &report.gpu_libraries {
            match (&l.flavor, &l.problem) {
                (Some(flavor), None) => {
                    println!("  ok   {} ({flavor:?}, {} functions)", l.path, l.functions)
                }
                (_, problem) => println!("  MISS {} ({})", l.path, problem.as_deref().unwrap_or("unusable")),
            }
        }
        for p in report.probes.iter().filter(|p| p.probe == "gpu" && p.attached) {
            println!("  probes {}: {}", p.target, p.detail);
        }
        let hot = &report.hot_calls;
        if hot.reachable {
            let counts: Vec<String> = hot.selected.iter().map(|(r, n)| format!("{n} {r}")).collect();
            let total: u64 = hot.selected.values().sum();
            println!(
                "Hot GPU calls (launches, async copies): trapped in {total} processes by the daemon at {} ({})",
                hot.daemon,
                counts.join(", ")
            );
        } else {
            println!(
                "Hot GPU calls (launches, async copies): no daemon answers at {} (its selection: canary pods and cgroups with recent GPU trouble)",
                hot.daemon
            );
        }
        let gate = &report.readiness_gate;
        match gate.enabled {
            Some(true) => {
                let counts: Vec<String> = gate.pods.iter().map(|(c, n)| format!("{n} {c}")).collect();
                println!(
                    "Readiness gate {}: enabled by the daemon at {}; {} pods on this node use it (condition: {})",
                    gate.condition_type,
                    hot.daemon,
                    gate.pod_count(),
                    counts.join(", ")
                );
            }
            Some(false) => println!(
                "Readiness gate {}: disabled in the daemon at {} (no Kubernetes API, or --no-readiness-gate)",
                gate.condition_type, hot.daemon
            ),
            None => println!(
                "Readiness gate {}: no daemon answers at {} (it is kept by `canaryscope run` with Kubernetes)",
                gate.condition_type, hot.daemon
            ),
        }
        println!(
            "{}",
            if report.observable {
                "=> this node can be observed"
            } else {
                "=> nothing can be observed here"
            }
        );
    }
    Ok(if report.observable { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_is_seen_where_a_parent_cgroup_of_pods_exists() {
        let root = std::env::temp_dir().join(format!("canaryscope-check-http-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("scratch");
        let missing = http_item(Some(&root));
        assert!(!missing.ok && missing.detail.contains("attach when one appears"), "{}", missing.detail);
        std::fs::create_dir_all(root.join("kubepods")).expect("kubepods");
        let seen = http_item(Some(&root));
        assert!(seen.ok && seen.detail.contains("/kubepods"), "{}", seen.detail);
        assert!(!http_item(None).ok);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn hot_counts_are_read_from_the_exposition() {
        let text = "# HELP canaryscope_gpu_hot_probed_processes x\n\
                    canaryscope_gpu_hot_probed_processes{reason=\"canary\"} 3\n\
                    canaryscope_gpu_hot_probed_processes{reason=\"gpu_trouble\"} 0\n\
                    canaryscope_probe_attached{probe=\"gpu\",target=\"x\"} 1\n";
        let counts = parse_hot_counts(&exposition::parse(text).expect("an exposition"));
        assert_eq!(counts.get("canary"), Some(&3));
        assert_eq!(counts.get("gpu_trouble"), Some(&0));
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn the_readiness_gate_is_read_from_the_exposition() {
        let text = "canaryscope_readiness_gate_enabled 1\n\
                    canaryscope_readiness_gate_pods{condition=\"true\"} 2\n\
                    canaryscope_readiness_gate_pods{condition=\"false\"} 1\n\
                    canaryscope_readiness_gate_pods{condition=\"none\"} 0\n\
                    canaryscope_readiness_gate_pending_patches 0\n";
        let gate = parse_readiness_gate(&exposition::parse(text).expect("an exposition"));
        assert_eq!(gate.enabled, Some(true));
        assert_eq!(gate.pod_count(), 3);
        assert_eq!(gate.pods.get("false"), Some(&1));
        let off = parse_readiness_gate(
            &exposition::parse("canaryscope_readiness_gate_enabled 0\n").expect("an exposition"),
        );
        assert_eq!((off.enabled, off.pod_count()), (Some(false), 0));
        assert_eq!(parse_readiness_gate(&[]).enabled, None);
    }

    #[test]
    fn vram_items_say_what_is_read_and_what_cannot_be() {
        let none = vram_items(&vram_gpus::Survey::default());
        assert_eq!((none[0].ok, none[1].ok), (false, false));
        assert!(none[0].detail.contains("no /sys/class/kfd"), "{}", none[0].detail);
        assert!(none[1].detail.contains("no GPU"), "{}", none[1].detail);
        // The test VM: a process with /dev/kfd open, no GPU device.
        let vm = vram_gpus::Survey { kfd_proc: true, processes: 1, ..Default::default() };
        let items = vram_items(&vm);
        assert!(items[0].ok && items[0].detail.contains("pasid only"), "{}", items[0].detail);
        let gpus = vec![
            vram_gpus::Gpu {
                gpu_id: 48879,
                used: vram_gpus::UsedMemory::Amdgpu(
                    "/sys/class/drm/renderD128/device/mem_info_vram_used".into(),
                ),
            },
            vram_gpus::Gpu { gpu_id: 1234, used: vram_gpus::UsedMemory::Unknown("no file") },
        ];
        let node = vram_gpus::Survey { kfd_proc: true, processes: 3, with_vram: 2, unreadable: 1, gpus };
        let items = vram_items(&node);
        assert!(
            items[0].detail.contains("3 processes, 2 with vram_<gpu_id> files, 1 gone"),
            "{}",
            items[0].detail
        );
        assert!(items[1].ok);
        assert!(items[1].detail.contains("GPU 48879 from /sys/class/drm/renderD128"), "{}", items[1].detail);
        assert!(items[1].detail.contains("GPU 1234: not computed, no file"), "{}", items[1].detail);
    }
}
