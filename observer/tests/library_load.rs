//! GPU libraries that fail to load, through the real loader: CuPy's cuBLAS
//! binding module from CuPy's own wheel (`tests/nvidia/fetch.sh`), which
//! needs `libcublas.so.12` from a wheel not installed here, imported by
//! Python as an application would. Python reports an ImportError and goes
//! on; canaryscope names the module and the missing file, counts it per
//! pod, and a gated pod gets a reason of its own.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;
use test_support::{
    assert_root,
    gate::{gated, wait_gate},
    in_vm,
    k8s::{control, scheduled_pod, scratch_dir, start_apiserver_with, write_kubeconfig, NodePod},
    metric_value, random_hex, random_pod_uid, Daemon, PodCgroup, Tracer,
};

const MODULE: &str = "cublas.cpython-311-x86_64-linux-gnu.so";
const MISSING: &str = "libcublas.so.12";

/// Event waits are generous: the VM runs under software emulation.
fn wait() -> Duration {
    Duration::from_secs(if in_vm() { 60 } else { 20 })
}

/// CuPy's module in a site-packages layout of its own; removed on drop.
struct Site {
    dir: PathBuf,
    module: PathBuf,
}

impl Site {
    fn new() -> Self {
        let env = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nvidia/paths.env");
        let text = fs::read_to_string(&env).unwrap_or_else(|e| {
            panic!("{}: {e}; run tests/nvidia/fetch.sh (cargo xtask test does)", env.display())
        });
        let source = text
            .lines()
            .find_map(|l| l.strip_prefix("CUPY_CUBLAS="))
            .unwrap_or_else(|| panic!("CUPY_CUBLAS missing from {}", env.display()));
        let dir = std::env::temp_dir().join(format!("canaryscope-load-{}", random_hex(12)));
        let module = dir.join("site-packages/cupy_backends/cuda/libs").join(MODULE);
        fs::create_dir_all(module.parent().expect("dir")).expect("mkdir");
        fs::copy(source, &module).expect("copy CuPy's module");
        Self { dir, module }
    }

    /// Python in `pod`: a failed load of a library that is no GPU's, then
    /// the import of CuPy's module.
    fn command(&self, pod: &PodCgroup) -> Command {
        let script = "import ctypes, importlib.util as u, json, os, sys\n\
                      try:\n    ctypes.CDLL('libcanaryscope_absent_test.so')\nexcept OSError:\n    pass\n\
                      spec = u.spec_from_file_location('cupy_backends.cuda.libs.cublas', sys.argv[1])\n\
                      try:\n    u.module_from_spec(spec)\n    error = None\nexcept ImportError as e:\n    error = str(e)\n\
                      print(json.dumps({'pid': os.getpid(), 'error': error}))\n";
        let mut cmd = pod.command(Path::new("/usr/bin/python3"));
        cmd.arg("-c").arg(script).arg(&self.module);
        cmd
    }

