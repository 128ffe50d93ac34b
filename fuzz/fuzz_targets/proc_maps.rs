//! `/proc/PID/maps` parsing. The file lists paths that the traced process
//! chose (any file it mapped, in any directory it could write), so every
//! byte after the inode is attacker-controlled.
#![no_main]

use canaryscope_fuzz::maps::{file_mappings, parse_line, Mapping};
use libfuzzer_sys::fuzz_target;
use std::collections::{HashMap, HashSet};

/// True when `part` is a slice of `whole`'s memory, i.e. borrowed from the
/// input rather than built or truncated elsewhere.
fn is_within(whole: &str, part: &str) -> bool {
    let (w, p) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    p >= w && p + part.len() <= w + whole.len()
}

/// The " (deleted)" helpers only ever strip the kernel's note.
fn check_deleted(m: &Mapping<'_>) {
    let file = m.file_path();
    assert!(m.path.starts_with(file), "file_path {file:?} is not a prefix of {:?}", m.path);
    if m.deleted() {
        assert_eq!(format!("{file} (deleted)"), m.path);
    } else {
        assert_eq!(file, m.path);
    }
}

fuzz_target!(|data: &[u8]| {
    // The observer reads the file with read_to_string: non-UTF-8 never
    // reaches the parser.
    let Ok(maps) = std::str::from_utf8(data) else { return };

    // The first file mapping of each path, computed independently of
    // file_mappings (and linearly: inputs reach thousands of lines).
    let mut first: HashMap<&str, usize> = HashMap::new();
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
        check_deleted(&m);
        if m.inode != 0 && m.path.starts_with('/') {
            first.entry(m.path).or_insert(m.path.as_ptr() as usize);
        }
    }

    let files = file_mappings(maps);
    assert_eq!(files.len(), first.len(), "files listed vs distinct file paths in the input");
    let mut seen = HashSet::new();
    for m in &files {
        assert!(m.path.starts_with('/') && m.inode != 0, "{:?} is not a file mapping", m.path);
        assert!(is_within(maps, m.path), "{:?} is not part of the input", m.path);
        assert!(!m.path.contains('\n'), "{:?} spans lines", m.path);
        // Each file once (with the equal counts: every file), from its first line.
        assert!(seen.insert(m.path), "{:?} listed twice", m.path);
        assert_eq!(
            first.get(m.path),
            Some(&(m.path.as_ptr() as usize)),
            "{:?} is not its first line",
            m.path
        );
        check_deleted(m);
    }
});
