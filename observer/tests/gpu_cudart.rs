//! NVIDIA's CUDA runtime (`libcudart`), the layer frameworks call, on
//! NVIDIA's real libraries: Debian's 535 driver userspace (no kernel module,
//! so its `cuInit` returns 100) and the 11.8, 12.9 and 13.x runtimes, which
//! `tests/nvidia/fetch.sh` (run by `cargo xtask test`) puts under target/.
//! Every case runs on fresh copies of the files (new inodes), without
//! `--lib`, and under the hold, so a first call right after the mapping is
//! seen by design.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;
use test_support::{
    assert_root, canaryscope, fixture,
    gate::{gated, wait_gate},
    in_vm,
    k8s::{scheduled_pod, scratch_dir, start_apiserver_with, write_kubeconfig, NodePod},
    metric_value, out_pid, random_hex, random_pod_uid, Daemon, PodCgroup, Tracer,
};

/// Init failures are cold calls, probed in every process; the hot tier is
/// left out because every probed function costs the kernel a grace period
/// to release when the tracer stops.
const TRACE: &[&str] = &["--hold", "--hot-calls", "none"];

/// Event waits are generous: the VM runs under software emulation.
fn wait() -> Duration {
    Duration::from_secs(if in_vm() { 60 } else { 20 })
}

/// The fetched libraries, by the keys of target/nvidia/paths.env.
fn nvidia() -> BTreeMap<String, PathBuf> {
    let env = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nvidia/paths.env");
    let text = fs::read_to_string(&env).unwrap_or_else(|e| {
        panic!("{}: {e}; run tests/nvidia/fetch.sh (cargo xtask test does)", env.display())
    });
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), PathBuf::from(v))).collect()
}

fn library(key: &str) -> PathBuf {
    nvidia().remove(key).unwrap_or_else(|| panic!("{key} missing from target/nvidia/paths.env"))
}

/// Fresh copies of a runtime, in a wheel's layout, and of the driver
/// library, in a directory of their own; removed on drop.
struct Copies {
    dir: PathBuf,
    runtime: PathBuf,
    driver_dir: PathBuf,
}

impl Copies {
    fn new(runtime_key: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("canaryscope-cudart-{}", random_hex(12)));
        let source = library(runtime_key);
        let name = source.file_name().expect("file name");
        let runtime = dir.join("site-packages/nvidia/cuda_runtime/lib").join(name);
        let driver_dir = dir.join("driver");
        for d in [runtime.parent().expect("dir"), &driver_dir] {
            fs::create_dir_all(d).expect("mkdir");
        }
        fs::copy(&source, &runtime).expect("copy the runtime");
        fs::copy(library("LIBCUDA"), driver_dir.join("libcuda.so.1")).expect("copy libcuda");
        Self { dir, runtime, driver_dir }
    }

    fn runtime(&self) -> &str {
        self.runtime.to_str().expect("utf8")
    }

    fn driver(&self) -> String {
        self.driver_dir.join("libcuda.so.1").display().to_string()
    }

    /// `cudart_probe` on the copy, in `pod`: cudaDriverGetVersion, then
    /// cudaGetDeviceCount. Returns its pid and what it printed.
    fn probe(&self, pod: &PodCgroup) -> (u64, Value) {
        let mut cmd = pod.command(&fixture("cudart_probe"));
        cmd.arg(&self.runtime).env("LD_LIBRARY_PATH", &self.driver_dir);
        Self::printed(detached(cmd))
    }

    /// [`Self::probe`] as the first process of the container of `cg` in
    /// `pod`, whose start the kubelet reports.
    fn probe_in(&self, pod: &test_support::k8s::NodePod, cg: &PodCgroup) -> (u64, Value) {
        use std::os::unix::process::CommandExt;
        let mut cmd = cg.command(&fixture("cudart_probe"));
        cmd.arg(&self.runtime).env("LD_LIBRARY_PATH", &self.driver_dir);
        // SAFETY: setsid is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        Self::printed(pod.output(cg, &mut cmd))
    }

    fn printed(out: std::process::Output) -> (u64, Value) {
        assert!(out.status.success(), "{out:?}");
        let printed: Value = serde_json::from_slice(&out.stdout).expect("cudart_probe prints JSON");
        (printed["pid"].as_u64().expect("pid"), printed)
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Runs a command in a session of its own: the hold never stops a process
/// a shell's job control could see.
fn detached(mut cmd: Command) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.output().expect("run cudart_probe")
}

