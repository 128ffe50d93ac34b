//! What the judge's rules cost and buy, by simulation: many analyses of a
//! canary against its baseline, each asked at every look as Argo asks, each
//! ending at its first `fail` (a rollback) or `pass`.
//!
//! Events arrive as Poisson counts over pod-seconds (and failures as
//! binomial draws over start-ups) on a few nodes, where the canary holds a
//! share of the exposure, spread over the nodes unlike the baseline's. At
//! each look the cumulative counts go through [`judge`] with the default
//! policy, as the service would send them.
//!
//! The canary's pod-seconds grow so that it reaches the minimum exposure at
//! the last look: an analysis is sized so that its minimum exposure is what
//! it is meant to see, and it cannot pass before. The tested signal has
//! about `baseline_events` baseline events over the whole analysis; beside
//! it run the service's other per-pod-second signals, at equal rates in
//! both revisions, so that every look judges a realistic signal set.
//!
//! Deterministic for a seed (xoshiro256** seeded by splitmix64), with no
//! crate beyond the observer's own.
use serde::Serialize;

use super::{
    policy::Policy,
    report::Outcome,
    spending,
    strata::{SignalData, SignalKind, Stratum},
    verdict::judge,
};

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub analyses: usize,
    pub looks: u32,
    /// The canary's share of the exposure (pod-seconds and start-ups).
    pub canary_share: f64,
    /// How each revision's exposure is spread over the nodes (shares).
    pub canary_nodes: Vec<f64>,
    pub baseline_nodes: Vec<f64>,
    /// Expected baseline events of the tested signal over the analysis.
    pub baseline_events: f64,
    /// The canary's rate over the baseline's in the detection cases.
    pub detect_ratio: f64,
    /// Other per-pod-second signals, at equal rates in both revisions,
    /// each with this many expected baseline events over the analysis.
    pub background_signals: usize,
    pub background_events: f64,
    /// The canary's GPU start-ups per look in the start-up cases.
    pub canary_startups_per_look: f64,
    pub seed: u64,
    pub policy: Policy,
}

impl SimConfig {
    /// The bench's configuration: 10,000 analyses of 10 looks on 3 nodes.
    pub fn default_for_share(share: f64) -> Self {
        SimConfig {
            analyses: 10_000,
            looks: 10,
            canary_share: share,
            canary_nodes: vec![0.4, 0.4, 0.2],
            baseline_nodes: vec![0.5, 0.3, 0.2],
            baseline_events: 20.0,
            detect_ratio: 5.0,
            background_signals: 4,
            background_events: 5.0,
            canary_startups_per_look: 5.0,
            seed: 0x6a75_6467_6521,
            policy: Policy::default(),
        }
    }

    fn pod_seconds_per_look(&self) -> (f64, f64) {
        let canary = self.policy.min_pod_seconds.max(1.0) / f64::from(self.looks.max(1));
        (canary, canary * (1.0 - self.canary_share) / self.canary_share)
    }

    fn startups_per_look(&self) -> (f64, f64) {
        let canary = self.canary_startups_per_look;
        (canary, canary * (1.0 - self.canary_share) / self.canary_share)
    }
}

/// The whole simulation, self-describing for the bench that prints it.
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    pub description: &'static str,
    pub analyses: usize,
    pub looks: u32,
    pub canary_share: f64,
    pub nodes: usize,
    pub seed: u64,
    pub alpha: f64,
    pub tolerated_ratio: f64,
    /// The share of alpha each look may spend.
    pub look_weights: Vec<f64>,
    pub min_pod_seconds: f64,
    pub min_startups: f64,
    pub canary_pod_seconds_per_look: f64,
    pub baseline_pod_seconds_per_look: f64,
    pub canary_startups_per_look: f64,
    pub baseline_startups_per_look: f64,
    pub background_signals: usize,
    pub background_events: f64,
    pub cases: Vec<CaseReport>,
}

/// One scenario: how often its analyses failed, passed or never decided.
#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    pub name: &'static str,
    pub description: String,
    /// The kind of the signal whose rate differs (or not).
    pub kind: SignalKind,
    /// Canary rate (or failure probability) over the baseline's.
    pub rate_ratio: f64,
    pub baseline_events_expected: f64,
    pub failed_share: f64,
    pub passed_share: f64,
    pub undecided_share: f64,
    pub median_looks_to_decision: Option<f64>,
    pub median_looks_to_fail: Option<f64>,
    pub target: Option<SimTarget>,
}

