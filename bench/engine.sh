#!/usr/bin/env bash
# bench/engine.sh: engine speed on the 110m shape (random weights, real sizes).
# Generates 110m F32 and F16 models into a temp dir, runs kvs-bench-engine
#   position  step time vs position, cached decode against full recompute, up to MAX_POS (F16)
#   batch     decode tok/s at batch 1,4,16,64 (F32 and F16) and the sgemm rate of the run
#   prefill   prompt rows per second in one step of 16..512 rows (F16)
# REPEATS times each, keeps the per-row median, writes CSVs and a gnuplot PNG to OUT, and
# rewrites the "Engine" section of docs/BENCHMARKS.md (between the engine.sh markers).
# Run on a quiet machine: every number is wall-clock.
#
# Environment: BUILD (build), OUT (docs/bench), REPEATS (3), MAX_POS (2048), STEPS (32),
# THREADS (nproc), BATCHES (1,4,16,64), KEEP_MODELS=1 keeps the temp dir.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
OUT=${OUT:-docs/bench}
REPEATS=${REPEATS:-3}
MAX_POS=${MAX_POS:-2048}
STEPS=${STEPS:-32}
THREADS=${THREADS:-$(nproc)}
BATCHES=${BATCHES:-1,4,16,64}
VOCAB=${VOCAB:-../shared/models/vocab/ggml-vocab-llama-spm.gguf}
BENCH="$BUILD/bench/kvs-bench-engine"
MKMODEL="$BUILD/tools/kvs-mkmodel"

[ -x "$BENCH" ] && [ -x "$MKMODEL" ] || { echo "engine.sh: build first (ninja -C $BUILD)" >&2; exit 1; }
[ -f "$VOCAB" ] || { echo "engine.sh: vocabulary $VOCAB not found" >&2; exit 1; }
# shellcheck source=tools/lib.sh
. "$(dirname "$0")/../tools/lib.sh"
kvs_apt_need engine.sh gnuplot-nox

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
TMP=$(mktemp -d /tmp/kvs-bench-engine.XXXXXX)
cleanup() { [ "${KEEP_MODELS:-0}" = 1 ] && echo "models kept in $TMP" >&2 || rm -rf "$TMP"; }
trap cleanup EXIT
mkdir -p "$OUT"

for t in f32 f16; do
    "$MKMODEL" --shape 110m --type "$t" --vocab "$VOCAB" -o "$TMP/110m-$t.gguf" >&2
done

# Runs the bench REPEATS times; raw CSVs go to $TMP/NAME.N.csv.
run() {
    local name=$1
    shift
    for i in $(seq 1 "$REPEATS"); do
        echo "engine.sh: $name run $i/$REPEATS" >&2
        "$BENCH" "$@" 2>/dev/null >"$TMP/$name.$i.csv"
    done
}

run position-f16 position "$TMP/110m-f16.gguf" "$MAX_POS" "$THREADS"
for t in f32 f16; do
    run batch-$t batch "$TMP/110m-$t.gguf" "$STEPS" "$BATCHES" "$THREADS"
done
run prefill-f16 prefill "$TMP/110m-f16.gguf" 16,64,128,256,512 "$THREADS"

# Medians per row, the CSVs, the plot data and the markdown section.
python3 - "$TMP" "$OUT" "$REPEATS" <<'EOF'
import csv, glob, statistics, sys
tmp, out, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])

def load(name):
    runs = []
    for i in range(1, reps + 1):
        rows, extra = [], []
        for line in open(f"{tmp}/{name}.{i}.csv"):
            (extra if line.startswith("#") else rows).append(line.strip())
        runs.append((list(csv.reader(rows)), extra))
    head = runs[0][0][0]
    body = [[statistics.median(float(r[0][k][j]) for r in runs) for j in range(len(head))]
            for k in range(1, len(runs[0][0]))]
    return head, body, [e for r in runs for e in r[1]]

def fmt(v):
    return str(int(v)) if v == int(v) else f"{v:.4g}"

head, pos, _ = load("position-f16")
with open(f"{out}/engine-position.csv", "w") as f:
    f.write(",".join(head) + "\n")
    for r in pos:
        f.write(",".join(fmt(v) for v in r) + "\n")
batch = {}
with open(f"{out}/engine-batch.csv", "w") as f:
    f.write("type,batch,steps,tok_per_s,ms_per_step,sgemm_gflops,engine_gflops\n")
    for t in ("f32", "f16"):
        head, body, extra = load(f"batch-{t}")
        sg = statistics.median(float(e.split(":")[1].split()[0]) for e in extra if "sgemm" in e)
        batch[t] = (body, sg)
        for r in body:
            # 2 flops per weight per token: 134.1M params less the embedding table (24.6M),
            # which is read once per token rather than multiplied, plus the output projection.
            gf = r[2] * 2 * (134.11e6 - 24.58e6) / 1e9
            f.write(f"{t},{fmt(r[0])},{fmt(r[1])},{r[2]:.1f},{r[3]:.3f},{sg:.1f},{gf:.1f}\n")

