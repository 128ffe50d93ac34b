"""What deploy/tools' checks share: where deploy/ keeps things, how a check reports,
and the two renderers (`helm template`, `kubectl kustomize`) run as the real tools.

Not a command. deploy/check.sh runs the checks that import it (queries.py,
policy.py, crds.py, gatecel.py, chartcheck.py) and render.py, which writes the
kustomize base.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


try:
    import yaml
except ImportError:  # pragma: no cover
    sys.stderr.write("deploy/tools: PyYAML is missing: apt-get install python3-yaml "
                     "(or pip install PyYAML)\n")
    sys.exit(2)

DEPLOY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(DEPLOY, "helm", "canaryscope")
BASE_VALUES = os.path.join(DEPLOY, "helm", "base-values.yaml")
ALL_ON_VALUES = os.path.join(DEPLOY, "helm", "ci", "all-on-values.yaml")
# (release, namespace) of the kustomize base's render, and of the all-on render: another
# name and namespace, so that a name hard-coded in a template shows.
BASE_RELEASE = ("canaryscope", "canaryscope")
ALL_ON_RELEASE = ("inference-observer", "observability")
ARGO = os.path.join(DEPLOY, "argo-analysistemplate.yaml")
FLAGGER = os.path.join(DEPLOY, "flagger-metrictemplate.yaml")
JUDGE_ARGO = os.path.join(DEPLOY, "judge", "argo-analysistemplate.yaml")
JUDGE_FLAGGER = os.path.join(DEPLOY, "judge", "flagger-canary-example.yaml")
GATE_POLICY = os.path.join(DEPLOY, "gate-admission-policy.yaml")
GATE_CONDITION = "canaryscope.io/gpu-runtime"

ERRORS = []


def err(msg):
    ERRORS.append(msg)
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


def by_kind(docs, kind, name=None):
    return [d for d in docs if d.get("kind") == kind and (name is None or d["metadata"]["name"] == name)]


def daemonset(docs):
    """The daemon's DaemonSet, whatever the release calls it."""
    ds = by_kind(docs, "DaemonSet")
    return ds[0] if len(ds) == 1 else None


BLOCK_RE = r"^# --- begin example {kind} ---\n(.*?)^# --- end example {kind} ---$"


def commented_example(path, kind):
    """The example object a manifest carries as a commented block (a Rollout, a Canary)."""
    with open(path) as f:
        text = f.read()
    m = re.search(BLOCK_RE.format(kind=kind), text, re.S | re.M)
    if not m:
        err("%s: no commented example %s block" % (rel(path), kind))
        return None
    lines = []
    for line in m.group(1).splitlines():
        if not line.startswith("#"):
            err("%s: uncommented line inside example %s: %r" % (rel(path), kind, line))
            return None
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return yaml.safe_load("\n".join(lines))


# ---------------------------------------------------------------------------------
# Rendering, with the real tools: `helm template` for the chart, `kubectl kustomize`
# for the kustomizations (deploy/tools/install-tools.sh installs both).

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


def kustomize(directory):
    """`kubectl kustomize` of a directory."""
    return [d for d in yaml.safe_load_all(run_tool(["kubectl", "kustomize", directory])) if d is not None]
