#!/usr/bin/env python3
"""An independent simulation of canary analyses through a real Prometheus and
the real `canaryscope judge` (issue 50): nothing here comes from
observer/src/judge.

For each case, N analyses are written as the series the daemon exports
(deploy/metric-contract.json: `canaryscope_pod_seconds_total` and
`canaryscope_gpu_startups_total`/`_startup_failures_total` per revision and
node, `canaryscope_native_crashes_total` per pod), sampled every 15 s, in
OpenMetrics. `promtool tsdb create-blocks-from openmetrics` loads them
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
  baseline, crashing at the same rate;
- runs_*: solver runs' durations and endings (tests/judge/sim_runs.py says
  how they are drawn): as long, 1.25 x (the tolerated slowdown) and twice
  as long; limit endings at equal shares and at three times the baseline's.

Cases with series or questions of their own (`OWN`, below):

- gpu_equal, gpu_detect, gpu_rare: a GPU canary. The stable pods started two
  days before the end and their start-ups (about 100 a node) all happened
  more than 4 hours before it, so only the judge's start-up lookback sees
  them; the canary's start-ups (a third as many by look 10: a 25% share)
  are in its own window. Start-up failures at the baseline's proportion
  (about 20 baseline failures; the null's edge for a per-start-up test), at
  5 x, and at equal but rare ones (1 in 1,000, as a healthy GPU workload
  has them);
- flagger_newest: asked as Flagger asks (POST /v1/flagger/rollout with its
  JSON payload), about a Deployment whose older revision, crashing at 5 x,
  ran until a minute after the newest one began (a rolling update): only
  the newest may be judged, at equal rates with the primary;
- parameters: at each analysis, an interval below 30 s (Argo's and Flagger's
  path) and a baseline equal to the canary answer 400 with one line; a
  window that starts after the canary's first data, and one that ends
  before it, answer `inconclusive` with the reason (docs/judge.md);
- deadline: a Prometheus made slow by a proxy that holds each answer. At
  1 s a query, a judge with a 5 s deadline answers exactly what it answers
  directly (its queries run at once); at 6 s a query, a judge with a 0.5 s
  deadline answers `inconclusive` naming the slow queries, within 2 s.

Counts per sample (crashes, start-ups and their failures; a sample is 15 s,
or an hour for the GPU baseline's days-old start-ups) are Poisson draws
(numpy's generator, seeded per case so that a case's draws do not depend
on which others run), checked by mean and by variance over all draws before
anything is judged.

The request signals' cases (HTTP 5xx and p99 against stable, issue 53) are
http_sim.py's, each in a Prometheus of its own; `--cases all` runs every case.

Prints one JSON report: per case, the share of analyses failed, passed and
undecided, the median looks to a decision, and whether the case expects
false rollbacks or detection; for the parameters and the deadline
(`"kind": "check"`), the share of analyses answered as documented and what
was not.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib

import numpy as np

import sim_runs
from services import Services, free_port, http, wait_http

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
    # Shaped by `OWN`: the canary's rate (or failure proportion) over the baseline's.
    "gpu_equal": 1.0,
    "gpu_detect": 5.0,
    "gpu_rare": 1.0,
    "flagger_newest": 1.0,
    "parameters": 1.0,
    "deadline": 1.0,
}
CASES.update({case: sim_runs.ratio(case) for case in sim_runs.CASES})


class Draws:
    """Every Poisson draw made, by its mean, to check the sampler."""

    def __init__(self, seed):
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.by_mean = {}

    def for_case(self, case):
        """A generator of the case's own, so that its draws are the same
        whichever other cases run before it."""
        self.rng = np.random.default_rng([self.seed, zlib.crc32(case.encode())])

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


def shares(case, results):
    """A case's line of the report from each analysis's (verdict, look)."""
    n = len(results)
    looks = sorted(look for v, look in results if look is not None)
    return {
        "name": case,
        "expect": "false_rollbacks" if CASES[case] <= 1.5 else "detection",
        "rate_ratio": CASES[case],
        "failed_share": sum(v == "fail" for v, _ in results) / n,
        "passed_share": sum(v == "pass" for v, _ in results) / n,
        "undecided_share": sum(v == "inconclusive" for v, _ in results) / n,
        "median_looks_to_decision": float(np.median(looks)) if looks else None,
    }


def judged_as_argo(pool, services, case, analyses):
    return shares(case, list(pool.map(lambda a: judge_analysis(services.judge_port, a[0], a[1]), analyses)))


def check_report(case, problems, **measured):
    """A case of questions with one documented answer each: the share of
    analyses answered so, and the first answers that were not."""
    wrong = [p for ps in problems for p in ps]
    return {"name": case, "kind": "check", "analyses": len(problems),
            "as_documented_share": sum(not ps for ps in problems) / len(problems),
            "not_as_documented": wrong[:5], **measured}


# A GPU canary. The stable pods started two days before the end; their
# start-ups (about GPU_BASELINE_STARTUPS a node) all came before its last 4
# hours, so only the judge's start-up lookback reads them (the window's
# queries reach 3 hours back at most). The canary's come in its own window,
# a third as many by look 10 (a 25% share).
GPU_STABLE_AGE = 2 * 86_400
GPU_QUIET = 4 * 3600
GPU_BASELINE_STARTUPS = 100.0
# Failures per start-up: about BASELINE_EVENTS of the baseline's, or rare.
GPU_FAILURE_PROPORTION = {"gpu_rare": 0.001}
# Samples older than the other cases' (which begin 90 minutes before the
# end) are taken every hour: a count is the same at any sampling, and two
# days at 15 s would be 10^8 lines at 1,000 analyses a case.
HISTORY_STEP = 3600
RECENT = END - 5400


def owner_labels(ns, workload, rev, node):
    return f'namespace="{ns}",workload="{workload}",revision="{rev}",track="x",node="{node}"'


def emit(out, metric, labels, times, values):
    """Samples as exposition lines; those before RECENT apart, in
    `out["history"]`."""
    for t, v in zip(times, values):
        part = "history" if t < RECENT else "lines"
        out[part].setdefault(metric, []).append(f"{metric}{{{labels}}} {float(v)} {int(t)}")


def startups(draws, out, labels, times, starting, per_step, proportion):
    """A revision's start-up and start-up failure counters on a node: at
    each of the first `starting` samples, Poisson failures and Poisson
    successes (a Poisson stream of `per_step` start-ups, each failing with
    `proportion`); none after."""
    quiet = np.zeros(len(times) - starting, dtype=np.int64)
    failed = np.concatenate([draws.poisson(round(per_step * proportion, 12), starting), quiet])
    ok = np.concatenate([draws.poisson(round(per_step * (1 - proportion), 12), starting), quiet])
    gpu = labels + ',api="cuda"'
    emit(out, "canaryscope_gpu_startups_total", gpu, times, np.cumsum(failed + ok))
    emit(out, "canaryscope_gpu_startup_failures_total", gpu, times, np.cumsum(failed))


def gpu_analysis(draws, case, ratio, i, out):
    ns = f"{case}-{i}"
    born = END - LOOKS * INTERVAL
    history = np.arange(END - GPU_STABLE_AGE, RECENT, HISTORY_STEP)
    stable_times = np.concatenate([history, np.arange(RECENT, END + 1, STEP)])
    starting = np.count_nonzero(history < END - GPU_QUIET)
    canary_times = np.arange(born, END + 1, STEP)
    proportion = GPU_FAILURE_PROPORTION.get(case, BASELINE_EVENTS / (len(NODES) * GPU_BASELINE_STARTUPS))
    for node in NODES:
        stable = owner_labels(ns, "infer", "stable", node)
        startups(draws, out, stable, stable_times, starting, GPU_BASELINE_STARTUPS / starting, proportion)
        emit(out, "canaryscope_pod_seconds_total", stable, stable_times,
             STABLE_PODS * (stable_times - stable_times[0]))
        canary = owner_labels(ns, "infer", "canary", node)
        per_step = GPU_BASELINE_STARTUPS / 3 / len(canary_times)
        startups(draws, out, canary, canary_times, len(canary_times), per_step, ratio * proportion)
        emit(out, "canaryscope_pod_seconds_total", canary, canary_times, CANARY_PODS * (canary_times - born))
    return ns, born


def pods_and_crashes(draws, out, labels, pods, rate, span):
    """A revision's pod-seconds on a node and its pods' crash counter over
    `span` (start, stop), crashes at `rate` per pod-second."""
    times = np.arange(span[0], span[1] + 1, STEP)
    emit(out, "canaryscope_pod_seconds_total", labels, times, pods * (times - span[0]))
    per_step = draws.poisson(round(rate * pods * STEP, 12), len(times))
    per_step[0] = 0
    crash = f'{labels},pod="p{span[0]}",container="c",signal="SIGSEGV",library="l"'
    emit(out, "canaryscope_native_crashes_total", crash, times, np.cumsum(per_step))


def flagger_analysis(draws, case, ratio, i, out):
    """Flagger's Deployment `infer`: its older revision, crashing at 5 x,
    ran until a minute after the newest began (a rolling update); the
    newest crashes at `ratio` times the primary's rate."""
    ns = f"{case}-{i}"
    born = END - LOOKS * INTERVAL
    stable_rate = BASELINE_EVENTS / (len(NODES) * STABLE_PODS * LOOKS * INTERVAL)
    for node in NODES:
        primary = owner_labels(ns, "infer-primary", "prim", node)
        pods_and_crashes(draws, out, primary, STABLE_PODS, stable_rate, (born - 1800, END))
        old = owner_labels(ns, "infer", "old", node)
        pods_and_crashes(draws, out, old, CANARY_PODS, 5 * stable_rate, (born - 1800, born + 60))
        new = owner_labels(ns, "infer", "new", node)
        pods_and_crashes(draws, out, new, CANARY_PODS, ratio * stable_rate, (born, END))
    return ns, born


