//! C programs and libraries the integration tests run: small stand-ins for
//! inference workers that call the real HIP runtime, and NVIDIA's real
//! driver userspace and CUDA runtimes, fetched into target/nvidia.
use std::process::Command;

use anyhow::Result;

use crate::{root, run, step};

const HIP_LIB: &str = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5";

pub fn build_all() -> Result<std::path::PathBuf> {
    let src = root().join("tests/fixtures");
    let out = root().join("target/fixtures");
    std::fs::create_dir_all(&out)?;
    // First: fixtures link NVIDIA's runtime, one of them statically.
    step("NVIDIA's driver userspace and CUDA runtimes in target/nvidia (tests/nvidia/fetch.sh)");
    run(Command::new(root().join("tests/nvidia/fetch.sh")).stdout(std::process::Stdio::null()))?;
    let paths = std::fs::read_to_string(root().join("target/nvidia/paths.env"))?;
    let path_of = |key: &str| {
        paths
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .ok_or_else(|| anyhow::anyhow!("target/nvidia/paths.env names no {key}"))
    };
    let (cudart13, cudart_static) = (path_of("CUDART13")?, path_of("CUDART13_STATIC")?);
    let cudart12_static = path_of("CUDART12_STATIC")?;
    step("building test fixtures (gcc) into target/fixtures");
    run(Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(&src)
        .arg(format!("OUT={}", out.display()))
        .arg(format!("HIP_LIB={HIP_LIB}"))
        .arg(format!("CUDART13={cudart13}"))
        .arg(format!("CUDART_STATIC={cudart_static}"))
        .arg(format!("CUDART12_STATIC={cudart12_static}")))?;
    Ok(out)
}
