#!/usr/bin/env bash
# Runs integration test binaries inside the test VM (Debian's 6.1 kernel with
# kprobes, amdgpu and /dev/kfd, pure cgroup v2). Arguments: the test
# executables to run with --ignored; the host root is the guest's root, so
# the same paths work inside.
#
# The test binaries and the canaryscope binary they start are copied to
# target/vm/run-<pid>/ first: a build on the host during the (long) VM run
# would otherwise replace them under the guest's feet.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
usage() {
    echo "usage: tests/vm/test.sh [--kernel FLAVOUR] [--repeat N] TEST_BINARY... (cargo xtask test passes them)" >&2
    exit 2
}
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
tests=""
for t in "$@"; do
    cp "$t" "$snap/"
    tests="$tests '$snap/$(basename "$t")'"
done
# The suites take 4-5 minutes under TCG; a hung guest fails the step well
# inside CI's budget instead of holding it for the default 40 minutes.
"$here/run.sh" --kernel "$kernel" --timeout "${CANARYSCOPE_VM_TEST_TIMEOUT:-1200}" -- \
    env CANARYSCOPE_IN_VM=1 CANARYSCOPE_FIXTURES="$repo/target/fixtures" CANARYSCOPE_BIN="$snap/canaryscope" \
    sh -c "set -e; cd '$repo'; \"$snap/canaryscope\" check --json > \"$repo/target/vm/check-\$(uname -r).json\" 2>/dev/null || true; for round in \$(seq $repeat); do for t in $tests; do echo \"==> [vm] \$(basename \$t) (round \$round of $repeat)\"; \"\$t\" --ignored --test-threads=1; done; done"
