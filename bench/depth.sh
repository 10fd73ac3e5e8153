#!/usr/bin/env bash
# bench/depth.sh: decode speed against the context already in the cache, kvserve's engine next
# to llama.cpp's in one run: "cost per token flat as the sequence grows" measured. kvs-mkmodel
# writes the SHAPE in F16 (random weights, llama-spm vocabulary), ../shared/peer's llama-quantize
# makes TYPE from it, then for each depth D of DEPTHS, alternating, REPEATS times:
#   kvserve      kvs-bench-engine batch (KVS_BENCH_PROMPT=D: D positions cached first, untimed),
#                STEPS decode steps of one sequence
#   OLD          the same with another kvs-bench-engine binary (optional: a before/after)
#   llama.cpp    llama-bench -lm none -p 0 -n STEPS -d D (its depth is untimed too)
# and, for the depths of B16_DEPTHS, 16 sequences at once: kvs-bench-engine batch 16 against
# llama-batched-bench -npl 16 -npp D -ntg STEPS (its S_TG); and for each length P of PROMPTS one
# prompt of P tokens, the time to its first token: kvs-bench-engine prefill (KVS_BENCH_PREFILL_LEN=P,
# one forward of P rows) against llama-bench -p P -n 0 (prompt tok/s both; attention grows with
# P squared). Medians; the ratio of the same run.
# Writes the "depth.sh" section of docs/BENCHMARKS.md (one per CPU kind).
# Environment: BUILD (build), THREADS (nproc), SHAPE (tinyllama-1.1b), TYPE (Q4_K_M; F16 serves
# the F16 file itself), DEPTHS ("0 512 2048 4096"), B16_DEPTHS ("512"; "" for none), PROMPTS
# ("512 2048 4096"; "" for none), STEPS (32), REPEATS (3), OLD (unset), PEER
# (../shared/peer/llama.cpp/bin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/peer_lib.sh
. bench/peer_lib.sh
SHAPE=${SHAPE:-tinyllama-1.1b}
TYPE=${TYPE:-Q4_K_M}
DEPTHS=${DEPTHS:-0 512 2048 4096}
B16_DEPTHS=${B16_DEPTHS-512}
PROMPTS=${PROMPTS-512 2048 4096}
STEPS=${STEPS:-32}
REPEATS=${REPEATS:-3}
OLD=${OLD:-}
peer_setup "$ENGINE" "$MKMODEL" --peer llama-bench llama-batched-bench llama-quantize --vocab
[ -z "$OLD" ] || [ -x "$OLD" ] || { echo "$WHO: OLD=$OLD is not executable" >&2; exit 1; }

make_model
model=$MODEL

# engine BINARY ROWS DEPTH -> decode tok/s of kvs-bench-engine batch (which prefills at least
# one position: depth 0 is 1 there)
engine() {
    KVS_BENCH_SGEMM=0 KVS_BENCH_PROMPT=$(($3 > 0 ? $3 : 1)) "$1" batch "$model" "$STEPS" "$2" "$THREADS" 2>/dev/null |
        tail -1 | cut -d, -f3
}
# -lm none in both: llama.cpp reads the weights into its own buffers, as kvserve does; mapped,
# it decodes a file written just before at about half speed (bench/peer_lib.sh).
# llama DEPTH -> llama-bench's generation tok/s after DEPTH cached positions
llama() {
    "$PEER/llama-bench" -m "$model" -lm none -p 0 -n "$STEPS" -d "$1" -t "$THREADS" -r 1 -o csv 2>/dev/null |
        python3 -c 'import csv,sys; print(list(csv.DictReader(sys.stdin))[-1]["avg_ts"])'
}
# llama16 DEPTH -> llama-batched-bench's S_TG with 16 sequences of DEPTH prompt tokens
llama16() {
    "$PEER/llama-batched-bench" -m "$model" -lm none -c $((16 * ($1 + STEPS + 16))) -b 2048 -ub 512 \
        -npp "$1" -ntg "$STEPS" -npl 16 -t "$THREADS" 2>/dev/null |
        awk -F'|' '$2 ~ /^ *[0-9]+ *$/ {gsub(/ /, "", $9); v = $9} END {print v}'
}

