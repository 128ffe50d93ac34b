//! The kernel matrix: which probe families work on which kernel, as
//! `canaryscope check --json` found it on this host and in each VM kernel
//! the suite booted (tests/vm/test.sh saves the guest's report as
//! target/vm/check-KERNEL.json before the tests run). The table goes into
//! docs/kernels.md between two markers, so the suite writes it, not a person.
use std::{collections::BTreeMap, fs, path::Path, process::Command};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::root;

const START: &str = "<!-- kernel-matrix:start (cargo xtask matrix writes this table) -->";
const END: &str = "<!-- kernel-matrix:end -->";

/// The families in the order docs/how-it-sees.md explains them.
const FAMILIES: [(&str, &str); 12] = [
    ("gpu", "GPU runtime calls (uprobes)"),
    ("discovery", "new runtime files before their first call"),
    ("kfd", "KFD ioctls"),
    ("crash", "native crashes"),
    ("exit", "abnormal exits"),
    ("exit_cause", "who sent a fatal signal"),
    ("oom", "OOM kills"),
    ("memlimit", "refused allocations (rlimits)"),
    ("runs", "runs of programs pods start (exec to exit)"),
    ("sched", "run-queue latency"),
    ("throttle", "CPU throttling"),
    ("http", "HTTP requests of pods (cgroup_skb)"),
];

/// One kernel's report: its release and each family's verdict.
struct Column {
    kernel: String,
    place: &'static str,
    verdicts: BTreeMap<&'static str, String>,
}

/// `check --json` on this host, into target/vm/check-host.json.
pub fn check_host() -> Result<()> {
    let bin = root().join("target/release/canaryscope");
    let out = Command::new(&bin)
        .args(["check", "--json"])
        .output()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    // check exits non-zero when something is missing; the report is what counts.
    let dir = root().join("target/vm");
    fs::create_dir_all(&dir)?;
    fs::write(dir.join("check-host.json"), &out.stdout)?;
    Ok(())
}

/// The page the table lives on, relative to the workspace root.
pub const PAGE: &str = "docs/kernels.md";

/// Renders the table from the saved reports and writes it into the kernels page.
pub fn write_page() -> Result<()> {
    let dir = root().join("target/vm");
    let mut columns = Vec::new();
    if let Ok(host) = read(&dir.join("check-host.json")) {
        columns.push(column(&host, "host")?);
    }
    let mut guests: Vec<_> =
        fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_else(|_| Vec::new());
    guests.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("check-") && n != "check-host.json")
    });
    guests.sort();
    for path in guests {
        columns.push(column(&read(&path)?, "VM")?);
    }
    if columns.is_empty() {
        bail!("no check reports in {}: run the suite (cargo xtask test) first", dir.display());
    }
    let table = render(&columns);
    let path = root().join(PAGE);
    let page = fs::read_to_string(&path).context(PAGE)?;
    let updated = replace_between_markers(&page, &table)
        .with_context(|| format!("{PAGE} lacks the kernel-matrix markers"))?;
    if updated != page {
        fs::write(&path, updated)?;
        eprintln!("    {PAGE}: kernel matrix updated ({} kernels)", columns.len());
    }
    Ok(())
}

/// `page` with what lies between the markers replaced by `table`; `None`
/// when either marker is missing or they are out of order.
fn replace_between_markers(page: &str, table: &str) -> Option<String> {
    let start = page.find(START)?;
    let end = page[start..].find(END)? + start;
    Some(format!("{}{START}\n{table}{}", &page[..start], &page[end..]))
}

fn read(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&text).with_context(|| format!("{}: not a check report", path.display()))
}

