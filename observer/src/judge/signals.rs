//! Which counts the judge compares, and how they are read from Prometheus:
//! per node, for each side, the events and the exposure they happened in.
//! The request signals' series (HTTP requests by status class, latency
//! buckets) are fetched with the others and counted the same way in
//! `http_signals`.
//!
//! # Counting
//!
//! The judge fetches each counter's raw samples (a range selector, which
//! Prometheus answers with a matrix) and counts them itself: a series'
//! count over a span is the sum of its increases between consecutive
//! samples, a drop being a reset after which the new value is all
//! increase. So a daemon restart, a revision's series purged and begun
//! again, or a pod replaced within a revision all add to the count, and
//! nothing is extrapolated: exact tests need whole events. A series with no
//! sample before the span (born inside it: a canary pod's first crash
//! creates its crash series at 1) counts from 0, which `increase()` would
//! miss. The samples fetched reach [`BEFORE`] back past the window, so the
//! value before it is known.
//!
//! # Spans
//!
//! The canary is read from its current try: the first data after the last
//! stretch of [`TRY_GAP`] in which none of its pods ran (no pod-second
//! series rose), so a revision retried after an abort is judged on what it
//! did since it came back. Per-pod-second signals read the baseline over
//! the same span, so a node-wide fault hits both in the same stratum.
//! Start-up failures read the baseline over the span too when that gives it
//! the minimum start-ups on the canary's nodes; otherwise over
//! `--startup-lookback` (7 days by default) on those nodes: a stable
//! revision's pods mostly started before any canary did, and its start-ups
//! are what its failure rate is known from. Each signal reports its spans.
//!
//! # Flagger
//!
//! Flagger names a Deployment, not a revision. The canary is its newest
//! revision in Prometheus: of those with data at the end of the window, the
//! one whose data began last (a revision rolled back earlier has no data
//! then). Prometheus has it without any access to the Kubernetes API.
use std::collections::{BTreeMap, BTreeSet};

use super::{
    http_signals::{self, HttpSeries},
    prometheus::{quote, PromError, Prometheus, Series},
    request::{Question, Side},
    solver_runs::{self, RunData},
    strata::{SignalData, SignalKind, Span, Stratum},
};

struct Signal {
    name: &'static str,
    kind: SignalKind,
    metric: &'static str,
    /// Series of the metric that are not this signal's events.
    excluded: fn(&BTreeMap<String, String>) -> bool,
}

pub(super) fn nothing(_: &BTreeMap<String, String>) -> bool {
    false
}

/// Abnormal exits that are neither counted by another signal (OOM kills,
/// native crashes) nor a rollout deleting its own pods.
fn counted_elsewhere(labels: &BTreeMap<String, String>) -> bool {
    let cause = labels.get("cause").map(String::as_str);
    matches!(cause, Some("oom_kill" | "fault" | "abort"))
        || labels.get("kill_reason").map(String::as_str) == Some("pod_deleted")
}

/// Rare events only: throttling and latency are not counts of independent
/// failures, and the rules and templates compare them as ratios already.
/// Events the driver attributes to no process (`canaryscope_node_gpu_*`)
/// are never a revision's.
const SIGNALS: &[Signal] = &[
    Signal {
        name: "gpu_startup_failures",
        kind: SignalKind::PerStartup,
        metric: "canaryscope_gpu_startup_failures_total",
        excluded: nothing,
    },
    Signal {
        name: "native_crashes",
        kind: SignalKind::PerPodSecond,
        metric: "canaryscope_native_crashes_total",
        excluded: nothing,
    },
    Signal {
        name: "oom_kills",
        kind: SignalKind::PerPodSecond,
        metric: "canaryscope_oom_kills_total",
        excluded: nothing,
    },
    Signal {
        name: "abnormal_exits",
        kind: SignalKind::PerPodSecond,
        metric: "canaryscope_abnormal_exits_total",
        excluded: counted_elsewhere,
    },
    Signal {
        name: "gpu_memory_faults",
        kind: SignalKind::PerPodSecond,
        metric: "canaryscope_gpu_memory_faults_total",
        excluded: nothing,
    },
    Signal {
        name: "memory_limit_refusals",
        kind: SignalKind::PerPodSecond,
        metric: "canaryscope_memory_limit_refusals_total",
        excluded: nothing,
    },
];

