//! What `top` shows: one row per pod (per cgroup without Kubernetes),
//! computed from two readings of the exposition. Counters of events that
//! end or fail something are shown as totals (a failure must not vanish a
//! second later); call volume as a rate; latencies as the p99 of the
//! calls observed between the two readings.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::metrics::catalog::{self, MetricDecl};
use crate::metrics::exposition::Sample;

/// One reading of the exposition and when it was taken.
pub struct Reading {
    pub samples: Vec<Sample>,
    pub at: std::time::Instant,
}

/// A pod's or cgroup's line.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Row {
    /// `namespace/pod`, the pod's uid without Kubernetes, else the cgroup path.
    pub name: String,
    pub namespace: String,
    pub workload: String,
    pub revision: String,
    pub track: String,
    /// GPU runtime calls per second between the two readings.
    pub gpu_calls_per_s: Option<f64>,
    /// GPU runtime calls that returned an error, since the daemon started.
    pub gpu_failures: u64,
    /// GPU calls in flight past the stall threshold now.
    pub gpu_stalls: u64,
    /// p99 of GPU call durations between the readings, in seconds.
    pub gpu_call_p99_s: Option<f64>,
    /// p99 of run-queue waits between the readings, in seconds.
    pub runq_p99_s: Option<f64>,
    /// Share of CFS periods throttled between the readings, in percent.
    pub throttled_pct: Option<f64>,
    pub oom_kills: u64,
    pub crashes: u64,
    pub abnormal_exits: u64,
    /// GPU libraries whose `dlopen` failed (the library or a GPU library it
    /// needs not found), since the probes started.
    pub gpu_library_load_failures: u64,
    /// Containers that requested a GPU and have made no successful GPU
    /// initialisation past `--gpu-init-timeout`, now (a daemon's, with
    /// Kubernetes: `top` on its own probes reads no pod specs).
    pub gpu_never_initialized: u64,
    /// VRAM the row's live processes hold now, over all GPUs; `None` when
    /// they never held any (or KFD is not there).
    pub vram_bytes: Option<u64>,
    /// HTTP requests its servers answered per second between the readings
    /// (kubelet's probes not counted); `None` without requests.
    pub http_per_s: Option<f64>,
    /// Of those, the share answered 5xx or closed under the request, in percent.
    pub http_failed_pct: Option<f64>,
    /// p99 of those requests' durations, in seconds.
    pub http_p99_s: Option<f64>,
}

impl Row {
    /// Trouble that needs a look: what sorts a row first by default.
    fn trouble(&self) -> u64 {
        self.gpu_failures
            + self.gpu_stalls
            + self.oom_kills
            + self.crashes
            + self.abnormal_exits
            + self.gpu_library_load_failures
            + self.gpu_never_initialized
    }

    /// Whether the row matches a filter by namespace or name (cgroup) prefix.
    pub fn matches(&self, filter: &str) -> bool {
        filter.is_empty() || self.namespace == filter || self.name.starts_with(filter)
    }
}

/// How rows are ordered; `s` in the view cycles through them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SortKey {
    /// Failures, stalls, OOM kills, crashes, abnormal exits, failed GPU
    /// library loads and GPUs never initialised together.
    #[default]
    Trouble,
    Name,
    Calls,
    Failures,
    P99,
    Runq,
    Throttled,
    Vram,
}

impl SortKey {
    pub const ALL: [SortKey; 8] = [
        SortKey::Trouble,
        SortKey::Name,
        SortKey::Calls,
        SortKey::Failures,
        SortKey::P99,
        SortKey::Runq,
        SortKey::Throttled,
        SortKey::Vram,
    ];

    pub fn next(self) -> Self {
        let i = Self::ALL.iter().position(|k| *k == self).unwrap_or(0);
        Self::ALL[(i + 1) % Self::ALL.len()]
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SortKey::Trouble => "trouble",
            SortKey::Name => "name",
            SortKey::Calls => "calls",
            SortKey::Failures => "failures",
            SortKey::P99 => "p99",
            SortKey::Runq => "runq",
            SortKey::Throttled => "throttled",
            SortKey::Vram => "vram",
        }
    }
}

