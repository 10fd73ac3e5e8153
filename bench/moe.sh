#!/usr/bin/env bash
# bench/moe.sh: a mixture-of-experts model, kvserve against llama.cpp's llama-server
# (../shared/peer) side by side, same file, same threads, same closed-loop client as
# bench/peer.sh (bench/serve_bench.py, non-streaming completions, token-id prompts,
# ignore_eos). kvs-mkmodel writes MODEL's shape with LAYERS of its layers and the llama-spm
# vocabulary (32000, as every side-by-side script here) in F16 (random weights: the whole model
# would be a 40-61 GB F16 file before quantizing; a token's cost is per layer, so the rates scale
# by about LAYERS / all), llama-quantize makes TYPE of it, and both servers load that file.
# MODEL: qwen3-30b-a3b (Qwen3-30B-A3B: qwen3moe, dim 2048, 32 heads of 128, 4 kv heads, 128
# experts of ffn 768, 8 used per token, 48 layers; TYPE Q4_K_M by default) or gpt-oss-20b
# (gpt-oss: dim 2880, 64 heads of 64, 8 kv heads, 32 experts of ffn 2880, 4 used, 24 layers,
# windows of 128 on half of them; TYPE MXFP4_MOE by default, the experts in MXFP4 and the rest
# Q8_0, as the published gpt-oss files) or lfm2-8b-a1b (LFM2-8B-A1B: lfm2moe, dim 2048, 32 heads,
# 8 kv heads, short convolutions in place of attention on two thirds of the layers, 32 experts
# of ffn 1792, 4 used, sigmoid gating, 2 dense layers first, 24 layers; TYPE Q4_K_M; with
# LAYERS 8 the dense pair is a quarter of the file, against a twelfth in the model). In each round both servers are up at once and each
# load level is measured on both back to back, in alternating order:
#   decode: 1 client and 16 clients, PROMPT-token prompts, OUT generated tokens each
#   prefill: 512-token prompts, 1 generated token, 1 client (prompt tokens per second)
# Beside them: the machine's read bandwidth from the same run (kvs-bench-machine) and the bytes a
# token reads (kvserve's load log: every weight but the 120 experts a token does not run), so
# the one-client figures read as a share of bandwidth / bytes; the servers' resident memory
# (VmRSS) after the run against the file's size.
# Writes the "moe.sh" (qwen3-30b-a3b), "moe.sh gpt-oss" or "moe.sh lfm2" section of docs/BENCHMARKS.md (one per
# CPU kind) and prints it.
# Environment: BUILD (build), MODEL (qwen3-30b-a3b), THREADS (nproc), LAYERS (8), TYPE (the
# model's), OUT (32), PROMPT
# (32), N1 (2), N16 (16), NPP (2), REPEATS (1), PEER (../shared/peer/llama.cpp/bin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/peer_lib.sh
. bench/peer_lib.sh
MODEL=${MODEL:-qwen3-30b-a3b}
case $MODEL in
qwen3-30b-a3b)
    ARCH=(--arch qwen3moe --head-dim 128) TYPE=${TYPE:-Q4_K_M} ALL_LAYERS=48 NAME=moe.sh
    TITLE="Qwen3-30B-A3B's shape"
    DESC="Qwen3-30B-A3B's shape (qwen3moe, 128 experts, 8 per token)" ;;
gpt-oss-20b)
    ARCH=(--arch gpt-oss --head-dim 64) TYPE=${TYPE:-MXFP4_MOE} ALL_LAYERS=24 NAME="moe.sh gpt-oss"
    TITLE="gpt-oss-20b's shape"
    DESC="gpt-oss-20b's shape (gpt-oss, 32 experts, 4 per token, windows of 128 on half the layers)" ;;
lfm2-8b-a1b)
    ARCH=(--arch lfm2moe --tied --dense-lead 2) TYPE=${TYPE:-Q4_K_M} ALL_LAYERS=24 NAME="moe.sh lfm2"
    TITLE="LFM2-8B-A1B's shape"
    DESC="LFM2-8B-A1B's shape (lfm2moe: short convolutions on two thirds of the layers, 32 experts of ffn 1792, 4 per token, sigmoid gating; the first 2 layers dense)" ;;
