#!/usr/bin/env bash
# bench/window_memory.sh: KV memory one long Gemma 3 conversation holds, with and without
# kvserve's sliding-window reclaim (issue 13), next to llama-server's SWA cache sizes for the
# same file. The model is kvs-mkmodel's gemma3-1b-kv shape: Gemma 3 1B's KV structure (26
# layers, 5 windowed to 1 global, window 512, one KV head of 256, F16 cache) on a small width
# and vocabulary, random weights, so a long prefill runs on a loaded 2-core machine; the KV
# bytes per token are those of Gemma 3 1B. One request of TOKENS prompt ids and OUT generated
# tokens; bench/window_memory.py samples GET /kv-cache meanwhile and reports the sample at the
# longest sequence. llama-server is only started (-c CTX -np 1) to read the KV buffer sizes it
# logs, default (SWA cache) and --swa-full. Prints a markdown table, then the closed-form
# figures for Gemma 3 1B and 4B at 32k tokens.
# Environment: BUILD (build), THREADS (nproc), TOKENS (32768), OUT (16), PEER
# (../shared/peer/llama.cpp/bin; skipped when absent).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/peer_lib.sh
. bench/peer_lib.sh
TOKENS=${TOKENS:-32768}
OUT=${OUT:-16}
peer_setup "$KVSERVE" "$MKMODEL"

CTX=$(( (TOKENS + OUT + 255) / 256 * 256 )) # llama-server pads its context to 256
MODEL="$TMP/gemma3-1b-kv.gguf"
"$MKMODEL" --shape gemma3-1b-kv --arch gemma3 --head-dim 256 --sliding-window 512 \
    --type f16 --ctx "$CTX" -o "$MODEL" >/dev/null

# Every layer's K/V of CTX tokens fit in the budget either way (26 KiB a token at F16).
MB=$(( CTX * 26 / 1024 + 64 ))
echo "| cache | tokens held | KV bytes held | blocks (global / windowed) | request s |"
echo "|---|---:|---:|---:|---:|"
for mode in reclaim no-reclaim; do
    port=$(free_port)
    extra=()
    [ "$mode" = no-reclaim ] && extra=(--no-window-reclaim)
    "$KVSERVE" serve -m "$MODEL" --port "$port" --threads "$THREADS" --max-num-seqs 1 \
        --ctx-size "$CTX" --kv-cache-mb "$MB" --log-level info "${extra[@]}" \
        2>"$TMP/kvs-$mode.log" &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    wait_health "$port" "$TMP/kvs-$mode.log" "$SERVER_PID"
    python3 bench/window_memory.py --url "http://127.0.0.1:$port" --tokens "$TOKENS" \
        --out "$OUT" >"$TMP/$mode.json"
    stop_server
    python3 - "$mode" "$TMP/$mode.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[2]))
b = r["longest"]
print("| kvserve %s | %d | %.1f MiB (most seen %.1f MiB) | %d / %d | %.0f |" % (
    sys.argv[1], b["tokens"], b["bytes_used"] / 2**20, r["max_bytes_used"] / 2**20,
    b["blocks"], b["window_blocks"], r["seconds"]))
PY
done

if [ -x "$PEER/llama-server" ]; then
    for mode in swa swa-full; do
        port=$(free_port)
        extra=()
        [ "$mode" = swa-full ] && extra=(--swa-full)
        "$PEER/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$port" -t "$THREADS" \
            -np 1 -c "$CTX" --no-webui -lv 4 "${extra[@]}" >"$TMP/peer-$mode.log" 2>&1 &
        SERVER_PID=$!
        PIDS+=("$SERVER_PID")
        wait_health "$port" "$TMP/peer-$mode.log" "$SERVER_PID"
        stop_server
        # llama_kv_cache: CPU KV buffer size = X MiB, once per cache (SWA and non-SWA)
        mib=$(grep -o 'KV buffer size = *[0-9.]* MiB' "$TMP/peer-$mode.log" |
              awk '{s += $(NF-1)} END {printf "%.1f", s}')
        echo "| llama-server $mode (allocated at start) | $CTX cells | $mib MiB | | |"
    done
else
    echo "window_memory.sh: no llama-server in $PEER: peer rows skipped" >&2
fi

# Closed form, 32768 tokens, F16: bytes a token per layer = 2 (K, V) * kv heads * head dim * 2;
# a windowed layer holds at most ceil((window + 512) / 16) + 3 blocks of 16 (kvserve's bound,
# 512-token prefill chunks) and in decode window / 16 + 1 (the measured 33 for window 512).
python3 - <<'PY'
def mib(x): return x / 2**20
for name, layers, glob, kvh, hd, win in (("Gemma 3 1B", 26, 4, 1, 256, 512),
                                         ("Gemma 3 4B", 34, 5, 4, 256, 1024)):
    per = 2 * kvh * hd * 2
    t = 32768
    full = layers * t * per
    held = glob * t * per + (layers - glob) * (win // 16 + 1) * 16 * per
    print("| %s at 32k (computed) | %d | without %.0f MiB, with %.0f MiB | | |" % (
        name, t, mib(full), mib(held)))
PY
echo
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $THREADS threads;" \
     "$(date -u +%Y-%m-%d); load before $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg)" \
     "(shared machine)"