def flagger_payload(ns, end, interval=f"{INTERVAL}s"):
    """What Flagger posts to a rollout webhook; `metadata` is the webhook's
    own (the end, for a simulated clock)."""
    return {"name": "infer", "namespace": ns, "phase": "Progressing", "checksum": "6d4f9b",
            "metadata": {"window": "2h", "interval": interval, "end": str(end)}}


def judged_as_flagger(pool, services, case, analyses):
    """Each analysis asked through /v1/flagger/rollout at each look until its
    first fail or pass; every answer must judge the newest revision, and a
    fail must answer 409."""

    def one(a):
        ns, born = a
        wrong = 0
        for look in range(1, LOOKS + 1):
            status, text = http(services.judge_port, "POST", "/v1/flagger/rollout",
                                flagger_payload(ns, born + look * INTERVAL))
            answer = json.loads(text)
            wrong += answer["question"]["canary"].get("revision") != "new" or answer["look"] != look
            wrong += status != (409 if answer["verdict"] == "fail" else 200)
            if answer["verdict"] in ("fail", "pass"):
                return (answer["verdict"], look), wrong
        return ("inconclusive", None), wrong

    results = list(pool.map(one, analyses))
    report = shares(case, [r for r, _ in results])
    report["newest_judged_share"] = sum(w == 0 for _, w in results) / len(results)
    return report


