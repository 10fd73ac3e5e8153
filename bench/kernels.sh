#!/usr/bin/env bash
# bench/kernels.sh: the portable build (-Dnative=false, kernels chosen at run time) against a
# -Dnative=true build on the same machine, in one run: 110m-shape decode tok/s at batch 1 and
# 16 and prompt rows/s, F16 and Q8_0 weights, both builds with --kernels auto (what each picks
# on this CPU, named in the table) and the portable build's --kernels generic (the portable C
# fallback and oracle). Runs
# alternate between the builds so load from other processes falls on both alike; each figure is
# the median of REPEATS runs and the ratios are taken between medians of this run. Writes the
# "kernels.sh" section of docs/BENCHMARKS.md. On shared cores wall-clock figures swing by 3x from
# one run to the next, so it also measures the CPU time (user + system, one thread) the same work
# takes in each build: what other processes do to the wall clock barely touches it.
# Where the CPU runs the avx512 table (AVX-512 F+BW+VL+DQ: Intel since Skylake-SP, AMD Zen 4),
# also the portable build's --kernels avx512 against --kernels avx2 (alternating, medians of
# REPEATS); elsewhere that A/B is skipped with a message (kvserve's own refusal, naming the
# missing feature).
# Environment: PORTABLE (build), NATIVE (build-native; made with meson setup -Dnative=true if
# missing), REPEATS (5), STEPS (32), THREADS (nproc), TYPES (f16 q8_0).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PORTABLE=${PORTABLE:-build}
NATIVE=${NATIVE:-build-native}
REPEATS=${REPEATS:-5}
STEPS=${STEPS:-32}
THREADS=${THREADS:-$(nproc)}
TYPES=${TYPES:-f16 q8_0}
VOCAB=${VOCAB:-../shared/models/vocab/ggml-vocab-llama-spm.gguf}
[ -f "$VOCAB" ] || { echo "kernels.sh: vocabulary $VOCAB not found" >&2; exit 1; }
if [ ! -d "$NATIVE" ]; then
    meson setup "$NATIVE" -Dnative=true -Dtests=disabled >&2