lines = ["| type | batch | tok/s | ms/step | GFLOP/s (engine) | sgemm GFLOP/s (64x768x2048) |",
         "|---|---:|---:|---:|---:|---:|"]
for t in ("f32", "f16"):
    body, sg = batch[t]
    for r in body:
        gf = r[2] * 2 * (134.11e6 - 24.58e6) / 1e9
        lines.append(f"| {t.upper()} | {int(r[0])} | {r[2]:.1f} | {r[3]:.2f} | {gf:.1f} | {sg:.1f} |")
head, pre, _ = load("prefill-f16")
with open(f"{out}/engine-prefill.csv", "w") as f:
    f.write(",".join(head) + "\n")
    for r in pre:
        f.write(",".join(fmt(v) for v in r) + "\n")
lines += ["", "Prompt processing, F16 (one step of R prompt rows: R / 32 sequences of 32 tokens, "
          "logits for each sequence's last row):", "",
          "| rows | ms/step | rows/s |", "|---:|---:|---:|"]
for r in pre:
    lines.append(f"| {int(r[0])} | {r[2]:.1f} | {r[3]:.0f} |")
lines += ["", "Step time against position, one sequence (F16 weights, F16 cache):", "",
          "| position | cached ms/step | recompute ms |", "|---:|---:|---:|"]
for r in pos:
    lines.append(f"| {int(r[0])} | {r[1]:.2f} | {r[2]:.1f} |")
open(f"{tmp}/tables.md", "w").write("\n".join(lines) + "\n")
EOF

gnuplot <<EOF
set terminal pngcairo size 900,560 noenhanced
set output "$OUT/engine-position.png"
set datafile separator ","
set title "kvserve engine, 110m F16, $THREADS threads: step time vs position"
set xlabel "position (tokens in context)"
set ylabel "ms per step"
set logscale y
set key top left
set grid
plot "$OUT/engine-position.csv" every ::1 using 1:2 with linespoints title "decode step, paged KV cache", \
     "" every ::1 using 1:3 with linespoints title "recompute whole sequence"
EOF

gnuplot <<EOF
set terminal pngcairo size 900,560 noenhanced
set output "$OUT/engine-batch.png"
set datafile separator ","
set title "kvserve engine, 110m, $THREADS threads: decode step time and throughput vs batch size"
set xlabel "sequences in the step (batch)"
set logscale x 2
set ylabel "ms per step"
set y2label "tokens/s"
set ytics nomirror
set y2tics
set key top left
set grid
plot "< grep '^f32' $OUT/engine-batch.csv" using 2:5 with linespoints title "F32 ms/step", \\
     "< grep '^f16' $OUT/engine-batch.csv" using 2:5 with linespoints title "F16 ms/step", \\
     "< grep '^f32' $OUT/engine-batch.csv" using 2:4 axes x1y2 with linespoints dt 2 title "F32 tok/s", \\
     "< grep '^f16' $OUT/engine-batch.csv" using 2:4 axes x1y2 with linespoints dt 2 title "F16 tok/s"
EOF

LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
FLAGS=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|f16c|avx512f)$' | tr '\n' ' ')
DOC=docs/BENCHMARKS.md
SECTION="$TMP/section.md"
{
    echo "<!-- engine.sh begin -->"
    echo "## Engine (bench/engine.sh)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of ${CPU} (${FLAGS% }), $THREADS engine threads;"
    echo "random-weight 110m models (dim 768, 12 layers, ffn 2048, vocab 32000) from kvs-mkmodel."
    echo "Median of $REPEATS runs. Load average (1/5/15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER"
    echo "(the after figure includes this benchmark's own threads; anything well above THREADS means"
    echo "other processes shared the cores and the figures understate the engine). Command:"
    echo
    echo '```'
    echo "REPEATS=$REPEATS MAX_POS=$MAX_POS STEPS=$STEPS THREADS=$THREADS bench/engine.sh"
    echo '```'
    echo
    echo "Decode throughput (every sequence steps once per forward; 8-token prompts):"
    echo
    cat "$TMP/tables.md"
    echo
    echo "![step time vs batch size]($(realpath --relative-to=docs "$OUT")/engine-batch.png)"
    echo
    echo "![step time vs position]($(realpath --relative-to=docs "$OUT")/engine-position.png)"
    echo
    echo "CSVs: \`$OUT/engine-batch.csv\`, \`$OUT/engine-prefill.csv\`, \`$OUT/engine-position.csv\`."
    echo "<!-- engine.sh end -->"
} >"$SECTION"
mkdir -p docs
[ -f "$DOC" ] || printf '# Benchmarks\n\n' >"$DOC"
python3 bench/doc_section.py "$DOC" engine.sh <"$SECTION"
cat "$SECTION"
