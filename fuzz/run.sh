#!/usr/bin/env bash
# Coverage-guided fuzzing of the observer's parsers of outside input.
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Builds every target once, then runs each for SECONDS_PER_TARGET (default 20)
# against a scratch copy of its seed corpus, so the committed corpus never
# grows. Exits non-zero if any target crashes, naming the saved input.
# FUZZ_SANITIZER=none builds without AddressSanitizer (faster, fewer checks).
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
FUZZ_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$FUZZ_DIR")
# Both under target/, which git ignores: the instrumented build, and the
# per-run corpora, crash artifacts and logs.
BUILD_DIR="$ROOT/target/fuzz-build"
OUT_DIR="$ROOT/target/fuzz"
SANITIZER=${FUZZ_SANITIZER:-address}

SECONDS_PER_TARGET=${1:-20}
if ! [[ $SECONDS_PER_TARGET =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2
    exit 2
fi
shift $(($# > 0 ? 1 : 0))
if (($# > 0)); then
    TARGETS=("$@")
else
    TARGETS=(cgroup_path proc_maps tracefs_format label_values ld_so_cache judge_request judge_http)
fi

# cargo-fuzz passes -Zsanitizer=... to rustc; this lets the stable toolchain
# accept it. It has no effect on the code generated.
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== cargo-fuzz is missing: cargo install cargo-fuzz --version $CARGO_FUZZ_VERSION --locked"
    echo "   (compiles it from crates.io, about 1.5 min on 2 CPUs)"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi
echo "== $(cargo fuzz --version), $(rustc --version)"

TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
echo "== building all fuzz targets (release, debug assertions, sanitizer: $SANITIZER) into $BUILD_DIR"
# Optimised with debug assertions and overflow checks: cargo-fuzz's default.
cargo fuzz build --fuzz-dir "$FUZZ_DIR" --target-dir "$BUILD_DIR" --target "$TRIPLE" -s "$SANITIZER"

# What `cargo fuzz run` would set; the binaries are run directly so that
# artifacts and corpora go to target/ rather than into fuzz/.
if [[ $SANITIZER == address ]]; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_odr_violation=0"
fi

# One of libFuzzer's -print_final_stats lines, e.g. `stat::peak_rss_mb: 52`.
final_stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -n 1; }

failed=()
for t in "${TARGETS[@]}"; do
    bin="$BUILD_DIR/$TRIPLE/release/$t"
    seeds="$FUZZ_DIR/corpus/$t"
    if [[ ! -x $bin || ! -d $seeds ]]; then
        echo "$t: no such target (binary $bin, seeds $seeds)" >&2
        failed+=("$t")
        continue
    fi
    corpus="$OUT_DIR/corpus/$t"
    artifacts="$OUT_DIR/artifacts/$t/"
    log="$OUT_DIR/logs/$t.log"
    rm -rf "$corpus"
    mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
    cp -R "$seeds/." "$corpus/"

    echo "== $t: ${SECONDS_PER_TARGET}s, log $log"
    rc=0
    # -timeout: an input taking 10 s is a hang worth a report, not a wait of
    # libFuzzer's default 20 minutes.
    "$bin" "$corpus" -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$artifacts" >"$log" 2>&1 || rc=$?

    execs=$(final_stat number_of_executed_units "$log")
    rate=$(final_stat average_exec_per_sec "$log")
    new=$(final_stat new_units_added "$log")
    rss=$(final_stat peak_rss_mb "$log")
    secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
    files=$(find "$corpus" -type f | wc -l)
    if ((rc == 0)); then
        echo "$t: ok, ${execs:-?} execs in ${secs:-?} s (${rate:-?} exec/s), ${new:-?} new units," \
            "corpus $files files, peak RSS ${rss:-?} MB"
    else
        failed+=("$t")
        artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
        echo "$t: FAILED (exit $rc) after ${execs:-?} execs; input: ${artifact:-none saved}" >&2
        grep -m 1 -A 12 -E '^==[0-9]+==|panicked at|ERROR: libFuzzer' "$log" >&2 || tail -n 30 "$log" >&2
        echo "   reproduce: $bin ${artifact:-<input>}" >&2
    fi
done

if ((${#failed[@]} > 0)); then
    echo "fuzzing found failures in: ${failed[*]} (artifacts under $OUT_DIR/artifacts)" >&2
    exit 1
fi
echo "all ${#TARGETS[@]} fuzz targets ran ${SECONDS_PER_TARGET}s each without a failure"