/// What the issue asks of a case's failed share.
#[derive(Clone, Debug, Serialize)]
pub struct SimTarget {
    /// `at_most` (false rollbacks) or `at_least` (detection).
    pub comparison: &'static str,
    pub failed_share: f64,
    pub met: bool,
}

/// One scenario to run.
struct Scenario {
    name: &'static str,
    kind: SignalKind,
    ratio: f64,
    target: Option<(&'static str, f64)>,
}

const SCENARIOS: [Scenario; 4] = [
    Scenario {
        name: "pod_seconds_equal_rates",
        kind: SignalKind::PerPodSecond,
        ratio: 1.0,
        target: Some(("at_most", 0.01)),
    },
    Scenario {
        name: "pod_seconds_detection",
        kind: SignalKind::PerPodSecond,
        ratio: f64::NAN,
        target: Some(("at_least", 0.90)),
    },
    Scenario {
        name: "startups_equal_rates",
        kind: SignalKind::PerStartup,
        ratio: 1.0,
        target: Some(("at_most", 0.01)),
    },
    Scenario { name: "startups_detection", kind: SignalKind::PerStartup, ratio: f64::NAN, target: None },
];

pub fn simulate(cfg: &SimConfig) -> SimReport {
    let (canary_ps, baseline_ps) = cfg.pod_seconds_per_look();
    let (canary_su, baseline_su) = cfg.startups_per_look();
    let cases = SCENARIOS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let ratio = if s.ratio.is_nan() { cfg.detect_ratio } else { s.ratio };
            let mut rng = Rng::new(cfg.seed ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            run_case(cfg, s, ratio, &mut rng)
        })
        .collect();
    SimReport {
        description:
            "analyses of a canary against its baseline, judged at every look with the default policy; \
                      each ends at its first fail (rollback) or pass",
        analyses: cfg.analyses,
        looks: cfg.looks,
        canary_share: cfg.canary_share,
        nodes: cfg.canary_nodes.len().max(cfg.baseline_nodes.len()),
        seed: cfg.seed,
        alpha: cfg.policy.alpha,
        tolerated_ratio: cfg.policy.tolerated_ratio,
        look_weights: (1..=cfg.looks).map(spending::look_weight).collect(),
        min_pod_seconds: cfg.policy.min_pod_seconds,
        min_startups: cfg.policy.min_startups,
        canary_pod_seconds_per_look: canary_ps,
        baseline_pod_seconds_per_look: baseline_ps,
        canary_startups_per_look: canary_su,
        baseline_startups_per_look: baseline_su,
        background_signals: cfg.background_signals,
        background_events: cfg.background_events,
        cases,
    }
}

/// Cumulative counts of one signal on every node.
#[derive(Clone)]
struct Track {
    name: String,
    kind: SignalKind,
    /// Per node: canary and baseline events per unit of exposure (or
    /// failure probabilities per start-up).
    canary_rate: f64,
    baseline_rate: f64,
    strata: Vec<Stratum>,
}

impl Track {
    fn new(name: String, kind: SignalKind, nodes: usize, canary_rate: f64, baseline_rate: f64) -> Track {
        let strata = (0..nodes)
            .map(|n| Stratum {
                node: format!("node-{n}"),
                canary_events: 0,
                canary_exposure: 0.0,
                baseline_events: 0,
                baseline_exposure: 0.0,
            })
            .collect();
        Track { name, kind, canary_rate, baseline_rate, strata }
    }

    /// Adds one look's exposure on every node, and the events it brought.
    fn advance(&mut self, canary: &[f64], baseline: &[f64], rng: &mut Rng) {
        for (n, s) in self.strata.iter_mut().enumerate() {
            let (dc, db) = (canary.get(n).copied().unwrap_or(0.0), baseline.get(n).copied().unwrap_or(0.0));
            s.canary_exposure += dc;
            s.baseline_exposure += db;
            let (ec, eb) = match self.kind {
                SignalKind::PerPodSecond => {
                    (rng.poisson(self.canary_rate * dc), rng.poisson(self.baseline_rate * db))
                }
                SignalKind::PerStartup | SignalKind::PerRun => (
                    rng.binomial(dc.round() as u64, self.canary_rate),
                    rng.binomial(db.round() as u64, self.baseline_rate),
                ),
                // Request signals are simulated by tests/judge/simulate.py.
                SignalKind::PerRequest | SignalKind::Latency => (0, 0),
            };
            s.canary_events += ec;
            s.baseline_events += eb;
        }
    }

