#!/usr/bin/env python3
"""Stand-in for the Kubernetes API server, for canaryscope's tests.

This is the one mocked part of the pod-attribution tests: it replaces
kube-apiserver only. The daemon under test talks to it through its real
kube-rs client and watcher, over plain HTTP, and receives real Pod objects
(apiVersion v1, kind Pod, metadata with uid, resourceVersion, labels and
ownerReferences, spec.nodeName, status.containerStatuses with containerID),
in the wire format of the real list and watch endpoints.

What it serves (Python 3 standard library only):

  GET /api/v1/pods                         list or watch, all namespaces
  GET /api/v1/namespaces/{ns}/pods         list or watch, one namespace
  GET /api/v1/namespaces/{ns}/pods/{name}  one pod
  GET /apis/argoproj.io/v1alpha1/rollouts  Argo Rollouts: list or watch, all
                                           namespaces
  GET /apis/argoproj.io/v1alpha1/namespaces/{ns}/rollouts
                                           list or watch, one namespace
  GET /apis/argoproj.io/v1alpha1/namespaces/{ns}/rollouts/{name}
                                           one Rollout
  GET /version, /api, /api/v1, /apis, /apis/argoproj.io,
      /apis/argoproj.io/v1alpha1, /healthz, /readyz, /livez
  PATCH /api/v1/namespaces/{ns}/pods/{name}/status
                                           the status subresource, with
                                           kube-apiserver's semantics for each
                                           patch type (see "Patching status")

Pods stored without status.conditions get the conditions a kubelet sets on a
running pod (PodScheduled, Initialized, ContainersReady and Ready; Ready is
False with reason ReadinessGatesNotReady when the pod declares readiness
gates), so a test can see that a status patch leaves them alone. They are not
recomputed afterwards: this server stands in for the API server, not for the
kubelet.

Patching status (PATCH .../pods/{name}/status), by Content-Type:

  application/merge-patch+json           RFC 7386 JSON merge patch: objects
                                         merge, null deletes a key, and a list
                                         replaces the list it patches (a
                                         patch of status.conditions replaces
                                         them all)
  application/strategic-merge-patch+json strategic merge patch: as above, but
                                         the lists that kube-apiserver merges
                                         are merged by their key:
                                         status.conditions by type,
                                         status.podIPs and status.hostIPs by
                                         ip, status.resourceClaimStatuses and
                                         metadata.ownerReferences by name /
                                         uid; an element with "$patch":
                                         "delete" is removed; $setElementOrder
                                         and $retainKeys directives are
                                         accepted and ignored
  application/json-patch+json            RFC 6902: add, remove, replace, move,
                                         copy, test
  application/apply-patch+yaml           415: server-side apply is not served
                                         here
  anything else                          415 UnsupportedMediaType

Only the status of the result is kept (metadata other than resourceVersion
and spec stay as they were), as for the real status subresource. A patch
naming metadata.resourceVersion that is not the current one is answered 409
Conflict. Conditions must have a type and a status of True, False or
Unknown, else 422 Invalid. A successful patch bumps the resourceVersion,
emits MODIFIED and answers with the pod. Every PATCH, answered or refused,
is recorded (see /control/patches).

Rollouts are served like pods, from the Rollouts the test gives (--rollouts,
POST /control/rollouts); only their metadata is looked at, so any status
(status.stableRS, say) comes back as given. Whether the Rollout endpoints
answer at all is the "rollouts access", --rollouts-access or POST
/control/rollouts-access:

  200  served (the default)
  403  every Rollout request is answered 403 Forbidden, as to a service
       account without RBAC on rollouts.argoproj.io; discovery still lists
       the group, since the CRD exists
  404  every Rollout request, and the argoproj.io discovery endpoints, are
       answered 404 NotFound, as when the Argo Rollouts CRD is not installed

Changing the access ends every open Rollout watch (the stream closes, with no
ERROR event), so a client's next request meets the new answer, as after a
CRD is deleted; pod watches are not touched.

Query parameters of list and watch:

  fieldSelector       honoured: metadata.name, metadata.namespace,
                      spec.nodeName, spec.schedulerName,
                      spec.serviceAccountName, spec.restartPolicy,
                      status.phase, status.podIP, status.nominatedNodeName
                      with =, == and !=; any other field is a 400, as on the
                      real server. Rollouts, like every custom resource,
                      only know metadata.name and metadata.namespace
  labelSelector       equality (k=v, k==v, k!=v) and existence (k, !k);
                      set-based terms (in, notin) are a 400 here
  watch=1|true        newline-delimited JSON watch events (ADDED, MODIFIED,
                      DELETED, BOOKMARK, ERROR) in a chunked response that
                      stays open until timeoutSeconds
  resourceVersion     watch: resume after this version. Unset or "0" starts
                      with synthetic ADDED events for the current pods, as on
                      the real server. A version older than this server's
                      history (for example one from a previous run of this
                      server) or newer than its latest gets a 200 response
                      with a single ERROR event of code 410 Gone, which is
                      what makes kube-rs relist. List: always the current
                      state (which satisfies every resourceVersionMatch).
                      Pods and Rollouts have separate version counters and
                      histories.
  allowWatchBookmarks BOOKMARK events every --bookmark-interval seconds
  sendInitialEvents   streaming list: ADDED for every pod, then a BOOKMARK
                      annotated k8s.io/initial-events-end
  timeoutSeconds      the watch ends cleanly after this long (default 1800)
  limit, continue     ignored: a list is always returned in one piece

As on the real server, a watch with a field or label selector sees a pod
that stops matching as DELETED and one that starts matching as ADDED, and
re-creating a pod under the same name with a new uid is a DELETED of the
old pod followed by an ADDED of the new one.

Control API for tests (not part of Kubernetes):

  POST   /control/pods               body: a Pod, a list of Pods or a PodList;
                                     adds or replaces each pod, emitting
                                     ADDED or MODIFIED. Missing uid,
                                     namespace ("default") and
                                     creationTimestamp are filled in; the
                                     resourceVersion is always assigned here.
                                     Answers with the stored pods.
  POST   /control/pods/{ns}/{name}/status
                                     the kubelet's status update: body a
                                     partial pod status, applied as the
                                     kubelet's strategic-merge patch is
                                     (conditions merged by type, so a
                                     client's condition stays; every other
                                     list, containerStatuses among them,
                                     replaced whole); emits MODIFIED. Not a
                                     client's PATCH: not in /control/patches
  POST   /control/pods/{ns}/{name}/terminate
                                     a graceful deletion, as a DELETE with
                                     a grace period: body
                                     {"gracePeriodSeconds": N} (default 30)
                                     sets metadata.deletionTimestamp (now +
                                     N) and deletionGracePeriodSeconds,
                                     emitting MODIFIED; the pod stays until
                                     the kubelet's DELETE below
  DELETE /control/pods/{ns}/{name}   removes a pod, emitting DELETED; 404 if
                                     there is no such pod
  GET    /control/pods               every stored pod, as a PodList
  POST   /control/rollouts           the same for Rollouts: body a Rollout,
                                     a list of Rollouts or a RolloutList
                                     (apiVersion argoproj.io/v1alpha1 and
                                     kind Rollout are set here)
  DELETE /control/rollouts/{ns}/{name}
                                     removes a Rollout, emitting DELETED
  GET    /control/rollouts           every stored Rollout, as a RolloutList
  POST   /control/rollouts-access    body {"code": 200|403|404}: how the
                                     Rollout endpoints answer from now on
                                     (see above); answers {"ok": true,
                                     "code": N}
  GET    /control/health             {"ok": true, "resourceVersion": ...,
                                      "pods": N, "watches": N,
                                      "rollouts": N, "rolloutWatches": N,
                                      "rolloutsAccess": 200|403|404}
  GET    /control/patches            every PATCH received, in order:
                                     {"items": [{"namespace", "name",
                                     "subresource", "contentType", "body",
                                     "code"}]}
  POST   /control/patch-failures     body {"code": N, "count": K}: the next
                                     K PATCH requests are answered N (409
                                     Conflict, 500, 503, ...) and recorded
                                     with that code; answers {"ok": true}
  POST   /control/compact            forgets all history, of pods and
                                     Rollouts: every open watch gets ERROR
                                     410 Gone and ends, and resuming from an
                                     older version fails, so clients relist
                                     (as after an etcd compaction or a watch
                                     cache reset)

Command line:

  fake_apiserver.py [--host 127.0.0.1] [--port 0] [--port-file FILE]
                    [--pods FILE] [--rollouts FILE]
                    [--rollouts-access 200|403|404] [--start-rv N]
                    [--bookmark-interval S] [--quiet]

--port 0 binds a free port; --port-file then receives the bound port number
(written atomically, so a reader never sees a partial file), and the URL is
printed on stdout. --pods loads initial pods from a JSON file holding a Pod,
a list of Pods or a PodList; --rollouts likewise loads Rollouts (a Rollout,
a list or a RolloutList). Resource versions start at --start-rv, by
default the current Unix time in milliseconds, so that a restarted server
never accepts a version handed out by the previous run: a client resuming a
watch across the restart is told 410 Gone and relists, as it would be by a
real API server whose history was compacted meanwhile.

Stop it with SIGTERM or SIGINT (exits at once, dropping open watches, as a
crashed or restarted API server would) or SIGKILL.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

# Keep at most this many watch events; a resume from an older version is
# answered 410 Gone, like a compacted etcd.
HISTORY_LIMIT = 10000
DEFAULT_WATCH_TIMEOUT = 1800

METADATA_FIELDS = {
    "metadata.name": lambda p: p.get("metadata", {}).get("name", ""),
    "metadata.namespace": lambda p: p.get("metadata", {}).get("namespace", ""),
}

SUPPORTED_FIELDS = {
    **METADATA_FIELDS,
    "spec.nodeName": lambda p: p.get("spec", {}).get("nodeName", ""),
    "spec.schedulerName": lambda p: p.get("spec", {}).get("schedulerName", ""),
    "spec.serviceAccountName": lambda p: p.get("spec", {}).get("serviceAccountName", ""),
    "spec.restartPolicy": lambda p: p.get("spec", {}).get("restartPolicy", ""),
    "status.phase": lambda p: p.get("status", {}).get("phase", ""),
    "status.podIP": lambda p: p.get("status", {}).get("podIP", ""),
    "status.nominatedNodeName": lambda p: p.get("status", {}).get("nominatedNodeName", ""),
}


ARGO_GROUP = {
    "name": "argoproj.io",
    "versions": [{"groupVersion": "argoproj.io/v1alpha1", "version": "v1alpha1"}],
    "preferredVersion": {"groupVersion": "argoproj.io/v1alpha1", "version": "v1alpha1"},
}
ROLLOUTS_ACCESS_CODES = (200, 403, 404)


class BadRequest(Exception):
    pass


def now_rfc3339():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_object(code, reason, message):
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def parse_field_selector(text, supported=SUPPORTED_FIELDS):
    """Returns a predicate on objects, or raises BadRequest. `supported` maps
    the field names the kind knows to their getters."""
    terms = []
    for raw in filter(None, (t.strip() for t in (text or "").split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            negate = True
        elif "==" in raw:
            key, value = raw.split("==", 1)
            negate = False
        elif "=" in raw:
            key, value = raw.split("=", 1)
            negate = False
        else:
            raise BadRequest(f"invalid field selector: {raw!r}: expected key=value or key!=value")
        key = key.strip()
        if key not in supported:
            raise BadRequest(f'"{key}" is not a known field selector: only "{", ".join(sorted(supported))}"')
        terms.append((supported[key], value.strip(), negate))

    def matches(pod):
        return all((get(pod) == value) != negate for get, value, negate in terms)

    return matches


def parse_label_selector(text):
    """Returns a predicate on pods, or raises BadRequest."""
    terms = []
    for raw in filter(None, (t.strip() for t in (text or "").split(","))):
        if " in " in raw or " notin " in raw or "(" in raw:
            raise BadRequest(f"set-based label selector {raw!r} is not supported by this fake API server")
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append(("ne", key.strip(), value.strip()))
        elif "==" in raw:
            key, value = raw.split("==", 1)
            terms.append(("eq", key.strip(), value.strip()))
        elif "=" in raw:
            key, value = raw.split("=", 1)
            terms.append(("eq", key.strip(), value.strip()))
        elif raw.startswith("!"):
            terms.append(("absent", raw[1:].strip(), None))
        else:
            terms.append(("present", raw, None))

    def matches(pod):
        labels = pod.get("metadata", {}).get("labels") or {}
        for op, key, value in terms:
            if op == "eq" and labels.get(key) != value:
                return False
            if op == "ne" and labels.get(key) == value:
                return False
            if op == "present" and key not in labels:
                return False
            if op == "absent" and key in labels:
                return False
        return True

    return matches


def kubelet_conditions(pod):
    """The conditions a kubelet sets on a running pod whose containers are
    ready; Ready waits for the readiness gates, if the pod has any."""
    stamp = now_rfc3339()
    gated = bool((pod.get("spec") or {}).get("readinessGates"))

    def condition(kind, status="True", reason=None, message=None):
        c = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": stamp}
        if reason:
            c["reason"] = reason
        if message:
            c["message"] = message
        return c

    ready = (condition("Ready", "False", "ReadinessGatesNotReady",
                       "the status of pod readiness gate is not set")
             if gated else condition("Ready"))
    return [condition("PodScheduled"), condition("Initialized"), condition("ContainersReady"), ready]


class Invalid(Exception):
    """A patch that cannot be applied: (code, reason, message)."""

    def __init__(self, code, reason, message):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def json_merge_patch(target, patch):
    """RFC 7386: a list (or any non-object) replaces what it patches."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = json_merge_patch(out.get(key), value)
    return out


