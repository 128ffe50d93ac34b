//! The report: results.md for people, results.json for tools, both from
//! the same rows.
//!
//! The markdown starts with the host's kernel, CPU, mitigations and load,
//! because those move the figures more than any change to the observer:
//! two reports compare only when that line matches.
use std::{fs, process::Command};

use serde_json::{json, Map, Value};

use super::{Env, Plan, Row};

pub(super) fn num(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

pub(super) fn opt(v: Option<f64>) -> String {
    v.map(num).unwrap_or_else(|| "–".into())
}

pub(super) fn render_markdown(
    rows: &[Row],
    plan: &Plan,
    env: &Env,
    load: (Option<f64>, Option<f64>),
) -> String {
    let mut s = String::new();
    s.push_str(&format!("# canaryscope benchmarks ({})\n\n", if plan.quick { "quick" } else { "full" }));
    s.push_str(&environment_line(env));
    s.push_str(&format!(
        " · 1-min load average {} before, {} after (other work on the host adds noise)",
        opt(load.0),
        opt(load.1)
    ));
    s.push_str("\n\nMedians over interleaved rounds unless the unit says otherwise. ");
    s.push_str("Targets are printed; only those marked required fail the run when missed.\n\n");
    s.push_str("| benchmark | unit | baseline | canaryscope | peer | floor | ratios | target | result |\n");
    s.push_str("|---|---|---:|---:|---:|---:|---|---|---|\n");
    for r in rows {
        let peer = match (&r.peer, &r.peer_tool) {
            (Some(v), Some(t)) => format!("{} ({t})", num(*v)),
            (Some(v), None) => num(*v),
            (None, Some(t)) => format!("– ({t})"),
            (None, None) => "–".into(),
        };
        let ratios =
            r.ratios.iter().map(|(k, v)| format!("{k}={}", num(*v))).collect::<Vec<_>>().join("<br>");
        let (target, verdict) = match &r.target {
            Some(t) => (t.description.clone(), t.verdict()),
            None => ("".into(), "".into()),
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            r.unit,
            opt(r.baseline),
            opt(r.canaryscope),
            peer,
            opt(r.floor),
            ratios,
            target,
            verdict
        ));
    }
    let noted: Vec<&Row> = rows.iter().filter(|r| !r.notes.is_empty()).collect();
    if !noted.is_empty() {
        s.push_str("\n## Notes\n");
        for r in noted {
            s.push_str(&format!("\n**{}**\n", r.name));
            for n in &r.notes {
                s.push_str(&format!("- {n}\n"));
            }
        }
    }
    s
}

pub(super) fn render_json(rows: &[Row]) -> Value {
    let list = rows
        .iter()
        .map(|r| {
            let ratios: Map<String, Value> = r.ratios.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            let samples: Map<String, Value> = r.samples.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            json!({
                "name": r.name,
                "unit": r.unit,
                "baseline": r.baseline,
                "canaryscope": r.canaryscope,
                "peer": r.peer,
                "peer_tool": r.peer_tool,
                "floor": r.floor,
                "ratios": ratios,
                "samples": samples,
                "target": r.target.as_ref().map(|t| json!({
                    "description": t.description,
                    "limit": t.limit,
                    "measured": t.measured,
                    "verdict": t.verdict(),
                })),
                "notes": r.notes,
            })
        })
        .collect();
    Value::Array(list)
}

fn environment_line(env: &Env) -> String {
    let read = |p: &str| fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_else(|_| "?".into());
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().into())
        })
        .unwrap_or_else(|| "?".to_string());
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let bpftrace = env
        .bpftrace
        .as_ref()
        .and_then(|b| Command::new(b).arg("--version").output().ok())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "not installed".into());
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    format!(
        "{date} · kernel {} · {cpu} × {cpus} · SRSO: {} · spectre_v2: {} · bpftrace {bpftrace} · runqlat {}",
        read("/proc/sys/kernel/osrelease"),
        read("/sys/devices/system/cpu/vulnerabilities/spec_rstack_overflow"),
        read("/sys/devices/system/cpu/vulnerabilities/spectre_v2"),
        if env.runqlat.is_some() { "installed" } else { "not installed" },
    )
}

pub(super) fn load_average() -> Option<f64> {
    fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}
