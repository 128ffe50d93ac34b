#!/usr/bin/env python3
"""An independent simulation of canary analyses through a real Prometheus and
the real `canaryscope judge` (issue 50): nothing here comes from
observer/src/judge.

For each case, N analyses are written as the series the daemon exports
(deploy/metric-contract.json: `canaryscope_pod_seconds_total` per revision
and node, `canaryscope_native_crashes_total` per pod), sampled every 15 s,
in OpenMetrics. `promtool tsdb create-blocks-from openmetrics` loads them
into a Prometheus, and the judge is asked as Argo asks it, at looks 1 to 10
(5-minute intervals); an analysis ends at its first `fail` or `pass`.

Three nodes; one canary pod and three stable pods on each (a 25% canary
share); about 20 baseline crashes over the analysis. Cases:

- equal: canary rate = baseline rate;
- edge: canary rate = 1.5 x baseline's, the tolerated ratio (the null's edge);
- detect: 5 x;
- restart: equal rates, and the daemon on node-b restarts at look 5
  (every series there starts again from 0);
- retried: equal rates now, after an aborted try at 5 x that ended 20
  minutes before this one began (same revision);
- canary_only: equal rates, and one more canary pod on a node without the
  baseline, crashing at the same rate.

Crash counts per 15 s are Poisson draws (numpy's generator), checked by mean
and by variance over all draws before anything is judged.

Prints one JSON report: per case, the share of analyses failed, passed and
undecided, and the median looks to a decision.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

STEP = 15
INTERVAL = 300
LOOKS = 10
END = 1_700_000_000 + 86_400
NODES = ["node-a", "node-b", "node-c"]
CANARY_PODS = 1
STABLE_PODS = 3
BASELINE_EVENTS = 20.0
CASES = {
    "equal": 1.0,
    "edge": 1.5,
    "detect": 5.0,
    "restart": 1.0,
    "retried": 1.0,
    "canary_only": 1.0,
}


class Draws:
    """Every Poisson draw made, by its mean, to check the sampler."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.by_mean = {}

    def poisson(self, mean, n):
        x = self.rng.poisson(mean, n)
        self.by_mean.setdefault(mean, []).append(x)
        return x

    def check(self):
        """Mean and variance of each sampler within 5 standard errors."""
        checks = []
        for mean, parts in self.by_mean.items():
            x = np.concatenate(parts)
            n = len(x)
            if n < 1000 or mean <= 0:
                continue
            se_mean = (mean / n) ** 0.5
            # Var of the sample variance of a Poisson: (mu + 2 mu^2 (n/(n-1))) / n.
            se_var = ((mean + 2 * mean * mean) / n) ** 0.5
            ok = abs(x.mean() - mean) < 5 * se_mean and abs(x.var(ddof=1) - mean) < 5 * se_var
            checks.append({"mean": mean, "draws": n, "sample_mean": float(x.mean()),
                           "sample_variance": float(x.var(ddof=1)), "ok": bool(ok)})
        return checks


def counter(values, start):
    """Cumulative sums of per-step counts, sampled from `start`."""
    return [(start + i * STEP, float(v)) for i, v in enumerate(np.cumsum(values))]


