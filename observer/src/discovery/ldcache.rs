//! GPU runtime paths named by a root's `/etc/ld.so.cache`.
//!
//! The cache's string table holds each library's full path. Rather than
//! follow the format's versions (the old `ld.so-1.7.0` layout, the new
//! `glibc-ld.so.cache1.1` one, or both in one file), every NUL-terminated
//! absolute path in the file is taken, and those whose file name is a GPU
//! runtime's are kept. A path that is not really a cache entry costs one
//! failed stat later; nothing can be missed this way.
use observer_common::discovery::is_gpu_library_name;

/// Size beyond which a file is not an ld.so.cache (real ones are well under
/// a megabyte); such a file is not read.
pub const MAX_CACHE_BYTES: u64 = 64 << 20;

/// GPU runtime library paths found in the bytes of an ld.so.cache, each once.
pub fn gpu_paths(cache: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for entry in cache.split(|b| *b == 0) {
        if entry.first() != Some(&b'/') {
            continue;
        }
        let Ok(path) = std::str::from_utf8(entry) else { continue };
        let name = path.rsplit('/').next().unwrap_or_default();
        if is_gpu_library_name(name.as_bytes()) && !out.iter().any(|p| p == path) {
            out.push(path.to_string());
        }
    }
    out
}

/// Every library path an ld.so.cache names, each once, in its order.
pub fn all_paths(cache: &[u8]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    cache
        .split(|b| *b == 0)
        .filter(|entry| entry.first() == Some(&b'/'))
        .filter_map(|entry| std::str::from_utf8(entry).ok())
        .filter(|path| seen.insert(*path))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_runtime_paths_among_other_strings() {
        let mut cache = b"glibc-ld.so.cache1.1\0\0\x07\0\0\0".to_vec();
        for s in [
            "libc.so.6",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "libcuda.so.1",
            "/opt/zluda/libcuda.so.1",
            "libamdhip64.so.5",
            "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5",
            "/opt/zluda/libcuda.so.1",
            "/usr/lib/libcudart.so.12",
            "/usr/lib/libcublas.so.12",
        ] {
            cache.extend_from_slice(s.as_bytes());
            cache.push(0);
        }
        assert_eq!(
            gpu_paths(&cache),
            vec![
                "/opt/zluda/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5",
                "/usr/lib/libcudart.so.12"
            ]
        );
    }

    #[test]
    fn garbage_gives_nothing_and_never_panics() {
        assert!(gpu_paths(b"").is_empty());
        assert!(gpu_paths(b"/\0/\xff\xfe/libcuda.so\0").is_empty());
        assert!(gpu_paths(&[0u8; 100]).is_empty());
    }

    #[test]
    fn this_machines_cache_lists_the_hip_runtime_when_installed() {
        let hip = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5");
        let Ok(cache) = std::fs::read("/etc/ld.so.cache") else { return };
        if hip.exists() {
            let found = gpu_paths(&cache);
            assert!(found.iter().any(|p| p.ends_with("/libamdhip64.so.5")), "{found:?}");
        }
    }
}
