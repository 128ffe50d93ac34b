//! The canary judge's decision over per-node counts: `pass`, `fail` or
//! `inconclusive`, and per signal which rule decided.
//!
//! # Tests
//!
//! Each signal gets one exact one-sided test (`stats`), stratified by node
//! and using only nodes that run both revisions; a node that runs one is
//! listed, never used to blame. Failures per start-up: Fisher's exact test
//! (a worse canary is any higher failure proportion). Events per pod-second:
//! the conditional binomial test of two Poisson rates against the tolerated
//! ratio (`H0: rate_c/rate_b <= r`, r = 1.5 unless the signal's own). HTTP
//! requests (`requests` has their tests and why): a share of requests
//! (5xx, cut off) fails only above both the tolerated share and r times
//! the baseline's (the exact binomial test and the Poisson one, the larger
//! p-value); the p99 is compared through the requests beyond the
//! baseline's p99 bucket bound and beyond 1.25 times it (Fisher's test),
//! held over the runbook's 3 minutes.
//!
//! # Repeated looks and many signals
//!
//! The false-rollback budget is spent over looks and signals as
//! `spending` documents: at most `alpha` over a whole analysis.
//!
//! # Pass: shown no worse
//!
//! "No test rejected" is not evidence that the canary is no worse, so a
//! signal passes on one of two rules, and only once the canary reached the
//! minimum exposure on shared nodes (start-ups or pod-seconds):
//!
//! - `no_events`: the canary had none of the signal's events on any node
//!   (those without the baseline included), and the baseline none in all
//!   that was read of it (the window and the 15 minutes before it, not only
//!   the canary's span): the signal is quiet for this workload. Nothing can
//!   be compared, and nothing happened; a canary worse by any ratio whose
//!   event is still so rare that neither revision showed one in the
//!   minimum exposure is what this rule lets through.
//! - `shown_no_worse`: the same exact conditional test run the other way,
//!   `H0: rate_c/rate_b >= r` at the tolerated ratio r, rejects: the
//!   one-sided upper confidence bound of the rate ratio is below r. Its
//!   p-value `P(S <= s)` is held to `alpha · w_k` at look k, the weights of
//!   `fail`'s spending, so that a canary worse than r passes at some look
//!   with probability at most alpha. An overall pass needs every signal to
//!   pass, so the worse signal alone must pass: no split over signals is
//!   needed. Failures per start-up use the Poisson form with start-ups as
//!   the exposure (r the tolerated ratio of their failure proportions), which
//!   is close for rare failures.
//!
//! Otherwise the signal is `inconclusive` with `exposure_needed`: the
//! canary exposure still to come before either rule could pass it at the
//! rates seen so far (none when the canary's rate is not below r). A
//! `fail` needs no minimum: strong early evidence is enough. A signal with
//! no exposure of either revision on any node (no GPU start-ups in a
//! CPU-only workload) does not apply and does not block a pass.
//!
//! # Nodes without the baseline
//!
//! Events on nodes where the baseline does not run cannot be compared
//! node by node, and pooling them against the baseline's other nodes would
//! blame a node-wide fault on the canary. They are reported in every
//! answer (counts, exposure, nodes, and the reason), and a signal with any
//! is never `pass`: it is `inconclusive` (`canary_only_events`) unless its
//! shared nodes fail it.
//!
//! # A fail stays failed
//!
//! The service is asked again after a `fail` (Argo's dry runs, a person
//! retrying). The thresholds differ by look, so the same counts could fail
//! at look 1 and not at look 5. The judge replays the earlier looks from
//! the same samples (the counts as they were at each look's end), and an
//! analysis that failed at any of them stays failed. This is the
//! sequential procedure the alpha spending bounds, so it costs no alpha.
use super::{
    policy::{failure_share, Policy},
    report::{CanaryOnly, Judgement, Outcome, SignalReport, SignalVerdict},
    requests::{self, FailTest, RequestTerms},
    spending::{look_weight, threshold, Tested},
    stats::{Conditional, Counts},
    strata::{positive, SignalData, SignalKind, Stratum},
};

/// Exposures within this relative distance below the minimum count as
/// reaching it: they are sums of floating-point counters.
const EXPOSURE_SLACK: f64 = 1e-9;

/// Judges every signal at look `look` (1-based; 0 is taken as 1).
pub fn judge(signals: &[SignalData], policy: &Policy, look: u32) -> Judgement {
    judge_explained(signals, policy, look, true)
}

/// As [`judge`], without the exposure an inconclusive signal still needs:
/// for the replay of earlier looks, where only a failure matters.
pub fn judge_for_failure(signals: &[SignalData], policy: &Policy, look: u32) -> Judgement {
    judge_explained(signals, policy, look, false)
}

