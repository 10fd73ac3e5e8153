# shellcheck shell=bash
# Shell functions of the side-by-side benchmarks (bench/peer.sh, bench/quant.sh): starting
# kvserve or llama-server on a model, waiting for it, one closed-loop client run, ratios.
# Source it after setting KVSERVE, PEER, THREADS, TMP and PIDS (an array: every server started
# is added, for the caller's EXIT trap) and WHO (the script's name, for messages).

# free_port: a loopback port nobody listens on now (the machine is shared: a fixed one may be
# taken)
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_health PORT LOG PID: until /health answers while PID lives (so it is our server, not
# another one on the port; 3 minutes at most; else LOG's tail and exit 1)
wait_health() {
    for _ in $(seq 900); do
        kill -0 "$3" 2>/dev/null || { echo "$WHO: server exited:" >&2; tail -5 "$2" >&2; exit 1; }
        curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
        sleep 0.2
    done
    echo "$WHO: server on $1 did not start:" >&2; tail -20 "$2" >&2; exit 1
}

# start_server kvserve|llama MODEL PORT LOG [KVSERVE ARGS...]: both with THREADS threads and
# room for 16 sequences of 1024 tokens; sets SERVER_PID once /health answers.
start_server() {
    local who=$1 model=$2 port=$3 log=$4
    shift 4
    if [ "$who" = kvserve ]; then
        "$KVSERVE" serve -m "$model" --port "$port" --threads "$THREADS" --max-num-seqs 16 \
            --ctx-size 1024 --log-level warn "$@" 2>"$log" &
    else
        "$PEER/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -t "$THREADS" \
            -tb "$THREADS" -np 16 -c $((16 * 1024)) --no-webui >"$log" 2>&1 &
    fi
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    wait_health "$port" "$log" "$SERVER_PID"
}

# stop_server: the one start_server started
stop_server() {
    kill "$SERVER_PID"
    wait "$SERVER_PID" 2>/dev/null || true
}

# bench PORT CONCURRENCY N INPUT OUTPUT -> "output-tok/s input-tok/s" of one closed-loop run
# (bench/serve_bench.py, non-streaming completions, token-id prompts, ignore_eos)
bench() {
    python3 bench/serve_bench.py --url "http://127.0.0.1:$1" --concurrency "$2" \
        --num-requests "$3" --input-len "$4" --output-len "$5" --json "$TMP/r.json" >/dev/null
    python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("%.1f %.1f" % (s["output_throughput"], s["total_token_throughput"] - s["output_throughput"]))' "$TMP/r.json"
}

# ratio A B -> A / B with two decimals (0 when B is 0)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", (b > 0 ? a / b : 0)}'; }
