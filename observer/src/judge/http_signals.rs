//! The request signals, read from the daemon's HTTP series: per node, each
//! side's requests by status class (`_count` of the latency histogram,
//! every class) and its latency buckets (the classes the runbook's p99
//! rule reads). Counted as every signal is (`signals`): the sum of each
//! series' increases over the span, resets included.
//!
//! - `http_5xx`: requests answered 5xx among all requests served;
//! - `http_closed`: requests whose connection ended before the response
//!   did, among all requests served;
//! - `http_p99`: requests slower than 1.25 times the baseline's p99 bucket
//!   bound (the canary's) or than the bound itself (the baseline's), among
//!   requests answered 2xx to 4xx; with the hold's earlier checks.
//!
//! kubelet's probes are a series of their own and never counted here.
use std::collections::BTreeMap;

use super::{
    latency::{self, Histogram},
    prometheus::Series,
    requests::{hold_checks, HeldCheck, RequestTerms},
    signals::{increase, node_of, nothing, per_node, strata, Query},
    stats::Counts,
    strata::{Bound, SignalData, SignalKind, Span, Stratum},
};

pub const REQUEST_COUNT: &str = "canaryscope_http_server_request_duration_seconds_count";
pub const REQUEST_BUCKETS: &str = "canaryscope_http_server_request_duration_seconds_bucket";
/// The classes whose latency the runbook's p99 compares (its rule in
/// deploy/prometheus/rules.yaml reads the same): a fast 5xx or a cut
/// connection says nothing of how long answers take.
const LATENCY_CLASSES: &str = "2xx|3xx|4xx";

pub const HTTP_5XX: &str = "http_5xx";
pub const HTTP_CLOSED: &str = "http_closed";
pub const HTTP_P99: &str = "http_p99";

/// The names the judge reports, in order.
pub fn signal_names() -> impl Iterator<Item = &'static str> {
    [HTTP_5XX, HTTP_CLOSED, HTTP_P99].into_iter()
}

/// One side's queries for the request signals over `range` seconds.
pub fn queries(side: &str, selector: &str, range: u64) -> Vec<(&'static str, Query)> {
    vec![
        (
            REQUEST_COUNT,
            (format!("{side} {REQUEST_COUNT}"), format!("{REQUEST_COUNT}{{{selector}}}[{range}s]")),
        ),
        (
            REQUEST_BUCKETS,
            (
                format!("{side} {REQUEST_BUCKETS}"),
                format!("{REQUEST_BUCKETS}{{{selector},status_class=~\"{LATENCY_CLASSES}\"}}[{range}s]"),
            ),
        ),
    ]
}

/// Each side's series of both metrics.
pub struct HttpSeries<'a> {
    pub canary_counts: &'a [Series],
    pub canary_buckets: &'a [Series],
    pub baseline_counts: &'a [Series],
    pub baseline_buckets: &'a [Series],
}

fn other_than_5xx(labels: &BTreeMap<String, String>) -> bool {
    labels.get("status_class").map(String::as_str) != Some("5xx")
}

fn other_than_closed(labels: &BTreeMap<String, String>) -> bool {
    labels.get("status_class").map(String::as_str) != Some("closed")
}

/// The three request signals over `span`; `read_from` is where the samples
/// fetched begin, `hold` the latency hold in seconds.
pub fn signals_at(s: &HttpSeries, span: Span, read_from: f64, hold: f64) -> Vec<SignalData> {
    let (from, to) = (span.from, span.to);
    let requests =
        (per_node(s.canary_counts, nothing, from, to), per_node(s.baseline_counts, nothing, from, to));
    let share = |name: &str, excluded: fn(&BTreeMap<String, String>) -> bool| {
        let canary = per_node(s.canary_counts, excluded, from, to);
        let baseline = per_node(s.baseline_counts, excluded, from, to);
        let read: f64 = per_node(s.baseline_counts, excluded, read_from, to).values().sum();
        let mut data = SignalData::new(
            name,
            SignalKind::PerRequest,
            strata(&canary, &requests.0, &baseline, &requests.1),
        );
        data.canary_span = span;
        data.baseline_span = span;
        data.baseline_events_read = data.baseline_events_read.max(read.round() as u64);
        data
    };
    vec![share(HTTP_5XX, other_than_5xx), share(HTTP_CLOSED, other_than_closed), p99(s, span, hold)]
}

