"""The request signals' cases of the independent simulation (issue 53), run by
simulate.py: nothing here comes from observer/src/judge.

Each analysis writes the series the daemon exports for HTTP requests
(deploy/metric-contract.json; the bucket bounds of
observer/src/metrics/http.rs): per node and revision, the latency histogram of
answered (2xx) requests, every bucket, and the request counts answered 5xx and
cut off mid-response (`_count` of their classes; the `_sum` series, which the
judge does not read, are left out), beside each revision's pod-seconds,
sampled every 30 s. Three nodes, one canary pod and three stable pods on each
(a 25% share), the canary serving 1,000 requests over the analysis (10 looks 5
minutes apart), stable serving three times as many from 15 minutes before.

Per step, requests are Poisson draws; 5xx among them, then cut-off ones among
the rest, binomial draws; each answered request's latency a lognormal draw
(median 50 ms, sigma 0.5 in log: p99 3.2 times the median). Every sampler is
checked by mean and by variance before anything is judged.

Cases (the null's edge first; the judge must not fail them):
- http_equal: the canary like stable (0.2% 5xx, 0.1% cut off);
- http_5xx_edge: the canary answers exactly the tolerated 1% with 5xx;
- http_5xx_outage: a downstream outage: stable answers 3% with 5xx, the
  canary 4.5%, 1.5 times it (the tolerated ratio);
- http_p99_edge: the canary's latencies stretched by 1.25 (p99 exactly +25%);
- http_p99_edge_delay: the canary's latencies plus a set delay of a quarter of
  stable's p99 (p99 exactly +25% too);
- http_5xx_detect: the canary answers 3% with 5xx;
- http_p99_detect: the canary's latencies stretched by 2 (p99 doubled);
- http_p99_detect_delay: plus a set delay of stable's p99 (p99 doubled);
- http_p99_edge_heavy, http_p99_detect_heavy: both revisions' latencies
  with sigma 1 (p99 ten times the median), the canary's stretched by 1.25
  (the edge) and by 2 (reported, with no target).

Each case runs in a Prometheus of its own, one after another, so that a
case's series are all one Prometheus holds at a time.
"""
import concurrent.futures
import os
import shutil
import subprocess
import tempfile
import zlib

import numpy as np

import simulate

STEP = 30
STABLE_BEFORE = 900
MEDIAN = 0.05
SIGMA = 0.5
# The lognormal's p99: its median times exp(sigma * z_0.99).
P99 = MEDIAN * float(np.exp(SIGMA * 2.3263478740408408))
CANARY_REQUESTS = 1000
BOUNDS = [0.001, 0.0025, 0.005] + [0.01 * 1.25 ** k for k in range(32)]
BASE = {"stable_5xx": 0.002, "canary_5xx": 0.002, "closed": 0.001, "stretch": 1.0, "delay": 0.0, "sigma": SIGMA}
CASES = {
    "http_equal": dict(BASE, expect="false_rollbacks"),
    "http_5xx_edge": dict(BASE, canary_5xx=0.01, expect="false_rollbacks"),
    "http_5xx_outage": dict(BASE, stable_5xx=0.03, canary_5xx=0.045, expect="false_rollbacks"),
    "http_p99_edge": dict(BASE, stretch=1.25, expect="false_rollbacks"),
    "http_p99_edge_delay": dict(BASE, delay=0.25 * P99, expect="false_rollbacks"),
    "http_5xx_detect": dict(BASE, canary_5xx=0.03, expect="detection"),
    "http_p99_detect": dict(BASE, stretch=2.0, expect="detection"),
    "http_p99_detect_delay": dict(BASE, delay=P99, expect="detection"),
    "http_p99_edge_heavy": dict(BASE, stretch=1.25, sigma=1.0, expect="false_rollbacks"),
    "http_p99_detect_heavy": dict(BASE, stretch=2.0, sigma=1.0, expect="report"),
}


class Checked:
    """Draws made, kept as sums that check each sampler's mean and variance:
    S1 = sum(x - mean) and S2 = sum((x - mean)^2 - var), each within 5 of its
    standard errors (from the draws' own second and fourth moments)."""

    def __init__(self, seed):
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.sums = {}

    def for_case(self, case):
        """A generator of the case's own, so that its draws are the same
        whichever other cases run before it."""
        self.rng = np.random.default_rng([self.seed, zlib.crc32(case.encode())])

    def _note(self, name, x, mean, var, fourth):
        s = self.sums.setdefault(name, np.zeros(5))
        d = x - mean
        s += [len(x), d.sum(), var.sum() if np.ndim(var) else var * len(x),
              (d * d - var).sum(), (fourth - var * var).sum() if np.ndim(fourth) else (fourth - var * var) * len(x)]

    def poisson(self, mean, n):
        x = self.rng.poisson(mean, n)
        self._note("poisson", x, mean, mean, mean + 3 * mean * mean)
        return x

    def binomial(self, n, p):
        x = self.rng.binomial(n, p)
        q = 1 - p
        var = n * p * q
        self._note("binomial", x, n * p, var, var * (1 + 3 * (n - 2) * p * q))
        return x

    def normal(self, n):
        z = self.rng.standard_normal(n)
        self._note("normal", z, 0.0, 1.0, 3.0)
        return z

    def check(self):
        checks = []
        for name, (n, s1, v1, s2, v2) in self.sums.items():
            ok = abs(s1) <= 5 * max(v1, 1e-12) ** 0.5 and abs(s2) <= 5 * max(v2, 1e-12) ** 0.5
            checks.append({"sampler": name, "draws": int(n), "mean_deviation": float(s1),
                           "variance_deviation": float(s2), "ok": bool(ok)})
        return checks


