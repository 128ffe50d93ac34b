//! The canary judge's decision over per-node counts (placeholder: the
//! interface the service feeds; the rules are filled in with their tests).
use serde::Serialize;

/// How a signal's exposure is counted, which picks its exact test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalKind {
    /// Failed GPU start-ups out of start-ups attempted: Fisher's exact test
    /// (two binomials), stratified by node.
    PerStartup,
    /// Events per pod-second observed: the conditional binomial test of two
    /// Poisson rates against the tolerated ratio, stratified by node.
    PerPodSecond,
}

/// One node's counts of one signal for both revisions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Stratum {
    pub node: String,
    pub canary_events: u64,
    /// Start-ups attempted (PerStartup) or pod-seconds observed (PerPodSecond).
    pub canary_exposure: f64,
    pub baseline_events: u64,
    pub baseline_exposure: f64,
}

/// One signal, as queried from Prometheus: its name (as reported) and per-node counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SignalData {
    pub name: String,
    pub kind: SignalKind,
    pub strata: Vec<Stratum>,
}

/// What the judge tolerates and how much it must see before it passes.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// The overall false-rollback rate the analysis spends over its looks.
    pub alpha: f64,
    /// Canary/baseline rate ratio tolerated for per-pod-second signals.
    pub tolerated_ratio: f64,
    /// Per-signal overrides of the tolerated ratio, by signal name.
    pub ratio_overrides: Vec<(String, f64)>,
    /// The canary's start-ups needed before a pass (GPU workloads).
    pub min_startups: f64,
    /// The canary's pod-seconds needed before a pass.
    pub min_pod_seconds: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Fail,
    Inconclusive,
}

// PLACEHOLDER (replaced by the statistics work): lets the service compile.
pub const DEFAULT_ALPHA: f64 = 0.05;
pub const DEFAULT_TOLERATED_RATIO: f64 = 1.5;
pub const DEFAULT_MIN_STARTUPS: f64 = 10.0;
pub const DEFAULT_MIN_POD_SECONDS: f64 = 600.0;

#[derive(Clone, Debug, Serialize)]
pub struct SignalReport {
    pub name: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Judgement {
    pub outcome: Outcome,
    pub reason: String,
    pub signals: Vec<SignalReport>,
}

pub fn judge(_signals: &[SignalData], _policy: &Policy, _look: u32) -> Judgement {
    Judgement { outcome: Outcome::Inconclusive, reason: "placeholder".into(), signals: Vec::new() }
}