#[test]
#[ignore = "needs root and NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn the_cuda_13_runtimes_insufficient_driver_is_a_runtime_failure() {
    assert_root();
    let copies = Copies::new("CUDART13");
    let tracer = Tracer::start(TRACE);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let (pid, printed) = copies.probe(&pod);
    // What the runtime told its caller, as the fixture saw it.
    assert_eq!(printed["device_count_rc"], 35, "{printed}");
    assert_eq!(printed["driver_version_rc"], 0, "{printed}");
    let call = tracer.wait_for("cudaGetDeviceCount", wait(), |e| {
        e["kind"] == "gpu_call" && e["function"] == "cudaGetDeviceCount" && e["pid"] == pid
    });
    assert_eq!(call["api"], "cudart", "{call}");
    assert_eq!(call["result"], 35);
    assert_eq!(call["result_name"], "cudaErrorInsufficientDriver");
    // The version the driver gave this process before the failure: what
    // tells a runtime too new for the driver from a missing device.
    assert!(printed["driver_version"].as_i64().is_some_and(|v| v > 0), "{printed}");
    assert_eq!(call["driver_version"], printed["driver_version"], "{call}");
    assert_eq!(call["library"], copies.runtime());
    assert_eq!(call["cgroup"], pod.rel.as_str());
    // Neither file was named by --lib: the runtime, opened by path, was
    // found at its mapping (its process held until probed); the driver
    // library, which the process's loader finds by name, at exec.
    let probed = |file: &str| {
        tracer.wait_for(&format!("probes of {file}"), wait(), |e| {
            e["kind"] == "library_probed" && e["library"] == file
        })
    };
    let runtime = probed(copies.runtime());
    assert_eq!(runtime["flavor"], "cudart", "{runtime}");
    assert!(runtime["reason"].as_str().is_some_and(|r| r.ends_with("held until probed")), "{runtime}");
    let driver = probed(&copies.driver());
    assert_eq!(driver["flavor"], "nvidia", "{driver}");
    assert!(
        driver["reason"].as_str().is_some_and(|r| r.starts_with("LD_LIBRARY_PATH of cudart_probe")),
        "{driver}"
    );
    // The driver layer beneath saw no failure: the runtime gave up on the
    // driver's version without calling cuInit.
    let (_, events) = tracer.stop();
    let driver_failures: Vec<&Value> =
        events.iter().filter(|e| e["kind"] == "gpu_call" && e["pid"] == pid && e["api"] == "cuda").collect();
    assert!(driver_failures.is_empty(), "{driver_failures:?}");
}

#[test]
#[ignore = "needs root and NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn no_device_is_seen_at_both_layers_of_the_11_8_and_12_runtimes() {
    assert_root();
    let tracer = Tracer::start(TRACE);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    for key in ["CUDART11", "CUDART12"] {
        let copies = Copies::new(key);
        let (pid, printed) = copies.probe(&pod);
        assert_eq!(printed["device_count_rc"], 100, "{key}: {printed}");
        let runtime = tracer.wait_for(&format!("{key}'s cudaGetDeviceCount"), wait(), |e| {
            e["kind"] == "gpu_call" && e["function"] == "cudaGetDeviceCount" && e["pid"] == pid
        });
        assert_eq!(runtime["api"], "cudart", "{key}: {runtime}");
        assert_eq!(runtime["result_name"], "cudaErrorNoDevice", "{key}: {runtime}");
        assert_eq!(runtime["library"], copies.runtime(), "{key}");
        let driver = tracer.wait_for(&format!("{key}'s cuInit"), wait(), |e| {
            e["kind"] == "gpu_call" && e["function"] == "cuInit" && e["pid"] == pid
        });
        assert_eq!(driver["api"], "cuda", "{key}: {driver}");
        assert_eq!(driver["result_name"], "CUDA_ERROR_NO_DEVICE", "{key}: {driver}");
        assert_eq!(driver["library"], copies.driver().as_str(), "{key}");
        assert_eq!(runtime["driver_version"], printed["driver_version"], "{key}: {runtime}");
        assert_eq!(driver["driver_version"], printed["driver_version"], "{key}: {driver}");
        // The driver's failure happened inside the runtime's call.
        assert_eq!(driver["tid"], runtime["tid"], "{key}");
        assert!(driver["ts_ns"].as_u64() <= runtime["ts_ns"].as_u64(), "{key}: {driver} after {runtime}");
    }
}

