//! NVIDIA's CUDA runtime linked into an executable (`nvcc`'s default,
//! `-cudart static`): there is no `libcudart` file to find, so the
//! executable itself is probed, at the runtime's functions in its own
//! symbol table. Symbol tables are read only of executables that carry the
//! runtime's mark and can reach a CUDA driver library (the discovery side
//! decides which), never of every exec on the node.
use std::{fs, os::unix::fs::MetadataExt, path::Path};

use object::Object;
use observer_common::gpu::Api;

use super::{resolve_functions, FileId, Flavor, GpuLibrary, LibraryError};

/// An executable larger than this is not read (as for its run path).
const MAX_EXE_BYTES: u64 = 512 << 20;

/// Every CUDA runtime carries its error names for `cudaGetErrorName`; a
/// stripped executable that has them has the runtime linked in.
const RUNTIME_MARK: &[u8] = b"cudaErrorInsufficientDriver";

/// What an executable holds of the CUDA runtime.
#[derive(Debug)]
pub enum LinkedRuntime {
    /// The runtime's functions, found in its symbol table: probe them.
    Probe(GpuLibrary),
    /// The runtime is linked in, but the file has no symbol table: its
    /// calls cannot be told apart from the rest of the code.
    Stripped,
    /// No CUDA runtime in it.
    Absent,
}

/// Whether a file's bytes carry the CUDA runtime's error names.
pub fn carries_runtime_mark(data: &[u8]) -> bool {
    memchr::memmem::find(data, RUNTIME_MARK).is_some()
}

pub fn inspect_executable(path: &Path, display_path: &str) -> Result<LinkedRuntime, LibraryError> {
    let io_err = |source| LibraryError::Io { path: display_path.to_string(), source };
    let meta = fs::metadata(path).map_err(io_err)?;
    if meta.len() > MAX_EXE_BYTES {
        return Ok(LinkedRuntime::Absent);
    }
    let data = fs::read(path).map_err(io_err)?;
    let file = object::File::parse(&*data)
        .map_err(|e| LibraryError::NotElf { path: display_path.to_string(), reason: e.to_string() })?;
    if file.symbol_table().is_none() {
        let stripped = carries_runtime_mark(&data);
        return Ok(if stripped { LinkedRuntime::Stripped } else { LinkedRuntime::Absent });
    }
    // Undefined references (an executable that calls a runtime file's
    // functions) are no definitions and resolve to nothing.
    let (functions, aliases) = resolve_functions(&file, file.symbols(), Api::Cudart.functions());
    if functions.is_empty() {
        return Ok(LinkedRuntime::Absent);
    }
    Ok(LinkedRuntime::Probe(GpuLibrary {
        path: path.to_path_buf(),
        display_path: display_path.to_string(),
        id: FileId { dev: meta.dev(), ino: meta.ino() },
        flavor: Flavor::Cudart,
        functions,
        aliases,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_executable_without_the_runtime_is_left_alone() {
        // This test binary: ELF, a symbol table, no CUDA runtime.
        let me = std::env::current_exe().expect("test binary");
        let found = inspect_executable(&me, "test").expect("an ELF file");
        assert!(matches!(found, LinkedRuntime::Absent), "{found:?}");
    }

    #[test]
    fn a_file_that_is_no_elf_names_its_path() {
        let dir = std::env::temp_dir().join(format!("canaryscope-linked-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("script");
        fs::write(&path, "#!/bin/sh\necho cudaErrorInsufficientDriver\n").expect("write");
        let err = inspect_executable(&path, "/app/script").expect_err("no ELF");
        assert!(err.to_string().starts_with("/app/script: not an ELF"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }
}
