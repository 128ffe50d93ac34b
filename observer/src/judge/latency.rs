//! The p99 comparison's strata, from each node's latency histograms of
//! both revisions: the baseline's p99 bucket bound is the node's cut, and
//! the events are the canary's requests slower than 1.25 times it and the
//! baseline's slower than it (`requests` says why).
use std::collections::BTreeMap;

use super::{
    requests::{NodeCut, Uncompared, LATENCY_RATIO, MIN_BASELINE_REQUESTS, TAIL_SHARE},
    strata::{Bound, Stratum},
};

/// One revision's requests on one node over a span: cumulative counts at
/// each finite upper bound (seconds), and all of them (`+Inf`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    pub cumulative: BTreeMap<Bound, f64>,
    pub total: f64,
}

impl Histogram {
    /// Requests slower than `bound`. Buckets are summed from counters read
    /// one by one, so a cumulative count above the total (a scrape between
    /// two series) is taken as the total. A bound this side has no series
    /// of is read at the next one it has, which counts fewer.
    fn above(&self, bound: Bound) -> f64 {
        let within = self.cumulative.range(bound..).next().map_or(self.total, |(_, v)| *v);
        (self.total - within).max(0.0)
    }
}

/// The strata and what the answer says of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatencyStrata {
    pub strata: Vec<Stratum>,
    pub cuts: Vec<NodeCut>,
    pub uncompared: Vec<Uncompared>,
}

/// Pairs of bounds `(b, b')` with `b' = 1.25·b`, in order: where a cut can
/// be, the canary's bound beside it.
fn cut_candidates(bounds: &[Bound]) -> Vec<(Bound, Bound)> {
    bounds
        .iter()
        .filter_map(|b| {
            let next = bounds.iter().find(|c| (c.0 / b.0 - LATENCY_RATIO).abs() < 1e-6)?;
            Some((*b, *next))
        })
        .collect()
}

/// The node's cut: the smallest candidate bound with at most 1% of the
/// baseline's requests above it.
fn cut(baseline: &Histogram) -> Option<(Bound, Bound)> {
    let bounds: Vec<Bound> = baseline.cumulative.keys().copied().collect();
    cut_candidates(&bounds).into_iter().find(|(b, _)| baseline.above(*b) <= TAIL_SHARE * baseline.total)
}

fn whole(x: f64) -> u64 {
    x.max(0.0).round() as u64
}

/// Each node's stratum. Nodes where the baseline has fewer than
/// [`MIN_BASELINE_REQUESTS`] requests, or its p99 beyond the last bound,
/// have the canary's requests and no baseline: they are not compared.
pub fn strata(nodes: &BTreeMap<String, (Histogram, Histogram)>) -> LatencyStrata {
    let mut out = LatencyStrata::default();
    for (node, (canary, baseline)) in nodes {
        let alone = |out: &mut LatencyStrata| {
            out.strata.push(Stratum {
                node: node.clone(),
                canary_events: 0,
                canary_exposure: canary.total,
                baseline_events: 0,
                baseline_exposure: 0.0,
            });
        };
        let uncompared = |needed| Uncompared {
            node: node.clone(),
            canary_requests: canary.total,
            baseline_requests: baseline.total,
            baseline_requests_needed: needed,
        };
        if baseline.total < MIN_BASELINE_REQUESTS {
            alone(&mut out);
            if canary.total > 0.0 {
                out.uncompared.push(uncompared(Some(MIN_BASELINE_REQUESTS - baseline.total)));
            }
            continue;
        }
        let Some((baseline_bound, canary_bound)) = cut(baseline) else {
            alone(&mut out);
            if canary.total > 0.0 {
                out.uncompared.push(uncompared(None));
            }
            continue;
        };
        out.strata.push(Stratum {
            node: node.clone(),
            canary_events: whole(canary.above(canary_bound)),
            canary_exposure: canary.total,
            baseline_events: whole(baseline.above(baseline_bound)),
            baseline_exposure: baseline.total,
        });
        if canary.total > 0.0 {
            out.cuts.push(NodeCut {
                node: node.clone(),
                baseline_p99_bound: baseline_bound.0,
                canary_bound: canary_bound.0,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's bounds: 1, 2.5 and 5 ms, then 1.25 apart from 10 ms.
    fn bounds() -> Vec<f64> {
        let mut b = vec![0.001, 0.0025, 0.005];
        b.extend((0..32).map(|k| 0.01 * 1.25f64.powi(k)));
        b
    }

    /// A histogram of requests, each a latency in seconds.
    fn histogram(latencies: &[f64]) -> Histogram {
        let cumulative = bounds()
            .into_iter()
            .map(|b| (Bound(b), latencies.iter().filter(|l| **l <= b).count() as f64))
            .collect();
        Histogram { cumulative, total: latencies.len() as f64 }
    }

    /// `n` latencies spread evenly (in log) from `low` to `high`.
    fn spread(n: usize, low: f64, high: f64) -> Vec<f64> {
        (0..n).map(|i| low * (high / low).powf(i as f64 / (n - 1) as f64)).collect()
    }

    #[test]
    fn the_cut_is_the_baselines_p99_bound_and_the_canarys_is_the_next() {
        let baseline = histogram(&spread(2000, 0.02, 0.2));
        let canary = histogram(&spread(1000, 0.02, 0.2));
        let nodes = BTreeMap::from([("a".to_string(), (canary, baseline.clone()))]);
        let s = strata(&nodes);
        let cut = &s.cuts[0];
        assert!((cut.canary_bound / cut.baseline_p99_bound - 1.25).abs() < 1e-9, "{cut:?}");
        // At most 1% of the baseline above the cut, more than 1% above the bound below it.
        let above = baseline.above(Bound(cut.baseline_p99_bound));
        assert!(above <= 20.0, "{above}");
        let below = bounds().into_iter().rev().find(|b| *b < cut.baseline_p99_bound).expect("a bound below");
        assert!(baseline.above(Bound(below)) > 20.0);
        assert_eq!(s.strata[0].baseline_events, above as u64);
        assert_eq!(s.strata[0].canary_events as f64, nodes["a"].0.above(Bound(cut.canary_bound)));
    }

    #[test]
    fn a_p99_below_10_ms_is_cut_at_10_ms_and_one_beyond_the_buckets_is_not_compared() {
        let fast = histogram(&vec![0.002; 1500]);
        let nodes = BTreeMap::from([("a".to_string(), (fast.clone(), fast))]);
        let s = strata(&nodes);
        assert_eq!(s.cuts[0].baseline_p99_bound, 0.01);
        let slow = histogram(&vec![20.0; 1500]);
        let nodes = BTreeMap::from([("a".to_string(), (slow.clone(), slow))]);
        let s = strata(&nodes);
        assert!(s.cuts.is_empty());
        assert_eq!(s.uncompared[0].baseline_requests_needed, None);
        assert_eq!(s.strata[0].baseline_exposure, 0.0, "not compared");
    }

    #[test]
    fn a_node_with_too_few_baseline_requests_says_how_many_more() {
        let nodes = BTreeMap::from([(
            "a".to_string(),
            (histogram(&spread(500, 0.02, 0.2)), histogram(&spread(200, 0.02, 0.2))),
        )]);
        let s = strata(&nodes);
        assert_eq!(s.uncompared[0].baseline_requests_needed, Some(100.0));
        assert_eq!((s.strata[0].canary_exposure, s.strata[0].baseline_exposure), (500.0, 0.0));
    }
}