#[test]
#[ignore = "needs root and NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn each_layer_counts_its_own_init_failure() {
    assert_root();
    let daemon = Daemon::start(&["--no-kubernetes", "--hold", "--hot-calls", "none"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let thirteen = Copies::new("CUDART13");
    let told = thirteen.probe(&pod).1;
    assert_eq!(told["device_count_rc"], 35);
    let eleven = Copies::new("CUDART11");
    assert_eq!(eleven.probe(&pod).1["device_count_rc"], 100);
    let container = pod.short_container_id();
    // One series per layer, function and result of this pod's container.
    let series = |api: &str, function: &str, result: &str| {
        let labels =
            [format!("api=\"{api}\""), format!("function=\"{function}\""), format!("result=\"{result}\"")];
        let container = container.clone();
        move |l: &str| {
            l.starts_with("canaryscope_gpu_init_failures_total{")
                && l.contains(&container)
                && labels.iter().all(|label| l.contains(label.as_str()))
        }
    };
    // Once per start-up and layer: 35 and 100 from the runtimes, 100 from
    // the driver beneath the 11.8 runtime only.
    for (api, function, result) in [
        ("cudart", "cudaGetDeviceCount", "cudaErrorInsufficientDriver"),
        ("cudart", "cudaGetDeviceCount", "cudaErrorNoDevice"),
        ("cuda", "cuInit", "CUDA_ERROR_NO_DEVICE"),
    ] {
        let line =
            daemon.wait_metric(&format!("{api} {function} {result}"), wait(), series(api, function, result));
        assert_eq!(metric_value(&line), 1.0, "{line}");
    }
    let text = daemon.metrics();
    let cu_init = series("cuda", "cuInit", "CUDA_ERROR_NO_DEVICE");
    assert_eq!(text.lines().filter(|l| cu_init(l)).count(), 1, "one driver series: {text}");
    // The driver version the pod's processes were told, per pod.
    let version = daemon.wait_metric("the pod's driver version", wait(), |l| {
        l.starts_with("canaryscope_gpu_driver_version{") && l.contains(&container)
    });
    assert_eq!(Some(metric_value(&version) as i64), told["driver_version"].as_i64(), "{version}");
}

/// A gated canary pod as the DaemonSet sees it (Kubernetes, no `--hold`),
/// in a rollout's order: the daemon runs, the pod is scheduled (Pending),
/// its container's cgroup appears and its worker starts at once; the
/// kubelet names the container 0.2 s later. The
/// worker's runtime is newer than the node's driver. The pod is kept out of
/// traffic with the call the application made, the runtime's error and the
/// version the driver reported.
#[test]
#[ignore = "needs root, python3 and NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn a_gated_pod_whose_runtime_is_newer_than_the_driver_gets_init_failed() {
    assert_root();
    let dir = scratch_dir();
    let name = "infer-canaryhash-cudart1";
    let spec = gated(scheduled_pod(name, &random_pod_uid(), "canary", "canaryhash"));
    let (_api, api_port) = start_apiserver_with(&dir, None, None);
    let kubeconfig = write_kubeconfig(&dir, api_port);
    let _daemon = Daemon::on_node(&kubeconfig, &["--hot-calls", "none"]);
    let copies = Copies::new("CUDART13");
    // Scheduled: no container yet.
    let node_pod = NodePod::schedule(api_port, spec, Duration::from_millis(200));
    let pod_cgroup = node_pod.create("worker");
    let printed = copies.probe_in(&node_pod, &pod_cgroup).1;
    assert_eq!(printed["device_count_rc"], 35, "{printed}");
    let version = printed["driver_version"].as_i64().expect("the driver's version");
    let want = format!(
        "container worker: cudaGetDeviceCount returned 35 cudaErrorInsufficientDriver (driver reports CUDA {}.{})",
        version / 1000,
        (version % 1000) / 10
    );
    // The kubelet names the container 0.2 s after its start: a condition
    // written before says its short ID, and is rewritten.
    let matches =
        |c: &Value| c["status"] == "False" && c["reason"] == "InitFailed" && c["message"] == want.as_str();
    if let Err((condition, _)) = wait_gate(api_port, name, wait(), matches) {
        panic!("no False/InitFailed condition {want:?}: {condition:?}");
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn runtime_error_names_are_the_runtimes_own() {
    for key in ["CUDART11", "CUDART12", "CUDART13"] {
        let out = Command::new(fixture("cudart_probe"))
            .arg(library(key))
            .arg("--names")
            .output()
            .expect("run cudart_probe --names");
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut checked = 0;
        for line in text.lines() {
            let (code, name) = line.split_once(' ').expect("CODE NAME");
            let code: i32 = code.parse().expect("a code");
            assert_eq!(observer::names::cuda_error_name(code), Some(name), "{key}: code {code}");
            checked += 1;
        }
        // Every runtime names over a hundred codes (11.8: 124).
        assert!(checked > 100, "{key}: only {checked} names");
    }
}

/// NVIDIA's own driver library (`Flavor::Nvidia`), with no runtime above
/// it: a framework's loader `dlopen`s it by path, an application linked
/// with `-lcuda` gets it through `DT_NEEDED`. Either way its `cuInit`
/// fails with 100 here (no kernel module) and is seen in the driver layer.
#[test]
#[ignore = "needs root and NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn nvidias_libcuda_fails_cuinit_through_dlopen_and_dt_needed() {
    assert_root();
    let tracer = Tracer::start(TRACE);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let by_dlopen = Copies::new("CUDART12");
    let by_needed = Copies::new("CUDART12");
    let runs = [
        ("dlopen", by_dlopen.driver(), {
            let mut cmd = pod.command(&fixture("gpu_dlopen"));
            cmd.arg(by_dlopen.driver());
            cmd
        }),
        ("DT_NEEDED", by_needed.driver(), {
            let mut cmd = pod.command(&fixture("cuda_needed"));
            cmd.env("LD_LIBRARY_PATH", &by_needed.driver_dir);
            cmd
        }),
    ];
    for (how, library, cmd) in runs {
        let out = detached(cmd);
        assert!(out.status.success(), "{how}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        // gpu_dlopen prints init=R, cuda_needed cuInit=R.
        assert!(text.split_whitespace().any(|w| w == "init=100" || w == "cuInit=100"), "{how}: {text}");
        let pid = out_pid(&out.stdout);
        let call = tracer.wait_for(&format!("cuInit by {how}"), wait(), |e| {
            e["kind"] == "gpu_call" && e["function"] == "cuInit" && e["pid"] == pid
        });
        assert_eq!(call["api"], "cuda", "{how}: {call}");
        assert_eq!(call["result_name"], "CUDA_ERROR_NO_DEVICE", "{how}: {call}");
        assert_eq!(call["library"], library.as_str(), "{how}: {call}");
        let probed = tracer.wait_for(&format!("probes of {library}"), wait(), |e| {
            e["kind"] == "library_probed" && e["library"] == library.as_str()
        });
        assert_eq!(probed["flavor"], "nvidia", "{how}: {probed}");
    }
}

/// A runtime file that is cut short, is no ELF, or exports nothing probed
/// is refused with a reason naming it; it is never probed half-way.
#[test]
#[ignore = "needs NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn a_broken_runtime_file_is_refused_with_its_reason() {
    use observer::gpu_library::inspect;
    let dir = std::env::temp_dir().join(format!("canaryscope-bad-cudart-{}", random_hex(12)));
    fs::create_dir_all(&dir).expect("mkdir");
    let whole = fs::read(library("CUDART13")).expect("read the runtime");
    // The good file first: the cases below differ from it in one way each.
    let good = dir.join("libcudart.so.13");
    fs::write(&good, &whole).expect("write");
    let probed = inspect(&good, "libcudart.so.13").expect("the real runtime is probed");
    assert!(probed.functions.contains_key("cudaGetDeviceCount"), "{:?}", probed.functions);
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("truncated/libcudart.so.13", whole[..4096].to_vec(), "not an ELF shared object"),
        ("text/libcudart.so.12", b"INPUT(libcudart.so.12.9)\n".to_vec(), "not an ELF shared object"),
        (
            "symbol-less/libcudart.so.12",
            fs::read(fixture("pingpong")).expect("an ELF without CUDA symbols"),
            "exports none of the probed cudart functions",
        ),
    ];
    for (name, bytes, why) in cases {
        let path = dir.join(name);
        fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        fs::write(&path, bytes).expect("write");
        let display = path.display().to_string();
        let err = inspect(&path, &display).expect_err(name).to_string();
        assert!(err.starts_with(&display) && err.contains(why), "{name}: {err}");
    }
    let _ = fs::remove_dir_all(&dir);
}