# The lists of a Pod that kube-apiserver merges in a strategic-merge patch
# (patchStrategy "merge" in the Go types), by path, and their merge keys.
# Every other list is replaced.
POD_MERGE_KEYS = {
    ("status", "conditions"): "type",
    ("status", "podIPs"): "ip",
    ("status", "hostIPs"): "ip",
    ("status", "resourceClaimStatuses"): "name",
    ("metadata", "ownerReferences"): "uid",
}


def strategic_merge_patch(target, patch, path=()):
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch") \
                or key.startswith("$deleteFromPrimitiveList/"):
            continue
        where = path + (key,)
        merge_key = POD_MERGE_KEYS.get(where)
        if value is None:
            out.pop(key, None)
        elif merge_key and isinstance(value, list):
            merged = [dict(e) for e in (out.get(key) or []) if isinstance(e, dict)]
            for item in value:
                if not isinstance(item, dict) or merge_key not in item:
                    raise Invalid(400, "BadRequest",
                                  "%s: every element needs the merge key %r" % (".".join(where), merge_key))
                item = dict(item)
                delete = item.pop("$patch", None) == "delete"
                at = next((i for i, e in enumerate(merged) if e.get(merge_key) == item[merge_key]), None)
                if delete:
                    if at is not None:
                        del merged[at]
                elif at is None:
                    merged.append(strategic_merge_patch({}, item, where))
                else:
                    merged[at] = strategic_merge_patch(merged[at], item, where)
            out[key] = merged
        else:
            out[key] = strategic_merge_patch(out.get(key), value, where)
    return out


