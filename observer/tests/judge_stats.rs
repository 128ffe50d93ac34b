//! The judge's exact tests against an independent oracle computed at test
//! time (tests/judge/oracle.py): SciPy's one-sided Fisher test, statsmodels'
//! exact conditional test of two Poisson rates, a brute-force enumeration
//! with exact rationals and a NumPy convolution of SciPy's probability
//! functions for stratified cases, and statsmodels' Cochran–Mantel–Haenszel
//! test (a normal approximation) for large stratified tables. The run
//! signals' p-values against tests/judge/runs_oracle.py, which chooses the
//! run p99's bound itself.
use std::collections::BTreeMap;

use observer::judge::{
    solver_runs::{slow_runs, Cumulative},
    stats::{
        fisher_greater, fisher_greater_stratified, poisson_ratio_greater, poisson_ratio_greater_stratified,
        Counts,
    },
    strata::Bound,
};
use serde_json::{json, Value};
use test_support::judge::run_oracle;

/// Relative tolerance against exact references: both sides compute in
/// doubles, the judge by saddle-point logarithms, SciPy by Boost.
const EXACT: f64 = 1e-9;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Fisher,
    Poisson,
}

/// One case: what the judge computes, and which references it must match.
struct Case {
    name: &'static str,
    kind: Kind,
    /// [canary events, canary exposure, baseline events, baseline exposure] per node.
    strata: Vec<[f64; 4]>,
    ratio: f64,
    /// What the oracle is given, when it is not `strata` (a pooled
    /// equivalent for counts too large for its enumerations).
    oracle_strata: Option<Vec<[f64; 4]>>,
    want: Vec<(&'static str, Tolerance)>,
}

#[derive(Clone, Copy, Debug)]
enum Tolerance {
    /// Relative difference at most this.
    Relative(f64),
    /// |ln p - ln q| at most this (a normal approximation's error).
    Log(f64),
}

fn counts(s: &[f64; 4]) -> Counts {
    Counts {
        canary_events: s[0] as u64,
        canary_exposure: s[1],
        baseline_events: s[2] as u64,
        baseline_exposure: s[3],
    }
}

impl Case {
    fn judge(&self) -> f64 {
        let strata: Vec<Counts> = self.strata.iter().map(counts).collect();
        match (self.kind, strata.as_slice()) {
            (Kind::Fisher, [c]) => fisher_greater(
                c.canary_events,
                c.canary_exposure as u64,
                c.baseline_events,
                c.baseline_exposure as u64,
            ),
            (Kind::Poisson, [c]) => poisson_ratio_greater(
                c.canary_events,
                c.canary_exposure,
                c.baseline_events,
                c.baseline_exposure,
                self.ratio,
            ),
            (Kind::Fisher, _) => fisher_greater_stratified(&strata).p_value,
            (Kind::Poisson, _) => poisson_ratio_greater_stratified(&strata, self.ratio).p_value,
        }
    }

