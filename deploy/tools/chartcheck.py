#!/usr/bin/env python3
"""Checks of the Helm chart deploy/helm/canaryscope; deploy/check.sh runs `all`.

Subcommands
  all             every check below
  lint            `helm lint --strict` and `helm install --dry-run=client` (which renders
                  NOTES.txt too), default and all-on values
  values          every value values.yaml documents (`## @param`) is typed by
                  values.schema.json and set by a case in REACH below, which renders the
                  chart with it and finds it in the manifests; every render's command
                  lines (the DaemonSet's and the judge's) are taken by the real binary
                  (`canaryscope run|judge --check-config`), and the default render's
                  settings are the ones the daemon runs with given no flag at all
  durations       the schema's duration grammar and the chart's own reading of durations
                  (templates/_helpers.tpl) take exactly what the binary takes
  refused         each case in REFUSED is refused by `helm template` (values.schema.json
                  or a `fail` in templates/_helpers.tpl) with a message naming the value
  readme          the chart README's parameter tables are what readme-generator-for-helm
                  (npm, scripts/setup.sh installs it) makes of values.yaml
  upgrade         selectors and other immutable fields are those of the golden render
                  of chart 0.1.0 (deploy/helm/ci/immutable-fields.yaml): `helm upgrade`
                  must never need a delete
  write-readme    regenerate the README's tables
  write-golden    rewrite the golden render (only with a new major chart version)

Needs helm (and, for readme, readme-generator) on PATH, python3 with PyYAML, and the
canaryscope binary: $CANARYSCOPE_BIN, or target/release/canaryscope (`cargo build
--release -p observer`).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lib as dc  # noqa: E402
from lib import err, ok, finish, by_kind, rel  # noqa: E402

import yaml  # noqa: E402

CHART = dc.CHART
VALUES = os.path.join(CHART, "values.yaml")
SCHEMA = os.path.join(CHART, "values.schema.json")
README = os.path.join(CHART, "README.md")
GOLDEN = os.path.join(dc.DEPLOY, "helm", "ci", "immutable-fields.yaml")
REPO = os.path.dirname(dc.DEPLOY)
# The binary the chart runs: its flags, defaults and grammar are asked of it, never read
# out of its source.
BINARY = os.environ.get("CANARYSCOPE_BIN") or os.path.join(REPO, "target", "release", "canaryscope")


# ---------------------------------------------------------------------------------
# What the rendered manifests are read through


def daemonset(docs):
    return dc.daemonset(docs)


def pod(docs):
    return daemonset(docs)["spec"]["template"]["spec"]


def daemon(docs):
    return next(c for c in pod(docs)["containers"] if c["name"] == "canaryscope")


def args(docs):
    return daemon(docs).get("args", [])


def judge(docs):
    deps = [d for d in by_kind(docs, "Deployment")
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "judge"]
    return deps[0] if len(deps) == 1 else None


def judge_container(docs):
    return judge(docs)["spec"]["template"]["spec"]["containers"][0]


def one(docs, kind):
    found = by_kind(docs, kind)
    return found[0] if len(found) == 1 else None


def role_rules(docs):
    """(group, resource, verbs) the daemon's ClusterRole grants."""
    cr = one(docs, "ClusterRole")
    return [(g, r, tuple(rule["verbs"])) for rule in cr["rules"]
            for g in rule.get("apiGroups", []) for r in rule.get("resources", [])]


def labels(obj):
    return obj["metadata"].get("labels", {})


# ---------------------------------------------------------------------------------
# REACH: one case (at least) per documented value: (value, values to set, what must
# then be true of the rendered objects). Values not at their default, so that a case
# cannot pass by the default alone; each case also fails on the default render
# (checked below), so it shows the value's own effect.

IMAGE = "registry.internal/ai/canaryscope"
DEBIAN_HIP = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5"
TOLERATIONS = [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}}
JUDGE_ON = {"enabled": True}

