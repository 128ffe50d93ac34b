//! The runs' signals (`canaryscope_run_endings_total`,
//! `canaryscope_run_duration_seconds`): the share of runs a limit or a
//! wrapper ended, and how slow the slowest runs are, canary against
//! baseline. Both are failures per run, Fisher's exact test stratified by
//! node and executable (a solver's share of timeouts and its times are its
//! own, and so are a node's).
//!
//! # `run_limit_endings`
//!
//! Events: runs ended by `oom_kill`, `rlimit_cpu`, `memory_limit` or `sent`
//! (a signal from its own pod: the wrapper's wall-clock timeout). Exposure:
//! runs ended, less those killed from outside their pod (`sent_outside`: a
//! pod deleted). A worse canary is any higher share; it passes once shown
//! below the tolerated ratio (1.5) of the baseline's share.
//!
//! # `run_duration_p99`
//!
//! The runbook rolls back on the solver's p99 per revision. The test is on
//! the runs beyond the p99, with a tolerated slowdown of 1.25 (a run 25%
//! slower is no failure): the canary's run counts are shifted one bucket
//! down (the buckets are 1.25 apart, so a canary exactly 1.25 times slower
//! than the baseline becomes, bucket for bucket, the baseline's
//! distribution), and both revisions' runs above one bound `t` are
//! compared: the canary's above `1.25·t`, the baseline's above `t`.
//!
//! `t` is chosen from the two revisions' runs pooled, the canary's shifted,
//! per executable: the highest bound with at least `max(10, 1%)` of the
//! pooled runs above it (but at most half of them), so the pooled p99 once
//! there are 1,000 runs, and a wider tail before (with 200 runs, the 10
//! slowest: the 95th percentile; with fewer than 20, the slower half).
//! Under the null's edge the shifted canary's runs and the baseline's are
//! exchangeable within a node, and `t` depends only on the pooled counts,
//! which any exchange of labels leaves as they are; so, given each
//! stratum's margins, the canary's runs above are hypergeometric and the
//! stratified test is exact. A canary faster than the edge has fewer runs
//! above, which only raises the p-value. A pass needs the canary's share
//! above shown below the baseline's (ratio 1: the tolerance is already in
//! the shift).
use std::collections::{BTreeMap, BTreeSet};

use super::{
    prometheus::Series,
    signals::{increase, node_of},
    strata::{Bound, SignalData, SignalKind, Span, Stratum},
};

const ENDINGS: &str = "canaryscope_run_endings_total";
const BUCKETS: &str = "canaryscope_run_duration_seconds_bucket";

/// The endings a limit or a wrapper decided.
pub const LIMIT_ENDINGS: [&str; 4] = ["oom_kill", "rlimit_cpu", "memory_limit", "sent"];
/// Killed from outside their pod: the run did not end on its own.
pub const OUTSIDE: &str = "sent_outside";
/// The slowdown tolerated: one bucket.
pub const TOLERATED_SLOWDOWN: f64 = 1.25;
/// The pooled share of runs above the tested bound...
pub const TAIL_SHARE: f64 = 0.01;
/// ...and at least this many runs (at most half of them all).
pub const MIN_TAIL_RUNS: f64 = 10.0;

pub const LIMIT_SIGNAL: &str = "run_limit_endings";
pub const P99_SIGNAL: &str = "run_duration_p99";

/// Each query's name and PromQL, both sides' endings and buckets.
pub fn queries(canary: &str, baseline: &str, range: f64) -> Vec<(String, String)> {
    let range = range.ceil() as u64;
    let mut out = Vec::new();
    for (side, selector) in [("canary", canary), ("baseline", baseline)] {
        for metric in [ENDINGS, BUCKETS] {
            out.push((format!("{side} {metric}"), format!("{metric}{{{selector}}}[{range}s]")));
        }
    }
    out
}

/// Both sides' run series, as answered to [`queries`].
#[derive(Default)]
pub struct RunData {
    canary_endings: Vec<Series>,
    canary_buckets: Vec<Series>,
    baseline_endings: Vec<Series>,
    baseline_buckets: Vec<Series>,
}

/// A stratum: node and executable.
pub type Key = (String, String);

impl RunData {
    pub fn new(answers: Vec<Vec<Series>>) -> Self {
        let mut answers = answers.into_iter();
        let mut next = || answers.next().unwrap_or_default();
        Self {
            canary_endings: next(),
            canary_buckets: next(),
            baseline_endings: next(),
            baseline_buckets: next(),
        }
    }

    /// Keeps the canary's series of `revision` only (Flagger's newest).
    pub fn keep_canary_revision(&mut self, revision: Option<&String>) {
        for series in [&mut self.canary_endings, &mut self.canary_buckets] {
            series.retain(|s| s.labels.get("revision") == revision);
        }
    }

    /// Both signals over `span`.
    pub fn signals_at(&self, span: Span) -> Vec<SignalData> {
        vec![self.limit_endings(span), self.duration_p99(span)]
    }