def _pointer(path):
    if path == "":
        return []
    if not path.startswith("/"):
        raise Invalid(400, "BadRequest", "json patch: bad path %r" % path)
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _walk(doc, parts):
    for p in parts:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    return doc


def json_patch(doc, ops):
    """RFC 6902 on a deep copy of `doc`."""
    doc = json.loads(json.dumps(doc))
    if not isinstance(ops, list):
        raise Invalid(400, "BadRequest", "a JSON patch is a list of operations")
    for op in ops:
        try:
            kind, parts = op["op"], _pointer(op["path"])
            parent = _walk(doc, parts[:-1]) if parts else None
            last = parts[-1] if parts else None
            if kind == "test":
                if _walk(doc, parts) != op["value"]:
                    raise Invalid(422, "Invalid", "json patch: test failed at %s" % op["path"])
                continue
            if kind in ("move", "copy"):
                value = _walk(doc, _pointer(op["from"]))
                if kind == "move":
                    src = _pointer(op["from"])
                    holder = _walk(doc, src[:-1])
                    holder.pop(int(src[-1]) if isinstance(holder, list) else src[-1])
                kind, op = "add", {"value": json.loads(json.dumps(value))}
            if kind == "add":
                if isinstance(parent, list):
                    parent.insert(len(parent) if last == "-" else int(last), op["value"])
                else:
                    parent[last] = op["value"]
            elif kind == "remove":
                parent.pop(int(last) if isinstance(parent, list) else last)
            elif kind == "replace":
                _walk(doc, parts)  # must exist
                if isinstance(parent, list):
                    parent[int(last)] = op["value"]
                else:
                    parent[last] = op["value"]
            else:
                raise Invalid(400, "BadRequest", "json patch: unknown op %r" % kind)
        except (KeyError, IndexError, ValueError, TypeError) as err:
            raise Invalid(422, "Invalid", "json patch: cannot apply %r: %s" % (op, err))
    return doc


