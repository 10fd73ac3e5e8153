#!/usr/bin/env bash
# Throughput and time to first token against concurrency (closed loop, streaming, so TTFT is
# the real first-token time): writes docs/bench/concurrency-<model>.csv, a gnuplot PNG, and the
# "concurrency" section of docs/BENCHMARKS.md for that model (one section per model name).
# Usage: bench/concurrency.sh [MODEL.gguf | SHAPE-TYPE] [LEVELS] [REQUESTS_PER_CLIENT]
# SHAPE-TYPE (e.g. 110m-f16) is generated with kvs-mkmodel (random weights, llama-spm vocab).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K.gguf}
levels=${2:-"1 2 4 8 16 32 64"}
per=${3:-8}
bash tools/setup.sh
bash tools/build.sh
# shellcheck source=tools/lib.sh
. tools/lib.sh
kvs_apt_need concurrency.sh gnuplot-nox
name=$(basename "$model" .gguf)
if [[ $model != *.gguf ]]; then
    gen=$(mktemp -d)
    ./build/tools/kvs-mkmodel --shape "${model%-*}" --type "${model##*-}" \
        --vocab ../shared/models/vocab/ggml-vocab-llama-spm.gguf -o "$gen/$name.gguf" >/dev/null
    model_file=$gen/$name.gguf
else
    model_file=$model
fi
mkdir -p docs/bench
csv=docs/bench/concurrency-$name.csv
png=docs/bench/concurrency-$name.png
port=18090
./build/server/kvserve serve -m "$model_file" --port $port --max-num-seqs 64 --log-level warn \
    2>/tmp/kvserve-concurrency.log &
pid=$!
trap 'kill $pid 2>/dev/null || true; [ -z "${gen:-}" ] || rm -rf "$gen"' EXIT
for _ in $(seq 100); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 0.1; done
echo "clients,output_tok_s,ttft_p50_ms,ttft_p99_ms,itl_p50_ms" >"$csv"
for c in $levels; do
    python3 bench/serve_bench.py --url http://127.0.0.1:$port --concurrency "$c" \
        --num-requests $((c * per)) --input-len 32 --output-len 128 --stream \
        --json /tmp/kvserve-concurrency.json >/dev/null
    python3 - "$c" >>"$csv" <<'PY'
import json, sys
s = json.load(open("/tmp/kvserve-concurrency.json"))
print(f"{sys.argv[1]},{s['output_throughput']:.0f},{s['ttft_ms']['p50']:.2f},"
      f"{s['ttft_ms']['p99']:.2f},{s['itl_ms']['p50']:.3f}")
PY
done
gnuplot <<GP
set terminal pngcairo size 900,520
set output "$png"
set datafile separator ","
set title "kvserve, $name: streaming, 32 prompt + 128 output tokens, closed loop"
set xlabel "concurrent clients"
set logscale x 2
set ylabel "output tokens/s"
set y2label "TTFT p50 (ms)"
set ytics nomirror
set y2tics
set key top left
set grid
plot "$csv" using 1:2 skip 1 with linespoints title "output tokens/s" axes x1y1, \
     "$csv" using 1:3 skip 1 with linespoints title "TTFT p50 (ms)" axes x1y2
GP
table=$(awk -F, 'NR>1 {printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}' "$csv")
section=$(cat <<MD
<!-- concurrency-$name:begin (written by bench/concurrency.sh) -->
## Throughput and TTFT against concurrency ($name)

$(date -u +%Y-%m-%d), $(nproc) cores, kvserve $(git rev-parse --short HEAD), load average before
the run: $(cut -d' ' -f1-3 /proc/loadavg). Command: \`bench/concurrency.sh $model "$levels" $per\`
(streaming completions, 32 prompt tokens, 128 output tokens, $per requests per client).

| clients | output tok/s | TTFT p50 (ms) | TTFT p99 (ms) | ITL p50 (ms) |
|---:|---:|---:|---:|---:|
$table

![throughput and TTFT against concurrency](bench/concurrency-$name.png)
<!-- concurrency-$name:end -->
MD
)
printf '%s\n' "$section" | python3 bench/doc_section.py docs/BENCHMARKS.md "concurrency-$name"
echo "$section"