    fn limit_endings(&self, span: Span) -> SignalData {
        let count = |series: &[Series], limit: bool| {
            let mut by: BTreeMap<Key, f64> = BTreeMap::new();
            for s in series {
                let ending = s.labels.get("ending").map(String::as_str).unwrap_or("");
                let counted = if limit { LIMIT_ENDINGS.contains(&ending) } else { ending != OUTSIDE };
                if counted {
                    *by.entry(key(s)).or_default() += increase(&s.samples, span.from, span.to);
                }
            }
            by
        };
        let (ce, cx) = (count(&self.canary_endings, true), count(&self.canary_endings, false));
        let (be, bx) = (count(&self.baseline_endings, true), count(&self.baseline_endings, false));
        let strata = strata(&ce, &cx, &be, &bx);
        signal(LIMIT_SIGNAL, strata, span, None)
    }

    fn duration_p99(&self, span: Span) -> SignalData {
        let canary = cumulative(&self.canary_buckets, span);
        let baseline = cumulative(&self.baseline_buckets, span);
        let (tail, thresholds) = slow_runs(&canary, &baseline);
        let definition = thresholds
            .iter()
            .map(|(exe, t)| {
                format!(
                    "{exe}: canary runs over {:.4}s against baseline runs over {t:.4}s",
                    t * TOLERATED_SLOWDOWN
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let strata = tail.into_iter().map(|(key, counts)| named(&key, counts)).collect();
        signal(P99_SIGNAL, strata, span, (!definition.is_empty()).then_some(definition))
    }
}

fn key(s: &Series) -> Key {
    let executable = s.labels.get("executable").cloned().unwrap_or_default();
    (node_of(&s.labels), executable)
}

fn named(key: &Key, [ce, cx, be, bx]: [f64; 4]) -> Stratum {
    Stratum {
        node: format!("{}/{}", key.0, key.1),
        canary_events: whole(ce),
        canary_exposure: cx,
        baseline_events: whole(be),
        baseline_exposure: bx,
    }
}

fn signal(name: &str, strata: Vec<Stratum>, span: Span, definition: Option<String>) -> SignalData {
    let mut data = SignalData::new(name, SignalKind::PerRun, strata);
    data.canary_span = span;
    data.baseline_span = span;
    data.definition = definition;
    data
}

fn whole(x: f64) -> u64 {
    x.max(0.0).round() as u64
}

fn strata(
    ce: &BTreeMap<Key, f64>,
    cx: &BTreeMap<Key, f64>,
    be: &BTreeMap<Key, f64>,
    bx: &BTreeMap<Key, f64>,
) -> Vec<Stratum> {
    let keys: BTreeSet<&Key> = ce.keys().chain(cx.keys()).chain(be.keys()).chain(bx.keys()).collect();
    let get = |m: &BTreeMap<Key, f64>, k: &Key| m.get(k).copied().unwrap_or(0.0).round();
    keys.into_iter().map(|k| named(k, [get(ce, k), get(cx, k), get(be, k), get(bx, k)])).collect()
}

/// One stratum's runs over the span: at or below each bound (by `le`, in
/// seconds), and in all (`+Inf`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cumulative {
    pub at_or_below: BTreeMap<Bound, f64>,
    pub total: f64,
}

impl Cumulative {
    /// Runs above `bound` (all of them for a bound not exported).
    fn above(&self, bound: f64) -> f64 {
        (self.total - self.at_or_below.get(&Bound(bound)).copied().unwrap_or(0.0)).max(0.0)
    }
}

/// Per stratum, each bucket's increase over the span.
fn cumulative(series: &[Series], span: Span) -> BTreeMap<Key, Cumulative> {
    let mut out: BTreeMap<Key, Cumulative> = BTreeMap::new();
    for s in series {
        let Some(le) = s.labels.get("le") else { continue };
        let n = increase(&s.samples, span.from, span.to);
        let entry = out.entry(key(s)).or_default();
        match le.as_str() {
            "+Inf" => entry.total += n,
            le => {
                let Ok(bound) = le.parse::<f64>() else { continue };
                *entry.at_or_below.entry(Bound(bound)).or_default() += n;
            }
        }
    }
    out
}

/// The bound 1.25 times `b` among `bounds`, if exported.
fn shifted(bounds: &BTreeSet<Bound>, b: f64) -> Option<f64> {
    let want = b * TOLERATED_SLOWDOWN;
    bounds.iter().map(|x| x.0).find(|x| (x / want - 1.0).abs() < 1e-6)
}

/// Per stratum `[canary above 1.25·t, canary runs, baseline above t,
/// baseline runs]` at each executable's bound `t` (see the module's
/// documentation), and each executable's `t`.
pub fn slow_runs(
    canary: &BTreeMap<Key, Cumulative>,
    baseline: &BTreeMap<Key, Cumulative>,
) -> (BTreeMap<Key, [f64; 4]>, BTreeMap<String, f64>) {
    let keys: BTreeSet<&Key> = canary.keys().chain(baseline.keys()).collect();
    let executables: BTreeSet<&String> = keys.iter().map(|(_, exe)| exe).collect();
    let mut thresholds = BTreeMap::new();
    let mut out = BTreeMap::new();
    let empty = Cumulative::default();
    for exe in executables {
        let strata: Vec<(&Key, &Cumulative, &Cumulative)> = keys
            .iter()
            .filter(|(_, e)| e == exe)
            .map(|k| (*k, canary.get(*k).unwrap_or(&empty), baseline.get(*k).unwrap_or(&empty)))
            .collect();
        let bounds: BTreeSet<Bound> = strata
            .iter()
            .flat_map(|(_, c, b)| c.at_or_below.keys().chain(b.at_or_below.keys()))
            .copied()
            .collect();
        let candidates: Vec<(f64, f64)> =
            bounds.iter().filter_map(|t| Some((t.0, shifted(&bounds, t.0)?))).collect();
        let pooled =
            |(t, up): (f64, f64)| strata.iter().map(|(_, c, b)| c.above(up) + b.above(t)).sum::<f64>();
        let runs: f64 = strata.iter().map(|(_, c, b)| c.total + b.total).sum();
        let wanted = MIN_TAIL_RUNS.max((TAIL_SHARE * runs).ceil()).min((runs / 2.0).ceil());
        let Some(&chosen) = candidates.iter().rev().find(|&&c| pooled(c) >= wanted).or(candidates.first())
        else {
            continue;
        };
        thresholds.insert(exe.clone(), chosen.0);
        for (k, c, b) in strata {
            out.insert(k.clone(), [c.above(chosen.1), c.total, b.above(chosen.0), b.total]);
        }
    }
    (out, thresholds)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs at the given seconds as one stratum's cumulative buckets over
    /// the runs' own bounds (10 ms x 1.25^k).
    fn runs(times: &[f64]) -> Cumulative {
        let bounds: Vec<f64> = (0..=48).map(|k| 0.01 * 1.25f64.powi(k)).collect();
        let mut c = Cumulative { total: times.len() as f64, ..Default::default() };
        for b in bounds {
            c.at_or_below.insert(Bound(b), times.iter().filter(|t| **t <= b).count() as f64);
        }
        c
    }

    fn one(node: &str, c: Cumulative) -> BTreeMap<Key, Cumulative> {
        BTreeMap::from([((node.to_string(), "z3".to_string()), c)])
    }

    #[test]
    fn a_canary_three_times_slower_has_every_run_of_the_tail() {
        let base: Vec<f64> = (0..30).map(|i| 0.10 + 0.001 * i as f64).collect();
        let slow: Vec<f64> = base.iter().map(|t| t * 3.0).collect();
        let (tail, t) = slow_runs(&one("a", runs(&slow)), &one("a", runs(&base)));
        let [ce, cx, be, bx] = tail[&("a".to_string(), "z3".to_string())];
        assert_eq!((cx, bx, be), (30.0, 30.0, 0.0), "{t:?}");
        assert!((10.0..=30.0).contains(&ce), "{ce}");
        assert!(t["z3"] > 0.129, "the bound is past every baseline run: {t:?}");
    }

    #[test]
    fn the_tail_is_the_top_percent_once_runs_are_many() {
        // 2,000 runs spread evenly over 0.1..1.1 s on each side.
        let times: Vec<f64> = (0..2000).map(|i| 0.1 + i as f64 / 2000.0).collect();
        let (tail, t) = slow_runs(&one("a", runs(&times)), &one("a", runs(&times)));
        let [ce, _, be, _] = tail[&("a".to_string(), "z3".to_string())];
        // At least 40 pooled (1% of 4,000); the highest bound that leaves them.
        assert!(ce + be >= 40.0, "{ce} {be}");
        let next = t["z3"] * 1.25;
        let over_next =
            times.iter().filter(|x| **x > next * 1.25).count() + times.iter().filter(|x| **x > next).count();
        assert!((over_next as f64) < 40.0, "{t:?}: the next bound would leave {over_next}");
    }

    #[test]
    fn the_canary_is_shifted_a_bucket_so_exactly_the_tolerance_is_even() {
        // Each canary run is exactly 1.25 times a baseline run: shifted, the
        // same counts above every bound.
        let base: Vec<f64> = (0..200).map(|i| 0.05 * 1.01f64.powi(i)).collect();
        let canary: Vec<f64> = base.iter().map(|t| t * 1.25).collect();
        let (tail, _) = slow_runs(&one("a", runs(&canary)), &one("a", runs(&base)));
        let [ce, _, be, _] = tail[&("a".to_string(), "z3".to_string())];
        assert_eq!(ce, be);
    }
}
