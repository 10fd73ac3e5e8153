#!/usr/bin/env bash
# Serving benchmark matrix of the issue's targets; writes the "Serving" section of
# docs/BENCHMARKS.md (between its markers) with the figures, commands, machine and date.
#   stories260K, 1 and 64 closed-loop clients, 128 output tokens, non-streaming
#   110m shape F16 (random weights, llama-spm vocab), 1 and 16 clients
#   wrk -t2 -c64 -d10s /health
# Each figure is the median of RUNS runs (default 3). Usage: bench/serve.sh [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
bash tools/setup.sh
bash tools/build.sh
# shellcheck source=tools/lib.sh
. tools/lib.sh
kvs_apt_need serve.sh wrk
models=../shared/models
tmp=$(mktemp -d)
trap 'pkill -P $$ kvserve 2>/dev/null || true; rm -rf "$tmp"' EXIT
kvserve=./build/server/kvserve

start_server() { # MODEL PORT [flags...]
    local model=$1 port=$2
    shift 2
    $kvserve serve -m "$model" --port "$port" --log-level warn "$@" 2>"$tmp/server-$port.log" &
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$port/health" >/dev/null && return 0
        sleep 0.1
    done
    echo "server on $port did not start"; cat "$tmp/server-$port.log"; exit 1
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# bench_tok PORT CLIENTS REQUESTS -> median output tok/s (also keeps the last JSON)
bench_tok() {
    local port=$1 c=$2 n=$3
    for _ in $(seq "$runs"); do
        python3 bench/serve_bench.py --url "http://127.0.0.1:$port" --concurrency "$c" \
            --num-requests "$n" --input-len 32 --output-len 128 --json "$tmp/last.json" >/dev/null
        python3 -c "import json;print(round(json.load(open('$tmp/last.json'))['output_throughput']))"
    done | median
}

bench_wrk() {
    local port=$1
    for _ in $(seq "$runs"); do
        wrk -t2 -c64 -d10s "http://127.0.0.1:$port/health" | awk '/Requests\/sec/ {print int($2)}'
    done | median
}

rows=()
if [ -f "$models/stories260K.gguf" ]; then
    start_server "$models/stories260K.gguf" 18080 --max-num-seqs 64
    s1=$(bench_tok 18080 1 100)
    s64=$(bench_tok 18080 64 640)
    h=$(bench_wrk 18080)
    pkill -f "port 18080" || true
    rows+=("| stories260K, 1 client | 2,450 tok/s | ≥ 3,700 tok/s | $s1 tok/s |")
    rows+=("| stories260K, 64 clients | 4,600 tok/s | ≥ 14,000 tok/s | $s64 tok/s |")
    rows+=("| \`wrk -t2 -c64 -d10s /health\` | 31,000 req/s | ≥ 45,000 req/s | $h req/s |")
fi
if [ -f "$models/vocab/ggml-vocab-llama-spm.gguf" ]; then
    ./build/tools/kvs-mkmodel --shape 110m --type f16 --vocab "$models/vocab/ggml-vocab-llama-spm.gguf" \
        -o "$tmp/110m-f16.gguf" >/dev/null
    start_server "$tmp/110m-f16.gguf" 18081 --max-num-seqs 16
    m1=$(bench_tok 18081 1 6)
    m16=$(bench_tok 18081 16 32)
    pkill -f "port 18081" || true
    rows+=("| 110m shape F16, 1 client | 57 tok/s | ≥ 57 tok/s | $m1 tok/s |")
    rows+=("| 110m shape F16, 16 clients | 232 tok/s | ≥ 460 tok/s | $m16 tok/s |")
fi

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
section=$(cat <<MD
<!-- serve:begin (written by bench/serve.sh; edit the script, not this section) -->
## Serving: throughput against llama.cpp's server

$(date -u +%Y-%m-%d), $(nproc) cores ($cpu), kvserve $(git rev-parse --short HEAD).
Command: \`bench/serve.sh $runs\` — closed-loop clients (\`bench/serve_bench.py\`), 32 prompt
tokens, 128 output tokens (\`ignore_eos\`), non-streaming, median of $runs runs. llama-server
figures are the issue's (llama.cpp 82bb485, \`-np 16 -c 8192 -t 2\`, same kind of machine).

| workload | llama-server | target | kvserve |
|---|---|---|---|
$(printf '%s\n' "${rows[@]}")
<!-- serve:end -->
MD
)
printf '%s\n' "$section" | python3 bench/doc_section.py docs/BENCHMARKS.md serve
echo "$section"
