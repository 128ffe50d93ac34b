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

    /// A histogram in the kernel's log2 latency buckets, with the total of
    /// the observed durations in nanoseconds.
    pub fn latency(&mut self, names: &[&str], values: &[&str], buckets: &[u64], total_ns: u64) {
        let bounded: Vec<(f64, u64)> =
            buckets.iter().enumerate().map(|(i, c)| (observer_common::bucket_upper_seconds(i), *c)).collect();
        self.histogram(names, values, &bounded, total_ns as f64 * 1e-9);
    }

    pub fn finish(self) -> MetricFamily {
        self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_latency_buckets_become_a_cumulative_histogram() {
        let mut f = Family::new("x_seconds", "x", MetricType::HISTOGRAM);
        f.latency(&["pod"], &["p"], &[1, 0, 2], 3_000_000_000);
        let family = f.finish();
        let h = family.get_metric()[0].get_histogram();
        let cumulative: Vec<u64> = h.get_bucket().iter().map(|b| b.cumulative_count()).collect();
        assert_eq!(cumulative, vec![1, 1, 3]);
        let bounds: Vec<f64> = h.get_bucket().iter().map(|b| b.upper_bound()).collect();
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds rise: {bounds:?}");
        assert_eq!(h.get_sample_count(), 3);
        assert!((h.get_sample_sum() - 3.0).abs() < 1e-9);
    }
}
