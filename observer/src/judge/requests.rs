//! The tests of the request signals (HTTP 5xx, connections closed
//! mid-response, p99 latency against stable), which `verdict` runs beside
//! the rare-event tests and holds to the same thresholds.
//!
//! # Shares of requests: 5xx, and connections closed mid-response
//!
//! The runbook rolls back when 5xx pass 1% of the canary's traffic. That
//! share is the tolerated absolute share `s` (`--http-error-share`, or the
//! question's `http_error_share`); the comparison with the baseline comes
//! on top of it, at the tolerated ratio `r` of every rate the judge
//! compares (1.5; `--ratio http_5xx=R`). A canary is within tolerance when
//! its share `p_c` is at most `max(s, r·p_b)`: a share below `s` is
//! tolerated whatever the baseline's, and a downstream outage that fails
//! both revisions alike is not the canary's. So the null is the union
//! `p_c <= s` or `p_c <= r·p_b`, and a signal fails only when both are
//! rejected (an intersection–union test, level alpha without splitting it):
//!
//! - against `s`: the exact binomial test of the canary's count among its
//!   requests on shared nodes, `P(Bin(n_c, s) >= x_c)`;
//! - against the baseline: the conditional test of two Poisson rates at
//!   ratio `r`, events per request, stratified by node, as the per-pod-second
//!   signals are tested. Requests are binomial, less dispersed than the
//!   Poisson model, which makes it conservative: given the events, the
//!   canary's count is drawn without replacement, less spread than the
//!   binomial the test assumes.
//!
//! and the p-value is the larger of the two. A tolerated share of 0 leaves
//! the comparison with the baseline alone. The binomial half is not
//! conditional on the margins that make the other half exact, so within a
//! look this signal is charged the whole threshold (a Bonferroni share)
//! whenever it could fail, instead of the size its attainable p-values
//! give.
//!
//! `pass` needs the canary shown within the same tolerance: the lower
//! binomial tail against `s`, or the test against the baseline run the
//! other way; either, at half the pass threshold each. Fail and pass share
//! their edge.
//!
//! # p99 against stable
//!
//! The runbook rolls back when the canary's p99 exceeds stable's by more
//! than 25%. The daemon's histogram buckets are 1.25 apart from 10 ms to
//! 10 s, so a bucket bound times 1.25 is the next bound and the comparison
//! needs no interpolation:
//!
//! - on each node, the cut `c` is the baseline's p99 bucket bound: the
//!   smallest bound with at most 1% of its requests (2xx–4xx, as the
//!   runbook's rule) above it, among bounds whose 1.25 multiple is a bound;
//! - the canary's events are its requests slower than `1.25·c`; the
//!   baseline's, its requests slower than `c` (about 1%, measured on the
//!   same span, so its own uncertainty is in the test);
//! - Fisher's exact test stratified by node, one-sided: the canary's share
//!   beyond `1.25·c` above the baseline's beyond `c`.
//!
//! For a canary whose latencies are the baseline's stretched by a factor
//! (the same shape, slower), the two shares are equal at exactly +25%:
//! that is the null's edge, where each look's test has its level. A canary
//! slowed by a fixed added delay is compared at the same edge on the side
//! of caution (its tail beyond the p99 is thinner than the stretched
//! one's). The cut is chosen from the baseline's own requests, which makes
//! the test slightly liberal on small counts; a node needs
//! [`MIN_BASELINE_REQUESTS`] baseline requests before it is compared,
//! where the simulation (`tests/judge/simulate.py`) measures the rates.
//!
//! `pass`: the same test run the other way (the canary's share beyond
//! `1.25·c` shown below the baseline's beyond `c`), once the canary has
//! `--min-requests` requests on compared nodes.
//!
//! # The runbook's "3 consecutive minutes"
//!
//! The runbook fails a canary whose p99 stays above for 3 minutes. Mapped
//! onto looks: the latency signal fails at a look only when its test
//! rejects on the counts as they stood at each minute of the last 3
//! (`--p99-for`, or the question's `p99_for`) as well as at the look's end,
//! each against the look's threshold; with Argo's 1-minute interval, that
//! is this look and the three before it. The p-value reported is the
//! largest of these, which is at least the look's own, so the hold costs
//! no alpha. A canary younger than the hold cannot fail on latency. Counts
//! are cumulative from the canary's first data, as every signal's are.
use serde::Serialize;