/// The names the judge reports, in order.
pub fn signal_names() -> impl Iterator<Item = &'static str> {
    SIGNALS
        .iter()
        .map(|s| s.name)
        .chain(http_signals::signal_names())
        .chain([solver_runs::LIMIT_SIGNAL, solver_runs::P99_SIGNAL])
}

const STARTUPS: &str = "canaryscope_gpu_startups_total";
const STARTUP_FAILURES: &str = "canaryscope_gpu_startup_failures_total";
const POD_SECONDS: &str = "canaryscope_pod_seconds_total";

/// How far before the window samples are fetched, so that each series'
/// value before it is known; longer than [`TRY_GAP`], so that a canary
/// whose data runs on from before the window is seen to.
pub const BEFORE: f64 = 900.0;
/// A stretch this long in which no canary pod ran ends a try: longer than a
/// few missed scrapes, shorter than an abort and a retry by a person.
pub const TRY_GAP: f64 = 600.0;

/// What to read for one question.
pub struct Reading<'a> {
    pub question: &'a Question,
    /// Unix seconds the window ends at.
    pub end: f64,
    /// How far back the baseline's start-ups may be read (seconds).
    pub startup_lookback: f64,
    /// The baseline start-ups on the canary's nodes that the canary's own
    /// span must hold before the lookback is left unused.
    pub min_startups: f64,
    /// When every query must have answered.
    pub deadline: tokio::time::Instant,
    /// How long the latency signal's test must hold (seconds).
    pub latency_hold: f64,
}