fn judge_explained(signals: &[SignalData], policy: &Policy, look: u32, explain: bool) -> Judgement {
    if let Some(why) = policy.invalid() {
        return Judgement {
            outcome: Outcome::Inconclusive,
            reason: format!("invalid policy: {why}"),
            signals: Vec::new(),
        };
    }
    let look = look.max(1);
    let mut assessed: Vec<Assessed> = signals.iter().map(|s| assess(s, policy)).collect();
    let budget = policy.alpha * look_weight(look);
    let tests: Vec<Tested> = assessed
        .iter()
        .filter_map(|a| {
            Some(Tested {
                test: a.test.as_ref()?,
                p_value: a.report.p_value?,
                min: a.report.min_attainable_p?,
                sizes_exact: a.sizes_exact,
            })
        })
        .collect();
    let threshold = threshold(&tests, budget);
    for a in &mut assessed {
        decide(a, threshold, budget, explain);
    }
    let reports: Vec<SignalReport> = assessed.into_iter().map(|a| a.report).collect();
    let (outcome, reason) = overall(&reports, look, threshold);
    Judgement { outcome, reason, signals: reports }
}

/// `current`, unless an earlier look (`earlier`, in order) failed: a
/// failure stays one (see the module's documentation).
pub fn stays_failed(current: Judgement, look: u32, earlier: Option<(u32, Judgement)>) -> Judgement {
    match earlier {
        Some((at, failed)) if current.outcome != Outcome::Fail && failed.outcome == Outcome::Fail => {
            Judgement {
                outcome: Outcome::Fail,
                reason: format!(
                    "look {look}: failed at look {at}, and a failure stays one ({})",
                    failed.reason
                ),
                signals: current.signals,
            }
        }
        _ => current,
    }
}

/// One signal's report, with its tests kept until the threshold is known.
struct Assessed {
    report: SignalReport,
    /// The failure test, when any node runs both revisions.
    test: Option<Conditional>,
    used: Vec<Stratum>,
    ratio: f64,
    baseline_events_read: u64,
    sizes_exact: bool,
    /// Request signals: their tolerated share (0 for the others).
    share: f64,
}

/// The counts and exact tests of one signal, before the threshold is known.
fn assess(signal: &SignalData, policy: &Policy) -> Assessed {
    let (used, not_used): (Vec<&Stratum>, Vec<&Stratum>) = signal.strata.iter().partition(|s| s.shared());
    let sum = |f: fn(&Stratum) -> f64| used.iter().map(|s| f(s)).sum::<f64>();
    let applies = signal.strata.iter().any(has_data);
    let counts: Vec<Counts> = used.iter().map(|s| s.counts()).collect();
    let ratio = policy.ratio_for(&signal.name);
    let (test, tolerated_ratio, rule) = match signal.kind {
        SignalKind::PerStartup | SignalKind::PerRun => {
            (Conditional::fisher(&counts), None, "fisher_exact_stratified")
        }
        SignalKind::PerPodSecond => {
            (Conditional::poisson(&counts, ratio), Some(ratio), "poisson_exact_cond_stratified")
        }
        SignalKind::PerRequest => {
            (Conditional::poisson(&counts, ratio), Some(ratio), "share_above_tolerated_and_baseline")
        }
        SignalKind::Latency => {
            (Conditional::fisher(&counts), Some(requests::LATENCY_RATIO), "p99_fisher_exact_stratified")
        }
    };
    let share = if signal.kind == SignalKind::PerRequest { policy.error_share } else { 0.0 };
    let mut terms = signal
        .requests
        .clone()
        .or_else(|| (signal.kind == SignalKind::PerRequest).then(RequestTerms::default));
    let tested = applies && !used.is_empty();
    let fail = tested.then(|| fail_test(signal.kind, &counts, &test, share, terms.as_mut()));
    let no_worse = tested.then(|| no_worse_p(signal.kind, &counts, ratio, share));
    let test = tested.then_some(test);
    let alone: Vec<&&Stratum> =
        not_used.iter().filter(|s| positive(s.canary_exposure) || s.canary_events > 0).collect();
    let report = SignalReport {
        name: signal.name.clone(),
        kind: signal.kind,
        verdict: SignalVerdict::Inconclusive,
        rule: if applies { rule } else { "no_exposure" },
        canary_events: used.iter().map(|s| s.canary_events).sum(),
        canary_exposure: sum(|s| s.canary_exposure),
        baseline_events: used.iter().map(|s| s.baseline_events).sum(),
        baseline_exposure: sum(|s| s.baseline_exposure),
        rate_ratio: mantel_haenszel_ratio(&used),
        tolerated_ratio,
        p_value: fail.map(|f| f.p_value),
        min_attainable_p: fail.map(|f| f.min_attainable),
        threshold: 0.0,
        no_worse_p_value: no_worse,
        pass_threshold: 0.0,
        min_exposure: policy.min_exposure(signal.kind),
        exposure_needed: None,
        nodes_used: used.iter().map(|s| s.node.clone()).collect(),
        nodes_not_used: not_used.iter().filter(|s| has_data(s)).map(|s| s.node.clone()).collect(),
        canary_only: CanaryOnly {
            events: alone.iter().map(|s| s.canary_events).sum(),
            exposure: alone.iter().map(|s| s.canary_exposure).sum(),
            nodes: alone.iter().map(|s| s.node.clone()).collect(),
        },
        canary_span: signal.canary_span,
        baseline_span: signal.baseline_span,
        definition: signal.definition.clone(),
        note: String::new(),
        requests: terms,
    };
    let baseline_events_read = signal.baseline_events_read.max(report.baseline_events);
    let sizes_exact = fail.is_none_or(|f| f.sizes_exact);
    let used = used.into_iter().cloned().collect();
    Assessed { report, test, used, ratio, baseline_events_read, sizes_exact, share }
}

