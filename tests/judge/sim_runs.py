"""Run cases of the independent simulation (tests/judge/simulate.py): solver
runs in the exporter's shape, written from the metric contract, not from
observer/src/judge.

Each analysis: three nodes, one canary pod and three stable ones on each (a
25% share); runs arrive as Poisson draws, RUNS_PER_LOOK canary runs per look
over the nodes (the baseline three times as many), each run's duration
log-normal (median 1 s, sigma 0.5), sampled every 120 s as
`canaryscope_run_duration_seconds_bucket` (only the bounds around the runs:
10 ms x 1.25^k from 0.14 s to 9.1 s) and `canaryscope_run_endings_total`.
Cases (the ratio is what the report's `rate_ratio` says):

- runs_p99_equal: the canary's runs as long as the baseline's (in the p99
  cases every run exits 0);
- runs_p99_edge: every canary run 1.25 x as long, the tolerated slowdown;
- runs_p99_detect: every canary run twice as long (its p99 doubled);
- runs_limits_edge: 10% of both revisions' runs end by a limit or wrapper
  (rlimit_cpu, memory_limit, sent), the tolerance's edge for failures per run;
- runs_limits_detect: 30% of the canary's against 10%.
"""
import math

import numpy as np

STEP = 120
RUNS_PER_LOOK = 30
MEDIAN_SECONDS = 1.0
SIGMA = 0.5
LIMIT_SHARE = 0.10
# (slowdown, limit share ratio) per case; the report's ratio is the one
# tested. The p99 cases end every run well (no limit endings at all), so
# each case tests its own signal.
CASES = {
    "runs_p99_equal": (1.0, 0.0),
    "runs_p99_edge": (1.25, 0.0),
    "runs_p99_detect": (2.0, 0.0),
    "runs_limits_edge": (1.0, 1.0),
    "runs_limits_detect": (1.0, 3.0),
}
BOUNDS = [0.01 * 1.25 ** k for k in range(12, 31)]
LIMIT_ENDINGS = ["rlimit_cpu", "memory_limit", "sent"]

# Every log-duration drawn, to check the sampler.
_LOG_DURATIONS = []


def ratio(case):
    slowdown, share = CASES[case]
    return share if case.startswith("runs_limits") else slowdown


def check():
    """The log-normal sampler: mean and variance of the logs within 5 SE."""
    if not _LOG_DURATIONS:
        return []
    x = np.concatenate(_LOG_DURATIONS)
    n = len(x)
    mu, var = math.log(MEDIAN_SECONDS), SIGMA * SIGMA
    ok = abs(x.mean() - mu) < 5 * math.sqrt(var / n) and abs(x.var(ddof=1) - var) < 5 * var * math.sqrt(2 / (n - 1))
    return [{"log_normal_median": MEDIAN_SECONDS, "sigma": SIGMA, "draws": n,
             "sample_mean_log": float(x.mean()), "sample_variance_log": float(x.var(ddof=1)), "ok": bool(ok)}]


def analysis(sim, draws, case, i, out):
    """Writes one analysis's run series; returns its namespace and canary birth."""
    ns = f"{case}-{i}"
    born = sim.END - sim.LOOKS * sim.INTERVAL
    stable_from = born - 1800
    slowdown, share_ratio = CASES[case]
    # The baseline's share is the case's own: none in the p99 cases.
    base_share = 1.0 if share_ratio else 0.0
    per_step_canary = RUNS_PER_LOOK * STEP / sim.INTERVAL / len(sim.NODES)
    out["lines"].types["canaryscope_run_duration_seconds_bucket"] = "unknown"

    def owner(rev, node):
        return f'namespace="{ns}",workload="infer",revision="{rev}",track="x",node="{node}"'

    def write(metric, labels, samples):
        for t, v in samples:
            out["lines"].setdefault(metric, []).append(f"{metric}{{{labels}}} {v} {t}")

    def runs(rev, node, start, pods, slow, share):
        steps = (sim.END - start) // STEP + 1
        # A copy: the sampler's check keeps the draws as they were drawn.
        counts = draws.poisson(round(per_step_canary * pods, 12), steps).copy()
        counts[0] = 0
        buckets = np.zeros((steps, len(BOUNDS) + 1))
        endings = np.zeros((steps, 2))
        for k, n in enumerate(counts):
            logs = draws.rng.normal(math.log(MEDIAN_SECONDS), SIGMA, n)
            _LOG_DURATIONS.append(logs)
            seconds = np.exp(logs) * slow
            buckets[k, :-1] = [np.sum(seconds <= b) for b in BOUNDS]
            buckets[k, -1] = n
            limited = draws.rng.binomial(n, min(LIMIT_SHARE * share, 1.0)) if n and share else 0
            endings[k] = [limited, n - limited]
        cumulative_buckets, cumulative_endings = np.cumsum(buckets, 0), np.cumsum(endings, 0)
        times = [start + k * STEP for k in range(steps)]
        for j, le in enumerate([repr(b) for b in BOUNDS] + ["+Inf"]):
            write("canaryscope_run_duration_seconds_bucket", f'{owner(rev, node)},executable="z3",le="{le}"',
                  zip(times, cumulative_buckets[:, j]))
        # The limit endings spread over the kinds, as they come.
        kind = LIMIT_ENDINGS[i % len(LIMIT_ENDINGS)]
        for j, ending in enumerate([kind, "exit_zero"]):
            write("canaryscope_run_endings_total", f'{owner(rev, node)},executable="z3",ending="{ending}"',
                  zip(times, cumulative_endings[:, j]))

    for node in sim.NODES:
        sim.write_pod_seconds(out, owner("stable", node), sim.STABLE_PODS, stable_from)
        sim.write_pod_seconds(out, owner("canary", node), sim.CANARY_PODS, born)
        runs("stable", node, stable_from, sim.STABLE_PODS, 1.0, base_share)
        runs("canary", node, born, sim.CANARY_PODS, slowdown, share_ratio)
    return ns, born
