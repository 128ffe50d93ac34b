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

/// Bytes read at a time when a whole file is searched for the mark.
const MARK_SCAN_CHUNK: usize = 1 << 20;

/// Whether a file carries the CUDA runtime's error names, searched a
/// chunk at a time: executables run to hundreds of megabytes, and the
/// daemon's memory must not grow with the largest one a node starts.
pub fn file_carries_runtime_mark(file: &mut impl std::io::Read) -> std::io::Result<bool> {
    let finder = memchr::memmem::Finder::new(RUNTIME_MARK);
    // A mark split across two reads is found in the next window, which
    // starts with the last `overlap` bytes of this one.
    let overlap = RUNTIME_MARK.len() - 1;
    let mut window = vec![0u8; MARK_SCAN_CHUNK + overlap];
    let mut kept = 0;
    loop {
        let read = match file.read(&mut window[kept..]) {
            Ok(0) => return Ok(false),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let filled = kept + read;
        if finder.find(&window[..filled]).is_some() {
            return Ok(true);
        }
        kept = overlap.min(filled);
        window.copy_within(filled - kept..filled, 0);
    }
}

pub fn inspect_executable(path: &Path, display_path: &str) -> Result<LinkedRuntime, LibraryError> {
    let io_err = |source| LibraryError::Io { path: display_path.to_string(), source };
    let meta = fs::metadata(path).map_err(io_err)?;
    if meta.len() > MAX_EXE_BYTES {
        return Ok(LinkedRuntime::Absent);
    }
    // Only the headers and the symbol table are read, never the whole file.
    let handle = fs::File::open(path).map_err(io_err)?;
    let cache = ReadCache::new(handle);
    let file = object::File::parse(&cache)
        .map_err(|e| LibraryError::NotElf { path: display_path.to_string(), reason: e.to_string() })?;
    if file.symbol_table().is_none() {
        let mut handle = fs::File::open(path).map_err(io_err)?;
        let stripped = file_carries_runtime_mark(&mut handle).map_err(io_err)?;
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
    fn the_mark_is_found_across_a_chunk_boundary() {
        // The mark placed at every offset around the first chunk's end,
        // and at the file's very end.
        for at in [
            0,
            MARK_SCAN_CHUNK - RUNTIME_MARK.len(),
            MARK_SCAN_CHUNK - 5,
            MARK_SCAN_CHUNK,
            2 * MARK_SCAN_CHUNK + 7,
        ] {
            let mut data = vec![b'x'; at];
            data.extend_from_slice(RUNTIME_MARK);
            let found = file_carries_runtime_mark(&mut &data[..]).expect("read");
            assert!(found, "mark at {at} not found");
            // One byte of it changed: not found.
            let last = data.len() - 1;
            data[last] = b'?';
            assert!(!file_carries_runtime_mark(&mut &data[..]).expect("read"), "changed mark at {at} found");
        }
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