/// Orders rows by `key`, largest first (names alphabetically), names
/// breaking ties so rows do not jump between refreshes.
pub fn sort(rows: &mut [Row], key: SortKey) {
    let opt = |v: Option<f64>| v.unwrap_or(-1.0);
    rows.sort_by(|a, b| {
        let by = match key {
            SortKey::Name => std::cmp::Ordering::Equal,
            SortKey::Trouble => b.trouble().cmp(&a.trouble()),
            SortKey::Failures => b.gpu_failures.cmp(&a.gpu_failures),
            SortKey::Calls => opt(b.gpu_calls_per_s).total_cmp(&opt(a.gpu_calls_per_s)),
            SortKey::P99 => opt(b.gpu_call_p99_s).total_cmp(&opt(a.gpu_call_p99_s)),
            SortKey::Runq => opt(b.runq_p99_s).total_cmp(&opt(a.runq_p99_s)),
            SortKey::Throttled => opt(b.throttled_pct).total_cmp(&opt(a.throttled_pct)),
            SortKey::Vram => b.vram_bytes.cmp(&a.vram_bytes),
        };
        by.then_with(|| a.name.cmp(&b.name))
    });
}

/// The family's full name, as exported.
fn full(decl: &MetricDecl) -> String {
    format!("{}{}", catalog::PREFIX, decl.name)
}

/// Per row: a family's sum, or its histogram's buckets.
#[derive(Default)]
struct Sums {
    labels: Row,
    calls: f64,
    failures: f64,
    /// Failed init calls, counted from events the moment they arrive (the
    /// call counters come from the kernel's maps, read once a second).
    init_failures: f64,
    stalls: f64,
    ooms: f64,
    crashes: f64,
    exits: f64,
    library_load_failures: f64,
    never_initialized: f64,
    periods: f64,
    throttled: f64,
    /// VRAM over the row's GPUs; `None` without a series.
    vram: Option<f64>,
    /// Cumulative bucket counts by upper bound, summed over the row's series.
    call_buckets: BTreeMap<u64, f64>,
    runq_buckets: BTreeMap<u64, f64>,
    /// HTTP requests (probes apart) and those failed, over status classes.
    http_requests: f64,
    http_failed: f64,
    http_buckets: BTreeMap<u64, f64>,
}

/// The row a workload series belongs to.
fn row_name(s: &Sample) -> String {
    let (ns, pod, workload) = (s.label("namespace"), s.label("pod"), s.label("workload"));
    match (ns, pod) {
        ("", "") if workload.is_empty() => "(unattributed)".to_string(),
        ("", "") => workload.to_string(),
        ("", pod) => pod.to_string(),
        (ns, pod) => format!("{ns}/{pod}"),
    }
}

/// A result label that means the call succeeded.
fn is_success(result: &str) -> bool {
    matches!(result, "hipSuccess" | "CUDA_SUCCESS" | "cudaSuccess" | "0")
}

impl Sums {
    /// Nothing counted yet for the row of `s`, named by its labels.
    fn of_row(s: &Sample) -> Self {
        let labels = Row {
            name: row_name(s),
            namespace: s.label("namespace").to_string(),
            workload: s.label("workload").to_string(),
            revision: s.label("revision").to_string(),
            track: s.label("track").to_string(),
            ..Row::default()
        };
        Self { labels, ..Self::default() }
    }
}

fn sums(samples: &[Sample]) -> BTreeMap<String, Sums> {
    let calls = full(&catalog::GPU_API_CALLS);
    let stalled = full(&catalog::GPU_API_STALLED_CALLS);
    let init = full(&catalog::GPU_INIT_FAILURES);
    let ooms = full(&catalog::OOM_KILLS);
    let crashes = full(&catalog::NATIVE_CRASHES);
    let exits = full(&catalog::ABNORMAL_EXITS);
    let library_loads = full(&catalog::GPU_LIBRARY_LOAD_FAILURES);
    let never_initialized = full(&catalog::GPU_NEVER_INITIALIZED);
    let periods = full(&catalog::CPU_PERIODS);
    let throttled = full(&catalog::CPU_THROTTLED_PERIODS);
    let vram = full(&catalog::GPU_VRAM);
    let call_buckets = format!("{}_bucket", full(&catalog::GPU_API_CALL_DURATION));
    let runq_buckets = format!("{}_bucket", full(&catalog::CPU_RUNQUEUE_LATENCY));
    let http_buckets = format!("{}_bucket", full(&catalog::HTTP_SERVER_REQUEST_DURATION));
    let http_count = format!("{}_count", full(&catalog::HTTP_SERVER_REQUEST_DURATION));
    let workload_families = [
        &calls,
        &init,
        &stalled,
        &ooms,
        &crashes,
        &exits,
        &library_loads,
        &never_initialized,
        &periods,
        &throttled,
        &vram,
        &call_buckets,
        &runq_buckets,
        &http_buckets,
        &http_count,
    ];
    let mut rows: BTreeMap<String, Sums> = BTreeMap::new();
    for s in samples {
        if !workload_families.contains(&&s.name) {
            continue;
        }
        let row = rows.entry(row_name(s)).or_insert_with(|| Sums::of_row(s));
        let v = s.value;
        let bucket = |map: &mut BTreeMap<u64, f64>| {
            let le: f64 = s.label("le").parse().unwrap_or(f64::INFINITY);
            *map.entry(le.to_bits()).or_default() += v;
        };
        match &s.name {
            n if *n == calls => {
                row.calls += v;
                if !is_success(s.label("result")) {
                    row.failures += v;
                }
            }
            n if *n == init => row.init_failures += v,
            n if *n == stalled => row.stalls += v,
            n if *n == ooms => row.ooms += v,
            n if *n == crashes => row.crashes += v,
            n if *n == exits => row.exits += v,
            n if *n == library_loads => row.library_load_failures += v,
            n if *n == never_initialized => row.never_initialized += v,
            n if *n == periods => row.periods += v,
            n if *n == throttled => row.throttled += v,
            n if *n == vram => *row.vram.get_or_insert(0.0) += v,
            n if *n == call_buckets => bucket(&mut row.call_buckets),
            n if *n == http_buckets => bucket(&mut row.http_buckets),
            n if *n == http_count => {
                row.http_requests += v;
                if matches!(s.label("status_class"), "5xx" | "closed") {
                    row.http_failed += v;
                }
            }
            _ => bucket(&mut row.runq_buckets),
        }
    }
    rows
}

