//! NVIDIA's CUDA runtime (or HIP's) linked into an executable (`nvcc`'s
//! default, `-cudart static`) or into a shared object (CuPy's extension
//! modules carry `libcudart_static.a`): there is no `libcudart` file to
//! find, so the file that carries it is probed, at the runtime's functions
//! in its own symbol table (`.symtab`, where they are local symbols of a
//! shared object built with `--exclude-libs`). Symbol tables are read only
//! of files the discovery side picks (an executable that carries the
//! runtime's mark, the objects of a process that maps a CUDA driver
//! library), once per inode, never of every file on the node.
use std::{fs, os::unix::fs::MetadataExt, path::Path};

use object::{Object, ObjectSection, ReadCache, ReadRef};
use observer_common::gpu::Api;

use super::{dynamic_strings, resolve_functions, FileId, Flavor, GpuLibrary, LibraryError};

/// An executable larger than this is not read (as for its run path).
const MAX_EXE_BYTES: u64 = 512 << 20;
/// A shared object's symbol table, or the read-only data searched for the
/// runtime's mark when it has none, is not read past this size: a
/// framework's multi-gigabyte library costs at most this much, once.
const MAX_SECTION_BYTES: u64 = 128 << 20;

/// Every CUDA runtime carries its error names for `cudaGetErrorName`; a
/// stripped executable that has them has the runtime linked in.
const RUNTIME_MARK: &[u8] = b"cudaErrorInsufficientDriver";

/// What an executable holds of the CUDA runtime.
#[derive(Debug)]
pub enum LinkedRuntime {
    /// The runtime's functions, found in its symbol table: probe them.
    Probe(GpuLibrary),
    /// The CUDA runtime is linked in, but the file has no symbol table:
    /// its calls cannot be told apart from the rest of the code.
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

/// What a shared object holds of a GPU runtime. Only the ELF headers,
/// the symbol table and, for a stripped file, its read-only data are read
/// (the file is never read whole: frameworks' libraries reach gigabytes).
/// A versioned definition (`cudaGetDeviceCount@@libcudart.so.12`) counts
/// as its plain name.
pub fn inspect_shared_object(path: &Path, display_path: &str) -> Result<LinkedRuntime, LibraryError> {
    let io_err = |source| LibraryError::Io { path: display_path.to_string(), source };
    let handle = fs::File::open(path).map_err(io_err)?;
    let meta = handle.metadata().map_err(io_err)?;
    let cache = ReadCache::new(handle);
    let file = object::File::parse(&cache)
        .map_err(|e| LibraryError::NotElf { path: display_path.to_string(), reason: e.to_string() })?;
    let symtab_bytes = file.section_by_name(".symtab").map(|s| s.size()).unwrap_or(0)
        + file.section_by_name(".strtab").map(|s| s.size()).unwrap_or(0);
    if file.symbol_table().is_none() || symtab_bytes > MAX_SECTION_BYTES {
        return Ok(if stripped_with_runtime(&file) {
            LinkedRuntime::Stripped
        } else {
            LinkedRuntime::Absent
        });
    }
    for flavor in [Flavor::Cudart, Flavor::Hip] {
        let (functions, aliases) = resolve_functions(&file, file.symbols(), flavor.api().functions());
        if !functions.is_empty() {
            return Ok(LinkedRuntime::Probe(GpuLibrary {
                path: path.to_path_buf(),
                display_path: display_path.to_string(),
                id: FileId { dev: meta.dev(), ino: meta.ino() },
                flavor,
                functions,
                aliases,
            }));
        }
    }
    Ok(LinkedRuntime::Absent)
}

/// A file without a symbol table that carries the CUDA runtime's error
/// names in its read-only data and loads no runtime file: it has the
/// runtime linked in (a framework that merely calls a `libcudart` file
/// needs it, and is left alone).
fn stripped_with_runtime<'data, R: ReadRef<'data>>(file: &object::File<'data, R>) -> bool {
    if dynamic_strings(file, &[object::elf::DT_NEEDED]).iter().any(|n| n.starts_with("libcudart")) {
        return false;
    }
    file.sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".rodata")) && s.size() <= MAX_SECTION_BYTES)
        .any(|s| s.data().is_ok_and(carries_runtime_mark))
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
