#!/usr/bin/env python3
"""The queries deploy/ ships, held to the metric contract and to their tests.

Prometheus' promtool checks PromQL syntax and runs the unit tests; what it cannot know
is canaryscope's own contract, so this file checks it (deploy/check.sh steps 3, 4, 7):

  contract [--scrape F]  metric names and labels in the rules, their annotations, the
                         Argo metrics, the Flagger templates and every test's input series
                         are those of deploy/metric-contract.json (generated from the
                         exporter's catalog); per-function GPU series read beyond the canary
                         name cold-tier functions only; the Argo/Flagger templates agree
                         with their args, variables and commented examples. With --scrape,
                         a real daemon's /metrics is checked against the contract too (the
                         integration test metric_contract does so).
  selftest               the tier check refuses what it is for
  coverage               every alert fires in a test and stays silent in another (canary
                         alerts against stable series too); every Argo metric and Flagger
                         template is exercised by an analysis test
  render-analysis DIR    the Argo/Flagger queries rendered with test arguments, for
                         `promtool check rules` (DIR/queries.rules.yaml) and `promtool test
                         rules` (the analysis tests with their @argo:/@flagger: placeholders
                         replaced): Argo and Flagger template their queries, promtool cannot
"""
import argparse
import glob
import json
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import (ARGO, DEPLOY, ERRORS, FLAGGER, commented_example, err, finish, load_all,  # noqa: E402
                 load_yaml, ok, rel)
import yaml  # noqa: E402

RULES = os.path.join(DEPLOY, "prometheus", "rules.yaml")
TESTS_GLOB = os.path.join(DEPLOY, "prometheus", "tests", "*.yaml")
ANALYSIS_TESTS_GLOB = os.path.join(DEPLOY, "prometheus", "analysis-tests", "*.yaml")

# ---------------------------------------------------------------------------------
# The metric contract, generated from the exporter's catalog
# (observer/src/metrics/catalog.rs; a unit test keeps the file equal to it).
# name (without prefix) -> (type, extra labels, owner labels: a pod's workload
# labels, a revision's (no pod or container), or none for the node's own)
CONTRACT_FILE = os.path.join(DEPLOY, "metric-contract.json")
with open(CONTRACT_FILE) as _f:
    _CONTRACT = json.load(_f)
CONTRACT = {name: (f["type"], f["labels"], f["owner_labels"]) for name, f in _CONTRACT["families"].items()}
PREFIX = _CONTRACT["prefix"]
WORKLOAD_LABELS = _CONTRACT["workload_labels"]
# Added by the scrape (job, instance) and by the ServiceMonitor relabelling (node).
TARGET_LABELS = ["job", "instance", "node"]
# GPU call families with a series per function, and which functions every process
# has probed (cold) versus only processes canaryscope selected (hot: launches,
# asynchronous copies). Stable processes are not selected, so a comparison that
# can see stable series may only use cold functions.
PER_FUNCTION = {PREFIX_NAME + f for f in _CONTRACT.get("per_function_families", [])
                for PREFIX_NAME in [_CONTRACT["prefix"]]}
COLD_FUNCTIONS = set(_CONTRACT.get("gpu_function_tiers", {}).get("cold", []))
HOT_FUNCTIONS = set(_CONTRACT.get("gpu_function_tiers", {}).get("hot", []))

# ---------------------------------------------------------------------------------
# Metric names and labels


def metric_series():
    """Every exported series name -> allowed label names."""
    out = {}
    for base, (typ, extra, owner) in CONTRACT.items():
        labels = set(extra) | set(TARGET_LABELS) | set(owner)
        name = PREFIX + base
        if typ == "histogram":
            out[name + "_bucket"] = labels | {"le"}
            out[name + "_sum"] = labels
            out[name + "_count"] = labels
        else:
            out[name] = labels
    return out