/// A family works when every probe of it attached; otherwise the first
/// reason given. A family the report does not list at all was not loaded.
fn column(report: &Value, place: &'static str) -> Result<Column> {
    let kernel = report["kernel"].as_str().context("check report without a kernel")?.to_owned();
    let probes = report["probes"].as_array().cloned().unwrap_or_default();
    let mut verdicts = BTreeMap::new();
    for (family, _) in FAMILIES {
        let mine: Vec<&Value> = probes.iter().filter(|p| p["probe"] == family).collect();
        let verdict = match mine.iter().find(|p| p["attached"] != true) {
            _ if mine.is_empty() => match report["load_error"].as_str() {
                Some(e) => format!("not loaded: {e}"),
                None if family == "gpu" => "no GPU runtime library found".into(),
                None => "not reported".into(),
            },
            Some(failed) => short(failed["detail"].as_str().unwrap_or("detached")),
            // "...; syscall fallback (why): ...": the clause's part before the why.
            None => match mine
                .iter()
                .find_map(|p| p["detail"].as_str()?.split(';').find(|clause| clause.contains("fallback")))
            {
                Some(clause) => {
                    format!("works ({})", clause.split(['(', ':']).next().unwrap_or(clause).trim())
                }
                None => "works".into(),
            },
        };
        verdicts.insert(family, verdict);
    }
    Ok(Column { kernel, place, verdicts })
}

fn short(detail: &str) -> String {
    let first = detail.split(';').next().unwrap_or(detail).trim();
    first.replace('|', "/")
}

fn render(columns: &[Column]) -> String {
    let mut out = String::from("| probe family |");
    for c in columns {
        out.push_str(&format!(" {} ({}) |", c.kernel, c.place));
    }
    out.push_str("\n|---|");
    out.push_str(&"---|".repeat(columns.len()));
    out.push('\n');
    for (family, what) in FAMILIES {
        out.push_str(&format!("| `{family}`: {what} |"));
        for c in columns {
            out.push_str(&format!(" {} |", c.verdicts.get(family).map(String::as_str).unwrap_or("?")));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_family_works_only_when_every_probe_of_it_attached() {
        let report = json!({
            "kernel": "6.1.0-57-amd64",
            "load_error": null,
            "probes": [
                {"probe": "sched", "attached": true, "detail": "run-queue latency per cgroup"},
                {"probe": "sched", "attached": false, "detail": "verifier refused sched_switch; see log"},
                {"probe": "kfd", "attached": true, "detail": "syscall fallback (no kprobes)"},
                {"probe": "oom", "attached": true, "detail": "oom:mark_victim"},
                {"probe": "gpu", "attached": true, "detail": "Hip: 32 functions; fallback before Linux 5.15 (no cookies): pairs"},
            ],
        });
        let c = column(&report, "VM").expect("column");
        assert_eq!(c.verdicts["sched"], "verifier refused sched_switch");
        assert_eq!(c.verdicts["kfd"], "works (syscall fallback)");
        assert_eq!(c.verdicts["oom"], "works");
        assert_eq!(c.verdicts["gpu"], "works (fallback before Linux 5.15)");
        assert_eq!(c.verdicts["exit"], "not reported");
        let table = render(&[c]);
        assert!(table.starts_with("| probe family | 6.1.0-57-amd64 (VM) |\n|---|---|\n"), "{table}");
        assert_eq!(table.lines().count(), 2 + FAMILIES.len());
    }

    #[test]
    fn the_table_replaces_only_what_lies_between_the_markers() {
        let page = format!("# Kernels\n\n{START}\n| old |\n{END}\n\nWhat runs where.\n");
        let updated = replace_between_markers(&page, "| new |\n").expect("markers");
        assert_eq!(updated, format!("# Kernels\n\n{START}\n| new |\n{END}\n\nWhat runs where.\n"));
        assert_eq!(replace_between_markers("no markers", "| new |\n"), None);
        assert_eq!(replace_between_markers(&format!("{END}\n{START}\n"), "| new |\n"), None);
    }

    /// The suite writes the table at its end, after an hour of VM boots: a
    /// page that lost its markers should fail here, in seconds.
    #[test]
    fn the_kernels_page_has_the_markers() {
        let page = fs::read_to_string(root().join(PAGE)).expect(PAGE);
        assert!(replace_between_markers(&page, "").is_some(), "{PAGE} lacks the kernel-matrix markers");
    }
}