def parameter_questions(draws, case, ratio, i, out):
    """Equal rates; and, drawn per analysis, the questions that would mislead."""
    ns, born = analysis(draws, case, ratio, i, out)
    rng = draws.rng
    end = born + int(rng.integers(2, LOOKS + 1)) * INTERVAL - int(rng.integers(0, INTERVAL))
    return ns, born, {
        "interval": int(rng.integers(1, 30)),
        "end": end,
        # A window starting after the canary's first data (its age at `end`).
        "window": int(rng.integers(60, end - born - 30)),
        "ended_before": born - int(rng.integers(15, 3600)),
    }


def parameter_problems(port, ns, born, q):
    """What of the documented answers (docs/judge.md) did not come."""
    problems = []
    question = f"/v1/judge?namespace={ns}&workload=infer&canary=canary"
    argo = f"{question}&window=2h"

    def refused(what, status, text, word):
        if status != 400 or len(text.strip().splitlines()) != 1 or word not in text:
            problems.append(f"{ns}: {what}: {status} {text[:200]!r}, not 400 with one line")

    interval = f"{q['interval']}s"
    status, text = http(port, "GET", f"{argo}&baseline=stable&interval={interval}&end={q['end']}")
    refused(f"interval {interval}", status, text, "interval")
    status, text = http(port, "POST", "/v1/flagger/rollout", flagger_payload(ns, q["end"], interval))
    refused(f"Flagger's interval {interval}", status, text, "interval")
    status, text = http(port, "GET", f"{argo}&baseline=canary&interval={INTERVAL}s&end={q['end']}")
    refused("baseline = canary", status, text, "baseline")
    for what, path in [
        (f"a {q['window']}s window starting after the canary's first data",
         f"{question}&baseline=stable&interval={INTERVAL}s&window={q['window']}s&end={q['end']}"),
        (f"a window ending {born - q['ended_before']}s before the canary's first data",
         f"{argo}&baseline=stable&interval={INTERVAL}s&end={q['ended_before']}"),
    ]:
        status, text = http(port, "GET", path)
        answer = json.loads(text) if status == 200 else {}
        reason = answer.get("reason", text)
        if answer.get("verdict") != "inconclusive" or "window" not in reason:
            problems.append(f"{ns}: {what}: {status} {answer.get('verdict')} ({reason[:200]})")
    return problems