/// Every raw sample one side holds, by metric.
#[derive(Default)]
struct SideData(BTreeMap<&'static str, Vec<Series>>);

impl SideData {
    fn of(&self, metric: &str) -> &[Series] {
        self.0.get(metric).map_or(&[], Vec::as_slice)
    }
}

/// What Prometheus holds for one question.
pub struct Collected {
    /// The canary's current try: its first data after the last gap, if it
    /// has any data in the window.
    pub first_data: Option<f64>,
    /// Whether that data began before the window (the window would drop
    /// the canary's earlier events).
    pub began_before_window: bool,
    /// The revision taken as the canary's when the question named none.
    pub canary_revision: Option<String>,
    pub baseline_seen: bool,
    canary: SideData,
    baseline: SideData,
    /// The baseline's start-ups and failures over the lookback, on the
    /// canary's nodes (only when the canary started GPUs).
    baseline_history: SideData,
    history_from: f64,
    min_startups: f64,
    /// Where the samples fetched begin.
    fetched_from: f64,
    latency_hold: f64,
    /// Both sides' runs.
    runs: RunData,
}

/// The node a series was scraped from: the `node` target label the
/// ServiceMonitor sets, else the daemon's address.
pub(super) fn node_of(labels: &BTreeMap<String, String>) -> String {
    labels.get("node").or_else(|| labels.get("instance")).cloned().unwrap_or_else(|| "unknown".into())
}

fn selector(namespace: &str, side: &Side) -> String {
    let mut s = format!("namespace={},workload={}", quote(namespace), quote(&side.workload));
    if let Some(revision) = &side.revision {
        s.push_str(&format!(",revision={}", quote(revision)));
    }
    s
}

/// The sum of a series' increases over `(from, to]`: a drop is a reset,
/// after which the new value is all increase. Without a sample at or
/// before `from`, the series was born inside the span and counts from 0.
pub fn increase(samples: &[(f64, f64)], from: f64, to: f64) -> f64 {
    let mut previous = samples.iter().take_while(|(t, _)| *t <= from).last().map(|&(_, v)| v);
    let mut total = 0.0;
    for &(_, value) in samples.iter().filter(|(t, _)| *t > from && *t <= to) {
        total += match previous {
            Some(p) if value >= p => value - p,
            _ => value,
        };
        previous = Some(value);
    }
    total
}

/// Per node, what the series counted over `(from, to]`.
pub(super) fn per_node(
    series: &[Series],
    excluded: fn(&BTreeMap<String, String>) -> bool,
    from: f64,
    to: f64,
) -> BTreeMap<String, f64> {
    let mut by_node: BTreeMap<String, f64> = BTreeMap::new();
    for s in series.iter().filter(|s| !excluded(&s.labels)) {
        let counted = increase(&s.samples, from, to);
        let entry = by_node.entry(node_of(&s.labels)).or_default();
        *entry += counted;
    }
    by_node
}

/// When the canary's current try began: the first of the times its
/// pod-seconds rose (or a series of them first appeared) after the last
/// gap longer than [`TRY_GAP`].
fn first_data(pod_seconds: &[Series]) -> Option<f64> {
    let mut active: Vec<f64> = Vec::new();
    for s in pod_seconds {
        let mut previous: Option<f64> = None;
        for &(t, v) in &s.samples {
            if previous.is_none_or(|p| v != p) {
                active.push(t);
            }
            previous = Some(v);
        }
    }
    active.sort_by(f64::total_cmp);
    let mut first = *active.first()?;
    for pair in active.windows(2) {
        if pair[1] - pair[0] > TRY_GAP {
            first = pair[1];
        }
    }
    Some(first)
}

/// Counts start just before the try's first data, so its first rise counts.
const BEFORE_FIRST_DATA: f64 = 1e-3;

/// Flagger's canary: of the target's revisions with data at the end, the
/// one whose data began last.
fn newest_revision(pod_seconds: &[Series], end: f64) -> Option<String> {
    let mut spans: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for s in pod_seconds {
        let (Some(revision), Some(first), Some(last)) =
            (s.labels.get("revision"), s.samples.first(), s.samples.last())
        else {
            continue;
        };
        let span = spans.entry(revision).or_insert((first.0, last.0));
        *span = (span.0.min(first.0), span.1.max(last.0));
    }
    spans
        .into_iter()
        .filter(|(_, (_, last))| *last >= end - TRY_GAP)
        .max_by(|a, b| a.1 .0.total_cmp(&b.1 .0))
        .map(|(revision, _)| revision.to_string())
}

/// Each query's name (what the answer names when it is slow) and PromQL.
pub(super) type Query = (String, String);

/// Every metric of one side over `range` seconds before the end.
fn side_queries(side: &str, selector: &str, range: f64) -> Vec<(&'static str, Query)> {
    let metrics = [STARTUPS, POD_SECONDS].into_iter().chain(SIGNALS.iter().map(|s| s.metric));
    let range = range.ceil() as u64;
    let mut queries: Vec<_> =
        metrics.map(|m| (m, (format!("{side} {m}"), format!("{m}{{{selector}}}[{range}s]")))).collect();
    queries.extend(http_signals::queries(side, selector, range));
    queries
}

/// Runs every query at once, each answer in its query's place, all by
/// `deadline`; past it, the error names the queries still unanswered.
async fn fetch_all(
    prom: &Prometheus,
    queries: &[Query],
    at: f64,
    deadline: tokio::time::Instant,
) -> Result<Vec<Vec<Series>>, PromError> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (_, query)) in queries.iter().enumerate() {
        let (prom, query) = (prom.clone(), query.clone());
        tasks.spawn(async move { (i, prom.samples(&query, at).await) });
    }
    let mut answers: Vec<Option<Vec<Series>>> = vec![None; queries.len()];
    loop {
        match tokio::time::timeout_at(deadline, tasks.join_next()).await {
            Ok(None) => break,
            Ok(Some(Ok((i, answer)))) => answers[i] = Some(answer?),
            Ok(Some(Err(e))) => return Err(PromError::Query(format!("a query did not finish: {e}"))),
            Err(_) => {
                let slow = queries.iter().zip(&answers).filter(|(_, a)| a.is_none());
                return Err(PromError::Deadline(slow.map(|((name, _), _)| name.clone()).collect()));
            }
        }
    }
    Ok(answers.into_iter().map(Option::unwrap_or_default).collect())
}

