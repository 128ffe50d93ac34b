//! Which counts the judge compares, and how they are read from Prometheus:
//! per node, for each side, the events and the exposure they happened in.
//!
//! A counter's count over the window is its last value in the window minus
//! its last value before the window, per series, and the whole value of a
//! series born within it. `increase()` would miss the first event of a
//! series created by that event (a canary pod's first crash creates its
//! crash series at 1) and extrapolates to non-integer counts, where exact
//! tests need whole events. A series that went down (the daemon restarted)
//! counts from zero.
use std::collections::BTreeMap;

use super::{
    prometheus::{quote, PromError, Prometheus, Sample},
    request::{Question, Side},
    verdict::{SignalData, SignalKind, Stratum},
};

/// The exposures events are weighed against.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Exposure {
    Startups,
    PodSeconds,
}

struct Signal {
    name: &'static str,
    kind: SignalKind,
    metric: &'static str,
    /// Series of the metric that are not this signal's events.
    excluded: fn(&BTreeMap<String, String>) -> bool,
}

fn nothing(_: &BTreeMap<String, String>) -> bool {
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
    SIGNALS.iter().map(|s| s.name)
}

const STARTUPS: &str = "canaryscope_gpu_startups_total";
const POD_SECONDS: &str = "canaryscope_pod_seconds_total";

/// What Prometheus holds for one question.
pub struct Collected {
    pub signals: Vec<SignalData>,
    /// When the canary was first observed within the window (Unix seconds).
    pub canary_first_seen: Option<f64>,
    /// Whether Prometheus has any of the canary's pods, and the baseline's.
    pub canary_seen: bool,
    pub baseline_seen: bool,
}

/// The node a series was scraped from: the `node` target label the
/// ServiceMonitor sets, else the daemon's address.
fn node_of(labels: &BTreeMap<String, String>) -> String {
    labels.get("node").or_else(|| labels.get("instance")).cloned().unwrap_or_else(|| "unknown".into())
}

fn selector(namespace: &str, side: &Side) -> String {
    let mut s = format!("namespace={},workload={}", quote(namespace), quote(&side.workload));
    if let Some(revision) = &side.revision {
        s.push_str(&format!(",revision={}", quote(revision)));
    }
    s
}

/// Per node, what `metric` counted for `side` within the window.
async fn counted(
    prom: &Prometheus,
    metric: &str,
    selector: &str,
    excluded: fn(&BTreeMap<String, String>) -> bool,
    window_secs: f64,
    end: f64,
) -> Result<BTreeMap<String, f64>, PromError> {
    let query = format!("last_over_time({metric}{{{selector}}}[{}s])", window_secs.ceil() as u64);
    let at_end = prom.instant(&query, end).await?;
    let before: BTreeMap<BTreeMap<String, String>, f64> =
        prom.instant(&query, end - window_secs).await?.into_iter().map(|s| (s.labels, s.value)).collect();
    let mut by_node: BTreeMap<String, f64> = BTreeMap::new();
    for Sample { labels, value } in at_end {
        if excluded(&labels) {
            continue;
        }
        let earlier = before.get(&labels).copied().unwrap_or(0.0);
        let delta = if value >= earlier { value - earlier } else { value };
        *by_node.entry(node_of(&labels)).or_default() += delta;
    }
    Ok(by_node)
}

/// Reads every signal and exposure of both sides.
pub async fn collect(prom: &Prometheus, q: &Question, end: f64) -> Result<Collected, PromError> {
    let window = q.window.as_secs_f64();
    let sides = [selector(&q.namespace, &q.canary), selector(&q.namespace, &q.baseline)];
    let mut exposure: [BTreeMap<String, f64>; 4] = Default::default();
    for (i, side) in sides.iter().enumerate() {
        exposure[2 * i] = counted(prom, STARTUPS, side, nothing, window, end).await?;
        exposure[2 * i + 1] = counted(prom, POD_SECONDS, side, nothing, window, end).await?;
    }
    let mut signals = Vec::new();
    for signal in SIGNALS {
        let canary = counted(prom, signal.metric, &sides[0], signal.excluded, window, end).await?;
        let baseline = counted(prom, signal.metric, &sides[1], signal.excluded, window, end).await?;
        let which = match signal.kind {
            SignalKind::PerStartup => Exposure::Startups,
            SignalKind::PerPodSecond => Exposure::PodSeconds,
        } as usize;
        let (canary_exposure, baseline_exposure) = (&exposure[which], &exposure[2 + which]);
        let nodes: std::collections::BTreeSet<&String> = canary_exposure
            .keys()
            .chain(baseline_exposure.keys())
            .chain(canary.keys())
            .chain(baseline.keys())
            .collect();
        let strata = nodes
            .into_iter()
            .map(|node| Stratum {
                node: node.clone(),
                canary_events: whole(canary.get(node)),
                canary_exposure: canary_exposure.get(node).copied().unwrap_or(0.0),
                baseline_events: whole(baseline.get(node)),
                baseline_exposure: baseline_exposure.get(node).copied().unwrap_or(0.0),
            })
            .collect();
        signals.push(SignalData { name: signal.name.to_string(), kind: signal.kind, strata });
    }
    let first_seen =
        format!("min(min_over_time(timestamp({POD_SECONDS}{{{}}})[{}s:]))", sides[0], window.ceil() as u64);
    let canary_first_seen = prom.instant(&first_seen, end).await?.first().map(|s| s.value);
    Ok(Collected {
        signals,
        canary_first_seen,
        canary_seen: !exposure[1].is_empty(),
        baseline_seen: !exposure[3].is_empty(),
    })
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
