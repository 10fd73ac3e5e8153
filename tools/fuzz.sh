#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) and runs each for SECONDS (default 60).
# Usage: tools/fuzz.sh [SECONDS] [TARGET...]
# New inputs found go to a scratch corpus under build-fuzz/; crashes are written to
# build-fuzz/crash-*, and each becomes a regression seed in tests/fuzz/corpus/<target>/.
# Prints one line per target: "fuzz <target>: ok, N execs" or "fuzz <target>: FAILED".
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_gguf fuzz_tokenizer fuzz_api fuzz_chat_template fuzz_http_head)
if [ ! -f build-fuzz/build.ninja ]; then
    CC=clang meson setup build-fuzz -Dfuzz=true -Dbuildtype=debugoptimized \
        -Db_sanitize=address,undefined -Dc_args=-fsanitize=fuzzer-no-link -Db_lundef=false \
        >build-fuzz.setup.log 2>&1 || { cat build-fuzz.setup.log; exit 1; }
fi
ninja -C build-fuzz >build-fuzz.build.log 2>&1 || { tail -40 build-fuzz.build.log; exit 1; }
status=0
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
for t in "${targets[@]}"; do
    seeds="tests/fuzz/corpus/${t#fuzz_}"
    work="build-fuzz/corpus-${t#fuzz_}"
    mkdir -p "$work"
    log="build-fuzz/$t.log"
    if ./build-fuzz/tests/fuzz/"$t" "$work" "$seeds" -max_total_time="$secs" -timeout=10 \
        -rss_limit_mb=4096 -artifact_prefix=build-fuzz/ -print_final_stats=1 >"$log" 2>&1; then
        execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
        echo "fuzz $t: ok, ${execs:-?} execs in ${secs}s"
    else
        echo "fuzz $t: FAILED"
        grep -E 'ERROR|SUMMARY|Test unit written' "$log" | head -10
        status=1
    fi
done
exit $status