fi
ninja -C "$PORTABLE" bench/kvs-bench-engine tools/kvs-mkmodel >&2
ninja -C "$NATIVE" bench/kvs-bench-engine >&2
TMP=$(mktemp -d /tmp/kvs-bench-kernels.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# run NAME BUILD KERNELS MODEL: one batch and one prefill run, CSV lines appended to $TMP/NAME.*
run() {
    local name=$1 build=$2 kern=$3 model=$4
    KVS_BENCH_KERNELS=$kern "$build/bench/kvs-bench-engine" batch "$model" "$STEPS" 1,16 "$THREADS" \
        2>>"$TMP/$name.log" | grep -v '^#' | tail -n +2 >>"$TMP/$name.batch"
    KVS_BENCH_KERNELS=$kern "$build/bench/kvs-bench-engine" prefill "$model" 128 "$THREADS" \
        2>>"$TMP/$name.log" | tail -n +2 >>"$TMP/$name.prefill"
}

rows=()
ab_rows=()
AB_SKIP=""
for t in $TYPES; do
    f="$TMP/110m-$t.gguf"
    "$PORTABLE/tools/kvs-mkmodel" --shape 110m --type "$t" --vocab "$VOCAB" -o "$f" >&2
    # avx512 against avx2 in the same (portable) build, where this CPU runs avx512
    if [ -z "$AB_SKIP" ] && ! KVS_BENCH_KERNELS=avx512 "$PORTABLE/bench/kvs-bench-engine" batch \
        "$f" 1 1 1 >/dev/null 2>"$TMP/probe.log"; then
        AB_SKIP=$(grep -m1 -o 'avx512: .*' "$TMP/probe.log" || echo "avx512: the probe run failed")
        echo "kernels.sh: skipping the avx512 / avx2 A/B: --kernels $AB_SKIP" >&2
    fi
    if [ -z "$AB_SKIP" ]; then
        for i in $(seq "$REPEATS"); do
            echo "kernels.sh: $t avx512/avx2 run $i/$REPEATS" >&2
            if [ $((i % 2)) = 1 ]; then
                run "$t-avx512" "$PORTABLE" avx512 "$f"
                run "$t-avx2" "$PORTABLE" avx2 "$f"
            else
                run "$t-avx2" "$PORTABLE" avx2 "$f"
                run "$t-avx512" "$PORTABLE" avx512 "$f"
            fi
        done
    fi
    for i in $(seq "$REPEATS"); do
        echo "kernels.sh: $t run $i/$REPEATS" >&2
        if [ $((i % 2)) = 1 ]; then
            run "$t-portable" "$PORTABLE" auto "$f"
            run "$t-native" "$NATIVE" auto "$f"
        else
            run "$t-native" "$NATIVE" auto "$f"
            run "$t-portable" "$PORTABLE" auto "$f"
        fi
    done
    # CPU seconds of one thread for the same work (load, prefill, 64 decode steps at batch 1
    # and at 16), alternating builds
    for i in $(seq "$REPEATS"); do
        for b in portable native; do
            d=$PORTABLE
            [ "$b" = native ] && d=$NATIVE
            k=auto
            KVS_BENCH_SGEMM=0 KVS_BENCH_KERNELS=$k /usr/bin/time -f '%U %S' -o "$TMP/time" \
                "$d/bench/kvs-bench-engine" batch "$f" 64 1,16 1 >/dev/null 2>&1
            awk '{print $1 + $2}' "$TMP/time" >>"$TMP/$t-$b.cpu"
        done
    done
    # the portable C table: 3 runs, a few steps (it is an order of magnitude slower)
    for i in 1 2 3; do
        KVS_BENCH_KERNELS=generic "$PORTABLE/bench/kvs-bench-engine" batch "$f" 4 1 "$THREADS" \
            2>>"$TMP/$t-generic.log" | grep -v '^#' | tail -n +2 >>"$TMP/$t-generic.batch"
    done
    b1() { awk -F, '$1 == 1 {print $3}' "$TMP/$1.batch" | median; }
    b16() { awk -F, '$1 == 16 {print $3}' "$TMP/$1.batch" | median; }
    pre() { awk -F, '{print $4}' "$TMP/$1.prefill" | median; }
    p1=$(b1 "$t-portable"); n1=$(b1 "$t-native")
    p16=$(b16 "$t-portable"); n16=$(b16 "$t-native")
    pp=$(pre "$t-portable"); np=$(pre "$t-native")
    g1=$(b1 "$t-generic")
    pc=$(median <"$TMP/$t-portable.cpu"); nc=$(median <"$TMP/$t-native.cpu")
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
    rows+=("| ${t^^} | decode, batch 1 (tok/s) | $n1 | $p1 | $(ratio "$p1" "$n1") | $g1 |")
    rows+=("| ${t^^} | decode, batch 16 (tok/s) | $n16 | $p16 | $(ratio "$p16" "$n16") | |")
    rows+=("| ${t^^} | prefill, 128 rows (rows/s) | $np | $pp | $(ratio "$pp" "$np") | |")
    rows+=("| ${t^^} | CPU seconds, 1 thread (less is faster) | $nc | $pc | $(ratio "$nc" "$pc") | |")
    if [ -z "$AB_SKIP" ]; then
        a1=$(b1 "$t-avx512"); v1=$(b1 "$t-avx2")
        a16=$(b16 "$t-avx512"); v16=$(b16 "$t-avx2")
        ap=$(pre "$t-avx512"); vp=$(pre "$t-avx2")
        ab_rows+=("| ${t^^} | decode, batch 1 (tok/s) | $v1 | $a1 | $(ratio "$a1" "$v1") |")
        ab_rows+=("| ${t^^} | decode, batch 16 (tok/s) | $v16 | $a16 | $(ratio "$a16" "$v16") |")
        ab_rows+=("| ${t^^} | prefill, 128 rows (rows/s) | $vp | $ap | $(ratio "$ap" "$vp") |")
    fi
    grep -h -o 'kernels: [a-z0-9]* ([^;]*' "$TMP/$t-native.log" | sort -u | sed 's/^/native build: /' >&2
    rm -f "$f"
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
PICK=$(cat "$TMP"/*-portable.log 2>/dev/null | grep -m1 -o 'kernels: [a-z0-9]*' | cut -d' ' -f2 || true)
PICK=${PICK:-?}

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512dq)$' | tr '\n' ' ')
SECTION="$TMP/section.md"
{
    echo "<!-- kernels.sh begin -->"
    echo "## Portable build against -march=native (bench/kernels.sh)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of ${CPU} (${FLAGS% }), $THREADS engine threads,"
    echo "kvserve $(git rev-parse --short HEAD); random-weight 110m models from kvs-mkmodel. \`portable\`"
    echo "is the default build (\`-Dnative=false\`: every kernel table compiled with its own flags, one"
    echo "chosen at start by \`--kernels auto\`: here \`$PICK\`), \`native\` a"
    echo "\`-Dnative=true\` build (everything compiled with \`-march=native\`, auto's choice). Runs"
    echo "alternate between the two builds; median of $REPEATS runs each ($STEPS decode steps after"
    echo "8-token prompts; prefill: best of 3 steps of 128 rows). \`generic\` is the portable build's"
    echo "\`--kernels generic\` (median of 3 runs of 4 steps). The CPU-seconds row is the user + system"
    echo "time of one thread doing the same work (load, prefill, 64 steps at batch 1 and 16) in each"
    echo "build, median of $REPEATS alternating runs; its ratio is native / portable, so there too a"
    echo "ratio of 1 or more means the portable build is as fast. Load average before: $LOAD_BEFORE, after:"
    echo "$LOAD_AFTER. Command:"
    echo
    echo '```'
    echo "REPEATS=$REPEATS STEPS=$STEPS THREADS=$THREADS bench/kernels.sh"
    echo '```'
    echo
    echo "| weights | figure | native | portable | portable / native | generic |"
    echo "|---|---|---:|---:|---:|---:|"
    printf '%s\n' "${rows[@]}"
    echo
    if [ -n "$AB_SKIP" ]; then
        echo "avx512 against avx2: not measured, this CPU cannot run it (\`--kernels $AB_SKIP\`)."
    else
        echo "avx512 against avx2, both in the portable build, alternating, median of $REPEATS runs:"
        echo
        echo "| weights | figure | avx2 | avx512 | avx512 / avx2 |"
        echo "|---|---|---:|---:|---:|"
        printf '%s\n' "${ab_rows[@]}"
    fi
    echo "<!-- kernels.sh end -->"
} >"$SECTION"
python3 bench/doc_section.py --per-cpu docs/BENCHMARKS.md kernels.sh <"$SECTION"
cat "$SECTION"
