//! NVIDIA's CUDA runtime (`libcudart`), the layer frameworks call, on
//! NVIDIA's real libraries: Debian's 535 driver userspace (no kernel module,
//! so its `cuInit` returns 100) and the 11.8, 12.9 and 13.x runtimes, which
//! `tests/nvidia/fetch.sh` (run by `cargo xtask test`) puts under target/.
//! Every case runs on fresh copies of the files (new inodes), without
//! `--lib`, and under the hold, so a first call right after the mapping is
//! seen by design.
mod support;

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;
use support::*;

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
        let out = detached(cmd);
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
    let call = tracer.wait_for("cudaGetDeviceCount", wait(), |e| {
        e["kind"] == "gpu_call" && e["function"] == "cudaGetDeviceCount" && e["pid"] == pid
    });
    assert_eq!(call["api"], "cudart", "{call}");
    assert_eq!(call["result"], 35);
    assert_eq!(call["result_name"], "cudaErrorInsufficientDriver");
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
    assert_eq!(thirteen.probe(&pod).1["device_count_rc"], 35);
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