/// The latency signal at the span's end, with the hold's earlier checks.
fn p99(s: &HttpSeries, span: Span, hold: f64) -> SignalData {
    let now = latency::strata(&histograms(s, span.from, span.to));
    let held = hold_checks(span.to, hold)
        .into_iter()
        .map(|at| {
            let then = latency::strata(&histograms(s, span.from, at));
            HeldCheck { at, p_value: None, counts: then.strata.iter().filter_map(compared).collect() }
        })
        .collect();
    let mut data = SignalData::new(HTTP_P99, SignalKind::Latency, now.strata);
    data.canary_span = span;
    data.baseline_span = span;
    data.requests =
        Some(RequestTerms { cuts: now.cuts, uncompared: now.uncompared, held, ..Default::default() });
    data
}

/// A stratum's counts when both revisions ran there.
fn compared(s: &Stratum) -> Option<Counts> {
    (s.canary_exposure > 0.0 && s.baseline_exposure > 0.0).then_some(Counts {
        canary_events: s.canary_events,
        canary_exposure: s.canary_exposure,
        baseline_events: s.baseline_events,
        baseline_exposure: s.baseline_exposure,
    })
}

/// Per node, both sides' latency histograms over `(from, to]`.
fn histograms(s: &HttpSeries, from: f64, to: f64) -> BTreeMap<String, (Histogram, Histogram)> {
    let mut nodes: BTreeMap<String, (Histogram, Histogram)> = BTreeMap::new();
    for (series, canary) in [(s.canary_buckets, true), (s.baseline_buckets, false)] {
        for (node, histogram) in side_histograms(series, from, to) {
            let entry = nodes.entry(node).or_default();
            *(if canary { &mut entry.0 } else { &mut entry.1 }) = histogram;
        }
    }
    nodes
}

/// One side's histogram per node: each bucket series' increase over the
/// span, summed over status classes by bound.
fn side_histograms(series: &[Series], from: f64, to: f64) -> BTreeMap<String, Histogram> {
    let mut out: BTreeMap<String, Histogram> = BTreeMap::new();
    for s in series {
        let Some(le) = s.labels.get("le") else { continue };
        let counted = increase(&s.samples, from, to);
        let histogram = out.entry(node_of(&s.labels)).or_default();
        if le == "+Inf" {
            histogram.total += counted;
        } else if let Ok(bound) = le.parse::<f64>() {
            *histogram.cumulative.entry(Bound(bound)).or_default() += counted;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(labels: &[(&str, &str)], samples: &[(f64, f64)]) -> Series {
        Series {
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            samples: samples.to_vec(),
        }
    }

    #[test]
    fn buckets_add_up_by_bound_over_classes_and_count_from_the_span() {
        let b = |class, le, v0, v1| {
            series(&[("node", "a"), ("status_class", class), ("le", le)], &[(0.0, v0), (100.0, v1)])
        };
        let buckets = [
            b("2xx", "0.01", 5.0, 15.0),
            b("2xx", "+Inf", 6.0, 26.0),
            b("4xx", "0.01", 0.0, 1.0),
            b("4xx", "+Inf", 0.0, 2.0),
        ];
        let h = side_histograms(&buckets, 50.0, 100.0);
        assert_eq!(h["a"].cumulative[&Bound(0.01)], 11.0);
        assert_eq!(h["a"].total, 22.0);
    }

    #[test]
    fn shares_count_their_class_among_every_request() {
        let c = |class, v| series(&[("node", "a"), ("status_class", class)], &[(0.0, 0.0), (100.0, v)]);
        let canary = [c("2xx", 97.0), c("5xx", 3.0), c("closed", 1.0)];
        let baseline = [c("2xx", 300.0)];
        let s = HttpSeries {
            canary_counts: &canary,
            canary_buckets: &[],
            baseline_counts: &baseline,
            baseline_buckets: &[],
        };
        let signals = signals_at(&s, Span { from: -1.0, to: 100.0 }, -900.0, 180.0);
        let names: Vec<&str> = signals.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, signal_names().collect::<Vec<_>>());
        let five = &signals[0].strata[0];
        assert_eq!((five.canary_events, five.canary_exposure, five.baseline_exposure), (3, 101.0, 300.0));
        assert_eq!(signals[1].strata[0].canary_events, 1);
        assert_eq!(signals[2].kind, SignalKind::Latency);
        assert_eq!(signals[2].requests.as_ref().map(|r| r.held.len()), Some(3));
    }
}
