//! `/etc/ld.so.cache` of a container root: the image's author wrote it, so
//! every byte is outside input.
#![no_main]

use canaryscope_fuzz::ldcache::gpu_paths;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let paths = gpu_paths(data);
    let mut seen = std::collections::HashSet::new();
    for path in &paths {
        // Each path is an absolute one taken whole from the input, NUL-bounded.
        assert!(path.starts_with('/'), "{path:?}");
        let mut needle = path.as_bytes().to_vec();
        needle.push(0);
        let bounded =
            data.windows(needle.len()).any(|w| w == needle.as_slice()) || data.ends_with(path.as_bytes());
        assert!(bounded, "{path:?} is not a NUL-terminated string of the input");
        let name = path.rsplit('/').next().unwrap_or_default();
        assert!(observer_common::discovery::is_gpu_library_name(name.as_bytes()), "{path:?}");
        assert!(seen.insert(path.clone()), "{path:?} twice");
    }
});