SERIES = metric_series()
ALL_LABELS = set().union(*SERIES.values()) | {"le"}
NAME_RE = re.compile(r"\b(canaryscope_[A-Za-z0-9_]+)")
SELECTOR_RE = re.compile(r"\b(canaryscope_[A-Za-z0-9_]+)\s*\{([^{}]*)\}")
MATCHER_RE = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
GROUPING_RE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
def check_promql(where, expr):
    for name in NAME_RE.findall(expr):
        if name not in SERIES:
            err("%s: %s is not in the metric contract" % (where, name))
    for name, body in SELECTOR_RE.findall(expr):
        allowed = SERIES.get(name)
        if allowed is None:
            continue
        for part in [p for p in body.split(",") if p.strip()]:
            m = MATCHER_RE.fullmatch(part)
            if not m:
                err("%s: cannot parse matcher %r of %s" % (where, part, name))
                continue
            if m.group(1) not in allowed:
                err("%s: %s has no label %r (has: %s)"
                    % (where, name, m.group(1), ", ".join(sorted(allowed))))
    for group in GROUPING_RE.findall(expr):
        for label in [x.strip() for x in group.split(",") if x.strip()]:
            if label not in ALL_LABELS:
                err("%s: grouping label %r is not exported by canaryscope" % (where, label))


def check_tiers(where, expr, canary=()):
    """A per-function GPU family read beyond the canary must name cold functions only.

    A selector is canary-only when it has track="canary", or one of `canary`, the
    matchers by which a template names the canary: the canary's revision (Argo's
    canary-hash) or Flagger's canary workload (its target; stable is target-primary).
    Returns the problems found.
    """
    problems = []
    for name, body in SELECTOR_RE.findall(expr):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if base not in PER_FUNCTION:
            continue
        matchers = [MATCHER_RE.fullmatch(p) for p in body.split(",") if p.strip()]
        matchers = [m.groups() for m in matchers if m]
        if ("track", "=", "canary") in matchers or any(m in matchers for m in canary):
            continue  # canary processes are selected: every tier is seen there
        functions = [(op, v) for label, op, v in matchers if label == "function"]
        names = set()
        for op, value in functions:
            if op == "=":
                names.add(value)
            elif op == "=~" and re.fullmatch(r"[A-Za-z0-9_|]+", value):
                names |= set(value.split("|"))
            else:
                names.add(None)
        if not functions or None in names:
            problems.append("%s: %s beyond the canary must pin `function` to cold-tier functions "
                "(function=\"...\" or function=~\"a|b\"): hot ones are not probed in stable processes"
                % (where, name))
            continue
        hot = sorted(n for n in names if n not in COLD_FUNCTIONS)
        if hot:
            problems.append("%s: %s compares %s, not cold-tier functions (probed only in selected processes)"
                % (where, name, ", ".join(hot)))
    return problems


def cmd_selftest(_):
    """The tier check catches what it is for (each case: query, expected problems)."""
    print("queries self-test")
    cases = [
        ('rate(canaryscope_gpu_api_calls_total{track="stable",result!="0"}[5m])', 1),
        ('rate(canaryscope_gpu_api_calls_total{function="cuLaunchKernel"}[5m])', 1),
        ('rate(canaryscope_gpu_api_call_failures_total{function=~"hipLaunchKernel|hipInit"}[5m])', 1),
        ('rate(canaryscope_gpu_api_calls_total{function=~"cu.*"}[5m])', 1),
        ('rate(canaryscope_gpu_api_calls_total{function=~"cuInit|cuStreamSynchronize"}[5m])', 0),
        ('rate(canaryscope_gpu_api_calls_total{track="canary"}[5m])', 0),
        ('rate(canaryscope_gpu_init_failures_total{track="stable"}[5m])', 0),
    ]
    for query, want in cases:
        got = len(check_tiers("self-test", query))
        if got != want:
            err("%s: %d problem(s), expected %d" % (query, got, want))
    if not ERRORS:
        ok("the tier check refuses hot or unpinned functions beyond the canary (%d cases)" % len(cases))
    finish("selftest")


