//! Reading `/proc`: which processes there are, and their `maps`, which
//! come from processes we do not control. A std-only leaf (the fuzz
//! targets compile this file on its own).
use std::path::PathBuf;

/// One mapping line: address range, permissions, offset, device, inode, path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping<'a> {
    pub start: u64,
    pub end: u64,
    pub executable: bool,
    pub offset: u64,
    pub inode: u64,
    pub path: &'a str,
}

/// Parses one line; `None` for anything malformed (never panics).
pub fn parse_line(line: &str) -> Option<Mapping<'_>> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let _dev = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().map(str::trim_start).unwrap_or("");
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    if end < start || perms.len() != 4 {
        return None;
    }
    Some(Mapping {
        start,
        end,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        inode: inode.parse().ok()?,
        path,
    })
}

/// The first mapping of each distinct file (anonymous and special mappings
/// such as `[heap]` are skipped).
pub fn file_mappings(maps: &str) -> Vec<Mapping<'_>> {
    // A process may map tens of thousands of files (vm.max_map_count is
    // 65530): a set keeps the scan linear.
    let mut seen = std::collections::HashSet::new();
    maps.lines()
        .filter_map(parse_line)
        .filter(|m| m.inode != 0 && m.path.starts_with('/') && seen.insert(m.path))
        .collect()
}

impl Mapping<'_> {
    /// The kernel appends this to the path of a file unlinked (or replaced
    /// by a rename) after it was mapped.
    const DELETED: &'static str = " (deleted)";

    /// Whether the mapped file no longer has this path.
    pub fn deleted(&self) -> bool {
        self.path.ends_with(Self::DELETED)
    }

    /// The path without the kernel's " (deleted)" note.
    pub fn file_path(&self) -> &str {
        self.path.strip_suffix(Self::DELETED).unwrap_or(self.path)
    }

    /// Where process `pid`'s mapped file opens from here: through its
    /// root while that path still names it, else through the mapping
    /// itself (/proc/PID/map_files, which needs CAP_SYS_ADMIN).
    pub fn open_path(&self, pid: u32) -> PathBuf {
        let via_root = PathBuf::from(format!("/proc/{pid}/root{}", self.file_path()));
        if !self.deleted() && via_root.exists() {
            via_root
        } else {
            PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", self.start, self.end))
        }
    }
}

/// Every pid in /proc (used once at start; later processes are found
/// through exec-mapping events, not by polling).
pub fn all_pids() -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 fd:01 1311 /usr/bin/hip_probe
7f1a2c000000-7f1a2c400000 r-xp 00100000 fd:01 4242 /usr/lib/x86_64-linux-gnu/libamdhip64.so.5.2.50203
7f1a2c400000-7f1a2c500000 r--p 00500000 fd:01 4242 /usr/lib/x86_64-linux-gnu/libamdhip64.so.5.2.50203
7f1a2d000000-7f1a2d021000 rw-p 00000000 00:00 0 [heap]
7f1a2e000000-7f1a2e001000 r-xp 00000000 00:00 0
7ffd1000-7ffd2000 r-xp 00000000 00:00 0                          [vdso]
7f1a2f000000-7f1a2f001000 r-xp 00000000 fd:01 99 /tmp/lib with space.so (deleted)
";

    #[test]
    fn parses_real_lines() {
        let m = parse_line(SAMPLE.lines().nth(1).expect("line")).expect("parses");
        assert!(m.executable);
        assert_eq!(m.offset, 0x100000);
        assert_eq!(m.inode, 4242);
        assert_eq!(m.path, "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5.2.50203");
    }

    #[test]
    fn lists_each_file_once() {
        let files: Vec<&str> = file_mappings(SAMPLE).iter().map(|m| m.path).collect();
        assert_eq!(
            files,
            vec![
                "/usr/bin/hip_probe",
                "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5.2.50203",
                "/tmp/lib with space.so (deleted)"
            ]
        );
    }

    #[test]
    fn deleted_files_are_told_apart() {
        let files = file_mappings(SAMPLE);
        let deleted = files.last().expect("three files");
        assert!(deleted.deleted());
        assert_eq!(deleted.file_path(), "/tmp/lib with space.so");
        assert_eq!((deleted.start, deleted.end), (0x7f1a2f000000, 0x7f1a2f001000));
        assert!(!files[1].deleted());
        assert_eq!(files[1].file_path(), files[1].path);
    }

    #[test]
    fn garbage_is_rejected_not_panicked_on() {
        for line in
            ["", "zz-yy r-xp 0 0 0 /x", "1-0 r-xp 0 0:0 1 /x", "1-2 r-x 0 0:0 1 /x", "1-2", "é-ü r-xp"]
        {
            assert_eq!(parse_line(line), None, "{line:?}");
        }
    }
}
