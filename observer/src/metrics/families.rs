//! Building Prometheus metric families from snapshots (kernel aggregates are
//! already counters and histograms: they are rendered, not re-observed).
//! Name, help, type and label names come from the family's declaration in
//! `catalog`; call sites supply only label values and numbers.
use observer_common::LatencyHistogram;
use prometheus::proto::{Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType};

use super::decl::{Kind, MetricDecl, View, PREFIX};

/// The kernel's log2 buckets exported as Prometheus buckets, a fixed set
/// (a set that changed between scrapes would break `rate()` and
/// `histogram_quantile`): upper bounds of 4.1 and 16.4 µs, then every
/// doubling from 65.5 µs to 268 ms, where run-queue waits and GPU calls
/// are compared canary against stable with a p99 ratio of 1.25, then every
/// fourfold up to 68.7 s for stalls. Nineteen buckets and `+Inf`, where all
/// 32 of the kernel's would make 33.
pub const EXPORTED_BUCKETS: [usize; 19] =
    [1, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 21, 23, 25];

pub struct Family {
    decl: &'static MetricDecl,
    view: View,
    inner: MetricFamily,
}

impl Family {
    pub fn new(decl: &'static MetricDecl, view: View) -> Self {
        let mut inner = MetricFamily::default();
        inner.set_name(format!("{PREFIX}{}", decl.name));
        inner.set_help(decl.help.to_string());
        inner.set_field_type(match decl.kind {
            Kind::Counter => MetricType::COUNTER,
            Kind::Gauge => MetricType::GAUGE,
            Kind::Histogram => MetricType::HISTOGRAM,
        });
        Self { decl, view, inner }
    }

    /// One series; `values` follow the declaration's label names.
    fn metric(&self, values: &[&str]) -> Metric {
        // A mismatch is a bug at the call site; the catalog tests render
        // every family and compare its label names with the declaration.
        debug_assert_eq!(values.len(), self.decl.label_names_in(self.view).count(), "{}", self.decl.name);
        let pairs = self
            .decl
            .label_names_in(self.view)
            .zip(values)
            .map(|(n, v)| {
                let mut p = LabelPair::default();
                p.set_name(n.to_string());
                p.set_value((*v).to_string());
                p
            })
            .collect();
        Metric::from_label(pairs)
    }

    /// A counter or gauge sample, whichever the declaration says.
    pub fn value(&mut self, values: &[&str], value: f64) {
        let mut m = self.metric(values);
        match self.decl.kind {
            Kind::Counter => {
                let mut c = Counter::default();
                c.set_value(value);
                m.set_counter(c);
            }
            Kind::Gauge => {
                let mut g = Gauge::default();
                g.set_value(value);
                m.set_gauge(g);
            }
            // Dropped rather than exported as garbage; tests catch the missing family.
            Kind::Histogram => {
                debug_assert!(false, "{} is a histogram", self.decl.name);
                return;
            }
        }
        self.inner.mut_metric().push(m);
    }

    /// The family with every series added (the label fuzzer encodes it whole).
    pub fn finish(self) -> MetricFamily {
        self.inner
    }

    /// A kernel latency histogram in its log2 buckets, with the total of the
    /// observed durations in nanoseconds as the sum.
    pub fn latency(&mut self, values: &[&str], h: &LatencyHistogram) {
        if self.decl.kind != Kind::Histogram {
            debug_assert!(false, "{} is not a histogram", self.decl.name);
            return;
        }
        // The kernel keeps per-bucket counts; Prometheus wants them
        // cumulative. The count is the last cumulative bucket, so `_count`
        // always equals the `+Inf` bucket.
        let mut cumulative = 0;
        let mut out = Vec::with_capacity(EXPORTED_BUCKETS.len());
        let mut next = EXPORTED_BUCKETS.iter().peekable();
        for (i, count) in h.buckets.iter().enumerate() {
            cumulative += count;
            if next.next_if_eq(&&i).is_some() {
                let mut b = Bucket::default();
                b.set_upper_bound(observer_common::bucket_upper_seconds(i));
                b.set_cumulative_count(cumulative);
                out.push(b);
            }
        }
        let mut hist = Histogram::default();
        hist.set_bucket(out);
        hist.set_sample_count(cumulative);
        hist.set_sample_sum(h.total_ns as f64 * 1e-9);
        let mut m = self.metric(values);
        m.set_histogram(hist);
        self.inner.mut_metric().push(m);
    }
}

impl Family {
    /// A histogram with bounds of its own: `cumulative` counts per bound
    /// (as Prometheus wants them), `count` for `+Inf`, `sum` in seconds.
    pub fn histogram(&mut self, values: &[&str], bounds: &[f64], cumulative: &[u64], count: u64, sum: f64) {
        if self.decl.kind != Kind::Histogram {
            debug_assert!(false, "{} is not a histogram", self.decl.name);
            return;
        }
        let buckets = bounds
            .iter()
            .zip(cumulative)
            .map(|(bound, n)| {
                let mut b = Bucket::default();
                b.set_upper_bound(*bound);
                b.set_cumulative_count(*n);
                b
            })
            .collect();
        let mut hist = Histogram::default();
        hist.set_bucket(buckets);
        hist.set_sample_count(count);
        hist.set_sample_sum(sum);
        let mut m = self.metric(values);
        m.set_histogram(hist);
        self.inner.mut_metric().push(m);
    }
}

