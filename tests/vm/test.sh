#!/usr/bin/env bash
# Runs integration test binaries inside the test VM (Debian's 6.1 kernel with
# kprobes, amdgpu and /dev/kfd, pure cgroup v2). Arguments: the test
# executables to run with --ignored; the host root is the guest's root, so
# the same paths work inside.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
if [ $# -eq 0 ]; then
    echo "usage: tests/vm/test.sh TEST_BINARY... (cargo xtask test passes them)" >&2
    exit 2
fi
tests=""
for t in "$@"; do tests="$tests '$t'"; done
exec "$here/run.sh" --timeout "${CANARYSCOPE_VM_TEST_TIMEOUT:-2400}" -- \
    env CANARYSCOPE_IN_VM=1 CANARYSCOPE_FIXTURES="$repo/target/fixtures" \
    sh -c "set -e; cd '$repo'; for t in $tests; do echo \"==> [vm] \$(basename \$t)\"; \"\$t\" --ignored --test-threads=1; done"
