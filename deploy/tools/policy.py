#!/usr/bin/env python3
"""The project's own policy for what deploy/ installs: python3 deploy/tools/policy.py ROLE=FILE...

Schemas say what Kubernetes accepts; this says what canaryscope allows itself, which
no tool knows (deploy/check.sh step 9 passes it the renders of kubectl kustomize and
helm template):
  - the daemon: hostPID and nothing more of the host's namespaces; capabilities BPF and
    PERFMON plus a listed few, each with a comment saying why (in the chart's template,
    in every helm render, and in deploy/daemonset.yaml); read-only hostPath mounts;
    probes, resources; Service and ServiceMonitor selecting it, job="canaryscope";
  - RBAC: the daemon reads pods and argoproj.io rollouts and patches pods/status,
    nothing else, and without the readiness gate not even that;
  - the judge: unprivileged, tokenless, probed on /healthz and served on 9808;
  - deploy/examples: the readiness gate declared, no exec readiness probe, a liveness
    probe kept; deploy/kustomization.yaml lists every manifest.

ROLE is what FILE is: base (deploy/), secure (deploy/ + secure/), judge (deploy/judge/),
or chart (a helm render: comments kept; the judge checked when rendered).
"""
import glob
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import (CHART, DEPLOY, ERRORS, GATE_CONDITION, by_kind, daemonset, err, finish, load_all,  # noqa: E402
                 load_yaml, ok, parse_render, rel)


def daemon_args(docs):
    ds = daemonset(docs)
    if ds is None:
        return []
    return next((c.get("args", []) for c in ds["spec"]["template"]["spec"]["containers"]
                 if c["name"] == "canaryscope"), [])


def gate_on(docs):
    """Whether the daemon keeps the readiness gate (it does unless told not to)."""
    return "--no-readiness-gate" not in daemon_args(docs)


def image_has_registry(image):
    first = image.split("/")[0]
    return "/" in image and ("." in first or ":" in first or first == "localhost")



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



ROLES = {
    # role: (daemon, secure, judge, shipped: deploy/'s own files, whose image has no registry host)
    "base": (True, False, False, True),
    "secure": (True, True, False, True),
    "judge": (False, False, True, True),
    "chart": (True, False, None, False),
}


def main():
    print("policy")
    sets = []
    for arg in sys.argv[1:]:
        role, _, path = arg.partition("=")
        if role not in ROLES or not path:
            sys.exit("usage: policy.py ROLE=FILE... (ROLE: %s)" % ", ".join(ROLES))
        sets.append((role, path))
    for role, path in sets:
        daemon, secure, judge, shipped = ROLES[role]
        with open(path) as f:
            text = f.read()
        docs = [d for _t, _c, d in parse_render(text)]
        label = "%s render %s" % (role, os.path.basename(path))
        if daemon:
            check_daemonset_policy(label, docs, secure, shipped)
            check_rbac_policy(label, docs, secure)
        if judge or (judge is None and by_kind(docs, "Deployment")):
            check_judge_policy(label, docs)
        if role == "chart":
            check_capability_comments(label + " DaemonSet", rendered_daemonset_text(text))
    for path in (DAEMONSET_TEMPLATE, os.path.join(DEPLOY, "daemonset.yaml")):
        with open(path) as f:
            check_capability_comments(rel(path), f.read())
    for path in sorted(glob.glob(os.path.join(DEPLOY, "examples", "*.yaml"))):
        for d in load_all(path):
            check_gated_example(rel(path), d)
    check_kustomization_lists_everything()
    finish("policy")


if __name__ == "__main__":
    main()
