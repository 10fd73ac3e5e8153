#!/usr/bin/env bash
# bench/embed.sh: POST /v1/embeddings, kvserve next to llama.cpp's llama-server --embeddings in
# one run, on the same file: kvs-mkmodel writes SHAPE (Qwen3 0.6B's: Qwen3-Embedding-0.6B) as a
# qwen3 embedding model (pooling last, EOS appended; random weights, llama-spm vocabulary) in
# F16, and ../shared/peer's llama-quantize makes TYPE from it. For each case NxL of CASES (N
# inputs of L token ids in one request: a batch of documents to index, or one query),
# alternating, REPEATS times, each with new inputs (bench/embed_client.py): inputs per second
# and input tokens per second of the median wall time. Both servers: THREADS threads; kvserve
# with its defaults (64 sequences, 512 tokens a step), llama-server with 16 slots of 512 tokens.
# Writes the "embed.sh" section of docs/BENCHMARKS.md (one per CPU kind).
# Environment: BUILD (build), THREADS (nproc), SHAPE (qwen3-0.6b), TYPE (Q8_0), CASES
# ("64x128 1x32"), REPEATS (3), PEER (../shared/peer/llama.cpp/bin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/peer_lib.sh
. bench/peer_lib.sh
SHAPE=${SHAPE:-qwen3-0.6b}
TYPE=${TYPE:-Q8_0}
CASES=${CASES:-64x128 1x32}
REPEATS=${REPEATS:-3}
peer_setup "$KVSERVE" "$MKMODEL" --peer llama-server llama-quantize --vocab

make_model --arch qwen3 --head-dim 128 --pooling 3 --add-eos
model=$MODEL

kport=$(free_port)
"$KVSERVE" serve -m "$model" --port "$kport" --threads "$THREADS" --ctx-size 1024 \
    --log-level warn 2>"$TMP/kvserve.log" &
kpid=$!
PIDS+=("$kpid")
wait_health "$kport" "$TMP/kvserve.log" "$kpid"
pport=$(free_port)
"$PEER/llama-server" -m "$model" --host 127.0.0.1 --port "$pport" -t "$THREADS" -tb "$THREADS" \
    -np 16 -c $((16 * 512)) --embeddings --no-mmap --no-webui >"$TMP/llama.log" 2>&1 &
ppid=$!
PIDS+=("$ppid")
wait_health "$pport" "$TMP/llama.log" "$ppid"

# one URL N L SEED -> inputs per second of that request
one() {
    local dt
    dt=$(python3 bench/embed_client.py --url "$1" --inputs "$2" --len "$3" --seed "$4")
    awk -v n="$2" -v t="$dt" 'BEGIN{printf "%.2f", n / t}'
}

rows=""
seed=1
for c in $CASES; do
    n=${c%x*}
    l=${c#*x}
    one "http://127.0.0.1:$kport" "$n" "$l" $((seed++)) >/dev/null # warm-ups, unmeasured
    one "http://127.0.0.1:$pport" "$n" "$l" $((seed++)) >/dev/null
    k="" p=""
    for _ in $(seq "$REPEATS"); do
        # (the seeds are counted here: an increment inside $(...) is the subshell's own)
        k+=" $(one "http://127.0.0.1:$kport" "$n" "$l" "$seed")"
        p+=" $(one "http://127.0.0.1:$pport" "$n" "$l" $((seed + 1)))"
        seed=$((seed + 2))
    done
    rk=$(median <<<"$k")
    rp=$(median <<<"$p")
    echo "$c: kvserve $rk inputs/s (runs$k), llama.cpp $rp (runs$p)" >&2
    tk=$(awk -v r="$rk" -v l="$l" 'BEGIN{printf "%.0f", r * l}')
    tp=$(awk -v r="$rp" -v l="$l" 'BEGIN{printf "%.0f", r * l}')
    rows+="| $n x $l | $rk | $rp | $tk | $tp | $(ratio "$rk" "$rp") |"$'\n'
done
kill "$kpid" "$ppid" 2>/dev/null || true

section=$(cat <<SECTION
<!-- embed.sh begin -->
## Embeddings against llama-server (bench/embed.sh)

Measured $(date -u +%Y-%m-%d) on $(cpu_desc), $THREADS threads, load before
$LOAD_BEFORE; $SHAPE as a qwen3 embedding model (pooling last; random weights), $TYPE, both
servers on the same file. Command:
\`THREADS=$THREADS SHAPE=$SHAPE TYPE=$TYPE CASES="$CASES" REPEATS=$REPEATS bench/embed.sh\`.
One request of N inputs of L token ids, new inputs every time (no prefix cache); medians of
$REPEATS alternating runs; llama-server with \`--embeddings\`, 16 slots.

| inputs x tokens | kvserve inputs/s | llama.cpp inputs/s | kvserve tok/s | llama.cpp tok/s | ratio |
|---|---:|---:|---:|---:|---:|
${rows%$'\n'}
<!-- embed.sh end -->
SECTION
)
python3 bench/doc_section.py --per-cpu docs/BENCHMARKS.md embed.sh <<<"$section"
echo "$section"