    fn data(&self) -> SignalData {
        SignalData::new(&self.name, self.kind, self.strata.clone())
    }
}

/// The signals of one analysis at its start: the tested one first.
fn tracks(cfg: &SimConfig, scenario: &Scenario, ratio: f64) -> Vec<Track> {
    let nodes = cfg.canary_nodes.len().max(cfg.baseline_nodes.len());
    let looks = f64::from(cfg.looks.max(1));
    let (_, baseline_ps) = cfg.pod_seconds_per_look();
    let (_, baseline_su) = cfg.startups_per_look();
    let pod_rate = |events: f64| events / (baseline_ps * looks);
    let mut out = Vec::new();
    match scenario.kind {
        SignalKind::PerPodSecond => {
            let rate = pod_rate(cfg.baseline_events);
            out.push(Track::new("tested".into(), SignalKind::PerPodSecond, nodes, rate * ratio, rate));
        }
        SignalKind::PerStartup | SignalKind::PerRun => {
            let p = (cfg.baseline_events / (baseline_su * looks)).min(1.0);
            out.push(Track::new("tested".into(), scenario.kind, nodes, (p * ratio).min(1.0), p));
            // A GPU workload is judged on its crashes too, at equal rates.
            let rate = pod_rate(cfg.baseline_events);
            out.push(Track::new("crashes".into(), SignalKind::PerPodSecond, nodes, rate, rate));
        }
        SignalKind::PerRequest | SignalKind::Latency => {}
    }
    for i in 0..cfg.background_signals {
        let rate = pod_rate(cfg.background_events);
        out.push(Track::new(format!("background_{i}"), SignalKind::PerPodSecond, nodes, rate, rate));
    }
    out
}

/// How one analysis ended: its outcome and the look it ended at.
fn run_analysis(cfg: &SimConfig, scenario: &Scenario, ratio: f64, rng: &mut Rng) -> Option<(Outcome, u32)> {
    let mut signals = tracks(cfg, scenario, ratio);
    let (canary_ps, baseline_ps) = cfg.pod_seconds_per_look();
    let (canary_su, baseline_su) = cfg.startups_per_look();
    let spread = |total: f64, shares: &[f64]| -> Vec<f64> { shares.iter().map(|w| total * w).collect() };
    let pod_seconds = (spread(canary_ps, &cfg.canary_nodes), spread(baseline_ps, &cfg.baseline_nodes));
    let mut startups_before = (vec![0.0; cfg.canary_nodes.len()], vec![0.0; cfg.baseline_nodes.len()]);
    for look in 1..=cfg.looks {
        // Whole start-ups per node, rounded on the cumulative count so the
        // shares hold over the analysis.
        let whole = |per_look: f64, shares: &[f64], before: &mut Vec<f64>| -> Vec<f64> {
            let now: Vec<f64> = shares.iter().map(|w| (per_look * w * f64::from(look)).round()).collect();
            let delta = now.iter().zip(before.iter()).map(|(n, b)| n - b).collect();
            *before = now;
            delta
        };
        let startups = (
            whole(canary_su, &cfg.canary_nodes, &mut startups_before.0),
            whole(baseline_su, &cfg.baseline_nodes, &mut startups_before.1),
        );
        for t in &mut signals {
            let (c, b) = match t.kind {
                SignalKind::PerPodSecond | SignalKind::PerRequest | SignalKind::Latency => {
                    (&pod_seconds.0, &pod_seconds.1)
                }
                // Runs are counted as start-ups are: failures out of attempts.
                SignalKind::PerStartup | SignalKind::PerRun => (&startups.0, &startups.1),
            };
            t.advance(c, b, rng);
        }
        let data: Vec<SignalData> = signals.iter().map(Track::data).collect();
        match judge(&data, &cfg.policy, look).outcome {
            Outcome::Inconclusive => {}
            decided => return Some((decided, look)),
        }
    }
    None
}

