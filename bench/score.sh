#!/usr/bin/env bash
# bench/score.sh: scoring prompts, as lm-evaluation-harness's loglikelihood tasks ask it
# (/v1/completions with echo and logprobs: every prompt token's logprob given those before it),
# with kvserve's plain prefill and llama.cpp's in the same run. llama-server scores no prompt
# (it ignores echo), so its figure is the prompt computed for one generated token: the least a
# score would cost it. kvs-mkmodel writes the SHAPE in F16 (random weights, llama-spm
# vocabulary), ../shared/peer's llama-quantize makes TYPE from it; both servers load that file
# (start_server: THREADS threads, 16 slots). For each case BxP of CASES (B prompts of P tokens
# in one request), alternating, REPEATS times, each with new prompts (bench/score_client.py):
#   kvserve score   echo, logprobs 1, max_tokens 0
#   kvserve plain   max_tokens 1
#   llama.cpp       /completion, n_predict 1, cache_prompt false
# Prompt tokens per second of the median wall time.
# Writes the "score.sh" section of docs/BENCHMARKS.md (one per CPU kind).
# Environment: BUILD (build), THREADS (nproc), SHAPE (tinyllama-1.1b), TYPE (Q4_K_M), CASES
# ("1x512 8x128"), REPEATS (3), PEER (../shared/peer/llama.cpp/bin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/peer_lib.sh
. bench/peer_lib.sh
SHAPE=${SHAPE:-tinyllama-1.1b}
TYPE=${TYPE:-Q4_K_M}
CASES=${CASES:-1x512 8x128}
REPEATS=${REPEATS:-3}
peer_setup "$KVSERVE" "$MKMODEL" --peer llama-server llama-quantize --vocab

make_model
model=$MODEL

kport=$(free_port)
start_server kvserve "$model" "$kport" "$TMP/kvserve.log"
kpid=$SERVER_PID
pport=$(free_port)
start_server llama "$model" "$pport" "$TMP/llama.log"
ppid=$SERVER_PID

# one MODE URL B P SEED -> prompt tokens per second of that request
one() {
    local dt
    dt=$(python3 bench/score_client.py --url "$2" --mode "$1" --prompts "$3" --len "$4" --seed "$5")
    awk -v b="$3" -v p="$4" -v t="$dt" 'BEGIN{printf "%.1f", b * p / t}'
}

rows=""
seed=1
for c in $CASES; do
    b=${c%x*}
    p=${c#*x}
    # a warm-up of each, unmeasured
    one score "http://127.0.0.1:$kport" "$b" "$p" $((seed++)) >/dev/null
    one plain "http://127.0.0.1:$kport" "$b" "$p" $((seed++)) >/dev/null
    one peer "http://127.0.0.1:$pport" "$b" "$p" $((seed++)) >/dev/null
    s="" k="" l=""
    for _ in $(seq "$REPEATS"); do
        # (the seeds are counted here: an increment inside $(...) is the subshell's own)
        s+=" $(one score "http://127.0.0.1:$kport" "$b" "$p" "$seed")"
        k+=" $(one plain "http://127.0.0.1:$kport" "$b" "$p" $((seed + 1)))"
        l+=" $(one peer "http://127.0.0.1:$pport" "$b" "$p" $((seed + 2)))"
        seed=$((seed + 3))
    done
    ms=$(median <<<"$s")
    mk=$(median <<<"$k")
    ml=$(median <<<"$l")
    echo "$c: kvserve score $ms (runs$s), plain $mk (runs$k); llama.cpp plain $ml (runs$l)" >&2
    rows+="| $b x $p | $ms | $mk | $ml | $(ratio "$ms" "$mk") | $(ratio "$ms" "$ml") |"$'\n'
done
kill "$kpid" "$ppid" 2>/dev/null || true

section=$(cat <<EOF
<!-- score.sh begin -->
## Scoring prompts: echo with logprobs (bench/score.sh)

Measured $(date -u +%Y-%m-%d) on $(cpu_desc), $THREADS threads, load before
$LOAD_BEFORE; $SHAPE $TYPE (random weights), both servers on the same file. Command:
\`THREADS=$THREADS SHAPE=$SHAPE TYPE=$TYPE CASES="$CASES" REPEATS=$REPEATS bench/score.sh\`.
Prompt tokens per second, medians of $REPEATS alternating runs, every request with new prompts
(no prefix cache). *score*: kvserve with \`echo\`, \`logprobs: 1\`, \`max_tokens: 0\` (each
prompt token's logprob, what lm-evaluation-harness's loglikelihood tasks ask); *plain*: the
prompts computed for one generated token (llama.cpp's \`/completion\`, \`cache_prompt: false\`,
which has no way to score a prompt).

| prompts x tokens | kvserve score | kvserve plain | llama.cpp plain | score / plain | score / llama.cpp plain |
|---|---:|---:|---:|---:|---:|
${rows%$'\n'}
<!-- score.sh end -->
EOF
)
python3 bench/doc_section.py --per-cpu docs/BENCHMARKS.md score.sh <<<"$section"
echo "$section"
