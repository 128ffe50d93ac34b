//! What the judge answers: the outcome, and per signal its counts, tests
//! and the rule that decided.
use serde::Serialize;

use super::{
    requests::RequestTerms,
    strata::{SignalKind, Span},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Pass,
    Fail,
    Inconclusive,
}

/// How one signal came out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalVerdict {
    Pass,
    Fail,
    Inconclusive,
    /// No exposure of either revision anywhere: the signal does not apply.
    NotApplicable,
}

/// What the judge found for one signal, summed over the nodes it used.
#[derive(Clone, Debug, Serialize)]
pub struct SignalReport {
    pub name: String,
    pub kind: SignalKind,
    pub verdict: SignalVerdict,
    /// Which rule decided: a failure by `fisher_exact_stratified` or
    /// `poisson_exact_cond_stratified`; a pass by `no_events` or
    /// `shown_no_worse`; or `below_min_exposure`, `not_shown_no_worse`,
    /// `canary_only_events`, `no_shared_node`, `no_exposure`.
    pub rule: &'static str,
    pub canary_events: u64,
    pub canary_exposure: f64,
    pub baseline_events: u64,
    pub baseline_exposure: f64,
    /// Mantel–Haenszel estimate of the canary/baseline rate (or failure
    /// proportion) ratio over the nodes used; absent when undefined or
    /// infinite (no baseline events).
    pub rate_ratio: Option<f64>,
    /// The ratio the Poisson test tolerates (absent for Fisher's).
    pub tolerated_ratio: Option<f64>,
    /// The exact one-sided p-value; absent when no node runs both revisions.
    pub p_value: Option<f64>,
    /// The smallest p-value these margins allow (Tarone's rule).
    pub min_attainable_p: Option<f64>,
    /// What the p-value was compared with at this look.
    pub threshold: f64,
    /// `P(S <= s)` at the tolerated ratio: small when the canary is shown
    /// no worse than it (the `shown_no_worse` rule).
    pub no_worse_p_value: Option<f64>,
    /// What `no_worse_p_value` is compared with at this look.
    pub pass_threshold: f64,
    /// The canary exposure needed before a pass.
    pub min_exposure: f64,
    /// For an inconclusive signal, the canary exposure still to come before
    /// it could pass at the rates seen so far; absent when it could not.
    pub exposure_needed: Option<f64>,
    pub nodes_used: Vec<String>,
    /// Nodes with data of one revision only: reported, never used to blame.
    pub nodes_not_used: Vec<String>,
    /// What the canary did on nodes where the baseline does not run.
    pub canary_only: CanaryOnly,
    pub canary_span: Span,
    pub baseline_span: Span,
    /// What counts as an event, where the data decides it.
    pub definition: Option<String>,
    pub note: String,
    /// Request signals: the tolerated share and the p-values of each half,
    /// or the latency cuts by node and the hold's earlier checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<RequestTerms>,
}

/// The canary's events and exposure on nodes the baseline does not run on.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CanaryOnly {
    pub events: u64,
    pub exposure: f64,
    pub nodes: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Judgement {
    pub outcome: Outcome,
    pub reason: String,
    pub signals: Vec<SignalReport>,
}