/// The failure test's p-value, the smallest it could attain, and whether
/// the conditional test's attainable p-values bound its size.
fn fail_test(
    kind: SignalKind,
    counts: &[Counts],
    test: &Conditional,
    share: f64,
    terms: Option<&mut RequestTerms>,
) -> FailTest {
    match (kind, terms) {
        (SignalKind::PerRequest, Some(terms)) => requests::share_fail(counts, test, share, terms),
        (SignalKind::Latency, Some(terms)) => requests::latency_fail(test, terms),
        _ => FailTest { p_value: test.p_value(), min_attainable: test.min_attainable(), sizes_exact: true },
    }
}

/// `P(S <= s)` of the test that shows the canary no worse than tolerated.
/// Failures per start-up use the Poisson form with start-ups as exposure.
fn no_worse_p(kind: SignalKind, counts: &[Counts], ratio: f64, share: f64) -> f64 {
    match kind {
        SignalKind::PerRequest => requests::share_no_worse(counts, share, ratio),
        SignalKind::Latency => requests::latency_no_worse(counts),
        SignalKind::PerStartup | SignalKind::PerPodSecond | SignalKind::PerRun => {
            Conditional::poisson(counts, ratio).lower_tail()
        }
    }
}

fn has_data(s: &Stratum) -> bool {
    positive(s.canary_exposure) || positive(s.baseline_exposure) || s.canary_events + s.baseline_events > 0
}

/// `Σ c_k·e_bk/(e_ck+e_bk) / Σ b_k·e_ck/(e_ck+e_bk)`: the stratified
/// estimate that weighs nodes as the test does.
fn mantel_haenszel_ratio(used: &[&Stratum]) -> Option<f64> {
    let (mut num, mut den) = (0.0, 0.0);
    for s in used {
        let total = s.canary_exposure + s.baseline_exposure;
        num += s.canary_events as f64 * s.baseline_exposure / total;
        den += s.baseline_events as f64 * s.canary_exposure / total;
    }
    (den > 0.0).then(|| num / den).filter(|r| r.is_finite())
}

/// The signal's verdict, its rule and a note saying why.
fn decide(a: &mut Assessed, threshold: f64, pass_threshold: f64, explain: bool) {
    let report = &mut a.report;
    let threshold = threshold * failure_share(&report.name);
    report.threshold = threshold;
    report.pass_threshold = pass_threshold;
    let unit = report.kind.unit();
    if report.rule == "no_exposure" {
        report.verdict = SignalVerdict::NotApplicable;
        report.note = format!("no {unit} of either revision on any node: does not apply");
        return;
    }
    let Some(p_value) = report.p_value.filter(|_| a.test.is_some()) else {
        report.verdict = SignalVerdict::Inconclusive;
        report.rule = "no_shared_node";
        report.note = format!(
            "no node runs both revisions (nodes with one: {})",
            if report.nodes_not_used.is_empty() { "none".into() } else { report.nodes_not_used.join(", ") }
        );
        if report.kind == SignalKind::Latency && report.canary_only.exposure > 0.0 {
            report.note = format!("no node to compare on ({})", uncompared(report.requests.as_ref()));
        }
        return;
    };
    let compared = format!(
        "canary {} in {} {unit}, baseline {} in {} {unit} on {} shared node(s): p = {} against {}",
        report.canary_events,
        short(report.canary_exposure),
        report.baseline_events,
        short(report.baseline_exposure),
        report.nodes_used.len(),
        short(p_value),
        short(threshold),
    );
    let now = a.test.as_ref().map_or(1.0, Conditional::p_value);
    if p_value <= threshold {
        report.verdict = SignalVerdict::Fail;
        report.note = compared;
    } else if report.kind == SignalKind::Latency && now <= threshold {
        report.rule = "slower_not_yet_held";
        report.note = format!(
            "{compared}: slower now (p = {}), not yet on the counts of each minute of the hold",
            short(now)
        );
    } else if report.canary_exposure < report.min_exposure * (1.0 - EXPOSURE_SLACK) {
        report.rule = "below_min_exposure";
        report.exposure_needed = Some(report.min_exposure - report.canary_exposure);
        report.note = format!(
            "canary {} {unit} on shared nodes, below the minimum {} ({compared})",
            short(report.canary_exposure),
            short(report.min_exposure)
        );
    } else if report.canary_only.events > 0 {
        report.rule = "canary_only_events";
        report.note = format!(
            "{} canary event(s) in {} {unit} on nodes without the baseline ({}), not compared ({compared})",
            report.canary_only.events,
            short(report.canary_only.exposure),
            report.canary_only.nodes.join(", ")
        );
    } else if report.kind == SignalKind::Latency && report.canary_only.exposure > 0.0 {
        report.rule = "uncompared_requests";
        report.note = format!(
            "{} canary requests on nodes where the baseline's p99 is not known ({}), not compared ({compared})",
            short(report.canary_only.exposure),
            uncompared(report.requests.as_ref())
        );
    } else if report.canary_events == 0 && a.baseline_events_read == 0 {
        report.verdict = SignalVerdict::Pass;
        report.rule = "no_events";
        report.note = compared;
    } else {
        pass_if_shown_no_worse(a, pass_threshold, compared, explain);
    }
}