    /// Its pid and the ImportError it printed.
    fn printed(out: std::process::Output) -> (u64, String) {
        assert!(out.status.success(), "{out:?}");
        let printed: Value = serde_json::from_slice(&out.stdout).expect("python prints JSON");
        let error = printed["error"].as_str().unwrap_or_default().to_string();
        (printed["pid"].as_u64().expect("pid"), error)
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The trace names the module Python asked for and the file its loader
/// could not find, from the process's own view; a failed load of a library
/// that is no GPU's is no event.
#[test]
#[ignore = "needs root, python3 and CuPy's module (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn a_gpu_library_that_fails_to_load_names_the_missing_file() {
    assert_root();
    let tracer = Tracer::start(&["--hot-calls", "none"]);
    let pod = PodCgroup::new(&random_pod_uid(), &random_hex(64));
    let site = Site::new();
    let (pid, error) = Site::printed(site.command(&pod).output().expect("run python3"));
    assert!(error.contains(MISSING), "Python's own words: {error}");
    let event = tracer
        .wait_for("the failed load", wait(), |e| e["kind"] == "gpu_library_load_failed" && e["pid"] == pid);
    assert_eq!(event["library"], MODULE, "{event}");
    assert_eq!(event["missing"], MISSING, "{event}");
    assert_eq!(event["gpu_library"], MISSING, "{event}");
    assert_eq!(event["path"], site.module.to_str().expect("utf8"), "{event}");
    assert_eq!(event["requested"], site.module.to_str().expect("utf8"), "{event}");
    assert_eq!(event["comm"], "python3", "{event}");
    // The ring buffer keeps one process's records in order: the earlier
    // failure, of a library that is no GPU's, would be here.
    let others: Vec<Value> = tracer
        .events()
        .into_iter()
        .filter(|e| e["kind"] == "gpu_library_load_failed" && e["pid"] == pid && e["library"] != MODULE)
        .collect();
    assert!(others.is_empty(), "{others:?}");
}

/// A gated canary pod whose framework cannot load its GPU library: counted
/// per pod with both names, as a failed GPU start-up of its revision, and
/// kept out of traffic with a reason of its own.
#[test]
#[ignore = "needs root, python3 and CuPy's module (tests/nvidia/fetch.sh); run by `cargo xtask test`"]
fn a_gated_pod_whose_gpu_library_fails_to_load_gets_library_load_failed() {
    assert_root();
    let dir = scratch_dir();
    let name = "infer-canaryhash-load1";
    let spec = gated(scheduled_pod(name, &random_pod_uid(), "canary", "canaryhash"));
    let (_api, api_port) = start_apiserver_with(&dir, None, None);
    let kubeconfig = write_kubeconfig(&dir, api_port);
    let daemon = Daemon::on_node(&kubeconfig, &["--hot-calls", "none"]);
    let site = Site::new();
    // Scheduled: no container yet; then the kubelet's order.
    let node_pod = NodePod::schedule(api_port, spec, Duration::from_millis(200));
    let pod_cgroup = node_pod.create("worker");
    let (_, error) = Site::printed(node_pod.output(&pod_cgroup, &mut site.command(&pod_cgroup)));
    assert!(error.contains(MISSING), "{error}");
    // The count first: it needs no API server, so a failure below says
    // whether the daemon saw the failed load at all.
    let line = daemon.wait_metric("the pod's failed load", wait(), |l| {
        l.starts_with("canaryscope_gpu_library_load_failures_total{")
            && l.contains(&format!("pod=\"{name}\""))
            && l.contains(&format!("library=\"{MODULE}\""))
            && l.contains(&format!("missing=\"{MISSING}\""))
    });
    assert_eq!(metric_value(&line), 1.0, "{line}");
    let want = format!("container worker: dlopen of {MODULE} failed: {MISSING} not found");
    // The kubelet names the container 0.2 s after its start: a condition
    // written before says its short ID, and is rewritten.
    let matches = |c: &Value| {
        c["status"] == "False" && c["reason"] == "LibraryLoadFailed" && c["message"] == want.as_str()
    };
    if let Err((condition, pod)) = wait_gate(api_port, name, wait(), matches) {
        let gate: Vec<String> = daemon
            .metrics()
            .lines()
            .filter(|l| l.starts_with("canaryscope_readiness_gate_"))
            .map(str::to_string)
            .collect();
        let patches = control(api_port, "GET", "/control/patches", "");
        panic!("no False/LibraryLoadFailed {want:?}: {condition:?}\npod: {pod}\ngate: {gate:#?}\npatches: {patches}");
    }
    let startup = daemon.wait_metric("the revision's failed start-up", wait(), |l| {
        l.starts_with("canaryscope_gpu_startup_failures_total{") && l.contains("revision=\"canaryhash\"")
    });
    assert_eq!(metric_value(&startup), 1.0, "{startup}");
    let _ = fs::remove_dir_all(&dir);
}