def judged_on_parameters(pool, services, case, analyses):
    return check_report(case, list(pool.map(lambda a: parameter_problems(services.judge_port, *a), analyses)))


# A Prometheus that answers each query in SLOW_QUERY seconds is answered
# in full under SLOW_DEADLINE (the queries run at once; one after another
# they would take 16 s); one that takes STALLED_QUERY is cut at
# TIGHT_DEADLINE, the answer within ANSWER_SLACK of it.
SLOW_QUERY, SLOW_DEADLINE = 1.0, 5.0
STALLED_QUERY, TIGHT_DEADLINE, ANSWER_SLACK = 6.0, 0.5, 1.5


def deadline_questions(draws, case, ratio, i, out):
    ns, born = analysis(draws, case, ratio, i, out)
    return ns, born, int(draws.rng.integers(1, LOOKS + 1))


def judged_under_deadlines(pool, services, case, analyses):
    slow = services.judge(services.slow_prometheus(SLOW_QUERY), "--deadline", f"{SLOW_DEADLINE}s")
    tight = services.judge(services.slow_prometheus(STALLED_QUERY), "--deadline", f"{TIGHT_DEADLINE}s")

    def timed(port, ns, end):
        started = time.monotonic()
        try:
            answer = ask(port, ns, end)
        except OSError as e:
            answer = {"verdict": None, "reason": f"no answer: {e}"}
        return answer, time.monotonic() - started

    def one(a):
        ns, born, look = a
        end = born + look * INTERVAL
        direct = ask(services.judge_port, ns, end)
        slowed, slow_s = timed(slow, ns, end)
        cut, cut_s = timed(tight, ns, end)
        problems = []
        if slowed != direct:
            problems.append(f"{ns}: at {SLOW_QUERY}s a query, under {SLOW_DEADLINE}s: {slowed['verdict']} "
                            f"({slowed['reason'][:200]}) in {slow_s:.1f}s; directly {direct['verdict']}")
        slow_queries = ("canaryscope_pod_seconds_total", "canaryscope_native_crashes_total")
        named = all(m in cut["reason"] for m in slow_queries)
        if cut["verdict"] != "inconclusive" or "deadline" not in cut["reason"] or not named:
            problems.append(f"{ns}: at {STALLED_QUERY}s a query: {cut['verdict']} ({cut['reason'][:200]})")
        if cut_s > TIGHT_DEADLINE + ANSWER_SLACK:
            problems.append(f"{ns}: a {TIGHT_DEADLINE}s deadline answered in {cut_s:.1f}s")
        return problems, slow_s, cut_s

    results = list(pool.map(one, analyses))
    return check_report(case, [p for p, _, _ in results],
                        slowest_answer_at_slow_queries_seconds=max(s for _, s, _ in results),
                        slowest_answer_past_deadline_seconds=max(c for _, _, c in results))


# Cases with series or questions of their own: how an analysis is written
# (as `analysis`), and how the case is judged and reported.
OWN = {
    "gpu_equal": (gpu_analysis, judged_as_argo),
    "gpu_detect": (gpu_analysis, judged_as_argo),
    "gpu_rare": (gpu_analysis, judged_as_argo),
    "flagger_newest": (flagger_analysis, judged_as_flagger),
    "parameters": (parameter_questions, judged_on_parameters),
    "deadline": (deadline_questions, judged_under_deadlines),
}