def parse_series(spec):
    """'name{a="b",...}' -> (name, {labels})"""
    m = re.fullmatch(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(.*)\})?\s*", spec)
    if not m:
        raise ValueError("bad series %r" % spec)
    labels = {}
    body = m.group(2) or ""
    for part in [p for p in re.findall(r'[A-Za-z_][A-Za-z0-9_]*\s*=\s*"(?:[^"\\]|\\.)*"', body)]:
        k, v = part.split("=", 1)
        labels[k.strip()] = v.strip()[1:-1]
    return m.group(1), labels

# ---------------------------------------------------------------------------------
# Rendering of the Argo / Flagger query templates


def argo_template():
    docs = [d for d in load_all(ARGO) if d.get("kind") == "AnalysisTemplate"]
    if len(docs) != 1:
        raise SystemExit("expected one AnalysisTemplate in %s" % rel(ARGO))
    return docs[0]


def flagger_templates():
    return [d for d in load_all(FLAGGER) if d.get("kind") == "MetricTemplate"]


ARGO_ARG_RE = re.compile(r"\{\{\s*args\.([A-Za-z0-9_.-]+)\s*\}\}")
FLAGGER_VAR_RE = re.compile(r"\{\{\s*([A-Za-z]+)\s*\}\}")
FLAGGER_VARS = {"name", "namespace", "target", "service", "ingress", "route", "interval"}


def render_argo(text, args):
    def sub(m):
        if m.group(1) not in args:
            raise KeyError("args.%s" % m.group(1))
        return str(args[m.group(1)])
    out = ARGO_ARG_RE.sub(sub, text)
    if "{{" in out:
        raise ValueError("unrendered template in %r" % out)
    return out


def render_flagger(text, variables):
    def sub(m):
        if m.group(1) not in variables:
            raise KeyError(m.group(1))
        return str(variables[m.group(1)])
    out = FLAGGER_VAR_RE.sub(sub, text)
    if "{{" in out:
        raise ValueError("unrendered template in %r" % out)
    return out


def argo_defaults():
    return {a["name"]: a["value"] for a in argo_template()["spec"].get("args", []) if "value" in a}


SAMPLE_ARGO_ARGS = {"namespace": "infer", "workload": "zluda-worker", "canary-hash": "7c9d5f"}
SAMPLE_FLAGGER_VARS = {"name": "zluda-worker", "namespace": "infer", "target": "zluda-worker",
                       "service": "zluda-worker", "ingress": "", "route": "", "interval": "1m"}


def rendered_queries():
    """[(where, key, promql)] of every Argo metric and Flagger template, sample values."""
    out = []
    args = dict(argo_defaults())
    args.update(SAMPLE_ARGO_ARGS)
    for m in argo_template()["spec"]["metrics"]:
        q = m["provider"]["prometheus"]["query"]
        out.append(("%s metric %s" % (rel(ARGO), m["name"]), "argo:" + m["name"], render_argo(q, args)))
    for t in flagger_templates():
        out.append(("%s template %s" % (rel(FLAGGER), t["metadata"]["name"]),
                    "flagger:" + t["metadata"]["name"], render_flagger(t["spec"]["query"], SAMPLE_FLAGGER_VARS)))
    return out


# ---------------------------------------------------------------------------------
# contract


SAMPLE_RE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+\S+")
LABEL_RE = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"')


def scraped_series(path):
    """Series name -> the label-name sets its samples carry, from an exposition."""
    seen = {}
    with open(path) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            m = SAMPLE_RE.match(line)
            if not m:
                err("%s: cannot parse sample line %r" % (path, line.strip()))
                continue
            seen.setdefault(m.group(1), set()).add(frozenset(LABEL_RE.findall(m.group(2) or "")))
    return seen