use super::stats::{Conditional, Counts};

/// The p99 latency tolerated: the runbook's "more than 25% above stable".
pub const LATENCY_RATIO: f64 = 1.25;
/// The share of a revision's requests above its p99.
pub const TAIL_SHARE: f64 = 0.01;
/// The runbook's "5xx above 1% of the canary's traffic".
pub const DEFAULT_ERROR_SHARE: f64 = 0.01;
/// Requests the canary needs on compared nodes before a request signal can
/// pass: a p99 rests on the slowest ten of a thousand.
pub const DEFAULT_MIN_REQUESTS: f64 = 1000.0;
/// The checks of the hold are this far apart: the runbook's minutes.
pub const HOLD_STEP: f64 = 60.0;
/// Baseline requests a node needs before its p99 is a cut: three above
/// it. Fewer make the cut often fall below the p99, where a canary slowed
/// by an added delay is more than 25% slower, and the truncation of the
/// baseline's count at the cut weighs more.
pub const MIN_BASELINE_REQUESTS: f64 = 300.0;

/// What the answer says of a request signal beyond the common fields.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RequestTerms {
    /// Shares: the tolerated absolute share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerated_share: Option<f64>,
    /// Shares: the exact binomial p-value against the tolerated share alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p_value_against_share: Option<f64>,
    /// Shares: the p-value against `r` times the baseline's share alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p_value_against_baseline: Option<f64>,
    /// Latency: per compared node, the baseline's p99 bound and the canary's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cuts: Vec<NodeCut>,
    /// Latency: nodes whose canary requests could not be compared, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub uncompared: Vec<Uncompared>,
    /// Latency: the earlier checks of the hold, oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldCheck>,
}

/// One node's cut: requests slower than these bounds are the events.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeCut {
    pub node: String,
    /// The baseline's p99 bucket bound (seconds).
    pub baseline_p99_bound: f64,
    /// The canary's bound, 1.25 times the baseline's (seconds).
    pub canary_bound: f64,
}

/// A node where the canary served requests that were not compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Uncompared {
    pub node: String,
    pub canary_requests: f64,
    pub baseline_requests: f64,
    /// Baseline requests still needed there before its p99 is known
    /// (absent when more would not help: its p99 is beyond the buckets).
    pub baseline_requests_needed: Option<f64>,
}

/// One earlier check of the latency hold.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeldCheck {
    /// Unix seconds the counts stood at.
    pub at: f64,
    pub p_value: Option<f64>,
    /// The strata then (nodes without both revisions left out).
    #[serde(skip)]
    pub counts: Vec<Counts>,
}

/// A request signal's failure test: its p-value, the smallest it could
/// attain, and whether its size at a threshold is known from the
/// conditional test's attainable p-values (else it is the threshold).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailTest {
    pub p_value: f64,
    pub min_attainable: f64,
    pub sizes_exact: bool,
}

/// `P(X >= x)` for X ~ Binomial(n, share), 0 < share < 1.
pub fn binomial_at_least(x: u64, n: u64, share: f64) -> f64 {
    one_sample(x, n, share).p_value()
}

/// `P(X <= x)` for X ~ Binomial(n, share), 0 < share < 1.
pub fn binomial_at_most(x: u64, n: u64, share: f64) -> f64 {
    one_sample(x, n, share).lower_tail()
}

/// The binomial as the conditional test of two Poisson rates whose
/// exposures are `share` and `1 - share`: given n events, the first's
/// count is Binomial(n, share), computed in log space by `stats`.
fn one_sample(x: u64, n: u64, share: f64) -> Conditional {
    let counts = Counts {
        canary_events: x,
        canary_exposure: share,
        baseline_events: n.max(x) - x,
        baseline_exposure: 1.0 - share,
    };
    Conditional::poisson(&[counts], 1.0)
}

/// The canary's events and requests summed over `used`.
fn canary_totals(used: &[Counts]) -> (u64, u64) {
    let events = used.iter().map(|c| c.canary_events).sum();
    let requests = used.iter().map(|c| whole(c.canary_exposure)).sum::<u64>().max(events);
    (events, requests)
}