def write_pod_seconds(out, labels, pods, start):
    """A revision's pod-seconds on a node, from `start` to the end."""
    lines = out["lines"].setdefault("canaryscope_pod_seconds_total", [])
    for k in range((END - start) // STEP + 1):
        t = start + k * STEP
        lines.append(f"canaryscope_pod_seconds_total{{{labels}}} {float(pods * (t - start))} {t}")


def runs_analysis(draws, case, ratio, i, out):
    return sim_runs.analysis(sys.modules[__name__], draws, case, i, out)


OWN.update({case: (runs_analysis, judged_as_argo) for case in sim_runs.CASES})


class Spool:
    """Exposition lines by metric, as `out["lines"]` holds them, kept in a
    file a metric rather than in memory: 1,000 analyses a case are tens of
    millions of lines."""

    class Lines:
        def __init__(self, file):
            self.file = file

        def append(self, line):
            self.file.write(line + "\n")

        def extend(self, lines):
            self.file.writelines(line + "\n" for line in lines)

    def __init__(self, directory):
        self.directory, self.files = directory, {}
        # OpenMetrics types other than counter, by metric (histogram
        # buckets are written as `unknown`, one series per bound).
        self.types = {}

    def setdefault(self, metric, _default=None):
        if metric not in self.files:
            self.files[metric] = open(os.path.join(self.directory, f"{metric}.lines"), "w+")
        return Spool.Lines(self.files[metric])

    def __bool__(self):
        return bool(self.files)

    def write_openmetrics(self, path):
        with open(path, "w") as f:
            for metric, lines in self.files.items():
                kind = self.types.get(metric, "counter")
                family = metric.removesuffix("_total") if kind == "counter" else metric
                f.write(f"# TYPE {family} {kind}\n")
                lines.seek(0)
                shutil.copyfileobj(lines, f)
                lines.close()
                os.remove(lines.name)
            f.write("# EOF\n")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--judge", required=True, help="the canaryscope binary")
    p.add_argument("--analyses", type=int, default=200)
    p.add_argument("--seed", type=int, default=50)
    p.add_argument("--cases", default=",".join(CASES),
                   help="comma-separated; the request signals' cases are http_sim.py's; `all` is every case")
    args = p.parse_args()
    import http_sim  # the request signals' cases (issue 53), each in a Prometheus of its own
    cases = list(CASES) + list(http_sim.CASES) if args.cases == "all" else args.cases.split(",")
    unknown = [c for c in cases if c not in CASES and c not in http_sim.CASES]
    if unknown:
        sys.exit(f"unknown cases {unknown}")
    http_cases = [c for c in cases if c in http_sim.CASES]
    cases = [c for c in cases if c in CASES]
    draws = Draws(args.seed)
    work = tempfile.mkdtemp(prefix="canaryscope-judge-sim-")
    procs = []
    try:
        # Days-old samples apart: promtool reads its whole input once for
        # each two-hour block it writes.
        out = {part: Spool(tempfile.mkdtemp(dir=work)) for part in ("lines", "history")}
        namespaces = {}
        for c in cases:
            draws.for_case(c)
            write = OWN[c][0] if c in OWN else analysis
            namespaces[c] = [write(draws, c, CASES[c], i, out) for i in range(args.analyses)]
        sampler = draws.check() + sim_runs.check()
        if not all(c["ok"] for c in sampler):
            sys.exit(f"the Poisson sampler is off: {sampler}")
        tsdb = os.path.join(work, "tsdb")
        for part, spool in out.items():
            if spool:
                spool.write_openmetrics(os.path.join(work, f"{part}.om"))
                subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics",
                                os.path.join(work, f"{part}.om"), tsdb], check=True, capture_output=True)
                os.remove(os.path.join(work, f"{part}.om"))
        config = os.path.join(work, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 15s\n")
        prom_port = free_port()
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tsdb}",
             "--storage.tsdb.retention.time=100y", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", "Prometheus")
        services = Services(args.judge, prom_port, procs)
        report = {"analyses": args.analyses, "seed": args.seed, "looks": LOOKS,
                  "interval_seconds": INTERVAL, "nodes": len(NODES),
                  "canary_share": CANARY_PODS / (CANARY_PODS + STABLE_PODS),
                  "baseline_events": BASELINE_EVENTS, "sampler": sampler, "cases": []}
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            for case in cases:
                run = OWN[case][1] if case in OWN else judged_as_argo
                report["cases"].append(run(pool, services, case, namespaces[case]))
        if http_cases:
            http_reports, http_sampler = http_sim.run(args.judge, http_cases, args.analyses, args.seed)
            report["cases"] += http_reports
            report["sampler"] += http_sampler
            report["http_canary_requests"] = http_sim.CANARY_REQUESTS
        print(json.dumps(report))
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
