#!/usr/bin/env python3
"""Custom resources against the CRD schemas vendored in deploy/schemas/.

kubernetes-validate (deploy/check.sh step 9) knows Kubernetes' built-in kinds only,
and no tool here validates custom resources offline; so this file does, strictly:

  validate FILE...    every object of a CRD API group (Prometheus Operator, Argo
                      Rollouts, Flagger) in FILEs is valid against its vendored schema,
                      unknown fields refused as `kubeconform -strict` does; one with no
                      vendored schema is an error; no object of any kind holds a null
  examples OUT        write the commented example Rollouts and Canary of deploy/'s
                      Argo/Flagger files (and the Rollout's pod template, as a
                      PodTemplate) to OUT, for both validators
  extract-schemas ... regenerate deploy/schemas/*.json from upstream CRD files
"""
import argparse
import glob
import json
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the work tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lib import (ARGO, DEPLOY, ERRORS, FLAGGER, JUDGE_ARGO, commented_example, err, finish,  # noqa: E402
                 load_all, ok, rel)
import yaml  # noqa: E402

SCHEMAS = os.path.join(DEPLOY, "schemas")
CRD_GROUPS = ("argoproj.io/", "flagger.app/", "monitoring.coreos.com/")


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



def shown(path):
    """A file of the repository by its path in it; a render (a temporary file) by its name."""
    inside = os.path.abspath(path).startswith(os.path.dirname(DEPLOY) + os.sep)
    return rel(path) if inside else os.path.basename(path)


def validate_file(path, crds):
    docs = load_all(path)
    checked = 0
    for i, doc in enumerate(docs):
        where = "%s %s/%s" % (shown(path), doc.get("kind"), (doc.get("metadata") or {}).get("name", "#%d" % i))
        nulls = find_nulls(doc)
        if nulls:
            err("%s: null values at %s" % (where, ", ".join(nulls)))
        if not str(doc.get("apiVersion", "")).startswith(CRD_GROUPS):
            continue
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key not in crds:
            err("%s: no vendored schema for %s %s" % (where, key[0], key[1]))
            continue
        import jsonschema
        schema, name = crds[key]
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.absolute_path))
        for e in errors:
            err("%s: %s at /%s (%s)" % (where, e.message, "/".join(str(p) for p in e.absolute_path), name))
        checked += 1
    return len(docs), checked


def cmd_validate(ns):
    print("custom resources against deploy/schemas/ (strict), no nulls")
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        err("python module jsonschema is missing: apt-get install python3-jsonschema (or pip install jsonschema)")
        finish("crds")
    crds = load_crd_schemas()
    if not crds:
        err("no vendored CRD schemas in %s" % rel(SCHEMAS))
    docs = checked = 0
    for path in ns.files:
        n, c = validate_file(path, crds)
        docs, checked = docs + n, checked + c
    if not ERRORS:
        ok("%d objects in %d files without nulls; %d custom resources valid against their vendored schemas"
           % (docs, len(ns.files), checked))
    finish("crds")


def cmd_examples(ns):
    out = []
    for path, kind in ((ARGO, "Rollout"), (JUDGE_ARGO, "Rollout"), (FLAGGER, "Canary")):
        example = commented_example(path, kind)
        if example is not None:
            out.append(example)
            if kind == "Rollout" and path == ARGO:
                out.append({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "argo-example"},
                            "template": example["spec"]["template"]})
    with open(ns.out, "w") as f:
        yaml.safe_dump_all(out, f, sort_keys=False)
    finish("examples")


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
                                 "Regenerate with deploy/tools/crds.py extract-schemas; source: %s"
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
    p = sub.add_parser("validate")
    p.add_argument("files", nargs="+")
    p.set_defaults(fn=cmd_validate)
    p = sub.add_parser("examples")
    p.add_argument("out")
    p.set_defaults(fn=cmd_examples)
    p = sub.add_parser("extract-schemas")
    p.add_argument("--crd", action="append", required=True, help="upstream CRD YAML file")
    p.add_argument("--kind", action="append", required=True, help="kind to extract")
    p.add_argument("--source", required=True, help="provenance note (repository, commit, path)")
    p.set_defaults(fn=cmd_extract_schemas)
    ns = ap.parse_args()
    ns.fn(ns)


if __name__ == "__main__":
    main()