fn whole(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x.round() as u64
    } else {
        0
    }
}

/// Whether `share` is a tolerated share the binomial half can test.
fn binomial_applies(share: f64) -> bool {
    share > 0.0 && share < 1.0
}

/// The share signals' failure test over the shared nodes `used`, given
/// the test against the baseline over them, the conditional test of two
/// Poisson rates at the tolerated ratio (see the module's documentation).
pub fn share_fail(used: &[Counts], baseline: &Conditional, share: f64, terms: &mut RequestTerms) -> FailTest {
    let against_baseline = baseline.p_value();
    terms.tolerated_share = Some(share);
    terms.p_value_against_baseline = Some(against_baseline);
    if !binomial_applies(share) {
        let min_attainable = baseline.min_attainable();
        return FailTest { p_value: against_baseline, min_attainable, sizes_exact: true };
    }
    let (events, requests) = canary_totals(used);
    let against_share = binomial_at_least(events, requests, share);
    terms.p_value_against_share = Some(against_share);
    // Every request an event: what the binomial half allows at best, from
    // the canary's request count alone (not from the other half's margins).
    let min_attainable = (requests as f64 * share.ln()).exp();
    FailTest { p_value: against_baseline.max(against_share), min_attainable, sizes_exact: false }
}

/// The share signals' `shown_no_worse` p-value: the canary shown below the
/// tolerated share, or below `ratio` times the baseline's share.
pub fn share_no_worse(used: &[Counts], share: f64, ratio: f64) -> f64 {
    let against_baseline = Conditional::poisson(used, ratio).lower_tail();
    if !binomial_applies(share) {
        return against_baseline;
    }
    let (events, requests) = canary_totals(used);
    let against_share = binomial_at_most(events, requests, share);
    (2.0 * against_baseline.min(against_share)).min(1.0)
}

/// The latency signal's failure test: Fisher's test now and at each
/// earlier check of the hold, the largest p-value; the sizes are those of
/// the test now, which the largest can only be above.
pub fn latency_fail(now: &Conditional, terms: &mut RequestTerms) -> FailTest {
    let mut p_value = now.p_value();
    for check in &mut terms.held {
        let then = Conditional::fisher(&check.counts).p_value();
        check.p_value = Some(then);
        p_value = p_value.max(then);
    }
    FailTest { p_value, min_attainable: now.min_attainable(), sizes_exact: true }
}

/// The latency signal's `shown_no_worse` p-value: Fisher's test the other
/// way, `P(S <= s)`.
pub fn latency_no_worse(used: &[Counts]) -> f64 {
    Conditional::fisher(used).lower_tail()
}