def check_scrape(path):
    """The exporter's real output against the contract: every series it produced is
    declared, with exactly the declared labels. The rule checks then use what was
    scraped for those series."""
    global ALL_LABELS  # noqa: PLW0603 - the rule checks then use what was scraped
    scraped = scraped_series(path)
    for name, label_sets in sorted(scraped.items()):
        if not name.startswith(PREFIX):
            continue
        declared = SERIES.get(name)
        if declared is None:
            err("%s: %s is exported but not in the metric contract" % (rel(path), name))
            continue
        want = declared - set(TARGET_LABELS)
        for labels in label_sets:
            if set(labels) != want:
                err("%s: %s carries labels %s, the contract declares %s"
                    % (rel(path), name, sorted(labels), sorted(want)))
        SERIES[name] = set().union(*label_sets) | set(TARGET_LABELS)
    ALL_LABELS = set().union(*SERIES.values()) | {"le"}
    if not ERRORS:
        ok("%s: %d series names, each with the labels the contract declares"
           % (rel(path), sum(1 for n in scraped if n.startswith(PREFIX))))


def cmd_contract(ns):
    print("metric contract (names and labels)")
    if getattr(ns, "scrape", None):
        check_scrape(ns.scrape)
    rules = load_yaml(RULES)
    for g in rules["groups"]:
        for r in g["rules"]:
            name = r.get("alert") or r.get("record")
            check_promql("%s %s expr" % (rel(RULES), name), r["expr"])
            for problem in check_tiers("%s %s expr" % (rel(RULES), name), r["expr"]):
                err(problem)
            for k, v in (r.get("annotations") or {}).items():
                for n in NAME_RE.findall(v):
                    if n not in SERIES:
                        err("%s %s annotation %s: %s is not in the metric contract" % (rel(RULES), name, k, n))
            if r.get("alert", "").startswith("Canary") and 'track="canary"' in r["expr"]:
                for group in GROUPING_RE.findall(r["expr"]):
                    labels = [x.strip() for x in group.split(",")]
                    if "le" in labels:
                        continue
                    if "workload" not in labels:
                        err("%s %s: aggregation (%s) drops `workload`" % (rel(RULES), name, group))
    canary_by = {
        "argo": [("revision", "=", SAMPLE_ARGO_ARGS["canary-hash"])],
        "flagger": [("workload", "=", SAMPLE_FLAGGER_VARS["target"])],
    }
    for where, key, q in rendered_queries():
        check_promql(where, q)
        for problem in check_tiers(where, q, canary_by[key.split(":")[0]]):
            err(problem)
    if not COLD_FUNCTIONS or not HOT_FUNCTIONS:
        err("%s lists no GPU function tiers" % rel(CONTRACT_FILE))
    # test input series must look like what canaryscope exports
    for path in sorted(glob.glob(TESTS_GLOB)) + sorted(glob.glob(ANALYSIS_TESTS_GLOB)):
        for t in load_yaml(path).get("tests", []):
            for s in t.get("input_series", []):
                name, labels = parse_series(s["series"])
                if name == "up":
                    continue
                allowed = SERIES.get(name)
                if allowed is None:
                    err("%s (%s): input series %s is not in the metric contract" % (rel(path), t.get("name"), name))
                    continue
                extra = set(labels) - allowed
                if extra:
                    err("%s (%s): %s has labels not exported: %s" % (rel(path), t.get("name"), name, sorted(extra)))
                base = name[len(PREFIX):]
                for suffix in ("_bucket", "_sum", "_count"):
                    if base.endswith(suffix) and base[:-len(suffix)] in CONTRACT:
                        base = base[:-len(suffix)]
                missing = set(CONTRACT[base][2]) - set(labels)
                if missing:
                    err("%s (%s): %s lacks owner labels %s" % (rel(path), t.get("name"), name, sorted(missing)))
    if not ERRORS:
        ok("rules, annotations, Argo/Flagger queries and test series use only contract metrics and labels")
    check_argo_flagger(commented_example(ARGO, "Rollout"), commented_example(FLAGGER, "Canary"))
    finish("contract")


# ---------------------------------------------------------------------------------
# coverage


