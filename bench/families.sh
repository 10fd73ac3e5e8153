#!/usr/bin/env bash
# bench/families.sh: decode and prefill rates of each model family kvserve runs, next to
# llama.cpp's llama-server (../shared/peer), on one 1B-class shape (kvs-mkmodel's
# tinyllama-1.1b: dim 2048, 22 layers, 32 heads, 4 kv heads, ffn 5632), F16, random weights,
# llama-spm vocabulary; same model file, same threads, same closed-loop client as bench/peer.sh
# (bench/serve_bench.py, non-streaming completions, token-id prompts, ignore_eos). The families
# differ in what the layer does around the same products: Gemma's post-norms and GELU, its
# tied (bigger-looking) output, Qwen 3's head norms, windows. Prints a markdown table.
#   decode: 1 client, PROMPT-token prompts, OUT generated tokens each (N1 requests)
#   prefill: 512-token prompts, 1 generated token, 1 client (NPP requests)
# Environment: BUILD (build), THREADS (nproc), SHAPE (tinyllama-1.1b), FAMILIES (all six),
# OUT (64), PROMPT (32), N1 (2), NPP (2), PEER (../shared/peer/llama.cpp/bin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
THREADS=${THREADS:-$(nproc)}
SHAPE=${SHAPE:-tinyllama-1.1b}
FAMILIES=${FAMILIES:-llama qwen2 qwen3 gemma2 gemma3 phi3}
OUT=${OUT:-64}
PROMPT=${PROMPT:-32}
N1=${N1:-2}
NPP=${NPP:-2}
PEER=${PEER:-../shared/peer/llama.cpp/bin}
VOCAB=${VOCAB:-../shared/models/vocab/ggml-vocab-llama-spm.gguf}
KVSERVE="$BUILD/server/kvserve"
MKMODEL="$BUILD/tools/kvs-mkmodel"
for x in "$KVSERVE" "$MKMODEL"; do
    [ -x "$x" ] || { echo "families.sh: $x missing (ninja -C $BUILD)" >&2; exit 1; }
done
[ -x "$PEER/llama-server" ] || { echo "families.sh: no llama-server in $PEER" >&2; exit 1; }
[ -f "$VOCAB" ] || { echo "families.sh: vocabulary $VOCAB not found" >&2; exit 1; }
TMP=$(mktemp -d /tmp/kvs-bench-families.XXXXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$TMP"' EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

# A port nobody listens on now (the machine is shared: a fixed one may be taken).
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_health() { # PORT LOG PID: our server answers, not another one on the port
    for _ in $(seq 600); do
        kill -0 "$3" 2>/dev/null || { echo "families.sh: server exited:" >&2; tail -5 "$2" >&2; exit 1; }
        curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
        sleep 0.2
    done
    echo "families.sh: server on $1 did not start:" >&2; tail -20 "$2" >&2; exit 1
}

# bench PORT N INPUT OUTPUT -> output tok/s and input tok/s
bench() {
    python3 bench/serve_bench.py --url "http://127.0.0.1:$1" --concurrency 1 \
        --num-requests "$2" --input-len "$3" --output-len "$4" --json "$TMP/r.json" >/dev/null
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("%.1f %.1f" % (s["output_throughput"], s["total_token_throughput"] - s["output_throughput"]))' "$TMP/r.json"
}

# serve WHO MODEL PORT -> "decode-tok/s prefill-tok/s"
serve() {
    local who=$1 model=$2 port=$3 log="$TMP/$1-$3.log" pid
    if [ "$who" = kvserve ]; then
        "$KVSERVE" serve -m "$model" --port "$port" --threads "$THREADS" --ctx-size 1024 \
            --log-level warn 2>"$log" &
    else
        "$PEER/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -t "$THREADS" \
            -tb "$THREADS" -np 1 -c 1024 --no-webui >"$log" 2>&1 &
    fi
    pid=$!
    PIDS+=("$pid")
    wait_health "$port" "$log" "$pid"
    bench "$port" 1 8 4 >/dev/null # warm-up
    local dec pp
    dec=$(bench "$port" "$N1" "$PROMPT" "$OUT" | cut -d' ' -f1)
    pp=$(bench "$port" "$NPP" 512 1 | cut -d' ' -f2)
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    echo "$dec $pp"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", (b > 0 ? a / b : 0)}'; }
rows=()
for fam in $FAMILIES; do
    f="$TMP/$fam.gguf"
    extra=()
    case $fam in gemma2|gemma3) extra=(--sliding-window 512) ;; esac
    "$MKMODEL" --shape "$SHAPE" --type f16 --arch "$fam" --vocab "$VOCAB" "${extra[@]}" \
        -o "$f" 2>/dev/null
    mib=$(( $(stat -c %s "$f") / 1048576 ))
    echo "families.sh: $fam kvserve" >&2
    read -r kd kp <<<"$(serve kvserve "$f" "$(free_port)")"
    echo "families.sh: $fam llama-server" >&2
    read -r ld lp <<<"$(serve llama "$f" "$(free_port)")"
    rows+=("| $fam ($mib MiB) | $kd | $ld | $(ratio "$kd" "$ld")x | $kp | $lp | $(ratio "$kp" "$lp")x |")
    rm -f "$f"
done

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of ${CPU}, $THREADS threads for both, kvserve"
echo "$(git rev-parse --short HEAD), llama.cpp from ../shared/peer; shape $SHAPE F16; decode: 1 client,"
echo "$PROMPT-token prompts, $OUT tokens, $N1 requests; prefill: 512-token prompts, $NPP requests."
echo "Load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg). Command:"
echo
echo '```'
echo "THREADS=$THREADS SHAPE=$SHAPE FAMILIES=\"$FAMILIES\" OUT=$OUT PROMPT=$PROMPT N1=$N1 NPP=$NPP bench/families.sh"
echo '```'
echo
echo "| family | kvserve decode tok/s | llama-server | ratio | kvserve prefill tok/s | llama-server | ratio |"
echo "|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
