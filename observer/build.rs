//! Builds the eBPF object with Debian's Rust (the only compiler here that
//! ships a prebuilt `core` for bpfel-unknown-none) and hands its path to the
//! crate, which embeds it. aya-build would run `rustup run nightly` with
//! `-Z build-std`, which cannot work offline; this does the same job with the
//! toolchain that exists.
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("observer/ sits in the workspace root").to_path_buf();
    let ebpf_dir = root.join("observer-ebpf");
    for dir in
        ["observer-ebpf/src", "observer-common/src", "observer-ebpf/Cargo.toml", "observer-common/Cargo.toml"]
    {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed=CANARYSCOPE_EBPF_OBJECT");

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("canaryscope.bpf.o");
    if let Ok(prebuilt) = env::var("CANARYSCOPE_EBPF_OBJECT") {
        copy(Path::new(&prebuilt), &out);
        return;
    }

    let debian_rustc = Path::new("/usr/bin/rustc");
    let debian_cargo = Path::new("/usr/bin/cargo");
    if !debian_rustc.exists() || !debian_cargo.exists() {
        panic!(
            "building the eBPF programs needs Debian's Rust (rustc-web, libstd-rust-web-dev-bpf) \
             and bpf-linker: run scripts/setup.sh as root first"
        );
    }
    let target_dir = root.join("target").join("ebpf");
    let mut cmd = Command::new(debian_cargo);
    // The outer cargo exports its own toolchain, flags and jobserver; none of
    // that applies to a build for another target with another compiler.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO") || key.starts_with("RUST") {
            cmd.env_remove(&key);
        }
    }
    let status = cmd
        .current_dir(&ebpf_dir)
        .env("RUSTC", debian_rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", &target_dir)
        .args(["build", "--release", "--target", "bpfel-unknown-none"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", debian_cargo.display()));
    if !status.success() {
        panic!("building observer-ebpf failed ({status}); see the errors above");
    }
    copy(&target_dir.join("bpfel-unknown-none/release/observer"), &out);
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), to.display()));
}
