#!/usr/bin/env python3
"""Reference p-values for the judge's request signals (observer/tests/judge_http.rs),
computed here from the counts each revision served, with nothing from the judge.

Reads a JSON list of questions on stdin; writes a list of answers in the same
order. A question:

    {"bounds": [upper bounds in seconds], "share": s, "ratio": r,
     "now": NODES, "checks": [NODES, ...]}

where NODES is a list of {"node", "canary": SIDE, "baseline": SIDE} and SIDE is
{"cumulative": [requests answered 2xx-4xx at or below each bound],
 "answered": all of them, "5xx": n, "closed": n}.

Shares (http_5xx, http_closed), over the nodes where both revisions served
requests (all classes):
- against the tolerated share: scipy.stats.binom.sf(x - 1, n, s), the canary's
  events x among its n requests;
- against the baseline: the conditional test of two Poisson rates at ratio r
  (events per request) stratified by node: the canary's events summed against
  the convolution of each node's scipy.stats.binom(events there,
  r n_c / (r n_c + n_b)), upper tail (statsmodels' test_poisson_2indep
  exact-cond, for one node);
- the p-value: the larger of the two;
- no worse: 2 min(binom.cdf(x, n, s), the same conditional test's lower
  tail), at most 1.

Latency (http_p99): on each node where the baseline answered at least 300
requests, the cut is the smallest bound b, among those with a bound 1.25 b,
with at most 1% of the baseline's requests above it; the canary's events are
its requests above 1.25 b, the baseline's those above b. Fisher's exact test
stratified by node (the convolution of each node's
scipy.stats.hypergeom), at the end and at each check; the p-value is the
largest of them. No worse: its lower tail at the end.
"""
import json
import sys

import numpy as np
from scipy import stats

MIN_BASELINE = 300
TAIL = 0.01
RATIO = 1.25


def convolved(pmfs):
    out = np.array([1.0])
    for pmf in pmfs:
        out = np.convolve(out, pmf)
    return out


def fisher(tables, lower=False):
    """Stratified Fisher: tables of (canary events, canary n, baseline events, baseline n)."""
    tables = [t for t in tables if t[1] > 0 and t[3] > 0]
    pmfs, observed = [], 0
    for ce, cn, be, bn in tables:
        events = ce + be
        x = np.arange(0, min(events, cn) + 1)
        pmfs.append(stats.hypergeom.pmf(x, cn + bn, events, cn))
        observed += ce
    dist = convolved(pmfs)
    return float(dist[: observed + 1].sum() if lower else dist[observed:].sum())


def poisson(tables, ratio, lower=False):
    """The conditional test of two Poisson rates at `ratio`: P(S >= s), or P(S <= s)."""
    tables = [t for t in tables if t[1] > 0 and t[3] > 0]
    pmfs, observed = [], 0
    for ce, cn, be, bn in tables:
        p = ratio * cn / (ratio * cn + bn)
        pmfs.append(stats.binom.pmf(np.arange(ce + be + 1), ce + be, p))
        observed += ce
    dist = convolved(pmfs)
    return float(dist[: observed + 1].sum() if lower else dist[observed:].sum())


def requests(side):
    return int(side["answered"] + side["5xx"] + side["closed"])


def share(nodes, klass, s, ratio):
    tables = [(int(n["canary"][klass]), requests(n["canary"]), int(n["baseline"][klass]), requests(n["baseline"]))
              for n in nodes]
    tables = [t for t in tables if t[1] > 0 and t[3] > 0]
    x = sum(t[0] for t in tables)
    n = sum(t[1] for t in tables)
    against_share = float(stats.binom.sf(x - 1, n, s))
    against_baseline = poisson(tables, ratio)
    no_worse = min(1.0, 2 * min(float(stats.binom.cdf(x, n, s)), poisson(tables, ratio, lower=True)))
    return {"p_value": max(against_share, against_baseline), "against_share": against_share,
            "against_baseline": against_baseline, "no_worse": no_worse, "canary_events": x}


def latency_tables(nodes, bounds):
    """(tables, cuts): per compared node, the events above the cut and the requests."""
    pairs = [(i, k) for i, b in enumerate(bounds) for k, c in enumerate(bounds) if abs(c / b - RATIO) < 1e-6]
    tables, cuts = [], []
    for n in nodes:
        canary, baseline = n["canary"], n["baseline"]
        nb, nc = baseline["answered"], canary["answered"]
        if nb < MIN_BASELINE or nc <= 0:
            continue
        found = [(i, k) for i, k in pairs if nb - baseline["cumulative"][i] <= TAIL * nb]
        if not found:
            continue
        i, k = found[0]
        tables.append((int(nc - canary["cumulative"][k]), int(nc), int(nb - baseline["cumulative"][i]), int(nb)))
        cuts.append(bounds[i])
    return tables, cuts


def latency(question):
    bounds = question["bounds"]
    tables, cuts = latency_tables(question["now"], bounds)
    now = fisher(tables)
    checks = [fisher(latency_tables(c, bounds)[0]) for c in question["checks"]]
    return {"p_value": max([now] + checks), "checks": checks, "cuts": cuts,
            "no_worse": fisher(tables, lower=True),
            "canary_events": sum(t[0] for t in tables), "baseline_events": sum(t[2] for t in tables)}


def answer(question):
    s, ratio = question["share"], question["ratio"]
    return {"http_5xx": share(question["now"], "5xx", s, ratio),
            "http_closed": share(question["now"], "closed", s, ratio),
            "http_p99": latency(question)}


def main():
    json.dump([answer(q) for q in json.load(sys.stdin)], sys.stdout)


if __name__ == "__main__":
    main()
