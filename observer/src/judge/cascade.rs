//! Cascades: distinct pods of one workload killed by the OOM killer or a
//! crash within a window, whatever their revision. The solver runbook's
//! poison job, redelivered by the queue from worker to worker, kills one
//! pod after another, and an old revision's pods die of the new revision's
//! poison as readily as the new one's: whichever revision was hit last is
//! not thereby the worse one.
//!
//! Read from `canaryscope_last_kill_timestamp_seconds` (each pod's latest
//! kill, a gauge: a pod killed once is seen from its first sample, which a
//! counter's `increase()` would miss) over the window before the answer's
//! end, of every revision of the workload. With at least `--cascade-pods`
//! pods (3) killed within `--cascade-window` (10 minutes):
//!
//! - pods of two revisions or more: the kill signals (`oom_kills`,
//!   `native_crashes`, `abnormal_exits`, `run_limit_endings`) are set
//!   aside, at this look and at the earlier looks replayed, and the answer
//!   is `inconclusive` unless another signal fails; the reason names the
//!   cascade, its pods and revisions. A person decides (Argo pauses);
//! - one revision's pods only: the answer stands, and its reason names the
//!   cascade.
use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{
    prometheus::{quote, Series},
    report::{Judgement, Outcome, SignalVerdict},
};

pub const LAST_KILL: &str = "canaryscope_last_kill_timestamp_seconds";
pub const DEFAULT_PODS: usize = 3;
/// The signals a cascade's kills count in.
pub const SET_ASIDE: [&str; 4] = ["oom_kills", "native_crashes", "abnormal_exits", "run_limit_endings"];

/// What makes a cascade.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    pub window: f64,
    pub pods: usize,
}

/// One pod's latest kill within the window.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KilledPod {
    pub pod: String,
    pub revision: String,
    pub cause: String,
    /// Unix seconds.
    pub at: f64,
}

/// A cascade under way at the answer's end.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Cascade {
    pub window_seconds: f64,
    /// Oldest kill first.
    pub pods: Vec<KilledPod>,
    pub revisions: Vec<String>,
    /// Whether the kill signals were set aside (pods of two revisions).
    pub set_aside: bool,
}

/// The query: every revision's kill times over the window.
pub fn query(namespace: &str, workload: &str, rule: Rule) -> String {
    format!(
        "{LAST_KILL}{{namespace={},workload={}}}[{}s]",
        quote(namespace),
        quote(workload),
        rule.window.ceil() as u64
    )
}

/// The cascade in `series` at `end`, if there is one.
pub fn find(series: &[Series], end: f64, rule: Rule) -> Option<Cascade> {
    let mut latest: BTreeMap<(String, String), KilledPod> = BTreeMap::new();
    for s in series {
        let label = |name: &str| s.labels.get(name).cloned().unwrap_or_default();
        let within = s.samples.iter().map(|(_, v)| *v).filter(|v| *v > end - rule.window && *v <= end);
        let Some(at) = within.fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v)))) else {
            continue;
        };
        let key = (label("namespace"), label("pod"));
        let pod = KilledPod { pod: label("pod"), revision: label("revision"), cause: label("cause"), at };
        if latest.get(&key).is_none_or(|p| p.at < at) {
            latest.insert(key, pod);
        }
    }
    if latest.len() < rule.pods.max(1) {
        return None;
    }
    let mut pods: Vec<KilledPod> = latest.into_values().collect();
    pods.sort_by(|a, b| a.at.total_cmp(&b.at));
    let revisions: Vec<String> =
        pods.iter().map(|p| p.revision.clone()).collect::<BTreeSet<_>>().into_iter().collect();
    Some(Cascade { window_seconds: rule.window, set_aside: revisions.len() >= 2, pods, revisions })
}

impl Cascade {
    /// The cascade in words, for the reason.
    pub fn describe(&self) -> String {
        let pods: Vec<String> =
            self.pods.iter().map(|p| format!("{} ({}, {})", p.pod, p.revision, p.cause)).collect();
        format!(
            "cascade under way: {} pods of the workload killed within {}s, revisions {}: {}",
            self.pods.len(),
            self.window_seconds,
            self.revisions.join(", "),
            pods.join(", ")
        )
    }
}