/// The `shown_no_worse` rule for a signal the canary has events of.
fn pass_if_shown_no_worse(a: &mut Assessed, pass_threshold: f64, compared: String, explain: bool) {
    let report = &mut a.report;
    let no_worse = report.no_worse_p_value.unwrap_or(1.0);
    let against = format!("no-worse p = {} against {}", short(no_worse), short(pass_threshold));
    if no_worse <= pass_threshold {
        report.verdict = SignalVerdict::Pass;
        report.rule = "shown_no_worse";
        report.note = format!("{compared}; {against}");
        return;
    }
    report.rule = "not_shown_no_worse";
    if !explain {
        return;
    }
    report.exposure_needed = exposure_needed(&a.used, report.kind, a.ratio, a.share, pass_threshold);
    let needed = match (report.exposure_needed, report.kind) {
        (Some(more), kind) => format!("about {} more canary {} at these rates", short(more), kind.unit()),
        (None, SignalKind::PerRequest) => {
            format!("its share is not below {} nor {} times the baseline's", a.share, a.ratio)
        }
        (None, SignalKind::Latency) => {
            "its requests beyond 1.25 times the baseline's p99 are not fewer than \
             the baseline's beyond it"
                .into()
        }
        (None, _) => format!("its rate is not below {} times the baseline's", a.ratio),
    };
    report.note = format!("{compared}; not shown no worse ({against}): {needed}");
}

/// Where the canary's requests were not compared, and how many more
/// baseline requests each such node needs.
fn uncompared(terms: Option<&RequestTerms>) -> String {
    let nodes = terms.map(|t| t.uncompared.as_slice()).unwrap_or_default();
    let told: Vec<String> = nodes
        .iter()
        .map(|u| match u.baseline_requests_needed {
            Some(more) => format!("{}: {} more baseline requests needed", u.node, short(more)),
            None => format!("{}: the baseline's p99 is beyond the last bucket", u.node),
        })
        .collect();
    if told.is_empty() {
        "no baseline there".into()
    } else {
        told.join("; ")
    }
}

/// The canary exposure still to come before the `shown_no_worse` rule
/// could pass at the rates seen so far: every count and exposure scaled by
/// the smallest factor (up to 1024) at which the test rejects.
fn exposure_needed(
    used: &[Stratum],
    kind: SignalKind,
    ratio: f64,
    share: f64,
    pass_threshold: f64,
) -> Option<f64> {
    let rejects = |f: f64| {
        let scaled: Vec<Counts> = used
            .iter()
            .map(|s| Counts {
                canary_events: (s.canary_events as f64 * f).round() as u64,
                canary_exposure: s.canary_exposure * f,
                baseline_events: (s.baseline_events as f64 * f).round() as u64,
                baseline_exposure: s.baseline_exposure * f,
            })
            .collect();
        no_worse_p(kind, &scaled, ratio, share) <= pass_threshold
    };
    let mut high = 2.0;
    while !rejects(high) {
        high *= 2.0;
        if high > 1024.0 {
            return None;
        }
    }
    let mut low = high / 2.0;
    for _ in 0..12 {
        let mid = 0.5 * (low + high);
        if rejects(mid) {
            high = mid;
        } else {
            low = mid;
        }
    }
    let exposure: f64 = used.iter().map(|s| s.canary_exposure).sum();
    Some(exposure * (high - 1.0))
}

/// The analysis's outcome from its signals': any failure fails it; a pass
/// needs every applicable signal to pass, and at least one to apply.
fn overall(reports: &[SignalReport], look: u32, threshold: f64) -> (Outcome, String) {
    let (outcome, mut reason) = outcome_and_reason(reports, look, threshold);
    // Whatever the outcome, what the canary did where it was not compared.
    let alone: Vec<String> = reports
        .iter()
        .filter(|r| r.canary_only.events > 0 && r.rule != "canary_only_events")
        .map(|r| format!("{} {} on {}", r.name, r.canary_only.events, r.canary_only.nodes.join(", ")))
        .collect();
    if !alone.is_empty() {
        reason.push_str(&format!("; canary events on nodes without the baseline: {}", alone.join(", ")));
    }
    (outcome, reason)
}