/// The times of the hold's earlier checks for a look ending at `end`:
/// every [`HOLD_STEP`] back to `end - hold`, oldest first.
pub fn hold_checks(end: f64, hold: f64) -> Vec<f64> {
    if !(hold.is_finite() && hold > 0.0) {
        return Vec::new();
    }
    let steps = (hold / HOLD_STEP).ceil() as u32;
    (1..=steps).rev().map(|i| end - (f64::from(i) * HOLD_STEP).min(hold)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs())
    }

    /// The binomial tail summed term by term, for small n.
    fn direct_at_least(x: u64, n: u64, p: f64) -> f64 {
        let mut coefficient = 1.0;
        let mut total = 0.0;
        for k in 0..=n {
            if k > 0 {
                coefficient *= (n - k + 1) as f64 / k as f64;
            }
            if k >= x {
                total += coefficient * p.powi(k as i32) * (1.0 - p).powi((n - k) as i32);
            }
        }
        total
    }

    fn counts(ce: u64, cx: f64, be: u64, bx: f64) -> Counts {
        Counts { canary_events: ce, canary_exposure: cx, baseline_events: be, baseline_exposure: bx }
    }

    #[test]
    fn binomial_tails_match_a_direct_sum() {
        for (x, n, p) in [(3, 40, 0.01), (0, 10, 0.2), (7, 30, 0.1), (30, 30, 0.5), (1, 200, 0.01)] {
            let want = direct_at_least(x, n, p);
            assert!(close(binomial_at_least(x, n, p), want, 1e-12), "{x} {n} {p}");
            let below = 1.0 - direct_at_least(x + 1, n, p);
            assert!(close(binomial_at_most(x, n, p), below, 1e-9), "{x} {n} {p}");
        }
    }

    #[test]
    fn a_share_fails_only_above_both_the_tolerated_share_and_the_baseline() {
        let mut terms = RequestTerms::default();
        let fail = |c: &[Counts], share, terms: &mut RequestTerms| {
            share_fail(c, &Conditional::poisson(c, 1.5), share, terms)
        };
        // 3% against the baseline's 0.1%: above both.
        let bad = [counts(30, 1000.0, 3, 3000.0)];
        let f = fail(&bad, 0.01, &mut terms);
        assert!(f.p_value < 1e-4 && !f.sizes_exact, "{f:?}");
        let halves =
            (terms.p_value_against_share.expect("binomial"), Conditional::poisson(&bad, 1.5).p_value());
        assert_eq!(f.p_value, halves.0.max(halves.1));
        // 0.8% against none: above the baseline, within the tolerated 1%.
        let within = [counts(8, 1000.0, 0, 3000.0)];
        let f = fail(&within, 0.01, &mut terms);
        assert!(f.p_value > 0.5, "{f:?}");
        assert!(terms.p_value_against_baseline.is_some_and(|p| p < 1e-3), "{terms:?}");
        // 4.4% against a baseline's 3% (an outage of both): within 1.5 times it.
        let outage = [counts(44, 1000.0, 90, 3000.0)];
        assert!(fail(&outage, 0.01, &mut terms).p_value > 0.3);
        // 6% against 3%, by the ten thousand: not within it.
        let worse = [counts(600, 1e4, 900, 3e4)];
        assert!(fail(&worse, 0.01, &mut terms).p_value < 1e-6);
        // No tolerated share: the comparison alone, its sizes exact.
        let f = fail(&within, 0.0, &mut terms);
        assert!(f.sizes_exact && f.p_value < 1e-3, "{f:?}");
    }

    #[test]
    fn a_share_passes_below_the_tolerated_share_or_well_below_the_baseline() {
        // 2 in 2,000 against a 1% tolerance: shown below it.
        assert!(share_no_worse(&[counts(2, 2000.0, 1, 6000.0)], 0.01, 1.5) < 1e-5);
        // 0 in 100: too few requests to show anything.
        assert!(share_no_worse(&[counts(0, 100.0, 0, 300.0)], 0.01, 1.5) > 0.3);
        // A baseline failing 5%: the canary's 2% is shown below 1.5 times it.
        let flaky = [counts(40, 2000.0, 300, 6000.0)];
        assert!(share_no_worse(&flaky, 0.01, 1.5) < 1e-6);
        assert!(share_no_worse(&flaky, 0.0, 1.5) < 1e-6);
    }

    #[test]
    fn the_hold_is_the_largest_p_value_of_its_checks() {
        let now = [counts(40, 1000.0, 30, 3000.0)];
        let mut terms = RequestTerms {
            held: vec![
                HeldCheck { at: 1.0, p_value: None, counts: vec![counts(4, 100.0, 3, 300.0)] },
                HeldCheck { at: 2.0, p_value: None, counts: vec![counts(20, 500.0, 15, 1500.0)] },
            ],
            ..RequestTerms::default()
        };
        let f = latency_fail(&Conditional::fisher(&now), &mut terms);
        let p: Vec<f64> = terms.held.iter().map(|c| c.p_value.expect("tested")).collect();
        assert_eq!(f.p_value, p.iter().copied().fold(Conditional::fisher(&now).p_value(), f64::max));
        assert!(p[0] > p[1] && p[1] > Conditional::fisher(&now).p_value(), "{p:?}");
    }

    #[test]
    fn the_holds_checks_are_a_minute_apart_back_to_its_start() {
        assert_eq!(hold_checks(1000.0, 180.0), vec![820.0, 880.0, 940.0]);
        assert_eq!(hold_checks(1000.0, 90.0), vec![910.0, 940.0]);
        assert!(hold_checks(1000.0, 0.0).is_empty());
    }
}
