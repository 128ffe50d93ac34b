#!/usr/bin/env python3
"""Reference p-values for the judge's run signals (observer/src/judge/solver_runs.rs),
written from the README's description, not from the judge's code.

Reads a JSON list of cases on stdin, writes a JSON list of answers in the
same order. A case:

- {"kind": "limits", "strata": [[canary_events, canary_runs, baseline_events, baseline_runs], ...]}:
  failures per run, one-sided Fisher's exact test stratified by stratum.
- {"kind": "p99", "strata": [{"executable": e, "canary": {"le": [...], "cumulative": [...], "total": n},
  "baseline": {...}}, ...]}: runs beyond the pooled p99 with a tolerated slowdown of 1.25. Per
  executable, the canary's runs are moved one bucket down (a bound b counts the canary's runs above
  1.25 b), the bound b is the highest with at least max(10, ceil(1% of the pooled runs)) pooled runs
  above it, but no more than half of them (else the lowest one), and per stratum the canary's runs above 1.25 b are compared with
  the baseline's above b.

Answers: {"p_value": p, "method": "scipy" | "exact"} and, for p99, the bound per executable and the
tables used. SciPy's hypergeometric probabilities are convolved when SciPy is installed; otherwise
(or with CANARYSCOPE_ORACLE_EXACT=1) every combination is enumerated with exact rationals.
"""
import itertools
import json
import math
import os
import sys
from fractions import Fraction

try:
    if os.environ.get("CANARYSCOPE_ORACLE_EXACT") == "1":
        raise ImportError("exact enumeration asked for")
    import numpy as np
    from scipy import stats
except ImportError:  # the exact enumeration below needs neither
    stats = None

SLOWDOWN = 1.25
TAIL_SHARE = 0.01
MIN_TAIL = 10


def tables_p_value(tables):
    """One-sided stratified Fisher: P(sum of canary failures >= observed),
    each stratum hypergeometric given its margins. tables: [(cf, cn, bf, bn)]."""
    used = [(cf, cn, bf, bn) for cf, cn, bf, bn in tables if cn > 0 and bn > 0]
    observed = sum(t[0] for t in used)
    if stats is not None:
        pmf, lo = np.array([1.0]), 0
        for cf, cn, bf, bn in used:
            k = cf + bf
            first, last = max(0, k - bn), min(k, cn)
            xs = np.arange(first, last + 1)
            pmf = np.convolve(pmf, stats.hypergeom.pmf(xs, cn + bn, cn, k))
            lo += first
        return float(min(pmf[max(observed - lo, 0):].sum(), 1.0)), "scipy"
    supports = []
    for cf, cn, bf, bn in used:
        k = cf + bf
        total = math.comb(cn + bn, k)
        supports.append([(x, Fraction(math.comb(cn, x) * math.comb(bn, k - x), total))
                         for x in range(max(0, k - bn), min(k, cn) + 1)])
    tail = Fraction(0)
    for combo in itertools.product(*supports):
        if sum(x for x, _ in combo) >= observed:
            tail += math.prod((p for _, p in combo), start=Fraction(1))
    return float(tail), "exact"


def above(side, bound):
    """Runs of a side above `bound` (all of them for a bound it lacks)."""
    for le, cum in zip(side["le"], side["cumulative"]):
        if math.isclose(le, bound, rel_tol=1e-9):
            return side["total"] - cum
    return side["total"]


def p99(case):
    by_exe = {}
    for s in case["strata"]:
        by_exe.setdefault(s["executable"], []).append(s)
    tables, bounds = [], {}
    for exe, strata in sorted(by_exe.items()):
        les = sorted({le for s in strata for side in ("canary", "baseline") for le in s[side]["le"]})
        pairs = [(b, up) for b in les for up in les if math.isclose(up, b * SLOWDOWN, rel_tol=1e-6)]
        if not pairs:
            continue
        runs = sum(s["canary"]["total"] + s["baseline"]["total"] for s in strata)
        wanted = min(max(MIN_TAIL, math.ceil(TAIL_SHARE * runs)), math.ceil(runs / 2))
        pooled = lambda pair: sum(above(s["canary"], pair[1]) + above(s["baseline"], pair[0]) for s in strata)
        chosen = next((pair for pair in reversed(pairs) if pooled(pair) >= wanted), pairs[0])
        bounds[exe] = chosen[0]
        for s in strata:
            tables.append((round(above(s["canary"], chosen[1])), round(s["canary"]["total"]),
                           round(above(s["baseline"], chosen[0])), round(s["baseline"]["total"])))
    p, method = tables_p_value(tables)
    return {"p_value": p, "method": method, "bounds": bounds, "tables": tables}


def limits(case):
    p, method = tables_p_value([tuple(int(round(x)) for x in t) for t in case["strata"]])
    return {"p_value": p, "method": method}


def main():
    answers = [p99(c) if c["kind"] == "p99" else limits(c) for c in json.load(sys.stdin)]
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
