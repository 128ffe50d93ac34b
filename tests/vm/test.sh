#!/usr/bin/env bash
# Runs integration test binaries inside the test VM (Debian's 6.1 kernel with
# kprobes, amdgpu and /dev/kfd, pure cgroup v2, by default). Arguments: the
# test executables to run with --ignored; the host root is the guest's root,
# so the same paths work inside.
#
#   tests/vm/test.sh [--kernel FLAVOUR] [--repeat N] [--only TEST]... TEST_BINARY...
#
# --only TEST (repeatable) limits the binary that follows to the tests named
# exactly TEST: the kernels of the matrix that run one test per probe family
# rather than whole suites.
#
# CANARYSCOPE_KERNEL_SHAPE, when set, reaches the guest's tests: the kernel's
# features as the matrix declares them (cargo xtask test sets it per boot);
# the tests that expect a family's shape on this kernel refuse to run without it.
#
# The test binaries and the canaryscope binary they start are copied to
# target/vm/run-<pid>/ first: a build on the host during the (long) VM run
# would otherwise replace them under the guest's feet.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
usage() {
    echo "usage: tests/vm/test.sh [--kernel FLAVOUR] [--repeat N] [--only TEST]... TEST_BINARY... (cargo xtask test passes them)" >&2
    exit 2
}
# sq WORD: WORD quoted for sh.
sq() { local s="$1"; printf "'%s'" "${s//\'/\'\\\'\'}"; }
# --repeat N runs the whole list N times in one boot and stops at the first
# failure: a hunt for a rare guest lockup, not a CI step.
repeat=1
kernel=6.1
while [ $# -gt 0 ]; do
    case "$1" in
        --repeat) [ $# -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] || usage; repeat="$2"; shift 2 ;;
        --kernel) [ $# -ge 2 ] || usage; kernel="$2"; shift 2 ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || usage
snap="$repo/target/vm/run-$$"
mkdir -p "$snap"
trap 'rm -rf "$snap"' EXIT
bin="${CANARYSCOPE_BIN:-$repo/target/release/canaryscope}"
[ -x "$bin" ] || { echo "tests/vm/test.sh: $bin missing; run cargo xtask build first" >&2; exit 2; }
cp "$bin" "$snap/canaryscope"

# The guest's script: check's report for the kernel matrix, then each
# suite with its time, stopping at the first failure.
guest="$snap/suites.sh"
{
    echo 'set -e'
    printf 'cd %s\n' "$(sq "$repo")"
    printf '%s check --json > "%s/check-$(uname -r).json" 2>/dev/null || true\n' \
        "$(sq "$snap/canaryscope")" "$repo/target/vm"
    printf 'for round in $(seq %d); do\n' "$repeat"
} > "$guest"
only=()
while [ $# -gt 0 ]; do
    case "$1" in
        --only) [ $# -ge 2 ] || usage; only+=("$2"); shift 2; continue ;;
        -*) usage ;;
    esac
    [ -x "$1" ] || { echo "tests/vm/test.sh: $1 is not an executable test binary" >&2; exit 2; }
    cp "$1" "$snap/"
    t="$snap/$(basename "$1")"
    name="$(basename "$1")"; name="${name%-*}"
    scope="all tests"
    [ ${#only[@]} -eq 0 ] || scope="${#only[@]} test(s)"
    # Named tests run by their exact names, and the run must report as many
    # passed (all of a suite: at least one): a renamed test or a filter
    # that matches nothing fails the boot instead of passing it empty.
    if [ ${#only[@]} -eq 0 ]; then
        want="-ge 1"; expected="at least 1"; exact=""
    else
        want="-eq ${#only[@]}"; expected="${#only[@]}"; exact=" --exact"
    fi
    {
        printf '  echo "==> [vm] %s: %s (round $round of %d)"; t0=$(date +%%s)\n' "$name" "$scope" "$repeat"
        printf '  { if %s --ignored --test-threads=1%s' "$(sq "$t")" "$exact"
        for o in ${only[@]+"${only[@]}"}; do printf ' %s' "$(sq "$o")"; done
        printf '; then echo 0 > %s/rc; else echo $? > %s/rc; fi; } 2>&1 | tee %s/out\n' \
            "$(sq "$snap")" "$(sq "$snap")" "$(sq "$snap")"
        printf '  [ "$(cat %s/rc)" = 0 ] || exit 1\n' "$(sq "$snap")"
        printf '  passed=$(sed -n "s/^test result: ok\\. \\([0-9]*\\) passed.*/\\1/p" %s/out)\n' "$(sq "$snap")"
        printf '  [ "${passed:-0}" %s ] || { echo "==> [vm] %s: ${passed:-0} tests passed, expected %s: a name matches no test"; exit 1; }\n' \
            "$want" "$name" "$expected"
        printf '  echo "==> [vm] %s took $(( $(date +%%s) - t0 )) s"\n' "$name"
    } >> "$guest"
    only=()
    shift
done
[ ${#only[@]} -eq 0 ] || usage # --only with no binary after it
echo 'done' >> "$guest"

# The suites take 4-7 minutes under TCG; a hung guest fails the step well
# inside CI's budget instead of holding it for the default 40 minutes. The
# limit is per round, so --repeat N is not cut short by its own length.
"$here/run.sh" --kernel "$kernel" --timeout "${CANARYSCOPE_VM_TEST_TIMEOUT:-$((1200 * repeat))}" -- \
    env CANARYSCOPE_IN_VM=1 CANARYSCOPE_FIXTURES="$repo/target/fixtures" CANARYSCOPE_BIN="$snap/canaryscope" \
    ${CANARYSCOPE_SKIPS:+"CANARYSCOPE_SKIPS=$CANARYSCOPE_SKIPS"} \
    ${CANARYSCOPE_KERNEL_SHAPE:+"CANARYSCOPE_KERNEL_SHAPE=$CANARYSCOPE_KERNEL_SHAPE"} \
    sh "$guest"