def latencies(draws, n, sigma, stretch=1.0, delay=0.0):
    return stretch * MEDIAN * np.exp(sigma * draws.normal(n)) + delay


def analysis(draws, case, i, files):
    """Writes one analysis's series into `files` (one per metric); returns
    its namespace and canary birth."""
    p = CASES[case]
    ns = f"{case}-{i}"
    born = simulate.END - simulate.LOOKS * simulate.INTERVAL
    nodes = simulate.NODES
    canary_rate = CANARY_REQUESTS / (len(nodes) * simulate.LOOKS * simulate.INTERVAL)
    stable_rate = canary_rate * simulate.STABLE_PODS / simulate.CANARY_PODS
    revisions = [("canary", born, canary_rate, p["canary_5xx"], p["stretch"], p["delay"], simulate.CANARY_PODS),
                 ("stable", born - STABLE_BEFORE, stable_rate, p["stable_5xx"], 1.0, 0.0, simulate.STABLE_PODS)]
    for rev, start, rate, five, stretch, delay, pods in revisions:
        times = np.arange(start, simulate.END + 1, STEP)
        for node in nodes:
            owner = f'namespace="{ns}",workload="infer",revision="{rev}",track="x",node="{node}"'
            write = lambda metric, labels, values: files[metric].writelines(
                f"{metric}{{{labels}}} {int(v)} {t}\n" for t, v in zip(times, values))
            write("canaryscope_pod_seconds_total", owner, pods * (times - start))
            n = draws.poisson(rate * STEP, len(times))
            n[0] = 0
            failed = draws.binomial(n, five)
            closed = draws.binomial(n - failed, p["closed"])
            answered = n - failed - closed
            buckets = np.zeros((len(times), len(BOUNDS)))
            for k, m in enumerate(answered):
                if m:
                    idx = np.searchsorted(BOUNDS, latencies(draws, m, p["sigma"], stretch, delay), side="left")
                    buckets[k] = np.bincount(idx, minlength=len(BOUNDS) + 1)[: len(BOUNDS)]
            cumulative = np.cumsum(np.cumsum(buckets, axis=1), axis=0)
            metric = "canaryscope_http_server_request_duration_seconds"
            ok = f'{owner},status_class="2xx"'
            for j, b in enumerate(BOUNDS):
                write(f"{metric}_bucket", f'{ok},le="{b}"', cumulative[:, j])
            write(f"{metric}_bucket", f'{ok},le="+Inf"', np.cumsum(answered))
            write(f"{metric}_count", ok, np.cumsum(answered))
            write(f"{metric}_count", f'{owner},status_class="5xx"', np.cumsum(failed))
            write(f"{metric}_count", f'{owner},status_class="closed"', np.cumsum(closed))
    return ns, born


def run_case(judge, case, analyses, draws, work):
    """One case's analyses through a Prometheus of its own: its report."""
    # Each metric's lines to a file of its own as they are drawn, then the
    # families in order: an analysis's series need not all be held at once.
    duration = "canaryscope_http_server_request_duration_seconds"
    parts = {"canaryscope_pod_seconds_total": "# TYPE canaryscope_pod_seconds counter\n",
             f"{duration}_bucket": f"# TYPE {duration} histogram\n", f"{duration}_count": ""}
    files = {metric: open(os.path.join(work, f"{case}-{i}.part"), "w") for i, metric in enumerate(parts)}
    draws.for_case(case)
    try:
        namespaces = [analysis(draws, case, i, files) for i in range(analyses)]
    finally:
        for f in files.values():
            f.close()
    off = [c for c in draws.check() if not c["ok"]]
    if off:
        raise SystemExit(f"a sampler is off: {off}")
    om = os.path.join(work, f"{case}.om")
    with open(om, "w") as out:
        for metric, header in parts.items():
            out.write(header)
            with open(files[metric].name) as part:
                shutil.copyfileobj(part, out)
            os.remove(files[metric].name)
        out.write("# EOF\n")
    tsdb = os.path.join(work, f"{case}-tsdb")
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", om, tsdb], check=True,
                   capture_output=True)
    os.remove(om)
    procs = []
    try:
        prom_port, judge_port = simulate.free_port(), simulate.free_port()
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 30s\n")
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
             "--storage.tsdb.retention.time=100y", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        simulate.wait_http(f"http://127.0.0.1:{prom_port}/-/ready", "Prometheus")
        procs.append(subprocess.Popen(
            [judge, "judge", "--listen", f"127.0.0.1:{judge_port}", "--prometheus", f"http://127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        simulate.wait_http(f"http://127.0.0.1:{judge_port}/healthz", "the judge")
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda a: simulate.judge_analysis(judge_port, *a), namespaces))
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait()
        shutil.rmtree(tsdb, ignore_errors=True)
    n = len(results)
    looks = sorted(look for v, look in results if look is not None)
    p = CASES[case]
    return {
        "name": case,
        "expect": p["expect"],
        "canary_5xx": p["canary_5xx"], "stable_5xx": p["stable_5xx"],
        "latency_stretch": p["stretch"], "latency_delay_seconds": p["delay"], "latency_sigma": p["sigma"],
        "failed_share": sum(v == "fail" for v, _ in results) / n,
        "passed_share": sum(v == "pass" for v, _ in results) / n,
        "undecided_share": sum(v == "inconclusive" for v, _ in results) / n,
        "median_looks_to_decision": float(np.median(looks)) if looks else None,
    }


def run(judge, cases, analyses, seed):
    """Every HTTP case's report, and the samplers' checks."""
    draws = Checked(seed)
    work = tempfile.mkdtemp(prefix="canaryscope-judge-http-sim-")
    try:
        reports = [run_case(judge, case, analyses, draws, work) for case in cases]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return reports, draws.check()