def cmd_coverage(_):
    print("test coverage")
    rules = load_yaml(RULES)
    alerts = [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"] if "alert" in r]
    tests = []
    for path in sorted(glob.glob(TESTS_GLOB)):
        for t in load_yaml(path).get("tests", []):
            tests.append((path, t))
    for alert, expr in alerts:
        fires = silent = with_stable = False
        for _path, t in tests:
            cases = [c for c in t.get("alert_rule_test", []) if c.get("alertname") == alert]
            if not cases:
                continue
            if any(c.get("exp_alerts") for c in cases):
                fires = True
            if any(not c.get("exp_alerts") for c in cases):
                silent = True
            for s in t.get("input_series", []):
                if parse_series(s["series"])[1].get("track") == "stable":
                    with_stable = True
        if not fires:
            err("alert %s has no test where it fires" % alert)
        if not silent:
            err("alert %s has no test where it must stay silent" % alert)
        if 'track="canary"' in expr and not with_stable:
            err("canary alert %s is never tested against stable series" % alert)
    if not ERRORS:
        ok("%d alerts: each fires in a test and stays silent in another; canary alerts see stable series"
           % len(alerts))
    # analysis templates
    used = set()
    for path in sorted(glob.glob(ANALYSIS_TESTS_GLOB)):
        for t in load_yaml(path).get("tests", []):
            for c in t.get("promql_expr_test", []):
                if c["expr"].startswith("@"):
                    used.add(c["expr"][1:].strip())
    keys = [k for _w, k, _q in rendered_queries()]
    for k in keys:
        if k not in used:
            err("analysis query %s is not exercised by any test in %s" % (k, rel(os.path.dirname(ANALYSIS_TESTS_GLOB))))
    for k in used - set(keys):
        err("analysis test refers to unknown query @%s" % k)
    if not ERRORS:
        ok("%d Argo metrics / Flagger templates each exercised by analysis tests" % len(keys))
    finish("coverage")


# ---------------------------------------------------------------------------------
# render-analysis


def cmd_render_analysis(ns):
    out = ns.dir
    os.makedirs(out, exist_ok=True)
    # 1. every query as a recording rule, so that promtool parses all of them
    rules = {"groups": [{"name": "canaryscope-analysis-queries", "rules": []}]}
    for _where, key, q in rendered_queries():
        rules["groups"][0]["rules"].append(
            {"record": "analysis:" + re.sub(r"[^A-Za-z0-9_]", "_", key), "expr": q})
    with open(os.path.join(out, "queries.rules.yaml"), "w") as f:
        yaml.safe_dump(rules, f, sort_keys=False, width=1000)
    with open(os.path.join(out, "empty.rules.yaml"), "w") as f:
        f.write("groups: []\n")
    # 2. analysis tests with @argo:/@flagger: placeholders replaced
    argo = {"argo:" + m["name"]: m["provider"]["prometheus"]["query"] for m in argo_template()["spec"]["metrics"]}
    flagger = {"flagger:" + t["metadata"]["name"]: t["spec"]["query"] for t in flagger_templates()}
    defaults = argo_defaults()
    n = 0
    for path in sorted(glob.glob(ANALYSIS_TESTS_GLOB)):
        doc = load_yaml(path)
        doc["rule_files"] = ["empty.rules.yaml"]
        for t in doc.get("tests", []):
            args = dict(defaults)
            args.update(t.pop("x-argo-args", {}) or {})
            variables = dict(t.pop("x-flagger-vars", {}) or {})
            for c in t.get("promql_expr_test", []):
                e = c["expr"]
                if not e.startswith("@"):
                    continue
                key = e[1:].strip()
                if key in argo:
                    c["expr"] = render_argo(argo[key], args)
                elif key in flagger:
                    c["expr"] = render_flagger(flagger[key], variables)
                else:
                    raise SystemExit("%s: unknown query %s" % (rel(path), e))
                n += 1
        with open(os.path.join(out, os.path.basename(path)), "w") as f:
            yaml.safe_dump(doc, f, sort_keys=False, width=1000)
    print("rendered %d analysis queries and %d test expressions into %s" % (len(argo) + len(flagger), n, out))


def check_argo_flagger(rollout, canary):
    tpl = argo_template()
    declared = {a["name"]: a for a in tpl["spec"].get("args", [])}
    text = json.dumps(tpl["spec"]["metrics"])
    for used in set(ARGO_ARG_RE.findall(text)):
        if used not in declared:
            err("%s: {{args.%s}} is not declared in spec.args" % (rel(ARGO), used))
    for name in declared:
        if name not in ARGO_ARG_RE.findall(text):
            err("%s: arg %s is declared but never used" % (rel(ARGO), name))
    required = {n for n, a in declared.items() if "value" not in a and "valueFrom" not in a}
    if required != {"namespace", "workload", "canary-hash"}:
        err("%s: required args are %s, expected namespace, workload, canary-hash" % (rel(ARGO), sorted(required)))
    for m in tpl["spec"]["metrics"]:
        q = m["provider"]["prometheus"]["query"]
        if 'revision="{{args.canary-hash}}"' not in q.replace(" ", ""):
            err("%s metric %s does not select the canary revision" % (rel(ARGO), m["name"]))
        if "or vector(0)" not in q:
            err("%s metric %s lacks `or vector(0)`" % (rel(ARGO), m["name"]))
    if rollout is not None:
        canary_strategy = rollout["spec"]["strategy"]["canary"]
        uses = [canary_strategy.get("analysis")] + [s["analysis"] for s in canary_strategy.get("steps", []) if "analysis" in s]
        for u in [u for u in uses if u]:
            names = {t.get("templateName") for t in u.get("templates", [])}
            if tpl["metadata"]["name"] not in names:
                err("example Rollout analysis does not reference %s" % tpl["metadata"]["name"])
            given = {a["name"] for a in u.get("args", [])}
            if required - given:
                err("example Rollout analysis misses required args %s" % sorted(required - given))
            if given - set(declared):
                err("example Rollout analysis passes undeclared args %s" % sorted(given - set(declared)))
    mts = {t["metadata"]["name"]: t for t in flagger_templates()}
    for name, t in mts.items():
        for v in set(FLAGGER_VAR_RE.findall(t["spec"]["query"])):
            if v not in FLAGGER_VARS:
                err("%s template %s: unknown variable {{ %s }}" % (rel(FLAGGER), name, v))
        if "or vector(0)" not in t["spec"]["query"]:
            err("%s template %s lacks `or vector(0)`" % (rel(FLAGGER), name))
    if canary is not None:
        refs = set()
        for m in canary["spec"]["analysis"]["metrics"]:
            ref = m.get("templateRef", {})
            refs.add(ref.get("name"))
            t = mts.get(ref.get("name"))
            if t is None:
                err("example Canary references unknown MetricTemplate %s" % ref.get("name"))
            elif ref.get("namespace") != t["metadata"].get("namespace"):
                err("example Canary references %s in namespace %s, it lives in %s"
                    % (ref.get("name"), ref.get("namespace"), t["metadata"].get("namespace")))
            if "thresholdRange" not in m:
                err("example Canary metric %s has no thresholdRange" % m["name"])
        for name in set(mts) - refs:
            err("MetricTemplate %s is not used by the example Canary" % name)
    if not ERRORS:
        ok("Argo args/queries and Flagger variables/templates are consistent with their examples")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("contract")
    p.add_argument("--scrape", help="a /metrics exposition of a real daemon to check against too")
    p.set_defaults(fn=cmd_contract)
    sub.add_parser("selftest").set_defaults(fn=cmd_selftest)
    sub.add_parser("coverage").set_defaults(fn=cmd_coverage)
    p = sub.add_parser("render-analysis")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_render_analysis)
    ns = ap.parse_args()
    ns.fn(ns)


if __name__ == "__main__":
    main()