def validate_conditions(pod):
    for c in (pod.get("status") or {}).get("conditions") or []:
        if not isinstance(c, dict) or not c.get("type"):
            raise Invalid(422, "Invalid", "status.conditions: every condition needs a type")
        if c.get("status") not in ("True", "False", "Unknown"):
            raise Invalid(422, "Invalid", 'status.conditions[type=%s].status: Unsupported value: %r: '
                          'supported values: "False", "True", "Unknown"' % (c.get("type"), c.get("status")))


class Kind:
    """What differs between the kinds served: names and field selectors."""

    def __init__(self, api_version, kind, fields):
        self.api_version = api_version
        self.kind = kind
        self.list_kind = kind + "List"
        self.fields = fields


POD = Kind("v1", "Pod", SUPPORTED_FIELDS)
ROLLOUT = Kind("argoproj.io/v1alpha1", "Rollout", METADATA_FIELDS)


class Store:
    """Objects of one kind, the resource version counter and the watch event
    history."""

    def __init__(self, start_rv, kind=POD):
        self.kind = kind
        self.cond = threading.Condition()
        self.rv = start_rv
        # Versions <= history_floor cannot be resumed from; the server's
        # history starts after it.
        self.history_floor = start_rv
        self.pods = {}  # (namespace, name) -> object (pods or, in the Rollout store, Rollouts)
        self.events = []  # (rv, type, object, previous object or None)
        self.watches = 0
        # Bumped by compact(); open watches compare it to end themselves.
        self.epoch = 0
        # Bumped by close_watches(); open watches end cleanly when it moves.
        self.closings = 0
        # Every PATCH received, and failures to inject: [code, count].
        self.patches = []
        self.patch_failures = [0, 0]

    def _next_rv(self):
        self.rv += 1
        return self.rv

    def _record(self, rv, kind, obj, old):
        self.events.append((rv, kind, obj, old))
        if len(self.events) > HISTORY_LIMIT:
            dropped = self.events[: len(self.events) - HISTORY_LIMIT]
            self.events = self.events[len(dropped):]
            self.history_floor = dropped[-1][0]
        self.cond.notify_all()

    def put(self, pod):
        if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
            raise BadRequest(f"a {self.kind.kind} must be a JSON object with metadata")
        meta = pod["metadata"]
        if not meta.get("name"):
            raise BadRequest("metadata.name is required")
        pod = json.loads(json.dumps(pod))  # private deep copy
        pod["apiVersion"] = self.kind.api_version
        pod["kind"] = self.kind.kind
        meta = pod["metadata"]
        meta.setdefault("namespace", "default")
        meta.setdefault("creationTimestamp", now_rfc3339())
        if self.kind is POD:
            pod.setdefault("spec", {})
            pod.setdefault("status", {})
            if "conditions" not in pod["status"]:
                pod["status"]["conditions"] = kubelet_conditions(pod)
        key = (meta["namespace"], meta["name"])
        with self.cond:
            old = self.pods.get(key)
            if old is not None and meta.get("uid") and meta["uid"] != old["metadata"]["uid"]:
                # Same name, new uid: the old pod is gone and a new one exists.
                self._delete_locked(key)
                old = None
            if old is not None:
                meta["uid"] = old["metadata"]["uid"]
                meta["creationTimestamp"] = old["metadata"].get("creationTimestamp", meta["creationTimestamp"])
            else:
                meta.setdefault("uid", str(uuid.uuid4()))
            rv = self._next_rv()
            meta["resourceVersion"] = str(rv)
            self.pods[key] = pod
            self._record(rv, "MODIFIED" if old is not None else "ADDED", pod, old)
            return pod

    def _delete_locked(self, key):
        pod = self.pods.pop(key)
        pod = json.loads(json.dumps(pod))
        rv = self._next_rv()
        pod["metadata"]["resourceVersion"] = str(rv)
        self._record(rv, "DELETED", pod, None)
        return pod

    def patch_status(self, namespace, name, content_type, raw):
        """Applies a PATCH of pods/{name}/status; returns (code, object)."""
        with self.cond:
            record = {"namespace": namespace, "name": name, "subresource": "status",
                      "contentType": content_type, "body": raw.decode("utf-8", "replace")}
            self.patches.append(record)
            code, count = self.patch_failures
            if count > 0:
                self.patch_failures = [code, count - 1]
                record["code"] = code
                reason = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError",
                          503: "ServiceUnavailable"}.get(code, "Failure")
                return code, status_object(code, reason, "injected by /control/patch-failures")
            try:
                result = self._patch_status_locked(namespace, name, content_type, raw)
            except Invalid as err:
                record["code"] = err.code
                return err.code, status_object(err.code, err.reason, err.message)
            record["code"] = 200
            return 200, result

    def _patch_status_locked(self, namespace, name, content_type, raw):
        old = self.pods.get((namespace, name))
        if old is None:
            raise Invalid(404, "NotFound", 'pods "%s" not found' % name)
        media = (content_type or "").split(";")[0].strip()
        if media == "application/apply-patch+yaml":
            raise Invalid(415, "UnsupportedMediaType", "server-side apply is not served by this fake API server")
        try:
            patch = json.loads(raw or b"null")
        except ValueError as err:
            raise Invalid(400, "BadRequest", "the patch is not JSON: %s" % err)
        if media == "application/merge-patch+json":
            new = json_merge_patch(old, patch)
        elif media == "application/strategic-merge-patch+json":
            new = strategic_merge_patch(old, patch)
        elif media == "application/json-patch+json":
            new = json_patch(old, patch)
        else:
            raise Invalid(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                          "accepted media types include: application/json-patch+json, "
                          "application/merge-patch+json, application/apply-patch+yaml, "
                          "application/strategic-merge-patch+json")
        if not isinstance(new, dict):
            raise Invalid(422, "Invalid", "the patched object is not an object")
        wanted_rv = (new.get("metadata") or {}).get("resourceVersion")
        if wanted_rv is not None and wanted_rv != old["metadata"]["resourceVersion"]:
            raise Invalid(409, "Conflict", 'Operation cannot be fulfilled on pods "%s": the object has been '
                          "modified; please apply your changes to the latest version and try again" % name)
        # The status subresource changes the status only.
        pod = json.loads(json.dumps(old))
        pod["status"] = new.get("status") or {}
        validate_conditions(pod)
        rv = self._next_rv()
        pod["metadata"]["resourceVersion"] = str(rv)
        self.pods[(namespace, name)] = pod
        self._record(rv, "MODIFIED", pod, old)
        return pod

    def kubelet_status(self, namespace, name, status):
        """The kubelet's status update: `status` is applied to the stored
        status as its strategic-merge patch is (conditions merged by type,
        every other list replaced whole). Returns the pod, or None."""
        if not isinstance(status, dict):
            raise BadRequest("body must be a pod status object")
        with self.cond:
            old = self.pods.get((namespace, name))
            if old is None:
                return None
            try:
                patched = strategic_merge_patch(old, {"status": status})
            except Invalid as err:
                raise BadRequest(err.message)
            pod = json.loads(json.dumps(old))
            pod["status"] = patched.get("status") or {}
            return self._modified_locked(namespace, name, pod, old)

    def terminate(self, namespace, name, grace_seconds):
        """A graceful DELETE: the deletion timestamp is set and the pod stays
        until the kubelet confirms (DELETE /control/pods/...). Returns the
        pod, or None."""
        with self.cond:
            old = self.pods.get((namespace, name))
            if old is None:
                return None
            pod = json.loads(json.dumps(old))
            meta = pod["metadata"]
            if "deletionTimestamp" not in meta:
                at = datetime.fromtimestamp(time.time() + grace_seconds, timezone.utc)
                meta["deletionTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
                meta["deletionGracePeriodSeconds"] = grace_seconds
            return self._modified_locked(namespace, name, pod, old)

    def _modified_locked(self, namespace, name, pod, old):
        rv = self._next_rv()
        pod["metadata"]["resourceVersion"] = str(rv)
        self.pods[(namespace, name)] = pod
        self._record(rv, "MODIFIED", pod, old)
        return pod

    def delete(self, namespace, name):
        with self.cond:
            if (namespace, name) not in self.pods:
                return None
            return self._delete_locked((namespace, name))

    def compact(self):
        with self.cond:
            self.history_floor = self.rv
            self.events = []
            self.epoch += 1
            self.cond.notify_all()

    def close_watches(self):
        with self.cond:
            self.closings += 1
            self.cond.notify_all()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-apiserver/1"

    # Set on the class by main().
    store = None
    rollouts = None  # the Rollout store
    rollouts_access = 200  # 200, 403 or 404; see the module docstring
    bookmark_interval = 15.0
    quiet = False

    def log_message(self, fmt, *args):
        if not self.quiet:
            sys.stderr.write("fake-apiserver: %s %s\n" % (self.address_string(), fmt % args))

    # -- plumbing ---------------------------------------------------------

    def send_json(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_status(self, code, reason, message):
        self.send_json(code, status_object(code, reason, message))

    def read_json_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw or b"null")
        except ValueError as err:
            raise BadRequest(f"request body is not JSON: {err}")

    def write_chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # -- routing ----------------------------------------------------------

    def do_GET(self):
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        parts = [unquote(p) for p in url.path.split("/") if p]
        try:
            self.route_get(parts, query)
        except BadRequest as err:
            self.send_status(400, "BadRequest", str(err))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def route_get(self, parts, query):
        if parts in (["healthz"], ["readyz"], ["livez"]):
            body = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif parts == ["version"]:
            self.send_json(200, {
                "major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "gitCommit": "fake",
                "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                "compiler": "gc", "platform": "linux/amd64",
            })
        elif parts == ["api"]:
            host, port = self.server.server_address[:2]
            self.send_json(200, {
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": f"{host}:{port}"}],
            })
        elif parts == ["api", "v1"]:
            self.send_json(200, {
                "kind": "APIResourceList", "groupVersion": "v1",
                "resources": [{
                    "name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
                    "verbs": ["get", "list", "watch"], "shortNames": ["po"],
                }, {
                    "name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod",
                    "verbs": ["get", "patch"],
                }],
            })
        elif parts == ["apis"]:
            groups = [] if Handler.rollouts_access == 404 else [ARGO_GROUP]
            self.send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        elif parts[:2] == ["apis", "argoproj.io"]:
            self.route_rollouts(parts[2:], query)
        elif parts == ["api", "v1", "pods"]:
            self.list_or_watch(None, query)
        elif len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            self.list_or_watch(parts[3], query)
        elif len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            with self.store.cond:
                pod = self.store.pods.get((parts[3], parts[5]))
            if pod is None:
                self.send_status(404, "NotFound", f'pods "{parts[5]}" not found')
            else:
                self.send_json(200, pod)
        elif parts == ["control", "health"]:
            with self.store.cond:
                health = {
                    "ok": True, "resourceVersion": str(self.store.rv),
                    "pods": len(self.store.pods), "watches": self.store.watches,
                }
            with self.rollouts.cond:
                health.update({
                    "rollouts": len(self.rollouts.pods), "rolloutWatches": self.rollouts.watches,
                    "rolloutsAccess": Handler.rollouts_access,
                })
            self.send_json(200, health)
        elif parts == ["control", "pods"]:
            self.list_or_watch(None, {})
        elif parts == ["control", "patches"]:
            with self.store.cond:
                items = list(self.store.patches)
            self.send_json(200, {"items": items})
        elif parts == ["control", "rollouts"]:
            self.list_or_watch(None, {}, self.rollouts)
        else:
            self.send_status(404, "NotFound", f"the server could not find the requested resource ({self.path})")

    def route_rollouts(self, parts, query):
        """/apis/argoproj.io/...: discovery and the Rollout endpoints, as the
        rollouts access says."""
        if Handler.rollouts_access == 404:
            self.send_status(404, "NotFound", "the server could not find the requested resource")
            return
        if parts == []:
            self.send_json(200, {"kind": "APIGroup", "apiVersion": "v1", **ARGO_GROUP})
            return
        if parts == ["v1alpha1"]:
            self.send_json(200, {
                "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "argoproj.io/v1alpha1",
                "resources": [{
                    "name": "rollouts", "singularName": "rollout", "namespaced": True, "kind": "Rollout",
                    "verbs": ["get", "list", "watch"], "shortNames": ["ro"],
                }],
            })
            return
        if parts == ["v1alpha1", "rollouts"]:
            namespace, name = None, None
        elif len(parts) in (4, 5) and parts[:2] == ["v1alpha1", "namespaces"] and parts[3] == "rollouts":
            namespace, name = parts[2], (parts[4] if len(parts) == 5 else None)
        else:
            self.send_status(404, "NotFound", f"the server could not find the requested resource ({self.path})")
            return
        if Handler.rollouts_access == 403:
            verb = "get" if name else ("watch" if query.get("watch") in ("1", "true", "True") else "list")
            scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
            what = f'rollouts.argoproj.io "{name}"' if name else "rollouts.argoproj.io"
            self.send_status(403, "Forbidden", (
                f'{what} is forbidden: User "system:serviceaccount:canaryscope:canaryscope" cannot {verb} '
                f'resource "rollouts" in API group "argoproj.io" {scope}'))
            return
        if name is None:
            self.list_or_watch(namespace, query, self.rollouts)
            return
        with self.rollouts.cond:
            rollout = self.rollouts.pods.get((namespace, name))
        if rollout is None:
            self.send_status(404, "NotFound", f'rollouts.argoproj.io "{name}" not found')
        else:
            self.send_json(200, rollout)

    def do_POST(self):
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        try:
            if parts in (["control", "pods"], ["control", "rollouts"]):
                store = self.store if parts[1] == "pods" else self.rollouts
                list_kind = store.kind.list_kind
                body = self.read_json_body()
                if isinstance(body, dict) and body.get("kind") == list_kind:
                    objects = body.get("items") or []
                elif isinstance(body, list):
                    objects = body
                else:
                    objects = [body]
                stored = [store.put(p) for p in objects]
                self.send_json(200, stored[0] if isinstance(body, dict) and body.get("kind") != list_kind else stored)
            elif parts == ["control", "rollouts-access"]:
                body = self.read_json_body()
                code = body.get("code") if isinstance(body, dict) else None
                if code not in ROLLOUTS_ACCESS_CODES:
                    raise BadRequest(f'body must be {{"code": 200|403|404}}, got {body!r}')
                Handler.rollouts_access = code
                # A real server ends watches when the CRD goes; ending them on
                # every change lets the client meet the new answer at once.
                self.rollouts.close_watches()
                self.send_json(200, {"ok": True, "code": code})
            elif parts == ["control", "patch-failures"]:
                body = self.read_json_body()
                if not (isinstance(body, dict) and isinstance(body.get("code"), int)
                        and isinstance(body.get("count"), int)):
                    raise BadRequest('body must be {"code": N, "count": K}, got %r' % (body,))
                with self.store.cond:
                    self.store.patch_failures = [body["code"], body["count"]]
                self.send_json(200, {"ok": True})
            elif len(parts) == 5 and parts[:2] == ["control", "pods"] and parts[4] in ("status", "terminate"):
                body = self.read_json_body()
                if parts[4] == "status":
                    pod = self.store.kubelet_status(parts[2], parts[3], body)
                else:
                    grace = body.get("gracePeriodSeconds", 30) if isinstance(body, dict) else None
                    if not isinstance(grace, int) or grace < 0:
                        raise BadRequest('body must be {"gracePeriodSeconds": N}, got %r' % (body,))
                    pod = self.store.terminate(parts[2], parts[3], grace)
                if pod is None:
                    self.send_status(404, "NotFound", f'pods "{parts[3]}" not found in namespace "{parts[2]}"')
                else:
                    self.send_json(200, pod)
            elif parts == ["control", "compact"]:
                self.store.compact()
                self.rollouts.compact()
                self.send_json(200, {"ok": True, "resourceVersion": str(self.store.rv)})
            else:
                self.send_status(404, "NotFound", f"no such control endpoint ({self.path})")
        except BadRequest as err:
            self.send_status(400, "BadRequest", str(err))

    def do_PATCH(self):
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if len(parts) == 7 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods" \
                and parts[6] == "status":
            code, obj = self.store.patch_status(parts[3], parts[5], self.headers.get("Content-Type"), raw)
            self.send_json(code, obj)
        else:
            self.send_status(405, "MethodNotAllowed",
                             "this fake API server only patches pods/{name}/status (%s)" % self.path)

    def do_DELETE(self):
        parts = [unquote(p) for p in urlsplit(self.path).path.split("/") if p]
        if len(parts) == 4 and parts[:2] in (["control", "pods"], ["control", "rollouts"]):
            store = self.store if parts[1] == "pods" else self.rollouts
            pod = store.delete(parts[2], parts[3])
            if pod is None:
                self.send_status(404, "NotFound", f'{parts[1]} "{parts[3]}" not found in namespace "{parts[2]}"')
            else:
                self.send_json(200, pod)
        else:
            self.send_status(404, "NotFound", f"no such control endpoint ({self.path})")

    # -- list and watch ---------------------------------------------------

    def list_or_watch(self, namespace, query, store=None):
        store = store or self.store
        field_match = parse_field_selector(query.get("fieldSelector"), store.kind.fields)
        label_match = parse_label_selector(query.get("labelSelector"))

        def matches(pod):
            if pod is None:
                return False
            if namespace is not None and pod["metadata"].get("namespace") != namespace:
                return False
            return field_match(pod) and label_match(pod)

        if query.get("watch") in ("1", "true", "True"):
            self.watch(matches, query, store)
            return
        with store.cond:
            items = [p for p in store.pods.values() if matches(p)]
            rv = store.rv
        # The real server leaves kind and apiVersion out of list items.
        items = [{k: v for k, v in p.items() if k not in ("kind", "apiVersion")} for p in items]
        self.send_json(200, {
            "kind": store.kind.list_kind, "apiVersion": store.kind.api_version,
            "metadata": {"resourceVersion": str(rv)}, "items": items,
        })

    def watch(self, matches, query, store):
        try:
            timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT)
        except ValueError:
            raise BadRequest(f"timeoutSeconds: not a number: {query.get('timeoutSeconds')!r}")
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true", "True")
        initial_events = query.get("sendInitialEvents") in ("1", "true", "True")
        requested = query.get("resourceVersion") or ""
        deadline = time.monotonic() + timeout

        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def emit(kind, obj):
            self.write_chunk(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        def bookmark(rv, annotations=None):
            meta = {"resourceVersion": str(rv)}
            if annotations:
                meta["annotations"] = annotations
            emit("BOOKMARK", {"kind": store.kind.kind, "apiVersion": store.kind.api_version, "metadata": meta})

        with store.cond:
            store.watches += 1
        try:
            with store.cond:
                epoch = store.epoch
                closings = store.closings
                snapshot = None
                if requested in ("", "0") or initial_events:
                    snapshot = [p for p in store.pods.values() if matches(p)]
                    last = store.rv
                else:
                    try:
                        last = int(requested)
                    except ValueError:
                        last = -1
                    if last < store.history_floor or last > store.rv:
                        snapshot = "gone"
            if snapshot == "gone":
                emit("ERROR", status_object(
                    410, "Expired", f"too old resource version: {requested} ({store.history_floor})"))
                return
            for pod in snapshot or []:
                emit("ADDED", pod)
            if initial_events:
                bookmark(last, {"k8s.io/initial-events-end": "true"})
            next_bookmark = time.monotonic() + self.bookmark_interval
            while True:
                with store.cond:
                    while True:
                        if store.epoch != epoch:
                            pending = "gone"
                            break
                        if store.closings != closings:
                            pending = "closed"
                            break
                        pending = [e for e in store.events if e[0] > last]
                        now = time.monotonic()
                        if pending or now >= deadline or (bookmarks and now >= next_bookmark):
                            break
                        wake = min(deadline, next_bookmark) if bookmarks else deadline
                        store.cond.wait(max(0.0, wake - now))
                    current = store.rv
                if pending == "closed":
                    return
                if pending == "gone" or last < store.history_floor:
                    # Compacted, or this watch fell behind the history kept.
                    emit("ERROR", status_object(410, "Expired", "watch history was compacted"))
                    return
                for rv, kind, obj, old in pending:
                    last = rv
                    now_matches, before = matches(obj), matches(old)
                    if kind == "MODIFIED" and now_matches and not before:
                        kind = "ADDED"
                    elif kind == "MODIFIED" and before and not now_matches:
                        kind = "DELETED"
                    elif not now_matches:
                        continue
                    emit(kind, obj)
                now = time.monotonic()
                if now >= deadline:
                    return
                if bookmarks and now >= next_bookmark:
                    # Every event up to `current` has been sent or filtered out.
                    last = max(last, current)
                    bookmark(last)
                    next_bookmark = now + self.bookmark_interval
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            with store.cond:
                store.watches -= 1
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self.close_connection = True


def load_pods(path, list_kind="PodList"):
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict) and data.get("kind") == list_kind:
        return data.get("items") or []
    if isinstance(data, list):
        return data
    return [data]


