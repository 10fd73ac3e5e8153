#!/bin/bash
# The relay's cost (docs/BENCHMARKS.md, "The relay's cost"): two kvserve binaries, started in
# turn on stories260K, each measured with wrk on short completions and on /health, for ROUNDS
# alternating rounds in one run. Usage: bench/relay_cost.sh BEFORE_BIN AFTER_BIN
# (e.g. a build of the commit before server/relay.c, and build/server/kvserve).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
model=${KVS_SHARED_MODELS:-$here/../shared/models}/stories260K.gguf
port=${PORT:-18391}
rounds=${ROUNDS:-2}
[ $# -eq 2 ] || { echo "usage: $0 BEFORE_BIN AFTER_BIN" >&2; exit 2; }
[ -f "$model" ] || { echo "skip: $model not found" >&2; exit 0; }
command -v wrk >/dev/null || { echo "skip: wrk not installed (tools/setup.sh)" >&2; exit 0; }
for round in $(seq "$rounds"); do
    for bin in "$1" "$2"; do
        "$bin" serve -m "$model" --host 127.0.0.1 --port "$port" --ctx-size 512 --threads 1 \
            --http-threads 2 2>/dev/null &
        pid=$!
        for _ in $(seq 100); do
            curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
            sleep 0.1
        done
        echo "== $bin round $round; $(uptime)"
        MAX_TOKENS=8 wrk -t2 -c16 -d10s -s "$here/bench/wrk-completions.lua" \
            "http://127.0.0.1:$port" | grep -E "Latency|requests,|Requests/sec"
        wrk -t2 -c64 -d10s "http://127.0.0.1:$port/health" | grep -E "Latency|Requests/sec"
        # CPU ticks per thread over both runs (relay and front door are unnamed "kvserve" ones)
        for t in /proc/"$pid"/task/*; do
            printf '%s:%s ' "$(cat "$t/comm")" "$(awk '{print $14+$15}' "$t/stat")"
        done
        echo
        kill "$pid"
        wait "$pid" || true
    done
done