REACH = [
    ("image.repository", {"image": {"repository": IMAGE}},
     lambda d: daemon(d)["image"] == IMAGE + ":0.1.0"),
    ("image.repository", {"image": {"repository": IMAGE}, "judge": JUDGE_ON},
     lambda d: judge_container(d)["image"] == IMAGE + ":0.1.0"),
    ("image.tag", {"image": {"tag": "0.2.0-rc1"}}, lambda d: daemon(d)["image"] == "canaryscope:0.2.0-rc1"),
    ("image.pullPolicy", {"image": {"pullPolicy": "Always"}}, lambda d: daemon(d)["imagePullPolicy"] == "Always"),
    ("imagePullSecrets", {"imagePullSecrets": [{"name": "registry-internal"}], "judge": JUDGE_ON},
     lambda d: pod(d)["imagePullSecrets"] == [{"name": "registry-internal"}]
     and judge(d)["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "registry-internal"}]),
    ("tolerations", {"tolerations": TOLERATIONS}, lambda d: pod(d)["tolerations"] == TOLERATIONS),
    ("tolerations", {"tolerations": []}, lambda d: "tolerations" not in pod(d)),
    ("nodeSelector", {"nodeSelector": {"node-role.internal/inference": "true"}},
     lambda d: pod(d)["nodeSelector"] == {"kubernetes.io/os": "linux", "node-role.internal/inference": "true"}),
    ("affinity", {"affinity": AFFINITY}, lambda d: pod(d)["affinity"] == AFFINITY),
    ("priorityClassName", {"priorityClassName": "inference-critical"},
     lambda d: pod(d)["priorityClassName"] == "inference-critical"),
    ("priorityClassName", {"priorityClassName": ""}, lambda d: "priorityClassName" not in pod(d)),
    ("resources.requests.cpu", {"resources": {"requests": {"cpu": "75m"}}},
     lambda d: daemon(d)["resources"]["requests"]["cpu"] == "75m"),
    ("resources.requests.memory", {"resources": {"requests": {"memory": "96Mi"}}},
     lambda d: daemon(d)["resources"]["requests"]["memory"] == "96Mi"),
    ("resources.limits.cpu", {"resources": {"limits": {"cpu": "1"}}},
     lambda d: daemon(d)["resources"]["limits"]["cpu"] == "1"),
    ("resources.limits.memory", {"resources": {"limits": {"memory": "512Mi"}}},
     lambda d: daemon(d)["resources"]["limits"]["memory"] == "512Mi"),
    ("updateStrategy.type", {"updateStrategy": {"type": "OnDelete"}},
     lambda d: daemonset(d)["spec"]["updateStrategy"] == {"type": "OnDelete"}),
    ("updateStrategy.rollingUpdate.maxUnavailable", {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "10%"}}},
     lambda d: daemonset(d)["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                                          "rollingUpdate": {"maxUnavailable": "10%"}}),
    ("terminationGracePeriodSeconds", {"terminationGracePeriodSeconds": 1200000},
     lambda d: pod(d)["terminationGracePeriodSeconds"] == 1200000),
    ("podAnnotations", {"podAnnotations": {"inference.internal/owner": "ml-platform"}},
     lambda d: daemonset(d)["spec"]["template"]["metadata"]["annotations"] == {"inference.internal/owner": "ml-platform"}),
    # A library that is there where the checks run (Debian's HIP, scripts/setup.sh), since the
    # binary the arguments are run through checks that a --lib file exists.
    ("extraArgs", {"extraArgs": ["--lib=" + DEBIAN_HIP]}, lambda d: args(d)[-1] == "--lib=" + DEBIAN_HIP),
    ("hold", {"hold": True}, lambda d: "--hold" in args(d)),
    ("readinessGate", {"readinessGate": False},
     lambda d: "--no-readiness-gate" in args(d) and ("", "pods/status", ("patch",)) not in role_rules(d)
     and not by_kind(d, "ValidatingAdmissionPolicy") and not by_kind(d, "ValidatingAdmissionPolicyBinding")),
    ("gateTimeout", {"gateTimeout": "10m"}, lambda d: "--gate-timeout=10m" in args(d)),
    ("gpuInitTimeout", {"gpuInitTimeout": "10m"}, lambda d: "--gpu-init-timeout=10m" in args(d)),
    ("gpuInitTimeout", {"gpuInitTimeout": "0"}, lambda d: "--gpu-init-timeout=0" in args(d)),
    ("gpuResources", {"gpuResources": ["example.com/fpga", "example.com/accel-*"]},
     lambda d: [a for a in args(d) if a.startswith("--gpu-resource=")]
     == ["--gpu-resource=example.com/fpga", "--gpu-resource=example.com/accel-*"]),
    ("hotCalls", {"hotCalls": "all"}, lambda d: "--hot-calls=all" in args(d)),
    ("hotCalls", {"hotCalls": "none"}, lambda d: "--hot-calls=none" in args(d)),
    ("hotDetail", {"hotDetail": "timed"}, lambda d: "--hot-detail=timed" in args(d)),
    ("hotWindow", {"hotWindow": "15m"}, lambda d: "--hot-window=15m" in args(d)),
    ("stallThreshold", {"stallThreshold": "30s"}, lambda d: "--stall-threshold=30s" in args(d)),
    ("probes", {"probes": ["gpu", "exits"]}, lambda d: "--probes=gpu,exits" in args(d)),
    ("trackLabel", {"trackLabel": "canary.internal/track"}, lambda d: "--track-label=canary.internal/track" in args(d)),
    ("cgroups", {"cgroups": ["/solver.slice", "/batch.slice"]},
     lambda d: [a for a in args(d) if a.startswith("--cgroup=")] == ["--cgroup=/solver.slice", "--cgroup=/batch.slice"]),
    ("maxCgroups", {"maxCgroups": 2000000}, lambda d: "--max-cgroups=2000000" in args(d)),
    ("seriesGrace", {"seriesGrace": "15m"}, lambda d: "--series-grace=15m" in args(d)),
    ("serviceMonitor.enabled", {"serviceMonitor": {"enabled": False}},
     lambda d: not by_kind(d, "ServiceMonitor") and not by_kind(d, "Role")),
    ("serviceMonitor.labels", {"serviceMonitor": {"labels": {"release": "kube-prometheus-stack"}}},
     lambda d: labels(one(d, "ServiceMonitor")).get("release") == "kube-prometheus-stack"),
    ("serviceMonitor.interval", {"serviceMonitor": {"interval": "30s"}},
     lambda d: one(d, "ServiceMonitor")["spec"]["endpoints"][0]["interval"] == "30s"),
    ("serviceMonitor.discoveryRole.serviceAccount",
     {"serviceMonitor": {"discoveryRole": {"serviceAccount": "kube-prometheus-stack-prometheus"}}},
     lambda d: one(d, "RoleBinding")["subjects"][0]["name"] == "kube-prometheus-stack-prometheus"),
    ("serviceMonitor.discoveryRole.serviceAccount", {"serviceMonitor": {"discoveryRole": {"serviceAccount": ""}}},
     lambda d: not by_kind(d, "Role") and not by_kind(d, "RoleBinding")),
    ("serviceMonitor.discoveryRole.namespace", {"serviceMonitor": {"discoveryRole": {"namespace": "observability"}}},
     lambda d: one(d, "RoleBinding")["subjects"][0]["namespace"] == "observability"),
    ("prometheusRule.enabled", {"prometheusRule": {"enabled": False}}, lambda d: not by_kind(d, "PrometheusRule")),
    ("prometheusRule.labels", {"prometheusRule": {"labels": {"release": "kube-prometheus-stack"}}},
     lambda d: labels(one(d, "PrometheusRule")).get("release") == "kube-prometheus-stack"),
    ("dashboard.enabled", {"dashboard": {"enabled": False}}, lambda d: not by_kind(d, "ConfigMap")),
    ("dashboard.labels", {"dashboard": {"labels": {"grafana_folder": "canary"}}},
     lambda d: labels(one(d, "ConfigMap")) == {"grafana_dashboard": "1", "grafana_folder": "canary"}),
    ("gateAdmissionPolicy.enabled", {"gateAdmissionPolicy": {"enabled": False}},
     lambda d: not by_kind(d, "ValidatingAdmissionPolicy") and not by_kind(d, "ValidatingAdmissionPolicyBinding")),
    ("createNamespace", {"createNamespace": True},
     lambda d: labels(one(d, "Namespace")).get("pod-security.kubernetes.io/enforce") == "privileged"),
    ("judge.enabled", {"judge": JUDGE_ON},
     lambda d: judge(d) is not None and {s["metadata"]["name"] for s in by_kind(d, "Service")}
     == {"canaryscope-judge", "canaryscope"}),
    ("judge.replicas", {"judge": {"enabled": True, "replicas": 3}}, lambda d: judge(d)["spec"]["replicas"] == 3),
    ("judge.prometheusUrl", {"judge": {"enabled": True, "prometheusUrl": "http://prometheus.observability.svc:9091/prom"}},
     lambda d: "--prometheus=http://prometheus.observability.svc:9091/prom" in judge_container(d)["args"]),
    ("judge.extraArgs", {"judge": {"enabled": True, "extraArgs": ["--alpha=0.01"]}},
     lambda d: judge_container(d)["args"][-1] == "--alpha=0.01"),
    ("judge.resources.requests.cpu", {"judge": {"enabled": True, "resources": {"requests": {"cpu": "20m"}}}},
     lambda d: judge_container(d)["resources"]["requests"]["cpu"] == "20m"),
    ("judge.resources.requests.memory", {"judge": {"enabled": True, "resources": {"requests": {"memory": "32Mi"}}}},
     lambda d: judge_container(d)["resources"]["requests"]["memory"] == "32Mi"),
    ("judge.resources.limits.memory", {"judge": {"enabled": True, "resources": {"limits": {"memory": "128Mi"}}}},
     lambda d: judge_container(d)["resources"]["limits"]["memory"] == "128Mi"),
]

# Renders away from the default release or Kubernetes version: (what, release,
# kube version, values, check).
SPECIAL = [
    ("the admission policy is left out before Kubernetes 1.30", ("canaryscope", "canaryscope"), "1.29.0", {},
     lambda d: not by_kind(d, "ValidatingAdmissionPolicy") and not by_kind(d, "ValidatingAdmissionPolicyBinding")),
    ("another release in another namespace: names, bindings and the policy's user follow it",
     ("gpu-observer", "observability"), None, {},
     lambda d: daemonset(d)["metadata"]["name"] == "gpu-observer-canaryscope"
     and daemonset(d)["metadata"]["namespace"] == "observability"
     and pod(d)["serviceAccountName"] == "gpu-observer-canaryscope"
     and one(d, "ClusterRoleBinding")["subjects"][0] == {"kind": "ServiceAccount", "name": "gpu-observer-canaryscope",
                                                         "namespace": "observability"}
     and "system:serviceaccount:observability:gpu-observer-canaryscope"
     in one(d, "ValidatingAdmissionPolicy")["spec"]["matchConditions"][0]["expression"]),
    ("the default render tolerates every taint and runs on Linux nodes", ("canaryscope", "canaryscope"), None, {},
     lambda d: pod(d)["tolerations"] == [{"operator": "Exists"}]
     and pod(d)["nodeSelector"] == {"kubernetes.io/os": "linux"} and judge(d) is None
     and not by_kind(d, "Namespace")),
]

# REFUSED: values `helm template` must refuse, and what its message must name.
REFUSED = [
    ({"hotCalls": "some"}, ["/hotCalls", "'selected', 'all', 'none'"]),
    ({"hotDetail": "deep"}, ["/hotDetail"]),
    ({"terminationGracePeriodSeconds": -30}, ["/terminationGracePeriodSeconds", "minimum"]),
    ({"tolerations": [{"key": "amd.com/gpu", "operator": "Exist"}]}, ["/tolerations/0/operator"]),
    ({"tolerations": ["amd.com/gpu"]}, ["/tolerations/0", "want object"]),
    ({"tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "efect": "NoSchedule"}]}, ["/tolerations/0", "efect"]),
    ({"tolerations": [{"key": "amd.com/gpu", "effect": "NoSchedul"}]}, ["/tolerations/0/effect"]),
    ({"tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "value": "true"}]},
     ["tolerations[0]", "Exists takes no value"]),
    ({"tolerations": [{"effect": "NoSchedule"}]}, ["tolerations[0]", "without a key"]),
    ({"tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}]},
     ["tolerations[0]", "tolerationSeconds"]),
    ({"tolerations": {"operator": "Exists"}}, ["/tolerations", "want array"]),
    ({"hotcalls": "all"}, ["'hotcalls' not allowed"]),
    ({"serviceMonitor": {"enable": False}}, ["/serviceMonitor", "'enable' not allowed"]),
    ({"hotWindow": "500ms"}, ["hotWindow", "shorter than 1s"]),
    ({"hotWindow": "10 minutes"}, ["/hotWindow"]),
    ({"gateTimeout": "0.5s"}, ["gateTimeout", "shorter than 1s"]),
    ({"gateTimeout": "10m", "readinessGate": False}, ["gateTimeout", "readinessGate"]),
    ({"gpuInitTimeout": "0.5s"}, ["gpuInitTimeout", "shorter than 1s"]),
    ({"gpuInitTimeout": "5 minutes"}, ["/gpuInitTimeout"]),
    ({"gpuResources": ["fpga"]}, ["/gpuResources/0"]),
    ({"gpuResources": ["example.com/*gpu"]}, ["/gpuResources/0"]),
    ({"stallThreshold": "0s"}, ["stallThreshold"]),
    ({"seriesGrace": "5d"}, ["/seriesGrace"]),
    ({"seriesGrace": 300}, ["/seriesGrace", "want string"]),
    ({"probes": []}, ["/probes"]),
    ({"probes": ["gpu", "net"]}, ["/probes/1"]),
    ({"probes": ["gpu", "gpu"]}, ["/probes"]),
    ({"hold": True, "probes": ["cpu", "exits"]}, ["hold", "gpu"]),
    ({"hold": "yes"}, ["/hold", "want boolean"]),
    ({"readinessGate": "false"}, ["/readinessGate", "want boolean"]),
    ({"cgroups": ["/sys/fs/cgroup/solver.slice"]}, ["cgroups[0]", "/proc/PID/cgroup"]),
    ({"cgroups": ["/solver.slice/../batch.slice"]}, ["cgroups[0]", ".."]),
    ({"cgroups": ["solver.slice"]}, ["/cgroups/0"]),
    ({"maxCgroups": 0}, ["/maxCgroups"]),
    ({"maxCgroups": "5000"}, ["/maxCgroups", "want integer"]),
    ({"trackLabel": "canary track"}, ["/trackLabel"]),
    ({"image": {"pullPolicy": "Sometimes"}}, ["/image/pullPolicy"]),
    ({"image": {"repository": "Registry.Internal/canaryscope"}}, ["/image/repository"]),
    ({"imagePullSecrets": ["registry-internal"]}, ["/imagePullSecrets/0", "want object"]),
    ({"nodeSelector": {"node-role.internal/inference": True}}, ["/nodeSelector/node-role.internal~1inference"]),
    ({"affinity": {"nodeAfinity": {}}}, ["/affinity", "'nodeAfinity' not allowed"]),
    ({"priorityClassName": "System Node Critical"}, ["/priorityClassName"]),
    ({"podAnnotations": {"inference.internal/replicas": 3}}, ["/podAnnotations", "want string"]),
    ({"resources": {"requests": {"cpu": "lots"}}}, ["/resources/requests/cpu"]),
    ({"resources": {"request": {"cpu": "50m"}}}, ["/resources", "'request' not allowed"]),
    ({"updateStrategy": {"type": "Recreate"}}, ["/updateStrategy/type"]),
    ({"updateStrategy": {"rollingUpdate": {"maxUnavailable": "ten"}}}, ["/updateStrategy/rollingUpdate/maxUnavailable"]),
    ({"extraArgs": ["--listen=0.0.0.0:9999"]}, ["extraArgs[0]", "port 9464"]),
    ({"extraArgs": ["hold"]}, ["/extraArgs/0"]),
    ({"serviceMonitor": {"interval": "15 seconds"}}, ["/serviceMonitor/interval"]),
    ({"serviceMonitor": {"labels": {"release": 1}}}, ["/serviceMonitor/labels/release"]),
    ({"createNamespace": "true"}, ["/createNamespace", "want boolean"]),
    ({"judge": {"enabled": True, "prometheusUrl": "prometheus-k8s.monitoring.svc:9090"}}, ["/judge/prometheusUrl"]),
    # The judge's client speaks no TLS: an https URL would crash-loop the judge.
    ({"judge": {"enabled": True, "prometheusUrl": "https://prometheus-k8s.monitoring.svc:9091"}},
     ["/judge/prometheusUrl"]),
    ({"judge": {"enabled": True, "replicas": -1}}, ["/judge/replicas"]),
    ({"judge": {"enabled": True, "extraArgs": "--alpha=0.01"}}, ["/judge/extraArgs", "want array"]),
]


# ---------------------------------------------------------------------------------
# Documentation of the values


def documented():
    """The values documented in values.yaml, in order: `## @param NAME [...] text`."""
    with open(VALUES) as f:
        return [m.group(1) for m in re.finditer(r"^\s*##\s*@param\s+(\S+)", f.read(), re.M)]


def schema_node(schema, path):
    """The schema of a dotted value path, or None where the schema does not take it."""
    node = schema
    for part in path.split("."):
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].split("/")[-1]]
        props = node.get("properties", {})
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    while "$ref" in node:
        node = schema["definitions"][node["$ref"].split("/")[-1]]
    return node


# ---------------------------------------------------------------------------------
# Through the binary: the chart's command lines parsed by the real `canaryscope`


class BinaryMissing(Exception):
    pass


def binary():
    if not os.access(BINARY, os.X_OK):
        raise BinaryMissing("%s is not there: build it (cargo build --release -p observer) or name it "
                            "in CANARYSCOPE_BIN" % BINARY)
    return BINARY


def pod_env(container):
    """The container's environment as its process sees it in the pod: the literal values,
    a stand-in for each value the kubelet fills in (the node's name), and the in-cluster
    API's address, which the daemon takes as the sign it runs in a cluster."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    for e in container.get("env", []):
        env[e["name"]] = e["value"] if "value" in e else "stand-in-" + e["name"].lower().replace("_", "-")
    return env


def check_config(argv, env):
    """(settings printed, None) when `canaryscope ARGV` with --check-config takes the command
    line, else (None, its error): `--check-config` goes right after the subcommand, so no
    flag of the chart's can take it as its value."""
    p = subprocess.run([binary(), argv[0], "--check-config"] + list(argv[1:]), env=env,
                       capture_output=True, text=True, timeout=60)
    if p.returncode == 0:
        return p.stdout, None
    return None, "exit %d: %s" % (p.returncode, (p.stderr.strip() or p.stdout.strip()))


def containers_of(docs):
    """(what, container) for each container the chart runs the binary in."""
    out = [("the DaemonSet's `canaryscope run`", daemon(docs))]
    if judge(docs) is not None:
        out.append(("the judge's `canaryscope judge`", judge_container(docs)))
    return out


def refused_by_binary(docs):
    """The binary's errors for the command lines of a render, one line each."""
    problems = []
    for what, c in containers_of(docs):
        # No command: the image's entrypoint, /usr/bin/canaryscope (`cargo xtask image` checks it).
        if c.get("command", ["/usr/bin/canaryscope"]) != ["/usr/bin/canaryscope"]:
            problems.append("%s: command %s is not the image's /usr/bin/canaryscope" % (what, c["command"]))
            continue
        _out, problem = check_config(c.get("args", []), pod_env(c))
        if problem:
            problems.append("%s refuses %s: %s" % (what, " ".join(c.get("args", [])), problem))
    return problems


def check_values():
    print("chart values: documented, typed, reaching the manifests, the daemon's defaults")
    with open(SCHEMA) as f:
        schema = json.load(f)
    with open(VALUES) as f:
        values = yaml.safe_load(f)
    params = documented()
    before = len(dc.ERRORS)
    for p in params:
        if schema_node(schema, p) is None:
            err("%s documents %s, which %s does not type" % (rel(VALUES), p, rel(SCHEMA)))
    for top in schema["properties"]:
        if top != "global" and not any(p == top or p.startswith(top + ".") for p in params):
            err("%s types %s, which %s does not document (## @param)" % (rel(SCHEMA), top, rel(VALUES)))
    for top in values:
        if top not in schema["properties"]:
            err("%s has %s, which %s does not type" % (rel(VALUES), top, rel(SCHEMA)))
    if len(dc.ERRORS) == before:
        ok("%d documented values, each typed by values.schema.json, and nothing untyped" % len(params))

    # Each documented value has a case; each case names a documented value.
    before = len(dc.ERRORS)
    cased = {p for p, _v, _c in REACH}
    for p in params:
        if p not in cased:
            err("%s is documented but no case in chartcheck.py REACH shows it reaching the manifests" % p)
    for p in sorted(cased - set(params)):
        err("chartcheck.py REACH has a case for %s, which values.yaml does not document" % p)

    # Render every case (and the default) and look.
    def render(overrides, release=dc.BASE_RELEASE, kube_version=None):
        try:
            return dc.helm_docs(release=release, overrides=overrides, kube_version=kube_version), None
        except dc.RenderError as e:
            return None, str(e)

    with ThreadPoolExecutor(max_workers=2) as pool:
        default_job = pool.submit(render, {})
        allon_job = pool.submit(lambda: dc.helm_docs(release=dc.ALL_ON_RELEASE, values=[dc.ALL_ON_VALUES]))
        jobs = [(p, v, c, pool.submit(render, v)) for p, v, c in REACH]
        special = [(w, c, pool.submit(render, v, rel_, kv)) for w, rel_, kv, v, c in SPECIAL]
    default, problem = default_job.result()
    if problem:
        err("the default values do not render: %s" % problem)
        return
    try:
        allon = allon_job.result()
    except dc.RenderError as e:
        err("the all-on values do not render: %s" % e)
        return
    for p, v, check, job in jobs:
        docs, problem = job.result()
        shown = json.dumps(v, separators=(",", ":"))
        if problem:
            err("%s: %s does not render: %s" % (p, shown, problem))
            continue
        try:
            reached = bool(check(docs))
        except (KeyError, IndexError, TypeError, StopIteration) as e:
            reached = False
            shown += " (%s: %s)" % (type(e).__name__, e)
        try:
            by_default = bool(check(default))
        except (KeyError, IndexError, TypeError, StopIteration, AttributeError):
            by_default = False
        if not reached:
            err("%s: setting %s does not show in the rendered manifests" % (p, shown))
        elif by_default:
            err("%s: the case %s also holds with the default values, so it shows nothing" % (p, shown))
        for problem in refused_by_binary(docs):
            err("%s: with %s, %s" % (p, shown, problem))
    for what, check, job in special:
        docs, problem = job.result()
        if problem or not check(docs):
            err("%s: does not hold%s" % (what, ": " + problem if problem else ""))
        else:
            ok(what)
    for label, docs in (("the default values", default), ("the all-on values", allon)):
        for problem in refused_by_binary(docs):
            err("%s: %s" % (label, problem))
    if len(dc.ERRORS) == before:
        ok("%d cases: each of the %d documented values, set away from its default, reaches the manifests, "
           "and the binary takes every render's command lines" % (len(REACH), len(params)))

    # The chart's defaults are the daemon's (values.yaml says so): the settings the daemon
    # prints for the default render's command line are those it has given no flag at all.
    before = len(dc.ERRORS)
    c = daemon(default)
    chart_settings, problem = check_config(c["args"], pod_env(c))
    bare_settings, bare_problem = check_config(["run"], pod_env(c))
    if problem or bare_problem:
        err("the daemon refuses %s: %s" % ("the default render" if problem else "no flags", problem or bare_problem))
    elif chart_settings != bare_settings:
        import difflib
        diff = [l for l in difflib.unified_diff(bare_settings.splitlines(), chart_settings.splitlines(),
                                                "no flags", "the chart's defaults", lineterm="", n=0)
                if l[:1] in "+-" and l[:3] not in ("+++", "---")]
        err("the default render runs the daemon away from its own defaults:\n      %s"
            % "\n      ".join(diff))
    if len(dc.ERRORS) == before:
        ok("the default render's settings are the daemon's own defaults (canaryscope run --check-config)")


# Duration spellings to try on both sides: numbers of each shape, with the units the
# binary takes and ones a user might try (Go's, Kubernetes', Prometheus').
DURATION_NUMBERS = ["0", "1", "10", "007", "1.5", "0.25", ".5", "5.", "1e3", "-1"]
DURATION_UNITS = ["", "ns", "us", "µs", "ms", "s", "m", "h", "d", "w", "y", "min", "sec", "S", "M", "H",
                  "h30m", " s"]
# Around the one-second floor of --hot-window, --gate-timeout and --gpu-init-timeout, in
# each unit, so that the chart's own reading of a duration (templates/_helpers.tpl,
# canaryscope.seconds) is held to the binary's.
NEAR_ONE_SECOND = ["999ms", "1000ms", "1s", "0.999s", "1", "0.5", "999999us", "1000000us", "1000000µs",
                   "999999999ns", "1000000000ns", "0.0166m", "0.017m", "0.0002h", "0.0003h"]


def binary_takes(flag, value):
    """None when `canaryscope run` takes FLAG=VALUE, else its error."""
    _out, problem = check_config(["run", "--no-kubernetes", "%s=%s" % (flag, value)],
                                 {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    return problem


def check_durations():
    print("durations: the schema's grammar and the chart's reading of it are the binary's")
    with open(SCHEMA) as f:
        pattern = re.compile(json.load(f)["definitions"]["duration"]["pattern"])
    before = len(dc.ERRORS)
    tried = 0
    for number in DURATION_NUMBERS:
        for unit in DURATION_UNITS:
            text = number + unit
            schema = pattern.search(text) is not None
            refused = binary_takes("--series-grace", text)
            tried += 1
            if schema and refused:
                err("values.schema.json takes the duration %r, which the binary refuses: %s" % (text, refused))
            # The units are the binary's: for a plain number, the schema takes what it takes.
            if number == "10" and not schema and not refused:
                err("the binary takes the duration %r, which values.schema.json refuses: its unit list "
                    "is not the binary's" % text)

    def render(value):
        try:
            dc.helm_template(overrides={"hotWindow": value, "gateTimeout": value, "gpuInitTimeout": value})
            return None
        except dc.RenderError as e:
            return str(e)

    with ThreadPoolExecutor(max_workers=2) as pool:
        renders = list(pool.map(render, NEAR_ONE_SECOND))
    for value, chart_refusal in zip(NEAR_ONE_SECOND, renders):
        for flag in ("--hot-window", "--gate-timeout", "--gpu-init-timeout"):
            refused = binary_takes(flag, value)
            if bool(chart_refusal) != bool(refused):
                err("%s=%s: the chart %s, the binary %s" % (
                    flag, value, "refuses it (%s)" % chart_refusal.splitlines()[0] if chart_refusal else "takes it",
                    "refuses it (%s)" % refused if refused else "takes it"))
    if len(dc.ERRORS) == before:
        ok("%d spellings: the schema takes none the binary refuses, and every unit the binary takes; "
           "%d values near 1s: hotWindow, gateTimeout and gpuInitTimeout refused by the chart as by the binary"
           % (tried, len(NEAR_ONE_SECOND)))


def check_refused():
    print("chart values: bad ones refused, with a message naming the value")
    before = len(dc.ERRORS)

    def render(overrides):
        try:
            dc.helm_template(overrides=overrides)
            return None
        except dc.RenderError as e:
            return str(e)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(render, [v for v, _m in REFUSED]))
    for (v, must), message in zip(REFUSED, results):
        shown = json.dumps(v, separators=(",", ":"))
        if message is None:
            err("%s was accepted; it must be refused" % shown)
            continue
        missing = [m for m in must if m not in message]
        if missing:
            err("%s was refused, but the message does not say %s:\n      %s"
                % (shown, ", ".join(repr(m) for m in missing), message.replace("\n", "\n      ")))
    if len(dc.ERRORS) == before:
        ok("%d bad values refused, each naming the value" % len(REFUSED))


def check_lint():
    print("helm lint")
    for label, release, values in (("default values", dc.BASE_RELEASE, []),
                                   ("all-on values", dc.ALL_ON_RELEASE, [dc.ALL_ON_VALUES])):
        a = ["helm", "lint", "--strict", CHART, "--namespace", release[1]]
        for v in values:
            a += ["--values", v]
        try:
            dc.run_tool(a)
            ok("helm lint --strict, %s" % label)
        except dc.RenderError as e:
            err(str(e))
        # `helm template` leaves NOTES.txt out; a client-side dry run renders it too.
        a = ["helm", "install", release[0], CHART, "--namespace", release[1], "--dry-run=client"]
        for v in values:
            a += ["--values", v]
        try:
            out = dc.run_tool(a)
            if "\nNOTES:\n" not in out or "rollout status ds/" not in out:
                err("helm install --dry-run=client, %s: no NOTES" % label)
            else:
                ok("helm install --dry-run=client renders NOTES.txt, %s" % label)
        except dc.RenderError as e:
            err(str(e))


def generated_readme():
    """The README as readme-generator-for-helm makes it from values.yaml."""
    exe = shutil.which("readme-generator")
    if exe is None:
        raise dc.RenderError("readme-generator is not on PATH: scripts/setup.sh (or deploy/check.sh "
                             "--install-deps) installs it (npm @bitnami/readme-generator-for-helm)")
    fd, tmp = tempfile.mkstemp(suffix=".md", prefix="canaryscope-chart-readme-")
    os.close(fd)
    try:
        shutil.copy(README, tmp)
        p = subprocess.run([exe, "--values", VALUES, "--readme", tmp], capture_output=True, text=True)
        if p.returncode != 0:
            raise dc.RenderError("readme-generator refused %s:\n%s" % (rel(VALUES), (p.stdout + p.stderr).strip()))
        with open(tmp) as f:
            return f.read()
    finally:
        os.unlink(tmp)


def check_readme():
    print("chart README == what readme-generator-for-helm makes of values.yaml")
    try:
        text = generated_readme()
    except dc.RenderError as e:
        err(str(e))
        return
    with open(README) as f:
        have = f.read()
    if have != text:
        import difflib
        print("\n".join(list(difflib.unified_diff(have.splitlines(), text.splitlines(), rel(README),
                                                   "generated", lineterm="", n=1))[:40]))
        err("%s is not what values.yaml documents: run python3 deploy/tools/chartcheck.py write-readme"
            % rel(README))
    else:
        ok("%s lists every value as values.yaml documents it (%d values)" % (rel(README), len(documented())))


# ---------------------------------------------------------------------------------
# Upgrades: fields Kubernetes will not change in place


def immutable_fields(docs):
    """{kind/name: {field: value}} of what an upgrade could only change by a delete."""
    out = {}
    for d in docs:
        key = "%s/%s" % (d["kind"], d["metadata"]["name"])
        fields = {}
        if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
            fields["spec.selector"] = d["spec"]["selector"]
        if d["kind"] == "Service":
            fields["spec.clusterIP"] = d["spec"].get("clusterIP", "(allocated)")
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding"):
            fields["roleRef"] = d["roleRef"]
        if fields:
            out[key] = fields
    return out


GOLDEN_RENDERS = (("default values", dc.BASE_RELEASE, []),
                  ("all-on values", dc.ALL_ON_RELEASE, [dc.ALL_ON_VALUES]))


def current_immutable():
    return {label: immutable_fields(dc.helm_docs(release=release, values=values))
            for label, release, values in GOLDEN_RENDERS}


def check_upgrade():
    print("upgrades: immutable fields == the golden render of chart 0.1.0")
    try:
        now = current_immutable()
    except dc.RenderError as e:
        err(str(e))
        return
    with open(GOLDEN) as f:
        golden = yaml.safe_load(f)["renders"]
    before = len(dc.ERRORS)
    for label, objects in golden.items():
        for key, fields in objects.items():
            have = now.get(label, {}).get(key)
            if have is None:
                err("%s: %s is gone from the render: a rename breaks what refers to it, and "
                    "`helm upgrade` deletes the old one" % (label, key))
                continue
            for field, value in fields.items():
                if have.get(field) != value:
                    err("%s: %s %s changed from %s to %s: Kubernetes does not change it in place, so "
                        "`helm upgrade` would fail until the object is deleted"
                        % (label, key, field, json.dumps(value), json.dumps(have.get(field))))
    if len(dc.ERRORS) == before:
        ok("selectors, headless Services and role references as in %s (%d objects)"
           % (rel(GOLDEN), sum(len(o) for o in golden.values())))


def write_golden(_):
    text = ("# Golden render of chart 0.1.0: the fields of its objects that Kubernetes will not\n"
            "# change in place (selectors, a Service's clusterIP, a binding's roleRef), for the\n"
            "# default and the all-on values. deploy/tools/chartcheck.py upgrade fails when a\n"
            "# render differs: `helm upgrade` must never need a delete. Rewrite it\n"
            "# (chartcheck.py write-golden) only with a new major chart version.\n")
    text += yaml.safe_dump({"chart": "0.1.0", "renders": current_immutable()}, sort_keys=True)
    with open(GOLDEN, "w") as f:
        f.write(text)
    print("wrote %s" % rel(GOLDEN))


def write_readme(_):
    text = generated_readme()
    with open(README, "w") as f:
        f.write(text)
    print("wrote %s" % rel(README))


def run(checks, what):
    for c in checks:
        try:
            c()
        except BinaryMissing as e:
            err(str(e))
    finish(what)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    table = {"lint": [check_lint], "values": [check_values], "durations": [check_durations],
             "refused": [check_refused], "readme": [check_readme], "upgrade": [check_upgrade]}
    table["all"] = [check_lint, check_values, check_durations, check_refused, check_readme, check_upgrade]
    for name, checks in table.items():
        sub.add_parser(name).set_defaults(fn=lambda _ns, c=checks, n=name: run(c, "chart " + n))
    sub.add_parser("write-readme").set_defaults(fn=write_readme)
    sub.add_parser("write-golden").set_defaults(fn=write_golden)
    ns = ap.parse_args()
    ns.fn(ns)


if __name__ == "__main__":
    main()
