//! How a row reads: short units a person takes in at a glance, `-` where a
//! rate or latency has no data yet. The screen and `--once` share it.
use super::table::Row;

pub const HEADERS: [&str; 11] = [
    "POD / CGROUP",
    "TRACK",
    "CALLS/s",
    "FAIL",
    "STALL",
    "CALL p99",
    "RUNQ p99",
    "THROT%",
    "OOM",
    "CRASH",
    "EXITS",
];
/// Column widths; the name column takes what is left of a 120-column line.
pub const WIDTHS: [u16; 11] = [44, 7, 8, 6, 6, 9, 9, 7, 5, 6, 6];

pub fn cells(r: &Row) -> [String; 11] {
    [
        r.name.clone(),
        r.track.clone(),
        r.gpu_calls_per_s.map(|v| format!("{v:.1}")).unwrap_or_else(dash),
        r.gpu_failures.to_string(),
        r.gpu_stalls.to_string(),
        r.gpu_call_p99_s.map(seconds).unwrap_or_else(dash),
        r.runq_p99_s.map(seconds).unwrap_or_else(dash),
        r.throttled_pct.map(|v| format!("{v:.0}")).unwrap_or_else(dash),
        r.oom_kills.to_string(),
        r.crashes.to_string(),
        r.abnormal_exits.to_string(),
    ]
}

fn dash() -> String {
    "-".to_string()
}

/// 850µs, 12.3ms, 2.10s.
pub fn seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.0}µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1}ms", s * 1e3)
    } else {
        format!("{s:.2}s")
    }
}

/// The rows as an aligned text table (`--once` without `--json`).
pub fn plain(rows: &[Row]) -> String {
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, width)) in cells.iter().zip(WIDTHS).enumerate() {
            let width = usize::from(width);
            // Long cgroup paths keep their informative tail.
            let count = cell.chars().count();
            let cell: String =
                if count > width { cell.chars().skip(count - width).collect() } else { cell.clone() };
            if i == 0 || i == 1 {
                out.push_str(&format!("{cell:<width$} "));
            } else {
                out.push_str(&format!("{cell:>width$} "));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = line(&HEADERS.map(str::to_string));
    out.push('\n');
    for r in rows {
        out.push_str(&line(&cells(r)));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_at_a_glance() {
        assert_eq!(seconds(0.000_85), "850µs");
        assert_eq!(seconds(0.0123), "12.3ms");
        assert_eq!(seconds(2.1), "2.10s");
        let row = Row { name: "inference/w-1".into(), gpu_failures: 2, ..Row::default() };
        let text = plain(&[row]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("POD / CGROUP"));
        assert!(lines[1].starts_with("inference/w-1"));
        assert!(lines[1].contains(" - "), "no rate yet reads as a dash: {}", lines[1]);
    }
}
