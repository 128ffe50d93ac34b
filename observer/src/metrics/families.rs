//! Building Prometheus metric families from snapshots (kernel aggregates are
//! already counters and histograms: they are rendered, not re-observed).
use prometheus::proto::{Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType};

pub struct Family {
    inner: MetricFamily,
}

fn label_pairs(names: &[&str], values: &[&str]) -> Vec<LabelPair> {
    names
        .iter()
        .zip(values)
        .map(|(n, v)| {
            let mut p = LabelPair::default();
            p.set_name((*n).to_string());
            p.set_value((*v).to_string());
            p
        })
        .collect()
}

impl Family {
    pub fn new(name: &str, help: &str, kind: MetricType) -> Self {
        let mut inner = MetricFamily::default();
        inner.set_name(format!("canaryscope_{name}"));
        inner.set_help(help.to_string());
        inner.set_field_type(kind);
        Self { inner }
    }

    pub fn counter(&mut self, names: &[&str], values: &[&str], value: f64) {
        let mut c = Counter::default();
        c.set_value(value);
        let mut m = Metric::from_label(label_pairs(names, values));
        m.set_counter(c);
        self.inner.mut_metric().push(m);
    }

    pub fn gauge(&mut self, names: &[&str], values: &[&str], value: f64) {
        let mut g = Gauge::default();
        g.set_value(value);
        let mut m = Metric::from_label(label_pairs(names, values));
        m.set_gauge(g);
        self.inner.mut_metric().push(m);
    }

    /// `buckets` are per-bucket (not cumulative) counts with their upper bounds.
    pub fn histogram(&mut self, names: &[&str], values: &[&str], buckets: &[(f64, u64)], sum: f64) {
        let mut cumulative = 0;
        let mut out = Vec::with_capacity(buckets.len());
        for (le, count) in buckets {
            cumulative += count;
            let mut b = Bucket::default();
            b.set_upper_bound(*le);
            b.set_cumulative_count(cumulative);
            out.push(b);
        }
        let mut h = Histogram::default();
        h.set_bucket(out);
        h.set_sample_count(cumulative);
        h.set_sample_sum(sum);
        let mut m = Metric::from_label(label_pairs(names, values));
        m.set_histogram(h);
        self.inner.mut_metric().push(m);
    }

    pub fn finish(self) -> MetricFamily {
        self.inner
    }
}