/// Reads every signal and exposure of both sides.
pub async fn collect(prom: &Prometheus, r: &Reading<'_>) -> Result<Collected, PromError> {
    let q = r.question;
    let window_start = r.end - q.window.as_secs_f64();
    let range = q.window.as_secs_f64() + BEFORE;
    let canary_sel = selector(&q.namespace, &q.canary);
    let mut plan = side_queries("canary", &canary_sel, range);
    plan.extend(side_queries("baseline", &selector(&q.namespace, &q.baseline), range));
    let mut queries: Vec<Query> = plan.iter().map(|(_, query)| query.clone()).collect();
    queries.extend(solver_runs::queries(&canary_sel, &selector(&q.namespace, &q.baseline), range));
    let mut answers = fetch_all(prom, &queries, r.end, r.deadline).await?;
    let mut runs = RunData::new(answers.split_off(plan.len()));
    let (mut canary, mut baseline) = (SideData::default(), SideData::default());
    let half = plan.len() / 2;
    for (i, ((metric, _), series)) in plan.iter().zip(answers).enumerate() {
        let side = if i < half { &mut canary } else { &mut baseline };
        side.0.insert(metric, series);
    }
    let canary_revision = match &q.canary.revision {
        Some(_) => None,
        None => {
            let newest = newest_revision(canary.of(POD_SECONDS), r.end);
            for series in canary.0.values_mut() {
                series.retain(|s| s.labels.get("revision") == newest.as_ref());
            }
            runs.keep_canary_revision(newest.as_ref());
            newest
        }
    };
    let first_data = first_data(canary.of(POD_SECONDS));
    let from = first_data.map_or(window_start, |t| t - BEFORE_FIRST_DATA);
    let baseline_seen = per_node(baseline.of(POD_SECONDS), nothing, from, r.end).values().any(|v| *v > 0.0);
    let nodes = canary_startup_nodes(&canary, from, r.end);
    let history =
        if nodes.is_empty() { SideData::default() } else { baseline_history(prom, r, &nodes).await? };
    Ok(Collected {
        first_data,
        began_before_window: first_data.is_some_and(|t| t <= window_start),
        canary_revision,
        baseline_seen,
        canary,
        baseline,
        baseline_history: history,
        history_from: r.end - r.startup_lookback,
        min_startups: r.min_startups,
        fetched_from: r.end - range,
        latency_hold: r.latency_hold,
        runs,
    })
}

/// The canary's nodes with GPU start-ups in `(from, to]`, by the label
/// that names them (`node`, else `instance`).
fn canary_startup_nodes(canary: &SideData, from: f64, to: f64) -> BTreeSet<(&'static str, String)> {
    canary
        .of(STARTUPS)
        .iter()
        .filter(|s| increase(&s.samples, from, to) > 0.0)
        .map(|s| match s.labels.get("node") {
            Some(node) => ("node", node.clone()),
            None => ("instance", s.labels.get("instance").cloned().unwrap_or_default()),
        })
        .collect()
}