# prompt BINARY P -> kvs-bench-engine's prompt tok/s for one sequence's P-token prompt
prompt() {
    KVS_BENCH_SGEMM=0 KVS_BENCH_PREFILL_LEN=$2 "$1" prefill "$model" "$2" "$THREADS" 2>/dev/null |
        tail -1 | cut -d, -f4
}
# llama_pp P -> llama-bench's prompt tok/s for a P-token prompt
llama_pp() {
    "$PEER/llama-bench" -m "$model" -lm none -p "$1" -n 0 -t "$THREADS" -r 1 -o csv 2>/dev/null |
        python3 -c 'import csv,sys; print(list(csv.DictReader(sys.stdin))[-1]["avg_ts"])'
}

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
rows=()
measure() { # ROWS DEPTH
    local k="" o="" l=""
    for _ in $(seq "$REPEATS"); do
        k+=" $(engine "$ENGINE" "$1" "$2")"
        [ -z "$OLD" ] || o+=" $(engine "$OLD" "$1" "$2")"
        if [ "$1" = 1 ]; then l+=" $(llama "$2")"; else l+=" $(llama16 "$2")"; fi
    done
    local km lm om="-"
    km=$(median <<<"$k")
    lm=$(median <<<"$l")
    [ -z "$OLD" ] || om=$(median <<<"$o")
    rows+=("| $1 | $2 | $km | $om | $lm | $(ratio "$km" "$lm")x |")
    echo "$WHO: ${rows[-1]} (kvserve:$k; old:${o:- -}; llama.cpp:$l)" >&2
}
for d in $DEPTHS; do measure 1 "$d"; done
for d in $B16_DEPTHS; do measure 16 "$d"; done
prows=()
for p in $PROMPTS; do
    k="" o="" l=""
    for _ in $(seq "$REPEATS"); do
        k+=" $(prompt "$ENGINE" "$p")"
        [ -z "$OLD" ] || o+=" $(prompt "$OLD" "$p")"
        l+=" $(llama_pp "$p")"
    done
    km=$(median <<<"$k")
    lm=$(median <<<"$l")
    om="-"
    [ -z "$OLD" ] || om=$(median <<<"$o")
    prows+=("| $p | $km | $om | $lm | $(ratio "$km" "$lm")x |")
    echo "$WHO: ${prows[-1]} (kvserve:$k; old:${o:- -}; llama.cpp:$l)" >&2
done

SECTION="$TMP/section.md"
{
    echo "<!-- depth.sh begin -->"
    echo "## Decode against context depth, and long prompts (bench/depth.sh)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of ${CPU}, $THREADS threads for both, kvserve"
    echo "$(git rev-parse --short HEAD), llama.cpp from ../shared/peer. The $SHAPE shape (random weights) as"
    echo "$TYPE; decode tok/s over $STEPS steps after the depth's positions are cached (untimed on both"
    echo "sides): kvs-bench-engine batch (the engine, no HTTP) against llama-bench -d (1 sequence) and"
    echo "llama-batched-bench -npl 16 (S_TG, 16 sequences); medians of $REPEATS alternating runs. Load average"
    echo "before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg). Command:"
    echo
    echo '```'
    echo "THREADS=$THREADS SHAPE=$SHAPE TYPE=$TYPE DEPTHS=\"$DEPTHS\" B16_DEPTHS=\"$B16_DEPTHS\" PROMPTS=\"$PROMPTS\" STEPS=$STEPS REPEATS=$REPEATS${OLD:+ OLD=$OLD} bench/depth.sh"
    echo '```'
    echo
    echo "| sequences | depth | kvserve tok/s | before (OLD) | llama.cpp tok/s | kvserve / llama.cpp |"
    echo "|---:|---:|---:|---:|---:|---:|"
    printf '%s\n' "${rows[@]}"
    if [ ${#prows[@]} -gt 0 ]; then
        echo
        echo "One prompt of P tokens, the time to its first token as prompt tok/s: kvs-bench-engine"
        echo "prefill (one forward of the P rows; the server runs a prompt in steps of"
        echo "--max-batched-tokens, 512 by default) against llama-bench -p P -n 0 (its batches of 2048,"
        echo "ubatches of 512); medians of $REPEATS alternating runs."
        echo
        echo "| prompt tokens | kvserve tok/s | before (OLD) | llama.cpp tok/s | kvserve / llama.cpp |"
        echo "|---:|---:|---:|---:|---:|"
        printf '%s\n' "${prows[@]}"
    fi
    echo "<!-- depth.sh end -->"
} >"$SECTION"
python3 bench/doc_section.py --per-cpu docs/BENCHMARKS.md depth.sh <"$SECTION"
cat "$SECTION"