fn outcome_and_reason(reports: &[SignalReport], look: u32, threshold: f64) -> (Outcome, String) {
    let with = |v: SignalVerdict| -> Vec<String> {
        reports.iter().filter(|r| r.verdict == v).map(|r| format!("{}: {}", r.name, r.note)).collect()
    };
    let failed = with(SignalVerdict::Fail);
    if !failed.is_empty() {
        return (Outcome::Fail, format!("look {look}: {}", failed.join("; ")));
    }
    let open = with(SignalVerdict::Inconclusive);
    if !open.is_empty() {
        return (Outcome::Inconclusive, format!("look {look}: {}", open.join("; ")));
    }
    if !reports.iter().any(|r| r.verdict == SignalVerdict::Pass) {
        return (Outcome::Inconclusive, "no signal applies: no exposure of either revision".into());
    }
    let idle: Vec<&str> = reports
        .iter()
        .filter(|r| r.verdict == SignalVerdict::NotApplicable)
        .map(|r| r.name.as_str())
        .collect();
    let mut reason = format!(
        "look {look}: no signal failed (threshold {}); each reached its minimum exposure and was shown \
         no worse than tolerated or had no event in either revision",
        short(threshold)
    );
    if !idle.is_empty() {
        reason.push_str(&format!("; not applicable: {}", idle.join(", ")));
    }
    (Outcome::Pass, reason)
}

