#!/usr/bin/env python3
"""Reference p-values for the judge's exact tests (observer/tests/judge_stats.rs).

Reads a JSON list of cases on stdin and writes, for each, the p-value of
every reference it asks for, as a JSON list in the same order:

- "scipy": scipy.stats.fisher_exact(..., alternative="greater") (one node,
  failures per start-up);
- "statsmodels": statsmodels' test_poisson_2indep(..., value=ratio,
  method="exact-cond", alternative="larger") (one node, events per
  pod-second);
- "brute": every combination of the nodes' counts enumerated, with exact
  rational probabilities (math.comb for the hypergeometric; the binomial's p
  as the exact value of the doubles the judge computes from);
- "numeric": the nodes' probability mass functions from SciPy, convolved
  with NumPy, tail summed;
- "cmh": statsmodels' StratifiedTable (Cochran-Mantel-Haenszel), one-sided
  from its continuity-corrected statistic: a normal approximation, for large
  counts where the canary is worse.

A case: {"kind": "fisher" | "poisson", "strata": [[canary_events,
canary_exposure, baseline_events, baseline_exposure], ...], "ratio": r,
"want": [...]}. Nodes without exposure of either revision are left out, as
the judge leaves them out.
"""
import itertools
import json
import math
import sys
from fractions import Fraction

import numpy as np
from scipy import stats
from statsmodels.stats.contingency_tables import StratifiedTable
from statsmodels.stats.rates import test_poisson_2indep


def strata_of(case):
    """[(canary events, canary exposure, baseline events, baseline exposure)],
    events as whole numbers (JSON gives them as floats)."""
    return [(int(c), float(ce), int(b), float(be)) for c, ce, b, be in case["strata"]]


def shared(strata):
    return [s for s in strata if s[1] > 0 and s[3] > 0]


def fisher_tables(strata):
    """2x2 tables [[cf, ct-cf], [bf, bt-bf]] of the nodes that count."""
    tables = []
    for cf, ct, bf, bt in strata:
        ct, bt = max(int(round(ct)), cf), max(int(round(bt)), bf)
        tables.append([[cf, ct - cf], [bf, bt - bf]])
    return tables


def poisson_nodes(strata, ratio):
    """(events, canary events, p as the judge computes it) per node."""
    nodes = []
    for c, ce, b, be in shared(strata):
        weighted = ratio * ce
        nodes.append((c + b, c, weighted / (weighted + be)))
    return nodes


def scipy_fisher(case):
    # SciPy takes any table, a node without start-ups included.
    [table] = fisher_tables(strata_of(case))
    return stats.fisher_exact(table, alternative="greater").pvalue


def statsmodels_poisson(case):
    [(c, ce, b, be)] = strata_of(case)
    # Its rate ratio (not the p-value) divides by zero without baseline events.
    with np.errstate(divide="ignore", invalid="ignore"):
        res = test_poisson_2indep(c, ce, b, be, value=case["ratio"], method="exact-cond", alternative="larger")
    return float(res.pvalue)


def supports(case):
    """Per node: list of (count, exact probability), and the observed sum."""
    nodes, observed = [], 0
    if case["kind"] == "fisher":
        for (a, b), (c, d) in fisher_tables(strata_of(case)):
            k, n_other, n = a + b, c + d, a + c
            if k == 0 or n_other == 0:
                continue
            total = math.comb(k + n_other, n)
            lo, hi = max(0, n - n_other), min(n, k)
            nodes.append([(x, Fraction(math.comb(k, x) * math.comb(n_other, n - x), total)) for x in range(lo, hi + 1)])
            observed += a
    else:
        for n, c, p in poisson_nodes(strata_of(case), case["ratio"]):
            p = Fraction(p)
            nodes.append([(x, math.comb(n, x) * p**x * (1 - p) ** (n - x)) for x in range(n + 1)])
            observed += c
    return nodes, observed


def brute(case):
    nodes, observed = supports(case)
    if math.prod(len(n) for n in nodes) > 300_000:
        raise ValueError("too many combinations to enumerate")
    tail = Fraction(0)
    for combo in itertools.product(*nodes):
        if sum(x for x, _ in combo) >= observed:
            tail += math.prod((p for _, p in combo), start=Fraction(1))
    return float(tail)


def numeric(case):
    pmf, lo, observed = np.array([1.0]), 0, 0
    if case["kind"] == "fisher":
        for (a, b), (c, d) in fisher_tables(strata_of(case)):
            k, n_other, n = a + b, c + d, a + c
            if k == 0 or n_other == 0:
                continue
            first, last = max(0, n - n_other), min(n, k)
            xs = np.arange(first, last + 1)
            pmf = np.convolve(pmf, stats.hypergeom.pmf(xs, k + n_other, k, n))
            lo += first
            observed += a
    else:
        for n, c, p in poisson_nodes(strata_of(case), case["ratio"]):
            pmf = np.convolve(pmf, stats.binom.pmf(np.arange(n + 1), n, p))
            observed += c
    start = max(observed - lo, 0)
    return float(min(np.sum(pmf[start:]), 1.0))


def cmh(case):
    tables = np.array(fisher_tables(shared(strata_of(case))), dtype=float).transpose(1, 2, 0)
    st = StratifiedTable(tables)
    excess = float(np.sum(tables[0, 0, :] - tables[0, :, :].sum(0) * tables[:, 0, :].sum(0) / tables.sum((0, 1))))
    if excess <= 0.5:
        raise ValueError("the corrected one-sided statistic needs the canary worse")
    statistic = st.test_null_odds(correction=True).statistic
    return float(stats.norm.sf(math.sqrt(statistic)))


ORACLES = {"scipy": scipy_fisher, "statsmodels": statsmodels_poisson, "brute": brute, "numeric": numeric, "cmh": cmh}


def main():
    cases = json.load(sys.stdin)
    out = []
    for case in cases:
        out.append({name: ORACLES[name](case) for name in case["want"]})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
