#!/usr/bin/env bash
# bench/models.sh: engine decode speed of a 1.1B-parameter model (TinyLlama's shape: dim 2048,
# 22 layers, 4 kv heads, ffn 5632, vocab 32000; random weights from kvs-mkmodel) in F16 and
# Q8_0, at batch 1 and 16 after 128-token prompts, with the model's size and load time: what a
# user's real model costs here. Writes the "models.sh" section of docs/BENCHMARKS.md.
# Environment: BUILD (build), REPEATS (3), STEPS (16), THREADS (nproc), TYPES (f16 q8_0).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
REPEATS=${REPEATS:-3}
STEPS=${STEPS:-16}
THREADS=${THREADS:-$(nproc)}
TYPES=${TYPES:-f16 q8_0}
VOCAB=${VOCAB:-../shared/models/vocab/ggml-vocab-llama-spm.gguf}
BENCH="$BUILD/bench/kvs-bench-engine"
MKMODEL="$BUILD/tools/kvs-mkmodel"
[ -x "$BENCH" ] && [ -x "$MKMODEL" ] || { echo "models.sh: build first (ninja -C $BUILD)" >&2; exit 1; }
[ -f "$VOCAB" ] || { echo "models.sh: vocabulary $VOCAB not found" >&2; exit 1; }
TMP=$(mktemp -d /tmp/kvs-bench-models.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

rows=()
for t in $TYPES; do
    f="$TMP/tinyllama-1.1b-$t.gguf"
    "$MKMODEL" --shape tinyllama-1.1b --type "$t" --vocab "$VOCAB" -o "$f" >&2
    size=$(du -m "$f" | cut -f1)
    for i in $(seq "$REPEATS"); do
        echo "models.sh: $t run $i/$REPEATS" >&2
        KVS_BENCH_PROMPT=128 "$BENCH" batch "$f" "$STEPS" 1,16 "$THREADS" >"$TMP/$t.$i.csv" 2>"$TMP/$t.$i.log"
    done
    b1=$(for i in $(seq "$REPEATS"); do awk -F, '$1 == 1 {print $3}' "$TMP/$t.$i.csv"; done | median)
    b16=$(for i in $(seq "$REPEATS"); do awk -F, '$1 == 16 {print $3}' "$TMP/$t.$i.csv"; done | median)
    load=$(for i in $(seq "$REPEATS"); do grep -o 'loaded in [0-9.]*' "$TMP/$t.$i.log" | awk '{print $3}'; done | median)
    rows+=("| ${t^^} | $size MiB | $load s | $b1 | $b16 |")
    rm -f "$f"
done

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
SECTION="$TMP/section.md"
{
    echo "<!-- models.sh begin -->"
    echo "## A 1.1B model (bench/models.sh)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of ${CPU}, $THREADS engine threads, kvserve"
    echo "$(git rev-parse --short HEAD); TinyLlama-1.1B's shape (dim 2048, 22 layers, 32 heads / 4 kv"
    echo "heads, ffn 5632, vocab 32000) with random weights from kvs-mkmodel. Decode after 128-token"
    echo "prompts, $STEPS steps, median of $REPEATS runs. Load average before: $LOAD_BEFORE. Command:"
    echo
    echo '```'
    echo "REPEATS=$REPEATS STEPS=$STEPS THREADS=$THREADS bench/models.sh"
    echo '```'
    echo
    echo "| weights | file | load (warm cache) | decode tok/s, batch 1 | decode tok/s, batch 16 |"
    echo "|---|---:|---:|---:|---:|"
    printf '%s\n' "${rows[@]}"
    echo "<!-- models.sh end -->"
} >"$SECTION"
python3 bench/doc_section.py docs/BENCHMARKS.md models.sh <"$SECTION"
cat "$SECTION"