def analysis(draws, case, ratio, i, out):
    """Writes one analysis's series; returns its namespace and canary birth."""
    ns = f"{case}-{i}"
    born = END - LOOKS * INTERVAL
    stable_from = born - 1800
    steps = (END - stable_from) // STEP + 1
    canary_steps = (END - born) // STEP + 1
    stable_rate = BASELINE_EVENTS / (len(NODES) * STABLE_PODS * LOOKS * INTERVAL)
    canary_rate = ratio * stable_rate

    def owner(rev, node):
        return f'namespace="{ns}",workload="infer",revision="{rev}",track="x",node="{node}"'

    def write(metric, labels, samples):
        for t, v in samples:
            out["lines"].setdefault(metric, []).append(f"{metric}{{{labels}}} {v} {t}")

    def pod_seconds(n, start, count, restart_at=None):
        vals = []
        for k in range(count):
            t = start + k * STEP
            base = start if restart_at is None or t < restart_at else restart_at
            vals.append((t, float(n * (t - base))))
        return vals

    def pods(rev, node, n, start, count, restart_at=None, earlier=()):
        write("canaryscope_pod_seconds_total", owner(rev, node), list(earlier) + pod_seconds(n, start, count, restart_at))

    def crashes(rev, node, n, rate, start, count, restart_at=None, pod=None):
        per_step = draws.poisson(round(rate * n * STEP, 12), count)
        per_step[0] = 0
        samples = counter(per_step, start)
        if restart_at is not None:
            # The daemon restarts: the count starts again from 0.
            at = next(k for k, (t, _) in enumerate(samples) if t >= restart_at)
            base = samples[at - 1][1]
            samples = samples[:at] + [(t, v - base) for t, v in samples[at:]]
        labels = f'{owner(rev, node)},pod="{pod or rev + "-" + node}",container="c",signal="SIGSEGV",library="l"'
        write("canaryscope_native_crashes_total", labels, samples)

    restart_at = born + 5 * INTERVAL if case == "restart" else None
    # The aborted try of `retried`: 20 minutes at 5 x, ending 20 minutes
    # before this one began; the revision's pod-seconds series is the same.
    old, old_count = born - 2400, 1200 // STEP + 1
    for node in NODES:
        r = restart_at if node == "node-b" else None
        pods("stable", node, STABLE_PODS, stable_from, steps, r)
        crashes("stable", node, STABLE_PODS, stable_rate, stable_from, steps, r)
        earlier = pod_seconds(CANARY_PODS, old, old_count) if case == "retried" else ()
        pods("canary", node, CANARY_PODS, born, canary_steps, r, earlier)
        crashes("canary", node, CANARY_PODS, canary_rate, born, canary_steps, r)
        if case == "retried":
            crashes("canary", node, CANARY_PODS, 5 * stable_rate, old, old_count, pod=f"old-{node}")
    if case == "canary_only":
        pods("canary", "node-d", CANARY_PODS, born, canary_steps)
        crashes("canary", "node-d", CANARY_PODS, canary_rate, born, canary_steps)
    return ns, born


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"{what} did not answer at {url}")


def ask(port, ns, end):
    url = (f"http://127.0.0.1:{port}/v1/judge?namespace={ns}&workload=infer&canary=canary"
           f"&baseline=stable&window=2h&interval={INTERVAL}s&end={end}")
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


def judge_analysis(port, ns, born):
    """The verdict at each look until the first fail or pass."""
    for look in range(1, LOOKS + 1):
        answer = ask(port, ns, born + look * INTERVAL)
        if answer["look"] != look:
            raise SystemExit(f"{ns}: asked at look {look}, answered look {answer['look']}")
        if answer["verdict"] in ("fail", "pass"):
            return answer["verdict"], look
    return "inconclusive", None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--judge", required=True, help="the canaryscope binary")
    p.add_argument("--analyses", type=int, default=200)
    p.add_argument("--seed", type=int, default=50)
    p.add_argument("--cases", default=",".join(CASES))
    args = p.parse_args()
    cases = args.cases.split(",")
    draws = Draws(args.seed)
    out = {"lines": {}}
    namespaces = {c: [analysis(draws, c, CASES[c], i, out) for i in range(args.analyses)] for c in cases}
    sampler = draws.check()
    if not all(c["ok"] for c in sampler):
        sys.exit(f"the Poisson sampler is off: {sampler}")
    work = tempfile.mkdtemp(prefix="canaryscope-judge-sim-")
    procs = []
    try:
        om = os.path.join(work, "series.om")
        with open(om, "w") as f:
            for metric, lines in out["lines"].items():
                f.write(f"# TYPE {metric.removesuffix('_total')} counter\n")
                f.write("\n".join(lines) + "\n")
            f.write("# EOF\n")
        tsdb = os.path.join(work, "tsdb")
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", om, tsdb],
                       check=True, capture_output=True)
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 15s\n")
        prom_port, judge_port = free_port(), free_port()
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
             "--storage.tsdb.retention.time=100y", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", "Prometheus")
        procs.append(subprocess.Popen(
            [args.judge, "judge", "--listen", f"127.0.0.1:{judge_port}",
             "--prometheus", f"http://127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{judge_port}/healthz", "the judge")
        report = {"analyses": args.analyses, "seed": args.seed, "looks": LOOKS,
                  "interval_seconds": INTERVAL, "nodes": len(NODES),
                  "canary_share": CANARY_PODS / (CANARY_PODS + STABLE_PODS),
                  "baseline_events": BASELINE_EVENTS, "sampler": sampler, "cases": []}
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for case in cases:
                results = list(pool.map(lambda a: judge_analysis(judge_port, *a), namespaces[case]))
                n = len(results)
                looks = sorted(look for v, look in results if look is not None)
                report["cases"].append({
                    "name": case,
                    "rate_ratio": CASES[case],
                    "failed_share": sum(v == "fail" for v, _ in results) / n,
                    "passed_share": sum(v == "pass" for v, _ in results) / n,
                    "undecided_share": sum(v == "inconclusive" for v, _ in results) / n,
                    "median_looks_to_decision": float(np.median(looks)) if looks else None,
                })
        print(json.dumps(report))
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