/// The `q` quantile of the observations between two cumulative bucket
/// sets, interpolated inside its bucket as Prometheus'
/// `histogram_quantile` does; `None` without observations.
pub fn quantile(q: f64, now: &BTreeMap<u64, f64>, before: Option<&BTreeMap<u64, f64>>) -> Option<f64> {
    // Positive floats order as their bits do.
    let mut bounds: Vec<(f64, f64)> = now
        .iter()
        .map(|(le, n)| {
            // Cumulative: a bound the earlier reading lacks had the count
            // of the largest bound below it then.
            let prev = before.and_then(|b| b.range(..=*le).next_back()).map(|(_, n)| *n).unwrap_or(0.0);
            (f64::from_bits(*le), (n - prev).max(0.0))
        })
        .collect();
    bounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = bounds.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, cum) in bounds {
        if cum >= rank {
            if le.is_infinite() {
                // Beyond the last finite bound: that bound is all we know.
                return Some(lower);
            }
            let inside = cum - below;
            let frac = if inside > 0.0 { (rank - below) / inside } else { 1.0 };
            return Some(lower + (le - lower) * frac);
        }
        (lower, below) = (le, cum);
    }
    Some(lower)
}

/// Rows from the latest reading and, for rates and windows, the one before.
pub fn rows(now: &Reading, before: Option<&Reading>) -> Vec<Row> {
    let current = sums(&now.samples);
    let previous = before.map(|b| (sums(&b.samples), now.at.duration_since(b.at).as_secs_f64()));
    current
        .into_values()
        .map(|s| {
            let prev = previous.as_ref().map(|(p, dt)| (p.get(&s.labels.name), *dt));
            let mut row = s.labels.clone();
            // Init failures are failed calls too: the larger count is the
            // more recent one.
            row.gpu_failures = s.failures.max(s.init_failures) as u64;
            row.gpu_stalls = s.stalls as u64;
            row.oom_kills = s.ooms as u64;
            row.crashes = s.crashes as u64;
            row.abnormal_exits = s.exits as u64;
            row.gpu_library_load_failures = s.library_load_failures as u64;
            row.gpu_never_initialized = s.never_initialized as u64;
            row.vram_bytes = s.vram.map(|v| v as u64);
            if let Some((p, dt)) = prev {
                let zero = Sums::default();
                let p = p.unwrap_or(&zero);
                if dt > 0.0 {
                    row.gpu_calls_per_s = Some((s.calls - p.calls).max(0.0) / dt);
                }
                let periods = s.periods - p.periods;
                row.throttled_pct = (periods > 0.0).then(|| 100.0 * (s.throttled - p.throttled) / periods);
                row.gpu_call_p99_s = quantile(0.99, &s.call_buckets, Some(&p.call_buckets));
                row.runq_p99_s = quantile(0.99, &s.runq_buckets, Some(&p.runq_buckets));
                let requests = s.http_requests - p.http_requests;
                if requests > 0.0 && dt > 0.0 {
                    row.http_per_s = Some(requests / dt);
                    row.http_failed_pct = Some(100.0 * (s.http_failed - p.http_failed).max(0.0) / requests);
                    row.http_p99_s = quantile(0.99, &s.http_buckets, Some(&p.http_buckets));
                }
            }
            row
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::exposition::parse;

    fn reading(text: &str, at: std::time::Instant) -> Reading {
        Reading { samples: parse(text).expect("exposition"), at }
    }

    const POD: &str = "namespace=\"inference\",pod=\"w-1\",container=\"c\",workload=\"w\",revision=\"abc\",track=\"canary\"";

    #[test]
    fn http_columns_are_the_windows_rate_failed_share_and_p99() {
        let t0 = std::time::Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(2);
        let family = "canaryscope_http_server_request_duration_seconds";
        let text = |ok: u64, failed: u64, slow: u64| {
            format!(
                "{family}_bucket{{{POD},status_class=\"2xx\",le=\"0.01\"}} {ok}\n\
                 {family}_bucket{{{POD},status_class=\"2xx\",le=\"1\"}} {}\n\
                 {family}_bucket{{{POD},status_class=\"2xx\",le=\"+Inf\"}} {}\n\
                 {family}_count{{{POD},status_class=\"2xx\"}} {}\n\
                 {family}_bucket{{{POD},status_class=\"closed\",le=\"0.01\"}} {failed}\n\
                 {family}_bucket{{{POD},status_class=\"closed\",le=\"1\"}} {failed}\n\
                 {family}_bucket{{{POD},status_class=\"closed\",le=\"+Inf\"}} {failed}\n\
                 {family}_count{{{POD},status_class=\"closed\"}} {failed}\n",
                ok + slow,
                ok + slow,
                ok + slow
            )
        };
        let before = reading(&text(100, 0, 0), t0);
        // 180 fast and 20 slow answers, and 0 closed, then 2 closed.
        let now = reading(&text(280, 2, 20), t1);
        let windowed = rows(&now, Some(&before));
        let pod = windowed.iter().find(|r| r.name == "inference/w-1").expect("the pod's row");
        assert_eq!(pod.http_per_s, Some(101.0), "202 requests in 2 s");
        let failed = pod.http_failed_pct.expect("a share");
        assert!((failed - 100.0 * 2.0 / 202.0).abs() < 1e-9, "{failed}");
        let p99 = pod.http_p99_s.expect("a p99");
        assert!(p99 > 0.01 && p99 <= 1.0, "the slow tenth puts p99 in (0.01, 1]: {p99}");
        assert_eq!(rows(&now, None)[0].http_per_s, None, "no rate from one reading");
    }

    #[test]
    fn counters_are_totals_calls_a_rate_and_latency_the_window_p99() {
        let t0 = std::time::Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(2);
        let before = reading(
            &format!(
                "canaryscope_gpu_api_calls_total{{{POD},api=\"hip\",function=\"hipInit\",result=\"hipSuccess\"}} 10\n\
                 canaryscope_gpu_api_call_duration_seconds_bucket{{{POD},api=\"hip\",function=\"hipInit\",le=\"0.001\"}} 10\n\
                 canaryscope_gpu_api_call_duration_seconds_bucket{{{POD},api=\"hip\",function=\"hipInit\",le=\"+Inf\"}} 10\n\
                 canaryscope_cpu_periods_total{{{POD}}} 100\n\
                 canaryscope_cpu_throttled_periods_total{{{POD}}} 0\n"
            ),
            t0,
        );
        let now = reading(
            &format!(
                "canaryscope_gpu_api_calls_total{{{POD},api=\"hip\",function=\"hipInit\",result=\"hipSuccess\"}} 14\n\
                 canaryscope_gpu_api_calls_total{{{POD},api=\"hip\",function=\"hipInit\",result=\"hipErrorInvalidDevice\"}} 2\n\
                 canaryscope_gpu_api_call_duration_seconds_bucket{{{POD},api=\"hip\",function=\"hipInit\",le=\"0.001\"}} 10\n\
                 canaryscope_gpu_api_call_duration_seconds_bucket{{{POD},api=\"hip\",function=\"hipInit\",le=\"0.002\"}} 16\n\
                 canaryscope_gpu_api_call_duration_seconds_bucket{{{POD},api=\"hip\",function=\"hipInit\",le=\"+Inf\"}} 16\n\
                 canaryscope_cpu_periods_total{{{POD}}} 110\n\
                 canaryscope_cpu_throttled_periods_total{{{POD}}} 4\n\
                 canaryscope_oom_kills_total{{{POD},scope=\"memcg\"}} 1\n\
                 canaryscope_abnormal_exits_total{{{POD},signal=\"SIGKILL\",cause=\"oom_kill\",sender_scope=\"none\",kill_reason=\"none\"}} 1\n\
                 canaryscope_gpu_library_load_failures_total{{{POD},library=\"libonnxruntime_providers_cuda.so\",missing=\"libcublasLt.so.13\"}} 2\n\
                 canaryscope_gpu_library_load_failures_total{{{POD},library=\"cublas.so\",missing=\"libcublas.so.12\"}} 1\n\
                 canaryscope_gpu_never_initialized{{{POD}}} 1\n\
                 canaryscope_gpu_never_initialized{{namespace=\"inference\",pod=\"w-1\",container=\"sidecar\",workload=\"w\",revision=\"abc\",track=\"canary\"}} 0\n\
                 canaryscope_gpu_vram_bytes{{{POD},gpu=\"48879\"}} 1073741824\n\
                 canaryscope_gpu_vram_bytes{{{POD},gpu=\"1234\"}} 536870912\n\
                 canaryscope_gpu_api_calls_total{{namespace=\"\",pod=\"\",container=\"\",workload=\"/system.slice/x.service\",revision=\"\",track=\"\",api=\"hip\",function=\"hipInit\",result=\"hipErrorNoDevice\"}} 1\n\
                 canaryscope_probe_attached{{probe=\"p\",target=\"t\"}} 1\n"
            ),
            t1,
        );
        let rows = rows(&now, Some(&before));
        assert_eq!(rows.len(), 2, "{rows:#?}");
        let pod = rows.iter().find(|r| r.name == "inference/w-1").expect("pod row");
        assert_eq!(pod.track, "canary");
        assert_eq!(pod.gpu_failures, 2);
        assert_eq!(pod.gpu_calls_per_s, Some(3.0));
        assert_eq!(pod.throttled_pct, Some(40.0));
        assert_eq!(pod.oom_kills, 1);
        assert_eq!(pod.abnormal_exits, 1);
        assert_eq!(pod.gpu_library_load_failures, 3, "over both libraries");
        assert_eq!(pod.gpu_never_initialized, 1, "one of its two GPU containers");
        assert_eq!(pod.vram_bytes, Some(1536 << 20), "over both GPUs");
        // All six new calls fell between 1 and 2 ms.
        let p99 = pod.gpu_call_p99_s.expect("calls in the window");
        assert!((p99 - 0.00199).abs() < 1e-9, "{p99}");
        assert_eq!(pod.runq_p99_s, None);
        let cgroup = rows.iter().find(|r| r.name == "/system.slice/x.service").expect("cgroup row");
        assert_eq!(cgroup.gpu_failures, 1);
        assert_eq!(cgroup.vram_bytes, None, "no VRAM series, no figure");
        assert!(cgroup.matches("/system.slice"));
        assert!(pod.matches("inference") && pod.matches("inference/w") && !pod.matches("other"));
        // One reading alone has totals but no rates.
        let first = super::rows(&now, None);
        assert!(first.iter().all(|r| r.gpu_calls_per_s.is_none()));
    }

    #[test]
    fn sorting_puts_trouble_first_and_cycles_keys() {
        let quiet = Row { name: "a".into(), ..Row::default() };
        let failing = Row { name: "b".into(), gpu_failures: 1, ..Row::default() };
        let mut rows = vec![quiet.clone(), failing.clone()];
        sort(&mut rows, SortKey::Trouble);
        assert_eq!(rows[0].name, "b");
        sort(&mut rows, SortKey::Name);
        assert_eq!(rows[0].name, "a");
        // A framework serving from the CPU fails no call: its own columns sort it first.
        for cpu_fallback in [
            Row { name: "c".into(), gpu_library_load_failures: 1, ..Row::default() },
            Row { name: "c".into(), gpu_never_initialized: 1, ..Row::default() },
        ] {
            let mut rows = vec![quiet.clone(), cpu_fallback];
            sort(&mut rows, SortKey::Trouble);
            assert_eq!(rows[0].name, "c");
        }
        let mut key = SortKey::default();
        for _ in 0..SortKey::ALL.len() {
            key = key.next();
        }
        assert_eq!(key, SortKey::default());
    }

    #[test]
    fn quantile_beyond_the_last_bound_is_that_bound() {
        let inf = f64::INFINITY.to_bits();
        let now = BTreeMap::from([(1.0f64.to_bits(), 1.0), (inf, 100.0)]);
        assert_eq!(quantile(0.99, &now, None), Some(1.0));
        assert_eq!(quantile(0.99, &now, Some(&now)), None);
    }
}
