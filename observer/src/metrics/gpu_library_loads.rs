//! GPU libraries that failed to load, per pod: `library` is the file a
//! process asked `dlopen` for, `missing` the dependency its loader could not
//! find (base names both). Label values come from the workload's files, so
//! each pod keeps at most [`MAX_PAIRS`] of them; a pair past that counts
//! under `other` and is named once in the log.
use super::decl::{decl, Kind::Counter, MetricDecl, Scope::Workload};
use std::collections::{BTreeSet, HashMap};

use super::{
    context::{workload_values, Render},
    families::FamilySet,
    series::{OnNode, PodCounts},
};
use crate::attribution::labels::WorkloadLabels;

pub const GPU_LIBRARY_LOAD_FAILURES: MetricDecl = decl(
    "gpu_library_load_failures_total",
    "dlopen or dlmopen calls that failed for a GPU library or a library that needs one (ONNX Runtime's CUDA provider without its cuBLAS, a CuPy module without its wheel), per pod: library is the file asked for, missing the dependency the process's loader could not find (base names; unknown when every file was found), other past the per-pod cap. Counted as a GPU start-up failure.",
    Counter,
    Workload,
    &["library", "missing"],
);

/// Distinct (library, missing) pairs a pod keeps as labels.
pub const MAX_PAIRS: usize = 16;
/// The label value of both past the cap.
const OTHER: &str = "other";

#[derive(Default)]
pub struct GpuLibraryLoads {
    failures: PodCounts<(String, String)>,
    /// Pairs labelled per cgroup, for the cap.
    pairs: HashMap<u64, BTreeSet<(String, String)>>,
}

impl GpuLibraryLoads {
    pub fn failed(&mut self, cgroup: u64, library: &str, missing: &str) {
        let pair = (library.to_string(), missing.to_string());
        let pairs = self.pairs.entry(cgroup).or_default();
        let pair = if pairs.contains(&pair) || pairs.len() < MAX_PAIRS {
            pairs.insert(pair.clone());
            pair
        } else {
            log::warn!(
                "cgroup {cgroup}: more than {MAX_PAIRS} failed GPU library loads by name; {library} missing \
                 {missing} counts as library=\"{OTHER}\", missing=\"{OTHER}\""
            );
            (OTHER.to_string(), OTHER.to_string())
        };
        self.failures.add(cgroup, pair, 1);
    }

    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels) {
        self.failures.retire(cgroup, labels);
        self.pairs.remove(&cgroup);
    }

    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.failures.keep_pods(on_node);
    }

    pub fn render(&self, fams: &mut FamilySet, r: &Render) {
        for ((labels, (library, missing)), n) in self.failures.shown(r.series) {
            let values = workload_values(labels, &[library, missing]);
            fams.get(&GPU_LIBRARY_LOAD_FAILURES).value(&values, n as f64);
        }
    }
}