/// NVIDIA's runtime linked into the executable (`nvcc`'s default): no
/// `libcudart` file exists. The executable is probed at its exec, before it
/// runs, at the runtime's functions in its symbol table, so its first
/// runtime call is seen; a stripped copy is named as unprobed, with why.
#[test]
#[ignore = "needs root and NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn a_runtime_linked_into_the_executable_is_probed_there() {
    assert_root();
    let tracer = Tracer::start(TRACE);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    // Fresh copies: new inodes, never seen by the tracer.
    let copies = Copies::new("CUDART13");
    let app = copies.dir.join("app/cudart_static_probe");
    let stripped = copies.dir.join("app/cudart_static_probe_stripped");
    fs::create_dir_all(app.parent().expect("dir")).expect("mkdir");
    fs::copy(fixture("cudart_static_probe"), &app).expect("copy the app");
    fs::copy(fixture("cudart_static_probe_stripped"), &stripped).expect("copy the stripped app");
    let run = |program: &Path| -> Value {
        let mut cmd = pod.command(program);
        cmd.env("LD_LIBRARY_PATH", &copies.driver_dir);
        let out = detached(cmd);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice(&out.stdout).expect("the app prints JSON")
    };
    let printed = run(&app);
    assert_eq!(printed["device_count_rc"], 35, "{printed}");
    let pid = printed["pid"].as_u64().expect("pid");
    let app_path = app.to_str().expect("utf8");
    let probed = tracer
        .wait_for("the app's probes", wait(), |e| e["kind"] == "library_probed" && e["library"] == app_path);
    assert_eq!(probed["flavor"], "cudart", "{probed}");
    assert!(probed["functions"].as_u64().is_some_and(|n| n > 10), "{probed}");
    assert!(
        probed["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("CUDA runtime linked into the executable of")),
        "{probed}"
    );
    // The first process's own calls, the first of them included.
    let call = tracer.wait_for("the app's cudaGetDeviceCount", wait(), |e| {
        e["kind"] == "gpu_call" && e["function"] == "cudaGetDeviceCount" && e["pid"] == pid
    });
    assert_eq!(call["api"], "cudart", "{call}");
    assert_eq!(call["result_name"], "cudaErrorInsufficientDriver", "{call}");
    assert_eq!(call["library"], app_path, "{call}");
    assert_eq!(call["driver_version"], printed["driver_version"], "{call}");

    let printed = run(&stripped);
    assert_eq!(printed["device_count_rc"], 35, "{printed}");
    let stripped_path = stripped.to_str().expect("utf8");
    let refused = tracer.wait_for("the stripped app's notice", wait(), |e| {
        e["kind"] == "library_probed" && e["library"] == stripped_path
    });
    assert_eq!(refused["functions"], 0, "{refused}");
    assert!(
        refused["reason"].as_str().is_some_and(|r| r.contains("stripped of its symbol table")),
        "{refused}"
    );
}

