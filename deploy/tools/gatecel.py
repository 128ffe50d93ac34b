#!/usr/bin/env python3
"""The readiness gate's admission policy, its CEL evaluated: python3 deploy/tools/gatecel.py

deploy/gate-admission-policy.yaml limits the daemon's status patches to pods on its own
node. Only an API server evaluates a ValidatingAdmissionPolicy, and none runs here; so
this file evaluates its CEL expressions with cel-python (PyPI), as deploy/ ships the
policy and as the chart renders it for another release, on the requests that matter:
the daemon's patch allowed for a pod on its own node; denied for a pod on another node,
without a node in its token, for an unscheduled pod, or when it would change another
condition (Ready); other users' requests not matched (deploy/check.sh step 10).
"""
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import (ALL_ON_RELEASE, ALL_ON_VALUES, DEPLOY, GATE_CONDITION, GATE_POLICY, RenderError,  # noqa: E402
                 by_kind, daemonset, err, finish, helm_docs, kustomize, load_all, ok, rel)

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



if __name__ == "__main__":
    cmd_cel(None)
