//! How a row reads: short units a person takes in at a glance, `-` where a
//! rate or latency has no data yet. The screen and `--once` share it.
use super::table::Row;

pub const HEADERS: [&str; 17] = [
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
    "LIBFAIL",
    "NOINIT",
    "VRAM",
    "REQ/s",
    "5XX%",
    "REQ p99",
];
/// Column widths: 138 columns with the separators for the GPU, CPU and
/// failure columns, 147 with VRAM and 171 with the HTTP ones last (a
/// narrower terminal cuts those first). The name column fits a pod's uid
/// (36), which names a row without Kubernetes.
pub const WIDTHS: [u16; 17] = [44, 7, 8, 6, 6, 9, 9, 7, 5, 6, 6, 7, 6, 8, 7, 6, 8];

pub fn cells(r: &Row) -> [String; 17] {
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
        r.gpu_library_load_failures.to_string(),
        r.gpu_never_initialized.to_string(),
        r.vram_bytes.map(crate::render::bytes).unwrap_or_else(dash),
        r.http_per_s.map(|v| format!("{v:.1}")).unwrap_or_else(dash),
        r.http_failed_pct.map(|v| format!("{v:.1}")).unwrap_or_else(dash),
        r.http_p99_s.map(seconds).unwrap_or_else(dash),
    ]
}

/// How many columns, from the first, fit `width` terminal columns: the
/// rest are left out whole rather than every column squeezed (which cut
/// the pod names a person reads rows by). The name and track always show.
pub fn fitting(width: u16) -> usize {
    let mut used = 0u16;
    for (i, w) in WIDTHS.iter().enumerate() {
        let need = used.saturating_add(*w).saturating_add(u16::from(i > 0));
        if need > width && i >= 2 {
            return i;
        }
        used = need;
    }
    WIDTHS.len()
}

/// A cell cut to `width` characters, keeping its tail: a cgroup path's
/// informative part (the pod's and container's ids) is at its end, and rows
/// of one QoS level share the start. A cut shows as a leading `…`.
pub fn fit_tail(cell: &str, width: usize) -> String {
    let count = cell.chars().count();
    if count <= width || width == 0 {
        return cell.to_string();
    }
    std::iter::once('…').chain(cell.chars().skip(count - (width - 1))).collect()
}

/// The cells as the screen shows them: the name column cut as [`fit_tail`]
/// cuts it (the terminal library would cut its tail).
pub fn screen_cells(r: &Row) -> [String; 17] {
    let mut cells = cells(r);
    cells[0] = fit_tail(&cells[0], usize::from(WIDTHS[0]));
    cells
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
            let cell = fit_tail(cell, width);
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
    #[test]
    fn a_long_name_keeps_its_tail_on_the_screen() {
        let path = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-abcdef.scope";
        let row = super::Row { name: path.to_string(), ..Default::default() };
        let shown = &super::screen_cells(&row)[0];
        assert_eq!(shown.chars().count(), usize::from(super::WIDTHS[0]));
        assert!(shown.starts_with('…') && shown.ends_with("cri-containerd-abcdef.scope"), "{shown}");
        assert_eq!(super::fit_tail("short", 44), "short");
    }

    use super::*;

    #[test]
    fn columns_that_do_not_fit_are_left_out_whole() {
        assert_eq!(fitting(200), HEADERS.len());
        // 140 columns: the name keeps its 44, the last columns go.
        let n = fitting(140);
        assert!(n < HEADERS.len() && n > 5, "{n}");
        let used: u16 = WIDTHS[..n].iter().sum::<u16>() + n as u16 - 1;
        assert!(used <= 140, "{used}");
        assert_eq!(fitting(10), 2, "name and track always");
    }

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
