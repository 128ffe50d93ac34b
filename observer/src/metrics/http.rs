//! The HTTP family's series: pods' servers' requests per revision (a
//! latency histogram per status class, named after OpenTelemetry's
//! `http.server.request.duration`), kubelet's probes apart, connections not
//! parsed, and per pod the failures a person chasing one pod needs.
//!
//! Series exist only for revisions that served traffic: nothing is
//! rendered for a class or a protocol never seen.
use std::collections::HashSet;

use super::{
    context::{workload_values, Render},
    decl::{
        decl,
        Kind::{Counter, Histogram},
        MetricDecl,
        Scope::{Node, Revision, Workload},
    },
    families::FamilySet,
    revision::{add_count, owner_labels, revision_key, ByRevision, Durations, RevisionKey},
    series::{OnNode, PodCounts},
};
use crate::attribution::labels::WorkloadLabels;

pub const HTTP_SERVER_REQUEST_DURATION: MetricDecl = decl(
    "http_server_request_duration_seconds",
    "Server-side HTTP/1.x requests of the revision's pods on this node, from the request's first byte in to the response's last byte out, by status class (1xx-5xx, closed: the connection ended before the response did); kubelet's probes are not counted here.",
    Histogram,
    Revision,
    &["status_class"],
);
pub const HTTP_SERVER_PROBE_REQUESTS: MetricDecl = decl(
    "http_server_probe_requests_total",
    "kubelet's HTTP probes (User-Agent: kube-probe/) the revision's pods answered on this node, by status class.",
    Counter,
    Revision,
    &["status_class"],
);
pub const HTTP_SERVER_UNPARSED_CONNECTIONS: MetricDecl = decl(
    "http_server_unparsed_connections_total",
    "Connections the revision's pods served in a protocol not parsed (h2: HTTP/2 with prior knowledge, tls); their requests are in no other series.",
    Counter,
    Revision,
    &["protocol"],
);
pub const HTTP_SERVER_FAILED_REQUESTS: MetricDecl = decl(
    "http_server_failed_requests_total",
    "The pod's HTTP requests answered 5xx, or whose connection ended before the response did (closed), kubelet's probes not counted.",
    Counter,
    Workload,
    &["status_class"],
);
pub const NODE_HTTP_SEGMENTS_LOST: MetricDecl = decl(
    "node_http_segments_lost_total",
    "TCP segments of pods the kernel had no ring-buffer room for: requests on those connections may be missed until their next request.",
    Counter,
    Node,
    &[],
);

/// Upper bounds in seconds: 1, 2.5 and 5 ms, then every factor 1.25 from
/// 10 ms to 10.1 s, so that a p99 1.25 times another's is a bucket apart
/// wherever the runbooks compare them. Fixed: `rate()` and
/// `histogram_quantile` need the same set at every scrape.
pub fn bounds() -> &'static [f64] {
    static BOUNDS: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    BOUNDS.get_or_init(|| {
        let mut b = vec![0.001, 0.0025, 0.005];
        b.extend((0..32).map(|k| 0.01 * 1.25f64.powi(k)));
        b
    })
}

#[derive(Default)]
pub struct Http {
    durations: ByRevision<&'static str, Durations>,
    probes: ByRevision<&'static str, u64>,
    unparsed: ByRevision<&'static str, u64>,
    failed: PodCounts<&'static str>,
    /// Segments the kernel had no room for (set by the daemon loop).
    pub segments_lost: u64,
}

impl Http {
    pub fn request(&mut self, cgroup: u64, class: &'static str, duration_ns: u64, probe: bool) {
        if probe {
            *self.probes.entry(cgroup, class) += 1;
            return;
        }
        self.durations.entry(cgroup, class).record(bounds(), duration_ns);
        if class == "5xx" || class == "closed" {
            self.failed.add(cgroup, class, 1);
        }
    }

    pub fn unparsed(&mut self, cgroup: u64, protocol: &'static str) {
        *self.unparsed.entry(cgroup, protocol) += 1;
    }

    pub fn retire(&mut self, cgroup: u64, labels: &WorkloadLabels) {
        let revision = revision_key(labels);
        self.durations.retire(cgroup, &revision, Durations::add);
        self.probes.retire(cgroup, &revision, add_count);
        self.unparsed.retire(cgroup, &revision, add_count);
        self.failed.retire(cgroup, labels);
    }

    pub fn keep_pods(&mut self, on_node: &OnNode) {
        self.failed.keep_pods(on_node);
    }

    /// Forgets what purged pods left to revisions no longer on the node.
    pub fn keep_revisions(&mut self, live: &HashSet<RevisionKey>) {
        self.durations.keep_revisions(live);
        self.probes.keep_revisions(live);
        self.unparsed.keep_revisions(live);
    }

    pub fn render(&self, fams: &mut FamilySet, r: &Render) {
        let bounds = bounds();
        for ((owner, class), d) in self.durations.shown(r, Durations::add) {
            let (cumulative, count, sum) = d.cumulative(bounds);
            let v = owner_labels(&owner, r.view, &[class]);
            fams.get(&HTTP_SERVER_REQUEST_DURATION).histogram(&v, bounds, &cumulative, count, sum);
        }
        for ((owner, class), n) in self.probes.shown(r, add_count) {
            fams.get(&HTTP_SERVER_PROBE_REQUESTS).value(&owner_labels(&owner, r.view, &[class]), n as f64);
        }
        for ((owner, protocol), n) in self.unparsed.shown(r, add_count) {
            let v = owner_labels(&owner, r.view, &[protocol]);
            fams.get(&HTTP_SERVER_UNPARSED_CONNECTIONS).value(&v, n as f64);
        }
        for ((labels, class), n) in self.failed.shown(r.series) {
            fams.get(&HTTP_SERVER_FAILED_REQUESTS).value(&workload_values(labels, &[class]), n as f64);
        }
        fams.get(&NODE_HTTP_SEGMENTS_LOST).value(&[], self.segments_lost as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_p99_a_quarter_higher_is_a_bucket_higher_from_10ms_to_10s() {
        let b = bounds();
        assert!(b.windows(2).all(|w| w[0] < w[1]));
        let from = b.iter().position(|x| (*x - 0.01).abs() < 1e-12).expect("10 ms is a bound");
        for w in b[from..].windows(2) {
            assert!((w[1] / w[0] - 1.25).abs() < 1e-9, "{w:?}");
        }
        assert!(*b.last().expect("bounds") >= 10.0);
    }

    #[test]
    fn durations_land_in_their_bucket_and_add_up() {
        let mut d = Durations::default();
        d.record(bounds(), 12_000_000);
        d.record(bounds(), 12_500_000);
        d.record(bounds(), 20_000_000_000);
        let (cumulative, count, sum) = d.cumulative(bounds());
        let i = bounds().iter().position(|b| *b >= 0.0125).expect("a bound");
        assert_eq!(cumulative[i], 2, "12 and 12.5 ms at or under 12.5 ms");
        assert_eq!(cumulative[i - 1], 0);
        assert_eq!(*cumulative.last().expect("buckets"), 2, "20 s is past the last bound");
        assert_eq!(count, 3, "and in the count (+Inf)");
        assert!((sum - 20.0245).abs() < 1e-9);
    }
}