/// A number with about three significant digits, for reasons people read.
fn short(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let magnitude = x.abs().log10().floor();
    if (-3.0..6.0).contains(&magnitude) {
        let decimals = (2.0 - magnitude).max(0.0) as usize;
        format!("{x:.decimals$}")
    } else {
        format!("{x:.2e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::{policy::DEFAULT_ALPHA, spending::tarone_count};

    fn stratum(node: &str, ce: u64, cx: f64, be: u64, bx: f64) -> Stratum {
        Stratum {
            node: node.into(),
            canary_events: ce,
            canary_exposure: cx,
            baseline_events: be,
            baseline_exposure: bx,
        }
    }

    fn signal(name: &str, kind: SignalKind, strata: Vec<Stratum>) -> SignalData {
        SignalData::new(name, kind, strata)
    }

    /// The service's signal set: start-up failures and five per-pod-second
    /// signals, quiet unless given.
    fn service_signals(
        startups: Vec<Stratum>,
        crashes: Vec<Stratum>,
        pod_seconds: &[(&str, f64, f64)],
    ) -> Vec<SignalData> {
        let quiet = || pod_seconds.iter().map(|(n, c, b)| stratum(n, 0, *c, 0, *b)).collect::<Vec<_>>();
        vec![
            signal("gpu_startup_failures", SignalKind::PerStartup, startups),
            signal(
                "native_crashes",
                SignalKind::PerPodSecond,
                if crashes.is_empty() { quiet() } else { crashes },
            ),
            signal("oom_kills", SignalKind::PerPodSecond, quiet()),
            signal("abnormal_exits", SignalKind::PerPodSecond, quiet()),
            signal("gpu_memory_faults", SignalKind::PerPodSecond, quiet()),
            signal("memory_limit_refusals", SignalKind::PerPodSecond, quiet()),
        ]
    }

    fn find<'a>(j: &'a Judgement, name: &str) -> &'a SignalReport {
        j.signals.iter().find(|s| s.name == name).expect("signal reported")
    }

    #[test]
    fn eight_of_twenty_failed_start_ups_against_none_fail_at_the_first_look() {
        let signals = service_signals(vec![stratum("a", 8, 20.0, 0, 20.0)], vec![], &[("a", 1200.0, 1200.0)]);
        let j = judge(&signals, &Policy::default(), 1);
        assert_eq!(j.outcome, Outcome::Fail, "{j:#?}");
        let s = find(&j, "gpu_startup_failures");
        assert_eq!((s.verdict, s.rule), (SignalVerdict::Fail, "fisher_exact_stratified"));
        let p = s.p_value.expect("tested");
        assert!((p - 0.001638).abs() < 1e-5, "{p}");
        assert!(j.reason.contains("gpu_startup_failures"), "{}", j.reason);
        // Even if every signal could fail (Tarone's m = 6), look 1 fails it.
        assert!(p <= DEFAULT_ALPHA * look_weight(1) / 6.0);
    }

    #[test]
    fn one_of_two_against_none_of_two_is_inconclusive() {
        let signals = service_signals(vec![stratum("a", 1, 2.0, 0, 2.0)], vec![], &[("a", 20.0, 20.0)]);
        let j = judge(&signals, &Policy::default(), 1);
        assert_eq!(j.outcome, Outcome::Inconclusive, "{j:#?}");
        assert_eq!(find(&j, "gpu_startup_failures").rule, "below_min_exposure");
    }

    #[test]
    fn a_healthy_canary_past_the_minimum_exposure_passes_and_not_before() {
        let at = |x: f64| {
            service_signals(
                vec![stratum("a", 0, 12.0 * x, 0, 36.0 * x)],
                vec![stratum("a", 0, 700.0 * x, 0, 2100.0 * x)],
                &[("a", 700.0 * x, 2100.0 * x)],
            )
        };
        let j = judge(&at(1.0), &Policy::default(), 3);
        assert_eq!(j.outcome, Outcome::Pass, "{j:#?}");
        assert!(j.signals.iter().all(|s| s.verdict == SignalVerdict::Pass), "{j:#?}");
        assert_eq!(find(&j, "native_crashes").rule, "no_events");
        let j = judge(&at(0.5), &Policy::default(), 3);
        assert_eq!(j.outcome, Outcome::Inconclusive, "{j:#?}");
        assert!(j.reason.contains("below the minimum"), "{}", j.reason);
        assert_eq!(find(&j, "native_crashes").exposure_needed, Some(250.0));
    }

    #[test]
    fn a_pass_needs_evidence_that_the_canary_is_no_worse() {
        let crashes =
            |c, cx, b, bx| service_signals(vec![], vec![stratum("a", c, cx, b, bx)], &[("a", cx, bx)]);
        // None against three: too few of the baseline's to show anything.
        let j = judge(&crashes(0, 700.0, 3, 2100.0), &Policy::default(), 3);
        assert_eq!(find(&j, "native_crashes").rule, "not_shown_no_worse", "{j:#?}");
        // One event against none: no evidence either way, at any look.
        for look in 1..=10 {
            let j = judge(&crashes(1, 1200.0, 0, 3600.0), &Policy::default(), look);
            assert_eq!(j.outcome, Outcome::Inconclusive, "look {look}: {j:#?}");
            let s = find(&j, "native_crashes");
            assert_eq!((s.rule, s.exposure_needed), ("not_shown_no_worse", None), "{s:#?}");
        }
        // Eight against none at equal exposure never passes.
        for look in 1..=10 {
            assert_ne!(
                judge(&crashes(8, 1200.0, 0, 1200.0), &Policy::default(), look).outcome,
                Outcome::Pass
            );
        }
        // Far fewer than the baseline's: shown no worse.
        let j = judge(&crashes(2, 1200.0, 60, 1200.0), &Policy::default(), 2);
        assert_eq!(j.outcome, Outcome::Pass, "{j:#?}");
        let s = find(&j, "native_crashes");
        assert_eq!(s.rule, "shown_no_worse");
        assert!(s.no_worse_p_value.is_some_and(|p| p <= s.pass_threshold), "{s:#?}");
        // Equal rates, few events: not yet, and how much more it needs.
        let j = judge(&crashes(10, 1200.0, 10, 1200.0), &Policy::default(), 2);
        let s = find(&j, "native_crashes");
        assert_eq!((j.outcome, s.rule), (Outcome::Inconclusive, "not_shown_no_worse"), "{j:#?}");
        let more = s.exposure_needed.expect("reachable at equal rates");
        let scale = 1.0 + more / 1200.0;
        let later = |f: f64| {
            let n = (10.0 * f).round() as u64;
            judge(&crashes(n, 1200.0 * f, n, 1200.0 * f), &Policy::default(), 2)
        };
        assert_eq!(later(scale * 1.01).outcome, Outcome::Pass, "{more}");
        assert_ne!(later(scale * 0.9).outcome, Outcome::Pass, "{more}");
    }

    #[test]
    fn a_failure_at_an_earlier_look_stays_one() {
        let signals = service_signals(vec![], vec![stratum("a", 5, 300.0, 0, 840.0)], &[("a", 300.0, 840.0)]);
        let first = judge(&signals, &Policy::default(), 1);
        assert_eq!(first.outcome, Outcome::Fail, "{first:#?}");
        let fifth = judge(&signals, &Policy::default(), 5);
        assert_ne!(fifth.outcome, Outcome::Fail, "the fifth look's threshold is smaller");
        let kept = stays_failed(fifth.clone(), 5, Some((1, first)));
        assert_eq!(kept.outcome, Outcome::Fail);
        assert!(kept.reason.starts_with("look 5: failed at look 1"), "{}", kept.reason);
        assert_eq!(stays_failed(fifth, 5, None).outcome, Outcome::Inconclusive);
    }

    #[test]
    fn a_gpu_reset_on_one_node_hitting_both_revisions_is_not_a_failure() {
        // Node b: every pod of both revisions crashed in the reset, in
        // proportion to their exposure there (one canary pod, three stable).
        let crashes = vec![
            stratum("a", 0, 1200.0, 0, 3600.0),
            stratum("b", 1, 1200.0, 3, 3600.0),
            stratum("c", 0, 1200.0, 0, 3600.0),
        ];
        let nodes = [("a", 1200.0, 3600.0), ("b", 1200.0, 3600.0), ("c", 1200.0, 3600.0)];
        let signals = service_signals(vec![], crashes, &nodes);
        for look in 1..=10 {
            let j = judge(&signals, &Policy::default(), look);
            assert_ne!(j.outcome, Outcome::Fail, "look {look}: {j:#?}");
        }
        // Node b runs most of the canary (three pods to stable's one) and
        // its resets crash every pod there four times. Pooled over nodes,
        // 12 canary crashes against 4 looks like a canary fault (p ≈ 0.001);
        // within node b it is what its share predicts.
        let crashes = vec![
            stratum("a", 0, 600.0, 0, 6000.0),
            stratum("b", 12, 3600.0, 4, 1200.0),
            stratum("c", 0, 600.0, 0, 6000.0),
        ];
        let nodes = [("a", 600.0, 6000.0), ("b", 3600.0, 1200.0), ("c", 600.0, 6000.0)];
        let j = judge(&service_signals(vec![], crashes, &nodes), &Policy::default(), 1);
        assert_ne!(j.outcome, Outcome::Fail, "{j:#?}");
        let p = find(&j, "native_crashes").p_value.expect("tested");
        assert!(p > 0.5, "{p}");
    }

    #[test]
    fn a_canary_fault_on_two_of_three_nodes_fails() {
        let crashes = vec![
            stratum("a", 6, 1200.0, 0, 3600.0),
            stratum("b", 6, 1200.0, 0, 3600.0),
            stratum("c", 0, 1200.0, 0, 3600.0),
        ];
        let signals = service_signals(
            vec![],
            crashes,
            &[("a", 1200.0, 3600.0), ("b", 1200.0, 3600.0), ("c", 1200.0, 3600.0)],
        );
        let j = judge(&signals, &Policy::default(), 4);
        assert_eq!(j.outcome, Outcome::Fail, "{j:#?}");
        let s = find(&j, "native_crashes");
        assert_eq!((s.rule, s.canary_events, s.nodes_used.len()), ("poisson_exact_cond_stratified", 12, 3));
    }

    #[test]
    fn a_node_with_only_the_canary_is_reported_and_not_used() {
        let crashes = vec![stratum("a", 6, 1200.0, 0, 0.0), stratum("b", 0, 0.0, 0, 3600.0)];
        let signals = service_signals(vec![], crashes, &[("a", 1200.0, 0.0), ("b", 0.0, 3600.0)]);
        let j = judge(&signals, &Policy::default(), 1);
        assert_eq!(j.outcome, Outcome::Inconclusive, "{j:#?}");
        let s = find(&j, "native_crashes");
        assert_eq!((s.rule, s.p_value, s.canary_events), ("no_shared_node", None, 0));
        assert_eq!(s.nodes_not_used, ["a", "b"]);
        // With a shared node beside it, the canary-only node is still left out.
        let crashes = vec![stratum("a", 6, 1200.0, 0, 0.0), stratum("b", 0, 1200.0, 0, 3600.0)];
        let signals = service_signals(vec![], crashes, &[("a", 1200.0, 0.0), ("b", 1200.0, 3600.0)]);
        let j = judge(&signals, &Policy::default(), 1);
        assert_eq!(j.outcome, Outcome::Inconclusive, "never a pass: {j:#?}");
        let s = find(&j, "native_crashes");
        assert_eq!(
            (s.nodes_used.clone(), s.nodes_not_used.clone()),
            (vec!["b".to_string()], vec!["a".to_string()])
        );
        assert_eq!(s.rule, "canary_only_events");
        assert_eq!(s.canary_only, CanaryOnly { events: 6, exposure: 1200.0, nodes: vec!["a".into()] });
        assert!(j.reason.contains("6 canary event(s) in 1200 pod-seconds on nodes without the baseline (a)"));
        // Told in the reason whatever else decides: here a failure on b.
        let crashes = vec![stratum("a", 6, 1200.0, 0, 0.0), stratum("b", 9, 1200.0, 0, 3600.0)];
        let signals = service_signals(vec![], crashes, &[("a", 1200.0, 0.0), ("b", 1200.0, 3600.0)]);
        let j = judge(&signals, &Policy::default(), 1);
        assert_eq!(j.outcome, Outcome::Fail, "{j:#?}");
        assert!(j.reason.contains("nodes without the baseline: native_crashes 6 on a"), "{}", j.reason);
    }

    #[test]
    fn a_cpu_only_workload_without_start_ups_can_pass() {
        let signals = service_signals(vec![stratum("a", 0, 0.0, 0, 0.0)], vec![], &[("a", 900.0, 2700.0)]);
        let j = judge(&signals, &Policy::default(), 2);
        assert_eq!(j.outcome, Outcome::Pass, "{j:#?}");
        let s = find(&j, "gpu_startup_failures");
        assert_eq!((s.verdict, s.rule), (SignalVerdict::NotApplicable, "no_exposure"));
        assert!(j.reason.contains("not applicable: gpu_startup_failures"), "{}", j.reason);
    }

    #[test]
    fn nothing_to_judge_is_never_a_pass() {
        assert_eq!(judge(&[], &Policy::default(), 1).outcome, Outcome::Inconclusive);
        let none = service_signals(vec![], vec![], &[]);
        assert_eq!(judge(&none, &Policy::default(), 1).outcome, Outcome::Inconclusive);
        let bad = Policy { alpha: f64::NAN, ..Policy::default() };
        let healthy = service_signals(vec![], vec![], &[("a", 900.0, 2700.0)]);
        assert_eq!(judge(&healthy, &bad, 1).outcome, Outcome::Inconclusive);
    }

    #[test]
    fn a_busy_healthy_signal_is_judged_quickly_and_costs_only_its_share() {
        // Memory-limit refusals by the hundred thousand, at equal rates,
        // beside the 8 of 20 failed start-ups.
        let mut signals =
            service_signals(vec![stratum("a", 8, 20.0, 0, 20.0)], vec![], &[("a", 1200.0, 1200.0)]);
        signals[5].strata = vec![stratum("a", 50_000, 1200.0, 50_000, 1200.0)];
        let start = std::time::Instant::now();
        let j = judge(&signals, &Policy::default(), 1);
        assert!(start.elapsed().as_secs_f64() < 2.0, "{:?}", start.elapsed());
        assert_eq!(j.outcome, Outcome::Fail, "{j:#?}");
        assert_eq!(find(&j, "memory_limit_refusals").verdict, SignalVerdict::Pass);
        // Its size at t is at most t: the threshold leaves Fisher's test half.
        let threshold = find(&j, "gpu_startup_failures").threshold;
        assert!(threshold >= DEFAULT_ALPHA * look_weight(1) / 2.0 - 1e-12, "{threshold}");
    }

    #[test]
    fn a_better_canary_never_fails() {
        // One-sided: many more baseline failures is no evidence against the canary.
        let signals = service_signals(
            vec![stratum("a", 0, 50.0, 30, 50.0)],
            vec![stratum("a", 0, 900.0, 40, 900.0)],
            &[("a", 900.0, 900.0)],
        );
        let j = judge(&signals, &Policy::default(), 1);
        assert_eq!(j.outcome, Outcome::Pass, "{j:#?}");
    }

    #[test]
    fn the_tolerated_ratio_is_per_signal() {
        // 3x the baseline's rate: fails against 1.5, not against 5.
        let crashes = vec![stratum("a", 90, 1000.0, 20, 1000.0)];
        let signals = service_signals(vec![], crashes, &[("a", 1000.0, 1000.0)]);
        assert_eq!(judge(&signals, &Policy::default(), 2).outcome, Outcome::Fail);
        let lenient = Policy { ratio_overrides: vec![("native_crashes".into(), 5.0)], ..Policy::default() };
        let j = judge(&signals, &lenient, 2);
        assert_ne!(j.outcome, Outcome::Fail, "{j:#?}");
        assert_eq!(find(&j, "native_crashes").tolerated_ratio, Some(5.0));
    }

    #[test]
    fn look_weights_sum_to_one_and_tarone_spends_only_on_signals_that_could_fail() {
        let sum: f64 = (1..=1_000_000).map(look_weight).sum();
        assert!((sum - 1.0).abs() < 1e-5 && sum <= 1.0, "{sum}");
        assert_eq!(tarone_count(&[1.0, 1.0, 1.0], 0.01), 1);
        assert_eq!(tarone_count(&[1e-9, 1.0, 0.3], 0.01), 1);
        assert_eq!(tarone_count(&[1e-9, 1e-9, 0.3], 0.01), 2);
        assert_eq!(tarone_count(&[1e-9, 1e-9, 0.006], 0.01), 2);
        assert_eq!(tarone_count(&[1e-9, 1e-9, 0.004], 0.01), 3);
        assert_eq!(tarone_count(&[], 0.01), 1);
    }

    #[test]
    fn a_share_against_a_tolerated_share_is_charged_its_threshold_whenever_it_applies() {
        // 6 of 10 failed start-ups against 0 of 10: Fisher's p = 0.00542,
        // its only attainable value within look 1's budget of 0.01.
        let mut signals =
            service_signals(vec![stratum("a", 6, 10.0, 0, 10.0)], vec![], &[("a", 1200.0, 1200.0)]);
        // No 5xx in 10,000 requests of either: the comparison with the
        // baseline could not fail, the binomial half against 1% could.
        signals.push(signal("http_5xx", SignalKind::PerRequest, vec![stratum("a", 0, 1e4, 0, 3e4)]));
        let judged = |error_share| judge(&signals, &Policy { error_share, ..Policy::default() }, 1);
        let alone = judged(0.0);
        assert_eq!(alone.outcome, Outcome::Fail, "the comparison alone, quiet, costs nothing: {alone:#?}");
        // Charged 0.00542 beside Fisher's 0.00542, the look's budget would
        // be spent twice over: the threshold falls to Tarone's 0.005.
        let charged = judged(0.01);
        let s = find(&charged, "gpu_startup_failures");
        assert_ne!(s.verdict, SignalVerdict::Fail, "{s:#?}");
        assert!((s.threshold - DEFAULT_ALPHA * look_weight(1) / 2.0).abs() < 1e-12, "{s:#?}");
        let s = find(&charged, "http_5xx");
        assert_eq!((s.verdict, s.rule), (SignalVerdict::Pass, "no_events"), "{s:#?}");
        assert_eq!(s.requests.as_ref().and_then(|r| r.tolerated_share), Some(0.01));
    }

    #[test]
    fn reports_serialize_with_the_fields_the_service_names() {
        let signals = service_signals(vec![stratum("a", 8, 20.0, 0, 20.0)], vec![], &[("a", 1200.0, 1200.0)]);
        let j = judge(&signals, &Policy::default(), 1);
        let v = serde_json::to_value(&j).expect("serializes");
        let s = &v["signals"][0];
        for field in [
            "canary_events",
            "canary_exposure",
            "baseline_events",
            "baseline_exposure",
            "rate_ratio",
            "p_value",
            "threshold",
            "rule",
            "nodes_used",
            "nodes_not_used",
        ] {
            assert!(s.get(field).is_some(), "{field} missing in {s}");
        }
        assert_eq!(v["outcome"], "fail");
        assert_eq!(s["rate_ratio"], serde_json::Value::Null, "8/0 has no finite ratio");
    }
}
