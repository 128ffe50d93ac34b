//! One signal's counts, node by node, as the verdict takes them: what
//! counts as an event, its exposure, and the spans each side was read over;
//! and the bucket bounds histogram signals stratify by.
use serde::Serialize;

use super::{requests::RequestTerms, stats::Counts};

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
    /// HTTP requests of one kind among those served: above both the
    /// tolerated share and the tolerated ratio times the baseline's
    /// (`requests`).
    PerRequest,
    /// HTTP requests slower than 1.25 times the baseline's p99, against the
    /// baseline's slower than it (`requests`).
    Latency,
    /// Runs that failed (a limit or wrapper ended them; slower than the
    /// tolerated p99) out of runs: Fisher's exact test, stratified by node
    /// and executable (`solver_runs`).
    PerRun,
}

impl SignalKind {
    pub(super) fn unit(self) -> &'static str {
        match self {
            SignalKind::PerStartup => "start-ups",
            SignalKind::PerPodSecond => "pod-seconds",
            SignalKind::PerRequest | SignalKind::Latency => "requests",
            SignalKind::PerRun => "runs",
        }
    }
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

impl Stratum {
    /// Both revisions ran here, so their counts can be compared.
    pub(super) fn shared(&self) -> bool {
        positive(self.canary_exposure) && positive(self.baseline_exposure)
    }

    pub(super) fn counts(&self) -> Counts {
        Counts {
            canary_events: self.canary_events,
            canary_exposure: self.canary_exposure,
            baseline_events: self.baseline_events,
            baseline_exposure: self.baseline_exposure,
        }
    }
}

pub(super) fn positive(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

/// The time each side's counts cover: `(from, to]`, Unix seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Span {
    pub from: f64,
    pub to: f64,
}

/// One signal, as queried from Prometheus: its name (as reported),
/// per-node counts, and the span each side was read over.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SignalData {
    pub name: String,
    pub kind: SignalKind,
    pub strata: Vec<Stratum>,
    pub canary_span: Span,
    pub baseline_span: Span,
    /// The baseline's events over everything read of it, before the
    /// canary's span too: whether the signal is quiet for this workload.
    pub baseline_events_read: u64,
    /// Request signals: what their tests need beyond the strata.
    pub requests: Option<RequestTerms>,
    /// What counts as an event, where the data decides it (the run p99's
    /// bound per executable).
    pub definition: Option<String>,
}

impl SignalData {
    /// A signal read over no particular span (the simulation, unit tests).
    pub fn new(name: &str, kind: SignalKind, strata: Vec<Stratum>) -> Self {
        let baseline_events_read = strata.iter().map(|s| s.baseline_events).sum();
        SignalData {
            name: name.into(),
            kind,
            strata,
            canary_span: Span::default(),
            baseline_span: Span::default(),
            baseline_events_read,
            requests: None,
            definition: None,
        }
    }
}

/// A histogram bucket's upper bound in seconds (`le` as Prometheus spells
/// it, parsed), ordered as a number so that a map of bounds reads in order.
#[derive(Clone, Copy, Debug)]
pub struct Bound(pub f64);

impl PartialEq for Bound {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Bound {}

impl PartialOrd for Bound {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bound {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