/// NVIDIA's runtime linked into a shared object, as CuPy's extension
/// modules carry it (`libcudart_static.a`, its functions local symbols of
/// `.symtab`): no `libcudart` file exists. The static runtime loads the
/// driver library on its first call; at that mapping (held) the process's
/// other code is read for the runtime and probed, so the calls that follow
/// are seen, whether the object came through `dlopen` (13.x: 35, with the
/// driver's version) or `DT_NEEDED` (12.x: 100 at both layers). A stripped
/// copy is named as unprobed, with why, by the tracer and by `check`.
#[test]
#[ignore = "needs root and NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn a_runtime_linked_into_a_shared_object_is_probed_there() {
    assert_root();
    let tracer = Tracer::start(TRACE);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let copies = Copies::new("CUDART13");
    // Fresh copies, new inodes: CuPy's module name, a DT_NEEDED user with
    // its library beside it, and a stripped module.
    let module =
        copies.dir.join("site-packages/cupy_backends/cuda/api/runtime.cpython-311-x86_64-linux-gnu.so");
    let needed = copies.dir.join("app/cudart_static_needed");
    let needed_lib = copies.dir.join("app/lib/libgpu_static_rt.so");
    let stripped = copies.dir.join("stripped/runtime.cpython-311-x86_64-linux-gnu.so");
    for (from, to) in [
        ("cudart-static-so/cu13/libgpu_static_rt.so", &module),
        ("cudart-static-so/cudart_static_needed", &needed),
        ("cudart-static-so/cu12/libgpu_static_rt.so", &needed_lib),
        ("cudart-static-so/cu13-stripped/libgpu_static_rt.so", &stripped),
    ] {
        fs::create_dir_all(to.parent().expect("dir")).expect("mkdir");
        fs::copy(fixture(from), to).expect("copy a fixture");
    }
    let run = |program: &Path, arg: Option<&Path>| -> (u64, Value) {
        let mut cmd = pod.command(program);
        cmd.args(arg).env("LD_LIBRARY_PATH", &copies.driver_dir);
        let out = detached(cmd);
        assert!(out.status.success(), "{out:?}");
        let printed: Value = serde_json::from_slice(&out.stdout).expect("the app prints JSON");
        (printed["pid"].as_u64().expect("pid"), printed)
    };
    let probed = |path: &Path| {
        let path = path.to_str().expect("utf8").to_string();
        tracer.wait_for(&format!("{path} probed"), wait(), move |e| {
            e["kind"] == "library_probed" && e["library"] == path.as_str()
        })
    };
    let call = |pid: u64, function: &str| {
        tracer.wait_for(&format!("{function} of pid {pid}"), wait(), |e| {
            e["kind"] == "gpu_call" && e["function"] == function && e["pid"] == pid
        })
    };

    // dlopen, 13.x: cudaErrorInsufficientDriver, with the driver's version.
    let (pid, printed) = run(&fixture("cudart-static-so/cudart_static_dlopen"), Some(&module));
    assert_eq!(printed["device_count_rc"], 35, "{printed}");
    let announced = probed(&module);
    assert_eq!(announced["flavor"], "cudart", "{announced}");
    assert!(announced["functions"].as_u64().is_some_and(|n| n > 10), "{announced}");
    let reason = announced["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("CUDA runtime linked into ") && reason.ends_with("held until probed"),
        "{announced}"
    );
    let count = call(pid, "cudaGetDeviceCount");
    assert_eq!(count["api"], "cudart", "{count}");
    assert_eq!(count["library"], module.to_str().expect("utf8"), "{count}");
    assert_eq!(count["result_name"], "cudaErrorInsufficientDriver", "{count}");
    assert_eq!(count["driver_version"], printed["driver_version"], "{count}");

    // DT_NEEDED, 12.x: no device, at the runtime and at the driver beneath.
    let (pid, printed) = run(&needed, None);
    assert_eq!(printed["device_count_rc"], 100, "{printed}");
    assert_eq!(probed(&needed_lib)["flavor"], "cudart");
    let runtime = call(pid, "cudaGetDeviceCount");
    assert_eq!(runtime["library"], needed_lib.to_str().expect("utf8"), "{runtime}");
    assert_eq!(runtime["result_name"], "cudaErrorNoDevice", "{runtime}");
    let driver = call(pid, "cuInit");
    assert_eq!(driver["api"], "cuda", "{driver}");
    assert_eq!(driver["result_name"], "CUDA_ERROR_NO_DEVICE", "{driver}");
    assert_eq!(driver["tid"], runtime["tid"], "the driver's failure inside the runtime's call");

    // Stripped: named, with why, and unprobed.
    let printed = run(&fixture("cudart-static-so/cudart_static_dlopen"), Some(&stripped)).1;
    assert_eq!(printed["device_count_rc"], 35, "{printed}");
    let refused = probed(&stripped);
    assert_eq!(refused["functions"], 0, "{refused}");
    assert!(
        refused["reason"].as_str().is_some_and(|r| r.contains("stripped of its symbol table")),
        "{refused}"
    );
    assert_check_says_stripped(&stripped);
}

