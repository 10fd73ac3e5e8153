#!/usr/bin/env bash
# Sets up, builds and runs every test suite, the way CI does:
#   release build           all suites
#   -Dnative=true build     the numeric suites (dtype, kernels, engine, models, dequant)
#   ASan+UBSan build        all suites (halt on the first finding)
#   TSan build              the threaded suites (scheduler, scheduler_stress, end-to-end server,
#                           load_short)
#   libFuzzer               each fuzz target for KVS_FUZZ_SECONDS (default 60) from its seeds
# Ends with one line: "N passed, N failed, N skipped" (one count per suite per build).
# Usage: tools/test.sh [--quick]   (--quick: release build only)
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

quick=0
[ "${1:-}" = "--quick" ] && quick=1
passed=0 failed=0 skipped=0

# run_suites NAME DIR "MESON SETUP ARGS" [SUITE...]
run_suites() {
    local name=$1 dir=$2 args=$3
    shift 3
    echo "=== $name ($dir)"
    if [ ! -f "$dir/build.ninja" ]; then
        # shellcheck disable=SC2086
        if ! meson setup "$dir" $args >"$dir.setup.log" 2>&1; then
            cat "$dir.setup.log"; failed=$((failed + 1)); return
        fi
    fi
    if ! ninja -C "$dir" >"$dir.build.log" 2>&1; then
        tail -50 "$dir.build.log"; failed=$((failed + 1)); return
    fi
    meson test -C "$dir" --print-errorlogs --num-processes 2 "$@" || true
    local log="$dir/meson-logs/testlog.json"
    [ -f "$log" ] || { failed=$((failed + 1)); return; }
    local counts
    counts=$(python3 - "$log" <<'PY'
import json, sys
p = f = s = 0
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    r = json.loads(line).get("result", "")
    if r in ("OK", "EXPECTEDFAIL"):
        p += 1
    elif r == "SKIP":
        s += 1
    else:
        f += 1
print(p, f, s)
PY
)
    read -r p f s <<<"$counts"
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    echo "=== $name: $p passed, $f failed, $s skipped"
}

# Style: every C file as .clang-format says (LLVM base, 4 spaces, 100 columns).
echo "=== format"
if git rev-parse --git-dir >/dev/null 2>&1 && command -v clang-format >/dev/null; then
    # shellcheck disable=SC2046
    if clang-format --dry-run --Werror $(git ls-files '*.c' '*.h') 2>/tmp/kvs-format.log; then
        echo "format: ok"; passed=$((passed + 1))
    else
        head -20 /tmp/kvs-format.log; echo "format: FAILED (run clang-format -i on the files above)"
        failed=$((failed + 1))
    fi
else
    echo "format: skipped (no git checkout or no clang-format)"; skipped=$((skipped + 1))
fi

run_suites release build ""
if [ $quick -eq 0 ]; then
    # -march=native is an option the README offers: its numeric suites must hold too (a
    # compiler's auto-vectorization for the build machine once broke the integer reference)
    run_suites native build-native "-Dnative=true -Dtests=enabled" dtype kernels engine models dequant
    run_suites asan build-asan "-Db_sanitize=address,undefined -Dbuildtype=debug -Db_lundef=false"
    threaded=()
    suites=$(meson test -C build --list 2>/dev/null)
    for s in scheduler scheduler_stress e2e load_short; do
        grep -qx "$s" <<<"$suites" && threaded+=("$s")
    done
    run_suites tsan build-tsan "-Db_sanitize=thread -Dbuildtype=debug -Db_lundef=false" "${threaded[@]}"
    echo "=== fuzz"
    while read -r line; do
        echo "$line"
        case "$line" in
        "fuzz "*": ok"*) passed=$((passed + 1)) ;;
        "fuzz "*": FAILED"*) failed=$((failed + 1)) ;;
        "fuzz run: FAILED") [ "$failed" -gt 0 ] || failed=$((failed + 1)) ;;
        esac
    done < <(bash tools/fuzz.sh "${KVS_FUZZ_SECONDS:-60}" 2>&1 || echo "fuzz run: FAILED")
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