/// `judgement` with the cascade told, and with its kill signals set aside
/// when it crossed revisions (see the module's documentation).
pub fn apply(mut judgement: Judgement, cascade: Option<&Cascade>, look: u32) -> Judgement {
    let Some(cascade) = cascade else { return judgement };
    if !cascade.set_aside {
        judgement.reason = format!("{}; {}", judgement.reason, cascade.describe());
        return judgement;
    }
    for report in judgement.signals.iter_mut().filter(|r| SET_ASIDE.contains(&r.name.as_str())) {
        if report.verdict == SignalVerdict::NotApplicable {
            continue;
        }
        report.verdict = SignalVerdict::Inconclusive;
        report.rule = "cascade";
        report.note = format!("set aside: {}; {}", cascade.describe(), report.note);
    }
    let failed: Vec<String> = judgement
        .signals
        .iter()
        .filter(|r| r.verdict == SignalVerdict::Fail)
        .map(|r| format!("{}: {}", r.name, r.note))
        .collect();
    let told = format!(
        "{}; a job moving from pod to pod kills whichever revision runs it, so {} are set aside",
        cascade.describe(),
        SET_ASIDE.join(", ")
    );
    (judgement.outcome, judgement.reason) = match failed.is_empty() {
        true => (Outcome::Inconclusive, format!("look {look}: {told}")),
        false => (Outcome::Fail, format!("look {look}: {}; {told}", failed.join("; "))),
    };
    judgement
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::judge::{
        policy::Policy,
        strata::{SignalData, SignalKind, Stratum},
        verdict::judge,
    };

    fn kill(pod: &str, revision: &str, at: &[f64]) -> Series {
        let labels = [("namespace", "ns"), ("pod", pod), ("revision", revision), ("cause", "oom_kill")];
        Series {
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            samples: at.iter().map(|t| (t + 5.0, *t)).collect(),
        }
    }

    const RULE: Rule = Rule { window: 600.0, pods: 3 };

    #[test]
    fn three_pods_killed_within_the_window_are_a_cascade() {
        let series =
            [kill("a", "new", &[1000.0]), kill("b", "old", &[1100.0]), kill("c", "new", &[1200.0, 1250.0])];
        let c = find(&series, 1300.0, RULE).expect("a cascade");
        assert_eq!(c.pods.iter().map(|p| p.pod.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!((c.revisions.clone(), c.set_aside), (vec!["new".to_string(), "old".to_string()], true));
        assert_eq!(c.pods[2].at, 1250.0, "a pod's latest kill");
        // One kill fell out of the window: two pods are no cascade.
        assert!(find(&series, 1000.0 + 600.0, RULE).is_none());
        // One revision's pods only: told, not set aside.
        let one = [kill("a", "new", &[1000.0]), kill("b", "new", &[1100.0]), kill("c", "new", &[1200.0])];
        assert!(!find(&one, 1300.0, RULE).expect("a cascade").set_aside);
    }

    #[test]
    fn a_cascade_across_revisions_sets_its_kills_aside_and_names_itself() {
        let stratum = |ce, be| Stratum {
            node: "n".into(),
            canary_events: ce,
            canary_exposure: 600.0,
            baseline_events: be,
            baseline_exposure: 600.0,
        };
        let signals = vec![SignalData::new("oom_kills", SignalKind::PerPodSecond, vec![stratum(12, 0)])];
        let j = judge(&signals, &Policy::default(), 1);
        assert_eq!(j.outcome, Outcome::Fail, "{j:#?}");
        let series = [kill("a", "new", &[1000.0]), kill("b", "old", &[1100.0]), kill("c", "new", &[1200.0])];
        let cascade = find(&series, 1300.0, RULE);
        let j = apply(j, cascade.as_ref(), 1);
        assert_eq!(j.outcome, Outcome::Inconclusive, "{j:#?}");
        assert!(
            j.reason.contains("cascade under way: 3 pods") && j.reason.contains("a (new, oom_kill)"),
            "{}",
            j.reason
        );
        assert_eq!(j.signals[0].rule, "cascade");
        // Another signal's failure still fails.
        let mut signals = signals;
        signals.push(SignalData::new("gpu_startup_failures", SignalKind::PerStartup, vec![stratum(12, 0)]));
        let j = apply(judge(&signals, &Policy::default(), 1), cascade.as_ref(), 1);
        assert_eq!(j.outcome, Outcome::Fail, "{j:#?}");
        assert!(
            j.reason.starts_with("look 1: gpu_startup_failures") && j.reason.contains("cascade"),
            "{}",
            j.reason
        );
    }
}