    fn oracle_input(&self) -> Value {
        json!({
            "kind": if self.kind == Kind::Fisher { "fisher" } else { "poisson" },
            "strata": self.oracle_strata.as_ref().unwrap_or(&self.strata),
            "ratio": self.ratio,
            "want": self.want.iter().map(|(name, _)| *name).collect::<Vec<_>>(),
        })
    }
}

fn one(name: &'static str, kind: Kind, s: [f64; 4], ratio: f64) -> Case {
    let reference = if kind == Kind::Fisher { "scipy" } else { "statsmodels" };
    Case {
        name,
        kind,
        strata: vec![s],
        ratio,
        oracle_strata: None,
        want: vec![(reference, Tolerance::Relative(EXACT))],
    }
}

fn stratified(name: &'static str, kind: Kind, strata: Vec<[f64; 4]>, ratio: f64) -> Case {
    let want = vec![("brute", Tolerance::Relative(EXACT)), ("numeric", Tolerance::Relative(EXACT))];
    Case { name, kind, strata, ratio, oracle_strata: None, want }
}

fn large(name: &'static str, kind: Kind, strata: Vec<[f64; 4]>, ratio: f64) -> Case {
    let mut want = vec![("numeric", Tolerance::Relative(EXACT))];
    if kind == Kind::Fisher {
        want.push(("cmh", Tolerance::Log(0.15)));
    }
    Case { name, kind, strata, ratio, oracle_strata: None, want }
}

fn fisher_cases() -> Vec<Case> {
    use Kind::Fisher;
    let f = |name, s| one(name, Fisher, s, 1.0);
    vec![
        f("no start-ups at all", [0.0, 0.0, 0.0, 0.0]),
        f("no failures", [0.0, 10.0, 0.0, 10.0]),
        f("only the baseline fails", [0.0, 10.0, 3.0, 10.0]),
        f("the issue's 8 of 20 against 0 of 20", [8.0, 20.0, 0.0, 20.0]),
        f("1 of 2 against 0 of 2", [1.0, 2.0, 0.0, 2.0]),
        f("a tie", [5.0, 10.0, 5.0, 10.0]),
        f("every start-up fails on both", [10.0, 10.0, 10.0, 10.0]),
        f("every canary start-up fails", [12.0, 12.0, 1.0, 30.0]),
        f("3 of 40 against 0 of 400", [3.0, 40.0, 0.0, 400.0]),
        f("one in a thousand", [1.0, 1000.0, 0.0, 1000.0]),
        f("slightly worse", [7.0, 100.0, 5.0, 100.0]),
        f("better", [2.0, 100.0, 9.0, 100.0]),
        f("a million start-ups, rare failures", [1000.0, 1e6, 600.0, 1e6]),
        f("a million start-ups, common failures", [50_400.0, 1e6, 50_000.0, 1e6]),
        f("a million start-ups, far in the tail", [52_000.0, 1e6, 50_000.0, 1e6]),
        f("unequal sizes", [9.0, 30.0, 40.0, 400.0]),
    ]
}

fn poisson_cases() -> Vec<Case> {
    use Kind::Poisson;
    let p = |name, s, r| one(name, Poisson, s, r);
    vec![
        p("no events", [0.0, 600.0, 0.0, 1800.0], 1.5),
        p("only the baseline's events", [0.0, 600.0, 5.0, 1800.0], 1.5),
        p("one canary event", [1.0, 600.0, 0.0, 1800.0], 1.5),
        p("a tie in rates", [10.0, 600.0, 30.0, 1800.0], 1.5),
        p("just below the tolerated ratio", [14.0, 100.0, 10.0, 100.0], 1.5),
        p("at the tolerated ratio", [15.0, 100.0, 10.0, 100.0], 1.5),
        p("just above the tolerated ratio", [16.0, 100.0, 10.0, 100.0], 1.5),
        p("twice the tolerated ratio", [30.0, 100.0, 10.0, 100.0], 1.5),
        p("5x at a quarter of the exposure", [33.0, 1800.0, 20.0, 5400.0], 1.5),
        p("5x at a tenth of the exposure", [11.0, 600.0, 20.0, 5400.0], 1.5),
        p("a crash loop on the canary", [12.0, 1200.0, 0.0, 3600.0], 1.5),
        p("ratio 1", [7.0, 250.5, 3.0, 260.25], 1.0),
        p("ratio 3", [40.0, 100.0, 10.0, 100.0], 3.0),
        p("tiny canary exposure", [1.0, 1e-3, 0.0, 1e6], 1.5),
        p("tiny baseline exposure", [3.0, 1e6, 2.0, 1e-3], 1.5),
        p("fractional exposures", [4.0, 123.4, 1.0, 567.8], 1.25),
        p("many events near the ratio", [150_000.0, 1e6, 100_000.0, 1e6], 1.5),
        p("many events beyond it", [153_000.0, 1e6, 100_000.0, 1e6], 1.5),
    ]
}

fn stratified_cases() -> Vec<Case> {
    use Kind::{Fisher, Poisson};
    let mut cases = vec![
        stratified(
            "start-ups on three nodes",
            Fisher,
            vec![[1.0, 5.0, 0.0, 5.0], [2.0, 5.0, 0.0, 6.0], [0.0, 4.0, 1.0, 4.0]],
            1.0,
        ),
        stratified(
            "start-ups: a node without failures and one without the baseline",
            Fisher,
            vec![[3.0, 8.0, 1.0, 9.0], [0.0, 7.0, 0.0, 7.0], [2.0, 3.0, 0.0, 0.0]],
            1.0,
        ),
        stratified(
            "start-ups: every failure on one node",
            Fisher,
            vec![[4.0, 6.0, 2.0, 20.0], [0.0, 10.0, 0.0, 30.0]],
            1.0,
        ),
        stratified(
            "start-ups: the canary better on one node, worse on another",
            Fisher,
            vec![[0.0, 10.0, 4.0, 10.0], [5.0, 10.0, 0.0, 10.0], [1.0, 3.0, 1.0, 9.0]],
            1.0,
        ),
        stratified(
            "crashes on three nodes at the tolerated ratio",
            Poisson,
            vec![[3.0, 100.0, 1.0, 300.0], [2.0, 50.0, 0.0, 200.0], [0.0, 10.0, 4.0, 40.0]],
            1.5,
        ),
        stratified(
            "a GPU reset on one node of three",
            Poisson,
            vec![[0.0, 1200.0, 0.0, 3600.0], [1.0, 1200.0, 3.0, 3600.0], [0.0, 1200.0, 0.0, 3600.0]],
            1.5,
        ),
        stratified(
            "a canary fault on two nodes of three",
            Poisson,
            vec![[6.0, 1200.0, 0.0, 3600.0], [6.0, 1200.0, 0.0, 3600.0], [0.0, 1200.0, 0.0, 3600.0]],
            1.5,
        ),
        stratified(
            "uneven shares per node",
            Poisson,
            vec![
                [5.0, 24.0, 4.0, 90.0],
                [6.0, 24.0, 3.0, 54.0],
                [2.0, 12.0, 1.0, 36.0],
                [1.0, 5.0, 0.0, 5.0],
            ],
            1.5,
        ),
        stratified(
            "ratio 1, four nodes",
            Poisson,
            vec![[2.0, 10.0, 2.0, 10.0], [3.0, 7.5, 1.0, 12.5], [0.0, 3.0, 2.0, 4.0], [4.0, 9.0, 0.0, 1.0]],
            1.0,
        ),
    ];
    // No shared node at all: nothing to test, p = 1.
    let mut lonely =
        stratified("no node runs both", Poisson, vec![[4.0, 100.0, 0.0, 0.0], [0.0, 0.0, 2.0, 50.0]], 1.5);
    lonely.want = vec![("numeric", Tolerance::Relative(EXACT))];
    cases.push(lonely);
    cases
}

fn large_cases() -> Vec<Case> {
    use Kind::{Fisher, Poisson};
    let mut cases = vec![
        large(
            "start-ups by the thousand on three nodes",
            Fisher,
            vec![[130.0, 2000.0, 100.0, 2000.0], [70.0, 1000.0, 180.0, 3000.0], [40.0, 500.0, 30.0, 500.0]],
            1.0,
        ),
        large(
            "start-ups by the ten thousand, close",
            Fisher,
            vec![[520.0, 10_000.0, 500.0, 10_000.0], [260.0, 5000.0, 740.0, 15_000.0]],
            1.0,
        ),
        large(
            "events by the thousand, uneven shares",
            Poisson,
            vec![[900.0, 1e4, 1500.0, 3e4], [2100.0, 2e4, 2500.0, 4e4], [300.0, 1e4, 800.0, 2e4]],
            1.5,
        ),
    ];
    // A million events on each of three nodes at the same share: the sum is
    // binomial, which statsmodels computes from the pooled counts.
    let node = [500_400.0, 1e6, 480_000.0, 1e6];
    cases.push(Case {
        name: "a million events on each of three nodes",
        kind: Poisson,
        strata: vec![node; 3],
        ratio: 1.0,
        oracle_strata: Some(vec![[1_501_200.0, 3e6, 1_440_000.0, 3e6]]),
        want: vec![("statsmodels", Tolerance::Relative(EXACT))],
    });
    let near = [500_400.0, 1e6, 500_000.0, 1e6];
    cases.push(Case {
        name: "a million events on each of three nodes, near the middle",
        kind: Poisson,
        strata: vec![near; 3],
        ratio: 1.0,
        oracle_strata: Some(vec![[1_501_200.0, 3e6, 1_500_000.0, 3e6]]),
        want: vec![("statsmodels", Tolerance::Relative(EXACT))],
    });
    cases
}

/// The oracle's answers, one object of reference p-values per case.
fn ask_oracle(cases: &[Case]) -> Vec<Value> {
    let input = Value::Array(cases.iter().map(Case::oracle_input).collect());
    let answers = run_oracle("tests/judge/oracle.py", &input, &[]);
    let answers = answers.as_array().cloned().expect("the oracle answers a list");
    assert_eq!(answers.len(), cases.len());
    answers
}

fn within(ours: f64, theirs: f64, tolerance: Tolerance) -> bool {
    match tolerance {
        Tolerance::Relative(rel) => (ours - theirs).abs() <= rel * ours.abs().max(theirs.abs()),
        Tolerance::Log(d) => ours > 0.0 && theirs > 0.0 && (ours.ln() - theirs.ln()).abs() <= d,
    }
}

#[test]
#[ignore = "needs python3 with statsmodels and SciPy (scripts/setup.sh); run by `cargo xtask test`"]
fn p_values_match_scipy_statsmodels_and_enumeration() {
    let cases: Vec<Case> =
        [fisher_cases(), poisson_cases(), stratified_cases(), large_cases()].into_iter().flatten().collect();
    let answers = ask_oracle(&cases);
    let mut wrong = Vec::new();
    for (case, answer) in cases.iter().zip(&answers) {
        let ours = case.judge();
        for (oracle, tolerance) in &case.want {
            let theirs =
                answer[oracle].as_f64().unwrap_or_else(|| panic!("{}: no {oracle} in {answer}", case.name));
            let line = format!("{}: judge {ours:e}, {oracle} {theirs:e} ({tolerance:?})", case.name);
            eprintln!("{line}");
            if !within(ours, theirs, *tolerance) {
                wrong.push(line);
            }
        }
    }
    assert!(wrong.is_empty(), "p-values that differ from the oracle:\n  {}", wrong.join("\n  "));
}

/// One stratum's runs at the given seconds, as cumulative buckets over the
/// exporter's bounds (10 ms x 1.25^k).
fn run_buckets(times: &[f64]) -> Cumulative {
    let mut c = Cumulative { total: times.len() as f64, ..Default::default() };
    for k in 0..=48 {
        let b = 0.01 * 1.25f64.powi(k);
        c.at_or_below.insert(Bound(b), times.iter().filter(|t| **t <= b).count() as f64);
    }
    c
}

fn side_json(c: &Cumulative) -> Value {
    json!({
        "le": c.at_or_below.keys().map(|b| b.0).collect::<Vec<_>>(),
        "cumulative": c.at_or_below.values().collect::<Vec<_>>(),
        "total": c.total,
    })
}

/// Deterministic log-normal run times around `median` (sigma 0.6, from a
/// fixed sequence through Box-Muller), for the cases below.
fn spread(n: usize, median: f64, seed: u64) -> Vec<f64> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut uniform = move || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| {
            let z = (-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
            median * (0.6 * z).exp()
        })
        .collect()
}