/// `check --lib` names a stripped object that carries the runtime, with why.
fn assert_check_says_stripped(stripped: &Path) {
    let out =
        Command::new(canaryscope()).args(["check", "--json", "--lib"]).arg(stripped).output().expect("check");
    let report: Value = serde_json::from_slice(&out.stdout).expect("check --json");
    let entry = report["gpu_libraries"]
        .as_array()
        .and_then(|a| a.iter().find(|l| l["path"].as_str() == stripped.to_str()))
        .unwrap_or_else(|| panic!("the stripped module is missing: {report:#}"));
    assert!(entry["problem"].as_str().is_some_and(|p| p.contains("stripped of its symbol table")), "{entry}");
}

/// A framework's wheel layout: the runtime is reached only through the
/// RUNPATH of the framework's own library (`torch/lib/...` naming
/// `$ORIGIN/../../nvidia/cu13/lib`), never through the executable, its
/// environment or the loader's cache. It is found at its mapping, the
/// process held until it is probed, and its first call is seen.
#[test]
#[ignore = "needs root and NVIDIA's libraries (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn a_runtime_reached_through_a_frameworks_runpath_is_seen_from_its_first_call() {
    assert_root();
    let tracer = Tracer::start(TRACE);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let copies = Copies::new("CUDART13");
    let site = copies.dir.join("venv/lib/python3.11/site-packages");
    let framework = site.join("torch/lib/libtorch_stub.so");
    let runtime = site.join("nvidia/cu13/lib/libcudart.so.13");
    for file in [&framework, &runtime] {
        fs::create_dir_all(file.parent().expect("dir")).expect("mkdir");
    }
    fs::copy(fixture("torch-like/libtorch_stub.so"), &framework).expect("copy the framework library");
    fs::copy(library("CUDART13"), &runtime).expect("copy the runtime");
    // cudart_probe dlopens the framework's library; dlsym through it
    // reaches the runtime that its RUNPATH brought in.
    let mut cmd = pod.command(&fixture("cudart_probe"));
    cmd.arg(&framework).env("LD_LIBRARY_PATH", &copies.driver_dir);
    let out = detached(cmd);
    assert!(out.status.success(), "{out:?}");
    let printed: Value = serde_json::from_slice(&out.stdout).expect("cudart_probe prints JSON");
    assert_eq!(printed["device_count_rc"], 35, "{printed}");
    let pid = printed["pid"].as_u64().expect("pid");
    let runtime_path = runtime.to_str().expect("utf8");
    let probed = tracer.wait_for("the runtime's probes", wait(), |e| {
        e["kind"] == "library_probed" && e["library"] == runtime_path
    });
    assert_eq!(probed["flavor"], "cudart", "{probed}");
    assert!(probed["reason"].as_str().is_some_and(|r| r.ends_with("held until probed")), "{probed}");
    // Its failing call: the probes were there before its first call.
    let first = tracer.wait_for("cudaGetDeviceCount", wait(), |e| {
        e["kind"] == "gpu_call" && e["function"] == "cudaGetDeviceCount" && e["pid"] == pid
    });
    assert_eq!(first["library"], runtime_path, "{first}");
    assert_eq!(first["result_name"], "cudaErrorInsufficientDriver", "{first}");
}