*) echo "moe.sh: MODEL is qwen3-30b-a3b, gpt-oss-20b or lfm2-8b-a1b" >&2; exit 2 ;;
esac
# shellcheck disable=SC2034 # make_model reads it
SHAPE=$MODEL
LAYERS=${LAYERS:-8}
OUT=${OUT:-32}
PROMPT=${PROMPT:-32}
N1=${N1:-2}
N16=${N16:-16}
NPP=${NPP:-2}
REPEATS=${REPEATS:-1}
peer_setup "$KVSERVE" "$MKMODEL" "$MACHINE" --peer llama-server llama-quantize --vocab

make_model "${ARCH[@]}" --layers "$LAYERS"
model=$MODEL
mib=$(( $(stat -c %s "$model") / 1048576 ))

K1=() K16=() KPP=() KRSS=() L1=() L16=() LPP=() LRSS=() rounds=() bws=()
for r in $(seq "$REPEATS"); do
    echo "moe.sh: round $r of $REPEATS" >&2
    read -r k1 k16 kpp krss l1 l16 lpp lrss <<<"$(pair_round "$model" "$(free_port)" \
        "$(free_port)" "$r" --log-level info)"
    K1+=("$k1") K16+=("$k16") KPP+=("$kpp") KRSS+=("$krss")
    L1+=("$l1") L16+=("$l16") LPP+=("$lpp") LRSS+=("$lrss")
    rounds+=("| $r | $(ratio "$k1" "$l1")x | $(ratio "$k16" "$l16")x | $(ratio "$kpp" "$lpp")x |")
    bws+=("$("$MACHINE" read-bw "$THREADS" 2>/dev/null | cut -d, -f4)")
done
k1=$(median <<<"${K1[*]}") k16=$(median <<<"${K16[*]}") kpp=$(median <<<"${KPP[*]}")
l1=$(median <<<"${L1[*]}") l16=$(median <<<"${L16[*]}") lpp=$(median <<<"${LPP[*]}")
krss=$(median <<<"${KRSS[*]}") lrss=$(median <<<"${LRSS[*]}")
bw=$(median <<<"${bws[*]}")
# (the load log's line; awk reads the logs itself: a reader that stops early would break the pipe)
active=$(awk 'match($0, /[0-9.]+ MiB of weights read per token/) {print substr($0, RSTART, RLENGTH); exit}' \
    "$TMP"/kvserve-*.log | cut -d' ' -f1)
# bandwidth (GB/s) / bytes per token: the one-client rate if every byte were read once at the
# measured bandwidth
bound=$(awk -v bw="$bw" -v a="$active" 'BEGIN{printf "%.1f", (a > 0 ? bw * 1e9 / (a * 1048576) : 0)}')

section=$(cat <<EOF
<!-- $NAME begin -->
## Mixture of experts: $TITLE (bench/moe.sh)

Measured $(date -u +%Y-%m-%d) on $(cpu_desc), $THREADS threads for both, load before
$LOAD_BEFORE; kvserve $(git rev-parse --short HEAD), llama.cpp from ../shared/peer. Command:
\`MODEL=$SHAPE THREADS=$THREADS LAYERS=$LAYERS TYPE=$TYPE OUT=$OUT PROMPT=$PROMPT N1=$N1 N16=$N16 NPP=$NPP REPEATS=$REPEATS bench/moe.sh\`.
$DESC with $LAYERS of its $ALL_LAYERS layers and
the llama-spm vocabulary, $TYPE from llama-quantize (random weights): a $mib MiB file; a token
reads $active MiB of it
(every weight but the experts it does not run). Read bandwidth $bw GB/s (kvs-bench-machine,
median of the rounds), so one client's bound is $bound tok/s. Tokens per second, medians of
$REPEATS rounds; both servers up at once, each load level measured on both back to back.

| | kvserve | llama.cpp | ratio |
|---|---:|---:|---:|
| decode, 1 client (tok/s) | $k1 ($(ratio "$k1" "$bound") of the bound) | $l1 ($(ratio "$l1" "$bound") of the bound) | $(ratio "$k1" "$l1")x |
| decode, 16 clients (tok/s) | $k16 | $l16 | $(ratio "$k16" "$l16")x |
| prefill, 512-token prompt (tok/s) | $kpp | $lpp | $(ratio "$kpp" "$lpp")x |
| resident memory after the run (MiB; file $mib) | $krss | $lrss | |

| round | 1 client | 16 clients | prefill |
|---|---:|---:|---:|
$(printf '%s\n' "${rounds[@]}")
<!-- $NAME end -->
EOF
)
python3 bench/doc_section.py --per-cpu docs/BENCHMARKS.md "$NAME" <<<"$section"
echo "$section"
