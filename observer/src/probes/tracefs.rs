//! tracefs: where tracepoint formats live. Many distributions boot with it
//! unmounted; root can mount it, and does before loading tracepoints.
use std::path::{Path, PathBuf};

pub const TRACEFS: &str = "/sys/kernel/tracing";

/// The mounted tracefs, mounting it when absent (root only).
pub fn ensure_mounted() -> Result<PathBuf, String> {
    for dir in [TRACEFS, "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(PathBuf::from(dir));
        }
    }
    let target = std::ffi::CString::new(TRACEFS).map_err(|e| e.to_string())?;
    let fstype = c"tracefs";
    // SAFETY: valid NUL-terminated strings; no mount data.
    let rc = unsafe { libc::mount(fstype.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(format!(
            "tracefs is not mounted and mounting it at {TRACEFS} failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    log::info!("tracefs was not mounted: mounted it at {TRACEFS}");
    Ok(PathBuf::from(TRACEFS))
}

/// A field of a tracepoint's format file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: u32,
}

/// Parses the `field:` lines of a tracefs `format` file; never panics.
pub fn parse_format(text: &str) -> Vec<Field> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let decl = line.strip_prefix("field:")?;
            let mut parts = decl.split(';').map(str::trim);
            let declaration = parts.next()?;
            let offset = parts.find_map(|p| p.strip_prefix("offset:")?.trim().parse().ok());
            // The name is the last token without its array suffix:
            // `char prev_comm[16]`, `__data_loc char[] comm`.
            let name = declaration.split_whitespace().last()?.split('[').next()?.to_string();
            if name.is_empty() {
                return None;
            }
            Some(Field { name, offset: offset? })
        })
        .collect()
}

pub fn field_offset(fields: &[Field], name: &str) -> Option<u32> {
    fields.iter().find(|f| f.name == name).map(|f| f.offset)
}

pub fn read_format(tracefs: &Path, category: &str, name: &str) -> Option<Vec<Field>> {
    let text =
        std::fs::read_to_string(tracefs.join("events").join(category).join(name).join("format")).ok()?;
    Some(parse_format(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MARK_VICTIM_6_18: &str = "name: mark_victim
ID: 123
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] comm;\toffset:12;\tsize:4;\tsigned:0;
\tfield:unsigned long total_vm;\toffset:16;\tsize:8;\tsigned:0;
\tfield:unsigned long anon_rss;\toffset:24;\tsize:8;\tsigned:0;
\tfield:short oom_score_adj;\toffset:64;\tsize:2;\tsigned:1;

print fmt: \"pid=%d\", REC->pid
";

    const MARK_VICTIM_6_1_OLD: &str = "name: mark_victim
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;
";

    #[test]
    fn reads_both_mark_victim_layouts() {
        let new = parse_format(MARK_VICTIM_6_18);
        assert_eq!(field_offset(&new, "pid"), Some(8));
        assert_eq!(field_offset(&new, "anon_rss"), Some(24));
        assert_eq!(field_offset(&new, "comm"), Some(12));
        assert_eq!(field_offset(&new, "oom_score_adj"), Some(64));
        let old = parse_format(MARK_VICTIM_6_1_OLD);
        assert_eq!(field_offset(&old, "pid"), Some(8));
        assert_eq!(field_offset(&old, "anon_rss"), None);
    }

    #[test]
    fn arrays_and_garbage() {
        let f = parse_format("\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;\nfield:;;;\nfield:int x; offset:zz; size:4;");
        assert_eq!(f, vec![Field { name: "prev_comm".into(), offset: 8 }]);
    }
}
