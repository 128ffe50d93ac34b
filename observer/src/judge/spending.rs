//! How the false-rollback budget is spent over looks and signals.
//!
//! Argo's `web` provider asks every interval and the service keeps no
//! state, so the judge is told only which look this is (`k`, counted in
//! intervals from the canary's first data) and sees the cumulative counts.
//! A rollback at any look of any signal is a false rollback if the canary
//! is within tolerance, so the false-rollback budget `alpha` is split over
//! both with union bounds, which need no independence between looks or
//! signals and no memory of earlier answers:
//!
//! - look k may spend `alpha · w_k` ([`look_weight`]): look 1 a fifth,
//!   looks 2 to 11 (the span of a typical analysis) 6% each, and look
//!   k > 11 `0.2 · 11 / ((k-1)k)`, which telescopes to the last fifth. The
//!   weights sum to 1 over infinitely many looks, so the bound holds
//!   however long an analysis runs. Alternatives weighed in the
//!   simulation (`simulate.rs`: canary at 25% of the exposure, 5x the
//!   baseline's rate, about 20 baseline events, the tested signal alone):
//!   `1/(k(k+1))` or `6/(π²k²)` spend half or more at look 1, when the
//!   counts are smallest, and leave look 10 a hundredth: 87% of such
//!   canaries failed. `c/((k+c-1)(k+c))` levels off near 90.5% whatever c.
//!   Spending evenly over the looks that carry the evidence fails 93–94%
//!   (91% beside four healthy signals of about 5 events each), at the
//!   same bound.
//! - within a look, the budget is split over signals by the size each test
//!   actually has: given the margins a test conditions on, its p-value can
//!   only take a few values, so `P(p_j <= t)` is the largest attainable
//!   p-value at or below t, and 0 when even its smallest (every event the
//!   canary's) is above t. The threshold t is the largest with
//!   `Σ_j P(p_j <= t) <= alpha · w_k` (a Bonferroni bound on actual sizes;
//!   it includes Tarone's `alpha_k / m`, m the number of tests able to
//!   reach it). Rare-event signals with a handful of events, most of them
//!   most of the time, then cost nothing or little, instead of dividing
//!   alpha by every signal. A request share tested against a tolerated
//!   share has a half that is not conditional on those margins: its size
//!   at t is taken as t (a Bonferroni share) whenever it could fail.
//!
//! So `P(any false rollback, over all looks and signals) <= alpha`, for
//! per-pod-second signals whenever the canary's rate is at most the
//! tolerated ratio times the baseline's, for start-ups whenever its
//! failure proportion is at most the baseline's, and for request shares
//! whenever the canary's is at most the larger of the tolerated share and
//! r times the baseline's. The p99's holds for a canary no slower than
//! stable stretched by 1.25, up to the cut being chosen from the
//! baseline's own requests (`requests`; measured by the simulation). The default alpha is
//! 0.05: the bound at the edge of tolerance, and in the simulation the
//! false-rollback share at equal rates is about 0.2% for per-pod-second
//! signals and 0.5–0.7% for start-ups (target 1%), as exact conditional
//! tests on sparse counts and union bounds over nested looks are
//! conservative. A smaller alpha buys nothing the target asks for and
//! costs detection: 0.05 is where 5x canaries reach 90%.
//! It also lets strong early evidence through: 8 of 20 failed start-ups
//! against 0 of 20 (one-sided p = 0.0016) fails at look 1, whose budget is
//! 0.05 · 0.2 = 0.01, even beside five other signals each able to fail.
use super::stats::{Attainable, Conditional};

/// The share of alpha look 1 may spend: strong early evidence (8 of 20
/// start-ups failed against none) must fail at once.
pub const FIRST_LOOK_SHARE: f64 = 0.2;
/// Looks 2 to `1 + HORIZON_LOOKS` share `HORIZON_SHARE` evenly: the span
/// of a typical analysis (Argo's `count` of about ten intervals).
pub const HORIZON_LOOKS: u32 = 10;
pub const HORIZON_SHARE: f64 = 0.6;

/// The share of alpha look `look` (1-based) may spend; over all looks they
/// sum to 1. Past the horizon, look k gets `tail · L / ((k-1)k)` with L the
/// horizon's last look, which telescopes to the tail's share.
pub fn look_weight(look: u32) -> f64 {
    let last = HORIZON_LOOKS + 1;
    match look.max(1) {
        1 => FIRST_LOOK_SHARE,
        k if k <= last => HORIZON_SHARE / f64::from(HORIZON_LOOKS),
        k => {
            let tail = 1.0 - FIRST_LOOK_SHARE - HORIZON_SHARE;
            let k = f64::from(k);
            tail * f64::from(last) / ((k - 1.0) * k)
        }
    }
}

/// How many attainable p-values of one test are weighed exactly; beyond
/// them its size is bounded by the threshold itself.
const ATTAINABLE_COUNT: usize = 64;

/// The largest p-value threshold that keeps this look's chance of any
/// false failure within `budget`, over all `tests`:
/// `Σ_j P(p_j <= t | margins) <= budget`. Each test's size at t is the
/// largest p-value it can attain at or below t (0 when even its smallest
/// is above t), so tests that cannot fail cost nothing and those that can
/// barely cost little. Tarone's `budget / m` always satisfies the bound;
/// among the attainable and observed p-values above it, the largest that
/// does is the threshold. Deciding `p_i <= threshold` is then the same as
/// rejecting whenever some threshold allowed by the bound reaches p_i.
pub(super) fn threshold(tests: &[Tested], budget: f64) -> f64 {
    let minima: Vec<f64> = tests.iter().map(|t| t.min).collect();
    let tarone = budget / tarone_count(&minima, budget) as f64;
    let attainable: Vec<Attainable> = tests
        .iter()
        .filter(|t| t.min <= budget)
        .map(|t| match t.sizes_exact {
            true => t.test.attainable_up_to(budget, ATTAINABLE_COUNT),
            // Its size at any threshold from its smallest p-value on is
            // bounded by the threshold itself.
            false => Attainable { values: vec![t.min], complete: false },
        })
        .collect();
    let mut candidates: Vec<f64> = attainable
        .iter()
        .flat_map(|a| a.values.iter().copied())
        .chain(tests.iter().map(|t| t.p_value))
        .filter(|&c| c > tarone && c <= budget)
        .collect();
    candidates.sort_by(|a, b| b.total_cmp(a));
    let size = |t: f64| attainable.iter().map(|a| size_at(a, t)).sum::<f64>();
    candidates.into_iter().find(|&c| size(c) <= budget).map_or(tarone, |c| c.max(tarone))
}

/// A signal's test with its p-value and smallest attainable one.
pub(super) struct Tested<'a> {
    pub test: &'a Conditional,
    pub p_value: f64,
    pub min: f64,
    /// Whether `test`'s attainable p-values bound the signal's size.
    pub sizes_exact: bool,
}

/// `P(p <= t)` for one test, or a bound on it past its listed values.
fn size_at(a: &Attainable, t: f64) -> f64 {
    match a.values.iter().rposition(|&v| v <= t) {
        None => 0.0,
        Some(i) if i + 1 == a.values.len() && !a.complete => t,
        Some(i) => a.values[i],
    }
}

/// Tarone's m: the smallest m >= 1 such that at most m signals could reach
/// a p-value of `budget / m` at all.
pub(super) fn tarone_count(min_attainable: &[f64], budget: f64) -> usize {
    (1..=min_attainable.len().max(1))
        .find(|&m| min_attainable.iter().filter(|&&p| p <= budget / m as f64).count() <= m)
        .unwrap_or(min_attainable.len().max(1))
}
