//! The shipped Grafana dashboard's panel queries, as a person choosing a
//! namespace and workload would run them, and what a panel shows.
use serde_json::Value;

use crate::k8s::repo;

/// The dashboard as shipped.
pub fn dashboard() -> Value {
    let path = repo().join("deploy/grafana/canaryscope.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("dashboard JSON")
}

/// Every target of every panel, as (panel title, PromQL) with Grafana's
/// variables filled in (`.*` is Grafana's "All").
pub fn panel_queries(board: &Value, namespace: &str, workload: &str) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    let panels = board["panels"].as_array().expect("panels");
    for p in panels.iter().filter(|p| p["type"] != "row") {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a PromQL target");
            let filled = expr
                .replace("$namespace", namespace)
                .replace("$workload", workload)
                .replace("$__rate_interval", "2m");
            queries.push((p["title"].as_str().unwrap_or("").to_string(), filled));
        }
    }
    queries
}

/// Whether a query's answer holds a series with a positive value for which
/// `pick` holds.
pub fn shows(answer: &Value, pick: impl Fn(&Value) -> bool) -> bool {
    answer["data"]["result"].as_array().is_some_and(|r| {
        r.iter().any(|s| {
            let v: f64 = s["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            pick(s) && v > 0.0
        })
    })
}