def main():
    parser = argparse.ArgumentParser(
        description="Stand-in Kubernetes API server serving Pods and Argo Rollouts (tests only).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", help="write the bound port here once listening")
    parser.add_argument("--pods", help="JSON file: a Pod, a list of Pods or a PodList, loaded at start")
    parser.add_argument("--rollouts",
                        help="JSON file: an Argo Rollout, a list of Rollouts or a RolloutList, loaded at start")
    parser.add_argument("--rollouts-access", type=int, choices=ROLLOUTS_ACCESS_CODES, default=200,
                        help="how the Rollout endpoints answer: 200 served, 403 Forbidden, 404 no CRD")
    parser.add_argument("--start-rv", type=int, default=None,
                        help="first resource version (default: Unix time in ms)")
    parser.add_argument("--bookmark-interval", type=float, default=15.0)
    parser.add_argument("--quiet", action="store_true", help="no access log on stderr")
    args = parser.parse_args()

    start_rv = args.start_rv if args.start_rv is not None else int(time.time() * 1000)
    store = Store(start_rv)
    rollouts = Store(start_rv, ROLLOUT)
    for option, path, target in (("--pods", args.pods, store), ("--rollouts", args.rollouts, rollouts)):
        if not path:
            continue
        try:
            for obj in load_pods(path, target.kind.list_kind):
                target.put(obj)
        except (OSError, ValueError, BadRequest) as err:
            sys.exit(f"fake-apiserver: {option} {path}: {err}")
        # Initial objects are state, not history a watch could replay.
        target.events = []
        target.history_floor = target.rv

    Handler.store = store
    Handler.rollouts = rollouts
    Handler.rollouts_access = args.rollouts_access
    Handler.bookmark_interval = args.bookmark_interval
    Handler.quiet = args.quiet

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.allow_reuse_address = True
    try:
        server = ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as err:
        sys.exit(f"fake-apiserver: cannot listen on {args.host}:{args.port}: {err}")
    port = server.server_address[1]

    if args.port_file:
        tmp = f"{args.port_file}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)

    # Exit at once on SIGTERM/SIGINT: open watches are dropped mid-stream, as
    # when a real API server goes away.
    def stop(_signum, _frame):
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"fake-apiserver: listening on http://{args.host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
