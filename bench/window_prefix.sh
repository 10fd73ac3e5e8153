#!/usr/bin/env bash
# bench/window_prefix.sh: prefix reuse of a re-sent long conversation on a hybrid model
# (issue 13: windowed layers matched backwards from the hit's end). The model is kvs-mkmodel's
# gemma3-1b-kv shape (Gemma 3 1B's KV structure: 26 layers, 5 windowed to 1 global, window
# 512; small width, random weights). One request of TOKENS prompt ids and OUT generated tokens,
# then the same ids and TURN new ones (a chat client sending the conversation back): the
# second request's prefix-cache hits (/metrics) and seconds, with the window reclaim and
# without it (--no-window-reclaim), and with OLD (a kvserve binary to compare, optional).
# Environment: BUILD (build), THREADS (nproc), TOKENS (2048), OUT (16), TURN (32), OLD.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/peer_lib.sh
. bench/peer_lib.sh
TOKENS=${TOKENS:-2048}
OUT=${OUT:-16}
TURN=${TURN:-32}
OLD=${OLD:-}
peer_setup "$KVSERVE" "$MKMODEL" ${OLD:+"$OLD"}

CTX=$(( (TOKENS + TURN + OUT + 255) / 256 * 256 ))
MODEL="$TMP/gemma3-1b-kv.gguf"
"$MKMODEL" --shape gemma3-1b-kv --arch gemma3 --head-dim 256 --sliding-window 512 \
    --type f16 --ctx "$CTX" -o "$MODEL" >/dev/null
MB=$(( CTX * 26 / 1024 + 64 )) # every layer's K/V of CTX tokens fit either way

echo "load before: $LOAD_BEFORE"
echo "| server | first request s | re-sent request s | prefix hits (blocks of 16) | of full blocks shared |"
echo "|---|---:|---:|---:|---:|"
modes=(reclaim no-reclaim)
[ -n "$OLD" ] && modes+=(old-reclaim)
for mode in "${modes[@]}"; do
    port=$(free_port)
    bin=$KVSERVE
    extra=()
    [ "$mode" = no-reclaim ] && extra=(--no-window-reclaim)
    [ "$mode" = old-reclaim ] && bin=$OLD
    "$bin" serve -m "$MODEL" --port "$port" --threads "$THREADS" --max-num-seqs 1 \
        --ctx-size "$CTX" --kv-cache-mb "$MB" "${extra[@]}" 2>"$TMP/kvs-$mode.log" &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    wait_health "$port" "$TMP/kvs-$mode.log" "$SERVER_PID"
    python3 - "$mode" "$port" "$TOKENS" "$OUT" "$TURN" <<'PY'
import json, sys, time, urllib.request
mode, port, tokens, out, turn = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
url = "http://127.0.0.1:%s" % port
def post(prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": out, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    t = time.time()
    urllib.request.urlopen(req, timeout=3600).read()
    return time.time() - t
def hits():
    for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
        if line.startswith("kvserve_prefix_cache_hits_total "):
            return float(line.split()[1])
ids = [(i * 37 + 11) % 200 + 3 for i in range(tokens)]
t1 = post(ids)
h0 = hits()
t2 = post(ids + [(i * 53 + 7) % 200 + 3 for i in range(turn)])
print("| kvserve %s | %.1f | %.1f | %d | %d |" % (mode, t1, t2, hits() - h0, tokens // 16))
PY
    stop_server
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