/// Where a render's families go, in catalog order: a family, and whether
/// it is the family's first part (its header is written) or a continuation
/// of the part before (its samples only).
pub type Sink<'a> = dyn FnMut(MetricFamily, bool) + 'a;

/// One `Family` per declaration, handed to a sink in catalog order as the
/// render goes: a family is passed on in parts of at most `chunk` series,
/// so a render holds a few hundred series as protos, never the whole
/// exposition (at a thousand pods one family is tens of thousands of
/// series, megabytes as protos). Families are written one after another in
/// catalog order; writing to a family after a later one has been passed on
/// is a bug, which the catalog-order test finds.
pub struct FamilySet<'a> {
    view: View,
    fams: Vec<Family>,
    /// Whether each family's first part has been passed on.
    started: Vec<bool>,
    chunk: usize,
    sink: &'a mut Sink<'a>,
}

impl<'a> FamilySet<'a> {
    /// `catalog`: every family in exposition order (the crate's is
    /// `catalog::CATALOG`; passed in, so that the families' own files can
    /// build on this one).
    pub fn new(catalog: &[&'static MetricDecl], view: View, chunk: usize, sink: &'a mut Sink<'a>) -> Self {
        let fams: Vec<Family> = catalog.iter().map(|d| Family::new(d, view)).collect();
        let started = vec![false; fams.len()];
        Self { view, fams, started, chunk: chunk.max(1), sink }
    }

    pub fn get(&mut self, decl: &'static MetricDecl) -> &mut Family {
        // By name: a `const` has no single address, and names are unique
        // (catalog test). A declaration missing from the catalog still renders,
        // last, which the test comparing rendered families with CATALOG
        // reports.
        let i = match self.fams.iter().position(|f| f.decl.name == decl.name) {
            Some(i) => i,
            None => {
                self.fams.push(Family::new(decl, self.view));
                self.started.push(false);
                self.fams.len() - 1
            }
        };
        if self.fams[i].inner.get_metric().len() >= self.chunk {
            self.pass_on_through(i);
        }
        &mut self.fams[i]
    }

    /// Passes on every series held of families up to and including `i`.
    fn pass_on_through(&mut self, i: usize) {
        for j in 0..=i {
            if self.fams[j].inner.get_metric().is_empty() {
                continue;
            }
            let mut part = self.fams[j].inner.clone_header();
            part.set_metric(self.fams[j].inner.take_metric());
            (self.sink)(part, !self.started[j]);
            self.started[j] = true;
        }
    }

    /// Passes on what is left. Families with no series are still valid
    /// exposition; they are left out to keep the output short.
    pub fn finish(mut self) {
        if !self.fams.is_empty() {
            self.pass_on_through(self.fams.len() - 1);
        }
    }
}

/// Collects a render's parts back into whole families (tests and tools).
pub fn collect_into(out: &mut Vec<MetricFamily>) -> impl FnMut(MetricFamily, bool) + '_ {
    move |mut part: MetricFamily, first: bool| match out.last_mut() {
        Some(last) if !first => last.mut_metric().extend(part.take_metric()),
        _ => out.push(part),
    }
}

/// A family's name, help and type, without its series.
trait CloneHeader {
    fn clone_header(&self) -> MetricFamily;
}

impl CloneHeader for MetricFamily {
    fn clone_header(&self) -> MetricFamily {
        let mut f = MetricFamily::default();
        f.set_name(self.name().to_string());
        f.set_help(self.help().to_string());
        f.set_field_type(self.get_field_type());
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::decl::Scope;

    const X: MetricDecl = MetricDecl {
        name: "x_seconds",
        help: "x",
        kind: Kind::Histogram,
        scope: Scope::Node,
        extra: &["pod"],
        per_pod_extra: None,
    };

    #[test]
    fn kernel_latency_buckets_become_a_cumulative_histogram() {
        let mut f = Family::new(&X, View::Scrape);
        let mut h = LatencyHistogram { count: 3, total_ns: 3_000_000_000, ..Default::default() };
        h.buckets[..3].copy_from_slice(&[1, 0, 2]);
        f.latency(&["p"], &h);
        let family = f.inner;
        let h = family.get_metric()[0].get_histogram();
        let cumulative: Vec<u64> = h.get_bucket().iter().map(|b| b.cumulative_count()).collect();
        // Kernel buckets 0 and 1 fall under the first exported bound (1),
        // bucket 2 under the second (3).
        assert_eq!(cumulative[..2], [1, 3]);
        assert!(cumulative[2..].iter().all(|c| *c == 3), "{cumulative:?}");
        let bounds: Vec<f64> = h.get_bucket().iter().map(|b| b.upper_bound()).collect();
        assert_eq!(bounds.len(), EXPORTED_BUCKETS.len());
        // The kernel's last bucket also holds everything longer: only +Inf
        // may stand for it.
        assert!(EXPORTED_BUCKETS[18] < observer_common::LATENCY_BUCKETS - 1);
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds rise: {bounds:?}");
        assert!(
            (bounds[0] - 4.096e-6).abs() < 1e-12 && (bounds[18] - 68.719_476_736).abs() < 1e-6,
            "{bounds:?}"
        );
        assert_eq!(h.get_sample_count(), 3);
        assert!((h.get_sample_sum() - 3.0).abs() < 1e-9);
    }
}