fn run_case(cfg: &SimConfig, scenario: &Scenario, ratio: f64, rng: &mut Rng) -> CaseReport {
    let mut fail_looks = Vec::new();
    let mut decision_looks = Vec::new();
    let mut passed = 0usize;
    for _ in 0..cfg.analyses {
        match run_analysis(cfg, scenario, ratio, rng) {
            Some((Outcome::Fail, look)) => {
                fail_looks.push(f64::from(look));
                decision_looks.push(f64::from(look));
            }
            Some((_, look)) => {
                passed += 1;
                decision_looks.push(f64::from(look));
            }
            None => {}
        }
    }
    let n = cfg.analyses.max(1) as f64;
    let failed_share = fail_looks.len() as f64 / n;
    let passed_share = passed as f64 / n;
    let what = match scenario.kind {
        SignalKind::PerPodSecond => "events per pod-second",
        SignalKind::PerStartup => "failures per start-up (crashes per pod-second beside, at equal rates)",
        SignalKind::PerRequest | SignalKind::Latency => "requests",
        SignalKind::PerRun => "failures per run (crashes per pod-second beside, at equal rates)",
    };
    CaseReport {
        name: scenario.name,
        description: format!(
            "{what}: canary at {ratio}x the baseline's rate, about {} baseline events over the analysis, \
             beside {} healthy per-pod-second signals of about {} baseline events each",
            cfg.baseline_events, cfg.background_signals, cfg.background_events
        ),
        kind: scenario.kind,
        rate_ratio: ratio,
        baseline_events_expected: cfg.baseline_events,
        failed_share,
        passed_share,
        undecided_share: (cfg.analyses - fail_looks.len() - passed) as f64 / n,
        median_looks_to_decision: median(&mut decision_looks),
        median_looks_to_fail: median(&mut fail_looks),
        target: scenario.target.map(|(comparison, share)| SimTarget {
            comparison,
            failed_share: share,
            met: if comparison == "at_most" { failed_share <= share } else { failed_share >= share },
        }),
    }
}

fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// xoshiro256**, seeded through splitmix64 (the generator's authors'
/// recommendation: no all-zero state, nearby seeds far apart).
struct Rng {
    s: [u64; 4],
}

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng { s: [next(), next(), next(), next()] }
    }

    fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1), from the top 53 bits.
    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A Poisson draw: products of uniforms for means up to 30 (expected
    /// mean + 1 draws); a larger mean is a sum of Poisson draws of at most
    /// 30 each, which is exact and costs in proportion to the mean.
    fn poisson(&mut self, mean: f64) -> u64 {
        if !(mean.is_finite() && mean > 0.0) {
            return 0;
        }
        let mut left = mean;
        let mut total = 0;
        while left > 0.0 {
            let chunk = left.min(30.0);
            left -= chunk;
            let limit = (-chunk).exp();
            let mut product = self.uniform();
            while product > limit {
                total += 1;
                product *= self.uniform();
            }
        }
        total
    }

    /// A binomial draw as `n` Bernoulli trials: start-ups per look are few.
    fn binomial(&mut self, n: u64, p: f64) -> u64 {
        (0..n).filter(|_| self.uniform() < p).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samplers_have_the_right_means() {
        let mut rng = Rng::new(7);
        let n = 200_000;
        for mean in [0.3, 4.0, 75.0] {
            let sum: u64 = (0..n).map(|_| rng.poisson(mean)).sum();
            let got = sum as f64 / n as f64;
            assert!((got - mean).abs() < 5.0 * (mean / n as f64).sqrt(), "{mean}: {got}");
        }
        let sum: u64 = (0..n).map(|_| rng.binomial(10, 0.2)).sum();
        assert!((sum as f64 / n as f64 - 2.0).abs() < 0.01);
    }

    #[test]
    fn a_small_simulation_meets_its_targets_and_is_deterministic() {
        let cfg = SimConfig { analyses: 400, ..SimConfig::default_for_share(0.25) };
        let report = simulate(&cfg);
        let case = |name: &str| report.cases.iter().find(|c| c.name == name).expect("case").clone();
        let equal = case("pod_seconds_equal_rates");
        assert!(equal.failed_share <= 0.02, "{equal:?}");
        // No analysis passes before the canary reaches its minimum exposure
        // at the last look.
        assert!(equal.median_looks_to_decision.is_none_or(|l| l >= 10.0), "{equal:?}");
        let detect = case("pod_seconds_detection");
        assert!(detect.failed_share >= 0.85, "{detect:?}");
        assert!(case("startups_equal_rates").failed_share <= 0.02);
        assert!(case("startups_detection").failed_share >= 0.9);
        let again = simulate(&cfg);
        assert_eq!(
            serde_json::to_string(&report).expect("json"),
            serde_json::to_string(&again).expect("json")
        );
    }
}
