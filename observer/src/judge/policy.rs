//! What the judge tolerates, per signal, and how much it must see of the
//! canary before it passes it.
use super::{
    requests,
    strata::{positive, SignalKind},
};

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
    /// The canary's HTTP requests on compared nodes needed before a pass.
    pub min_requests: f64,
    /// The share of the canary's requests answered 5xx (or cut off) that
    /// is tolerated whatever the baseline's (the runbook's 1%).
    pub error_share: f64,
    /// The canary's runs needed before a pass (workloads that start runs).
    pub min_runs: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            alpha: DEFAULT_ALPHA,
            tolerated_ratio: DEFAULT_TOLERATED_RATIO,
            ratio_overrides: Vec::new(),
            min_startups: DEFAULT_MIN_STARTUPS,
            min_pod_seconds: DEFAULT_MIN_POD_SECONDS,
            min_requests: requests::DEFAULT_MIN_REQUESTS,
            error_share: requests::DEFAULT_ERROR_SHARE,
            min_runs: DEFAULT_MIN_RUNS,
        }
    }
}

impl Policy {
    pub(super) fn ratio_for(&self, name: &str) -> f64 {
        let default =
            BUILT_IN_RATIOS.iter().find(|(n, _)| *n == name).map_or(self.tolerated_ratio, |(_, r)| *r);
        self.ratio_overrides.iter().rev().find(|(n, _)| n == name).map_or(default, |(_, r)| *r)
    }

    pub(super) fn min_exposure(&self, kind: SignalKind) -> f64 {
        match kind {
            SignalKind::PerStartup => self.min_startups,
            SignalKind::PerPodSecond => self.min_pod_seconds,
            SignalKind::PerRequest | SignalKind::Latency => self.min_requests,
            SignalKind::PerRun => self.min_runs,
        }
    }

    /// Why the policy cannot be used, if it cannot.
    pub(super) fn invalid(&self) -> Option<String> {
        if !(self.alpha > 0.0 && self.alpha < 1.0) {
            return Some(format!("alpha {} is not a probability", self.alpha));
        }
        let ratios =
            std::iter::once(self.tolerated_ratio).chain(self.ratio_overrides.iter().map(|(_, r)| *r));
        if let Some(r) = ratios.into_iter().find(|r| !positive(*r)) {
            return Some(format!("tolerated ratio {r} is not a positive number"));
        }
        if !(self.min_startups >= 0.0
            && self.min_pod_seconds >= 0.0
            && self.min_requests >= 0.0
            && self.min_runs >= 0.0)
        {
            return Some("a minimum exposure is negative".into());
        }
        if !(self.error_share >= 0.0 && self.error_share < 1.0) {
            return Some(format!("tolerated share {} is not below 1", self.error_share));
        }
        None
    }
}

/// The false-rollback rate a whole analysis may spend, over all its looks
/// and signals (see the module's documentation).
pub const DEFAULT_ALPHA: f64 = 0.05;
pub const DEFAULT_TOLERATED_RATIO: f64 = 1.5;
pub const DEFAULT_MIN_STARTUPS: f64 = 10.0;
/// Ten pod-minutes.
pub const DEFAULT_MIN_POD_SECONDS: f64 = 600.0;
pub const DEFAULT_MIN_RUNS: f64 = 100.0;
/// Signals whose tolerance is built into their events rather than a
/// ratio: the run p99's canary runs are shifted by the tolerated slowdown
/// (`solver_runs`), so its pass compares the shares above as they are.
const BUILT_IN_RATIOS: &[(&str, f64)] = &[("run_duration_p99", 1.0)];
/// Signals held to a share of each look's threshold: the runs'. A solver
/// canary runs hundreds of runs, so their exact tests are nearly
/// continuous, unlike the handful of crashes the other signals see, and
/// the run p99's tail bound moves with the pooled runs from look to look,
/// so its looks are nearly separate tests: the union bound over looks is
/// then nearly reached. With the whole threshold, tests/judge/simulate.py
/// failed 2.0% of canaries with the baseline's share of limit endings and
/// 3.5% of canaries exactly 1.25 times slower with that share too; with a
/// fifth, under 1% (0 and 1 of 300),
/// while canaries twice as slow or with three times the share still fail
/// at their second look. A smaller threshold keeps every bound above.
const FAILURE_SHARES: &[(&str, f64)] = &[("run_duration_p99", 0.2), ("run_limit_endings", 0.2)];

pub(super) fn failure_share(name: &str) -> f64 {
    FAILURE_SHARES.iter().find(|(n, _)| *n == name).map_or(1.0, |(_, share)| *share)
}
