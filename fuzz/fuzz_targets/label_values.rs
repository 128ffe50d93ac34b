//! Label values in the exposition come from Kubernetes objects (namespace,
//! pod and container names, workload labels) that users write. A value must
//! not be able to break out of its quotes: add a label, end the line, or
//! inject a sample that a scraper would believe.
//!
//! Input: label values separated by 0xFF (never part of UTF-8), six to a
//! sample, as many samples as the input fills (up to MAX_SAMPLES).
#![no_main]

use canaryscope_fuzz::{
    decl::{Kind, MetricDecl, Scope, View},
    families::Family,
    label_names::LABEL_NAMES as NAMES,
};
use libfuzzer_sys::fuzz_target;
use prometheus::TextEncoder;

const FAMILY: &str = "canaryscope_fuzz_calls_total";
const HELP: &str = "Calls, with labels taken from the fuzzer.";
/// A workload counter, as the exporter declares its families.
static DECL: MetricDecl = MetricDecl {
    name: "fuzz_calls_total",
    help: HELP,
    kind: Kind::Counter,
    scope: Scope::Workload,
    extra: &[],
    per_pod_extra: None,
};
const MAX_SAMPLES: usize = 8;

/// One sample line parsed back: its label pairs and value.
type Sample = (Vec<(String, String)>, f64);

/// A strict reader of the text format's sample lines (version 0.0.4): only
/// the three escapes `\\`, `\"` and `\n` are allowed inside a label value,
/// and a raw newline there is an error, as it is for Prometheus.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let rest = line.strip_prefix(FAMILY).ok_or("wrong metric name")?;
    let mut rest = rest.strip_prefix('{').ok_or("no label set")?;
    let mut labels = Vec::new();
    loop {
        let (name, after) = rest.split_once("=\"").ok_or("no `=\"` after a label name")?;
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("bad label name {name:?}"));
        }
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next().ok_or("unterminated label value")? {
                (i, '"') => break i,
                (_, '\\') => match chars.next().ok_or("dangling backslash")?.1 {
                    '\\' => value.push('\\'),
                    '"' => value.push('"'),
                    'n' => value.push('\n'),
                    c => return Err(format!("unknown escape \\{c:?}")),
                },
                (_, '\n') => return Err("raw newline in a label value".into()),
                (_, c) => value.push(c),
            }
        };
        labels.push((name.to_owned(), value));
        rest = &after[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else {
            rest = rest.strip_prefix('}').ok_or("no `,` or `}` after a label value")?;
            break;
        }
    }
    let value = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let value = value.parse::<f64>().map_err(|e| format!("bad value {value:?}: {e}"))?;
    Ok((labels, value))
}

fuzz_target!(|data: &[u8]| {
    let Ok(values) = data.split(|&b| b == 0xff).map(std::str::from_utf8).collect::<Result<Vec<_>, _>>()
    else {
        return;
    };
    let rows: Vec<Vec<&str>> = values
        .chunks(NAMES.len())
        .take(MAX_SAMPLES)
        .map(|c| {
            let mut row = c.to_vec();
            row.resize(NAMES.len(), "");
            row
        })
        .collect();

    let mut family = Family::new(&DECL, View::Scrape);
    for (i, row) in rows.iter().enumerate() {
        family.value(row, i as f64);
    }
    let text = TextEncoder::new().encode_to_string(&[family.finish()]).expect("encoding succeeds");

    let body = text.strip_suffix('\n').expect("the exposition ends with a newline");
    let mut lines = body.split('\n');
    assert_eq!(lines.next(), Some(format!("# HELP {FAMILY} {HELP}").as_str()));
    assert_eq!(lines.next(), Some(format!("# TYPE {FAMILY} counter").as_str()));
    let samples: Vec<&str> = lines.collect();
    assert_eq!(samples.len(), rows.len(), "sample lines differ from samples written:\n{text}");
    for (i, (line, row)) in samples.iter().zip(&rows).enumerate() {
        let (labels, value) = parse_sample(line).unwrap_or_else(|e| panic!("{e} in {line:?}"));
        let expected: Vec<(String, String)> =
            NAMES.iter().zip(row).map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
        assert_eq!(labels, expected, "labels did not round-trip in {line:?}");
        assert_eq!(value, i as f64, "value of {line:?}");
    }
});
