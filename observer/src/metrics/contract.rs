//! The metric contract as data for `deploy/`: every family's name, type and
//! labels, taken from the catalog. `deploy/metric-contract.json` is this
//! output; deploy/tools/queries.py checks rules, alerts, analysis
//! templates and test series against it, and a unit test keeps the file
//! equal to the code.
use serde_json::{json, Map, Value};

use observer_common::gpu::Api;

use super::catalog::{
    Kind, View, CATALOG, GPU_API_CALLS, GPU_API_CALL_FAILURES, GPU_API_STALLED_CALLS, PREFIX,
};
use crate::attribution::label_names::{LABEL_NAMES, REVISION_LABEL_NAMES};

/// Families with a series per GPU function, whose hot-tier series exist only
/// for selected processes.
const PER_FUNCTION_FAMILIES: [&str; 3] =
    [GPU_API_CALLS.name, GPU_API_CALL_FAILURES.name, GPU_API_STALLED_CALLS.name];

/// The contract as pretty JSON, one family per key, in catalog order.
pub fn contract_json() -> String {
    let mut families = Map::new();
    for decl in CATALOG {
        let kind = match decl.kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        families.insert(
            decl.name.to_string(),
            json!({ "type": kind, "labels": decl.extra, "owner_labels": decl.owner_label_names(View::Scrape) }),
        );
    }
    // Which GPU functions every process has probed (cold) and which only
    // selected ones (hot): a canary-vs-stable comparison may only use the
    // cold ones, since stable processes are not selected.
    let mut tiers: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for api in Api::ALL {
        for f in api.functions() {
            tiers.entry(f.tier.as_str()).or_default().push(f.name);
        }
    }
    let contract = json!({
        "note": "Generated from observer/src/metrics/catalog.rs; regenerate with \
                 CANARYSCOPE_WRITE_CONTRACT=1 cargo test -p observer --lib metric_contract",
        "prefix": PREFIX,
        "workload_labels": LABEL_NAMES,
        "revision_labels": REVISION_LABEL_NAMES,
        "families": Value::Object(families),
        "per_function_families": PER_FUNCTION_FAMILIES,
        "gpu_function_tiers": tiers,
    });
    let mut text = serde_json::to_string_pretty(&contract).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn metric_contract_file_matches_the_catalog() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/metric-contract.json");
        let want = contract_json();
        if std::env::var_os("CANARYSCOPE_WRITE_CONTRACT").is_some() {
            std::fs::write(&file, &want).expect("write deploy/metric-contract.json");
        }
        let have = std::fs::read_to_string(&file).unwrap_or_default();
        assert!(
            have == want,
            "deploy/metric-contract.json differs from the catalog: regenerate it with \
             CANARYSCOPE_WRITE_CONTRACT=1 cargo test -p observer --lib metric_contract"
        );
    }
}
