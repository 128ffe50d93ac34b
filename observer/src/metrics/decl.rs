//! What a metric family is: name, help, type, owner and label names.
//! Each family's file declares its own (`gpu_calls.rs` beside the state it
//! renders), and `catalog` lists them all once, in exposition order.
use crate::attribution::label_names::{LABEL_NAMES, REVISION_LABEL_NAMES};

/// What Prometheus is told the family is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Who a family's series belong to, which decides the leading labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A workload (cgroup): `LABEL_NAMES` come first, then the extras.
    Workload,
    /// A revision of a workload on this node: `REVISION_LABEL_NAMES` first.
    /// Its pods share the series, and pods that are gone keep adding to it
    /// while the revision has pods here. The per-pod view (`top`'s source)
    /// renders such a family per pod, with `LABEL_NAMES`.
    Revision,
    /// The node (or the daemon itself): only the extras.
    Node,
}

/// Which exposition is rendered: what Prometheus scrapes, within the
/// series budget, or every family per pod, for `top` and people.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Scrape,
    PerPod,
}

/// One family, as exported.
#[derive(Debug, PartialEq)]
pub struct MetricDecl {
    /// Without the `canaryscope_` prefix.
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub scope: Scope,
    /// Labels after the workload ones (if any), in exposition order.
    pub extra: &'static [&'static str],
    /// For a revision's family, the extras of its per-pod rendering where
    /// they differ: a finer split than the budget allows Prometheus.
    pub per_pod_extra: Option<&'static [&'static str]>,
}

pub const PREFIX: &str = "canaryscope_";

impl MetricDecl {
    /// Label names in exposition order, as Prometheus scrapes them.
    pub fn label_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.label_names_in(View::Scrape)
    }

    /// Label names in exposition order in `view`.
    pub fn label_names_in(&self, view: View) -> impl Iterator<Item = &'static str> + '_ {
        self.owner_label_names(view).iter().chain(self.extra_in(view)).copied()
    }

    /// The labels after the owner's in `view`.
    pub fn extra_in(&self, view: View) -> &'static [&'static str] {
        match (view, self.per_pod_extra) {
            (View::PerPod, Some(extra)) => extra,
            _ => self.extra,
        }
    }

    /// The labels naming who a series belongs to, before the extras.
    pub fn owner_label_names(&self, view: View) -> &'static [&'static str] {
        match (self.scope, view) {
            (Scope::Workload, _) | (Scope::Revision, View::PerPod) => &LABEL_NAMES,
            (Scope::Revision, View::Scrape) => &REVISION_LABEL_NAMES,
            (Scope::Node, _) => &[],
        }
    }
}

pub const fn decl(
    name: &'static str,
    help: &'static str,
    kind: Kind,
    scope: Scope,
    extra: &'static [&'static str],
) -> MetricDecl {
    MetricDecl { name, help, kind, scope, extra, per_pod_extra: None }
}
