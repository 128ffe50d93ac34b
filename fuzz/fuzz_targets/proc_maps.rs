//! `/proc/PID/maps` parsing. The file lists paths that the traced process
//! chose (any file it mapped, in any directory it could write), so every
//! byte after the inode is attacker-controlled.
#![no_main]

use canaryscope_fuzz::maps::{mapped_files, parse_line};
use libfuzzer_sys::fuzz_target;
use std::collections::HashSet;

/// True when `part` is a slice of `whole`'s memory, i.e. borrowed from the
/// input rather than built or truncated elsewhere.
fn is_within(whole: &str, part: &str) -> bool {
    let (w, p) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    p >= w && p + part.len() <= w + whole.len()
}

fuzz_target!(|data: &[u8]| {
    // The observer reads the file with read_to_string: non-UTF-8 never
    // reaches the parser.
    let Ok(maps) = std::str::from_utf8(data) else { return };

    for line in maps.lines() {
        let Some(m) = parse_line(line) else { continue };
        assert!(m.end >= m.start, "end {:#x} < start {:#x} in {line:?}", m.end, m.start);
        // A line without a path gets a static "", anything else is borrowed.
        assert!(m.path.is_empty() || is_within(line, m.path), "path {:?} is not part of {line:?}", m.path);
        assert_eq!(m.path.trim_start(), m.path, "path keeps its column padding");
        // The permissions are the second space-separated field, 4 characters.
        let perms = line.split(' ').nth(1).expect("a parsed line has permissions");
        assert_eq!(perms.len(), 4, "perms {perms:?} in {line:?}");
        assert_eq!(m.executable, perms.as_bytes()[2] == b'x', "executable bit of {line:?}");
    }

    let files = mapped_files(maps);
    // Sets keep the checks linear: inputs reach thousands of lines.
    let file_mappings: HashSet<(usize, usize)> = maps
        .lines()
        .filter_map(parse_line)
        .filter(|m| m.inode != 0)
        .map(|m| (m.path.as_ptr() as usize, m.path.len()))
        .collect();
    let mut seen = HashSet::new();
    for path in &files {
        assert!(path.starts_with('/'), "{path:?} is not absolute");
        assert!(is_within(maps, path), "{path:?} is not part of the input");
        assert!(!path.contains('\n'), "{path:?} spans lines");
        assert!(seen.insert(*path), "{path:?} listed twice");
        // Each listed file is the path of a line that parses with an inode.
        assert!(
            file_mappings.contains(&(path.as_ptr() as usize, path.len())),
            "{path:?} does not come from a file mapping"
        );
    }
});