/// The baseline's start-ups and their failures over the lookback, on the
/// canary's `nodes` only: days of raw samples on every node would be more
/// than an answer should carry.
async fn baseline_history(
    prom: &Prometheus,
    r: &Reading<'_>,
    nodes: &BTreeSet<(&'static str, String)>,
) -> Result<SideData, PromError> {
    let selector = selector(&r.question.namespace, &r.question.baseline);
    let range = (r.startup_lookback + BEFORE).ceil() as u64;
    let mut plan = Vec::new();
    for label in ["node", "instance"] {
        let names: Vec<String> =
            nodes.iter().filter(|(l, _)| *l == label).map(|(_, n)| regex_escape(n)).collect();
        if names.is_empty() {
            continue;
        }
        let matcher = format!("{label}=~{}", quote(&names.join("|")));
        for metric in [STARTUPS, STARTUP_FAILURES] {
            let query = format!("{metric}{{{selector},{matcher}}}[{range}s]");
            plan.push((metric, (format!("baseline {metric} over the start-up lookback"), query)));
        }
    }
    let queries: Vec<Query> = plan.iter().map(|(_, q)| q.clone()).collect();
    let answers = fetch_all(prom, &queries, r.end, r.deadline).await?;
    let mut history = SideData::default();
    for ((metric, _), series) in plan.into_iter().zip(answers) {
        history.0.entry(metric).or_default().extend(series);
    }
    Ok(history)
}

/// `text` matched literally by a PromQL (RE2) regular expression.
fn regex_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Collected {
    /// Per signal, both sides' counts from the canary's try to `at`.
    pub fn signals_at(&self, at: f64) -> Vec<SignalData> {
        let Some(from) = self.first_data.map(|t| t - BEFORE_FIRST_DATA) else {
            return Vec::new();
        };
        let span = Span { from, to: at };
        let pod_seconds = (
            per_node(self.canary.of(POD_SECONDS), nothing, from, at),
            per_node(self.baseline.of(POD_SECONDS), nothing, from, at),
        );
        let http = HttpSeries {
            canary_counts: self.canary.of(http_signals::REQUEST_COUNT),
            canary_buckets: self.canary.of(http_signals::REQUEST_BUCKETS),
            baseline_counts: self.baseline.of(http_signals::REQUEST_COUNT),
            baseline_buckets: self.baseline.of(http_signals::REQUEST_BUCKETS),
        };
        let requests = http_signals::signals_at(&http, span, self.fetched_from, self.latency_hold);
        let mut signals: Vec<SignalData> = SIGNALS
            .iter()
            .map(|signal| {
                let canary = per_node(self.canary.of(signal.metric), signal.excluded, from, at);
                let (canary_exposure, baseline, baseline_exposure, baseline_span) = match signal.kind {
                    // Runs are read by `solver_runs`.
                    SignalKind::PerRun => Default::default(),
                    SignalKind::PerStartup => {
                        let startups = per_node(self.canary.of(STARTUPS), nothing, from, at);
                        let (events, exposure, span) = self.baseline_startups(&startups, span);
                        (startups, events, exposure, span)
                    }
                    // Per pod-second: the table holds no request signal.
                    _ => (
                        pod_seconds.0.clone(),
                        per_node(self.baseline.of(signal.metric), signal.excluded, from, at),
                        pod_seconds.1.clone(),
                        span,
                    ),
                };
                let read = per_node(self.baseline.of(signal.metric), signal.excluded, self.fetched_from, at);
                SignalData {
                    name: signal.name.to_string(),
                    kind: signal.kind,
                    strata: strata(&canary, &canary_exposure, &baseline, &baseline_exposure),
                    canary_span: span,
                    baseline_span,
                    baseline_events_read: baseline
                        .values()
                        .chain(read.values())
                        .map(|v| whole(Some(v)))
                        .sum(),
                    requests: None,
                    definition: None,
                }
            })
            .chain(requests)
            .collect();
        signals.extend(self.runs.signals_at(span));
        signals
    }

    /// The baseline's start-up failures and start-ups: over the canary's
    /// span when that holds the minimum start-ups on the canary's nodes,
    /// else over the lookback (the part of it up to `span.to`).
    fn baseline_startups(
        &self,
        canary: &BTreeMap<String, f64>,
        span: Span,
    ) -> (BTreeMap<String, f64>, BTreeMap<String, f64>, Span) {
        let startups = per_node(self.baseline.of(STARTUPS), nothing, span.from, span.to);
        let on_canary_nodes: f64 =
            startups.iter().filter(|(n, _)| canary.get(*n).is_some_and(|c| *c > 0.0)).map(|(_, v)| v).sum();
        // A lookback no longer than the span adds nothing to it.
        let lookback_adds = self.history_from < span.from && !self.baseline_history.0.is_empty();
        if on_canary_nodes >= self.min_startups || !lookback_adds {
            let failures = per_node(self.baseline.of(STARTUP_FAILURES), nothing, span.from, span.to);
            return (failures, startups, span);
        }
        // At an earlier look too from the lookback's start at the end: its
        // samples are fetched from there.
        let history = Span { from: self.history_from, to: span.to };
        let failures =
            per_node(self.baseline_history.of(STARTUP_FAILURES), nothing, history.from, history.to);
        let startups = per_node(self.baseline_history.of(STARTUPS), nothing, history.from, history.to);
        (failures, startups, history)
    }
}

/// One stratum per node any count or exposure names.
pub(super) fn strata(
    canary: &BTreeMap<String, f64>,
    canary_exposure: &BTreeMap<String, f64>,
    baseline: &BTreeMap<String, f64>,
    baseline_exposure: &BTreeMap<String, f64>,
) -> Vec<Stratum> {
    let nodes: BTreeSet<&String> = canary_exposure
        .keys()
        .chain(baseline_exposure.keys())
        .chain(canary.keys())
        .chain(baseline.keys())
        .collect();
    nodes
        .into_iter()
        .map(|node| Stratum {
            node: node.clone(),
            canary_events: whole(canary.get(node)),
            canary_exposure: canary_exposure.get(node).copied().unwrap_or(0.0),
            baseline_events: whole(baseline.get(node)),
            baseline_exposure: baseline_exposure.get(node).copied().unwrap_or(0.0),
        })
        .collect()
}

/// Counters count whole events; a sum of them is whole too.
fn whole(v: Option<&f64>) -> u64 {
    v.map_or(0, |v| v.max(0.0).round() as u64)
}

/// Which look at the canary this is: one per interval since its first data.
pub fn look(canary_first_seen: Option<f64>, end: f64, interval_secs: f64) -> u32 {
    let elapsed = canary_first_seen.map_or(0.0, |first| (end - first).max(0.0));
    ((elapsed / interval_secs).ceil() as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(revision: &str, samples: &[(f64, f64)]) -> Series {
        let labels = [("revision", revision), ("node", "a")];
        Series {
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            samples: samples.to_vec(),
        }
    }

    #[test]
    fn increases_add_up_across_resets_and_from_the_value_before_the_span() {
        // 30 before the span; 30 more, a restart to 0, then 5.
        let s = [(0.0, 30.0), (100.0, 45.0), (200.0, 60.0), (300.0, 0.0), (400.0, 5.0)];
        assert_eq!(increase(&s, 50.0, 400.0), 35.0);
        assert_eq!(increase(&s, 0.0, 400.0), 35.0);
        // A restart that ends above the value before the span loses nothing.
        let s = [(0.0, 30.0), (100.0, 60.0), (200.0, 40.0)];
        assert_eq!(increase(&s, 0.0, 200.0), 70.0);
        // Born inside the span: counted from 0, its first event included.
        assert_eq!(increase(&[(150.0, 1.0), (250.0, 2.0)], 100.0, 300.0), 2.0);
        // Only what happened in (from, to].
        assert_eq!(increase(&[(0.0, 1.0), (100.0, 4.0), (200.0, 9.0)], 0.0, 100.0), 3.0);
    }

    #[test]
    fn a_try_begins_after_the_last_stretch_without_a_running_pod() {
        // Ran 0..600, stopped (flat) until 2000, back from 2015.
        let mut samples: Vec<(f64, f64)> = (0..=40).map(|i| (15.0 * i as f64, 15.0 * i as f64)).collect();
        samples.extend((0..=40).map(|i| (1400.0 + 15.0 * i as f64, 600.0)));
        samples.extend((1..=10).map(|i| (2000.0 + 15.0 * i as f64, 600.0 + 15.0 * i as f64)));
        assert_eq!(first_data(&[series("r", &samples)]), Some(2015.0));
        assert_eq!(first_data(&[]), None);
        // A restart (a drop) within a try does not split it.
        let restarted = [(0.0, 0.0), (15.0, 15.0), (30.0, 0.0), (45.0, 15.0)];
        assert_eq!(first_data(&[series("r", &restarted)]), Some(0.0));
    }

    #[test]
    fn flaggers_canary_is_the_newest_revision_with_data_at_the_end() {
        let old = series("old", &[(0.0, 1.0), (600.0, 600.0)]);
        let new = series("new", &[(3000.0, 1.0), (3600.0, 600.0)]);
        let gone = series("gone", &[(2700.0, 1.0), (2900.0, 100.0)]);
        assert_eq!(newest_revision(&[old.clone(), new, gone], 3600.0).as_deref(), Some("new"));
        assert_eq!(newest_revision(&[old], 3600.0), None);
    }

    #[test]
    fn node_names_are_matched_literally() {
        assert_eq!(regex_escape("ip-10-0-0-1.ec2.internal"), r"ip-10-0-0-1\.ec2\.internal");
        assert_eq!(regex_escape("a|b(c)"), r"a\|b\(c\)");
    }

    #[test]
    fn looks_count_intervals_since_the_canarys_first_data() {
        assert_eq!(look(None, 1000.0, 60.0), 1);
        assert_eq!(look(Some(1000.0), 1000.0, 60.0), 1);
        assert_eq!(look(Some(1000.0), 1061.0, 60.0), 2);
        assert_eq!(look(Some(1000.0), 1600.0, 60.0), 10);
    }

    #[test]
    fn exits_counted_by_other_signals_or_by_a_rollout_are_not_abnormal_exits_here() {
        let l = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(counted_elsewhere(&l(&[("cause", "oom_kill")])));
        assert!(counted_elsewhere(&l(&[("cause", "sent"), ("kill_reason", "pod_deleted")])));
        assert!(!counted_elsewhere(&l(&[("cause", "sent"), ("kill_reason", "container_restart")])));
        assert!(!counted_elsewhere(&l(&[("cause", "rlimit_cpu")])));
    }

    #[test]
    fn selectors_quote_and_leave_out_an_absent_revision() {
        let side = Side { workload: "infer".into(), revision: None };
        assert_eq!(selector("ml", &side), "namespace=\"ml\",workload=\"infer\"");
        let side = Side { workload: "w".into(), revision: Some("a\"b".into()) };
        assert_eq!(selector("n", &side), "namespace=\"n\",workload=\"w\",revision=\"a\\\"b\"");
    }
}