#[test]
#[ignore = "needs python3 (SciPy where installed); run by `cargo xtask test`"]
fn run_p99_and_limit_share_p_values_match_the_oracle() {
    type Strata = Vec<(&'static str, &'static str, Vec<f64>, Vec<f64>)>;
    let p99_cases: Vec<(&str, Strata)> = vec![
        ("3x slower, one node", vec![("a", "z3", spread(30, 0.3, 1), spread(30, 0.1, 2))]),
        ("equal, 2,000 runs a side", vec![("a", "z3", spread(2000, 0.1, 3), spread(2000, 0.1, 4))]),
        ("1.5x slower, 5,000 runs a side", vec![("a", "z3", spread(5000, 0.15, 16), spread(5000, 0.1, 17))]),
        (
            "two nodes and two solvers, one slower on one node",
            vec![
                ("a", "z3", spread(120, 0.2, 5), spread(300, 0.1, 6)),
                ("b", "z3", spread(80, 0.1, 7), spread(200, 0.1, 8)),
                ("a", "cvc5", spread(50, 1.0, 9), spread(90, 1.0, 10)),
                ("b", "cvc5", spread(40, 1.0, 11), spread(0, 1.0, 12)),
            ],
        ),
        ("exactly 1.25x", vec![("a", "z3", spread(400, 0.125, 13), spread(400, 0.1, 13))]),
        ("too few runs for ten", vec![("a", "z3", spread(4, 0.5, 14), spread(3, 0.1, 15))]),
    ];
    let limit_cases: Vec<(&str, Vec<[f64; 4]>)> = vec![
        ("8 of 30 timed out against 1 of 30", vec![[8.0, 30.0, 1.0, 30.0]]),
        (
            "two nodes and two solvers",
            vec![[3.0, 40.0, 2.0, 90.0], [5.0, 20.0, 1.0, 60.0], [0.0, 9.0, 4.0, 30.0]],
        ),
    ];
    let mut input = Vec::new();
    let mut ours = Vec::new();
    for (_, strata) in &p99_cases {
        let (mut canary, mut baseline) = (BTreeMap::new(), BTreeMap::new());
        let mut oracle = Vec::new();
        for (node, exe, c, b) in strata {
            let key = (node.to_string(), exe.to_string());
            let (c, b) = (run_buckets(c), run_buckets(b));
            oracle.push(json!({"executable": exe, "canary": side_json(&c), "baseline": side_json(&b)}));
            canary.insert(key.clone(), c);
            baseline.insert(key, b);
        }
        input.push(json!({"kind": "p99", "strata": oracle}));
        let (tail, thresholds) = slow_runs(&canary, &baseline);
        let counts: Vec<Counts> =
            tail.values().map(|[ce, cx, be, bx]| counts(&[*ce, *cx, *be, *bx])).collect();
        ours.push((fisher_greater_stratified(&counts).p_value, Some(thresholds)));
    }
    for (_, strata) in &limit_cases {
        input.push(json!({"kind": "limits", "strata": strata}));
        let counts: Vec<Counts> = strata.iter().map(counts).collect();
        ours.push((fisher_greater_stratified(&counts).p_value, None));
    }
    let input = Value::Array(input);
    let answers = oracle_answers("tests/judge/runs_oracle.py", &input, false);
    // Without SciPy the oracle enumerates with exact rationals: both agree.
    let exact = oracle_answers("tests/judge/runs_oracle.py", &input, true);
    let names = p99_cases.iter().map(|(n, _)| *n).chain(limit_cases.iter().map(|(n, _)| *n));
    let mut wrong = Vec::new();
    for (((name, (p, thresholds)), answer), exact) in names.zip(ours).zip(&answers).zip(&exact) {
        let enumerated = exact["p_value"].as_f64().expect("a p-value");
        if exact["method"] != "exact" || !within(p, enumerated, Tolerance::Relative(EXACT)) {
            wrong.push(format!("{name}: judge {p:e}, enumeration {enumerated:e} ({})", exact["method"]));
        }
        let theirs = answer["p_value"].as_f64().expect("a p-value");
        eprintln!("{name}: judge {p:e}, oracle ({}) {theirs:e}", answer["method"]);
        if !within(p, theirs, Tolerance::Relative(EXACT)) {
            wrong.push(format!("{name}: judge {p:e}, oracle {theirs:e}"));
        }
        for (exe, t) in thresholds.iter().flatten() {
            let theirs = answer["bounds"][exe].as_f64();
            if theirs.is_none_or(|x| (x / t - 1.0).abs() > 1e-9) {
                wrong.push(format!("{name}: {exe}'s bound: judge {t}, oracle {theirs:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "run signals that differ from the oracle:\n  {}", wrong.join("\n  "));
    // The cases test what they say: the slower canary's p is small, the
    // one at exactly the tolerance is not.
    let p = |i: usize| answers[i]["p_value"].as_f64().expect("p");
    assert!(p(2) < 1e-3 && p(4) > 0.01, "{answers:?}");
}

/// A reference script's answers to `input` (a JSON list of cases); with
/// `exact`, by enumeration with exact rationals rather than SciPy.
fn oracle_answers(script: &str, input: &Value, exact: bool) -> Vec<Value> {
    let env = [("CANARYSCOPE_ORACLE_EXACT", if exact { "1" } else { "0" })];
    let answers = run_oracle(script, input, &env);
    answers.as_array().cloned().expect("the oracle answers a list")
}
