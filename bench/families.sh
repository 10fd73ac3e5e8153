#!/usr/bin/env bash
# bench/families.sh: decode and prefill rates of each model family kvserve runs, next to
# llama.cpp's llama-server (../shared/peer), on one 1B-class shape (kvs-mkmodel's
# tinyllama-1.1b: dim 2048, 22 layers, 32 heads, 4 kv heads, ffn 5632), F16, random weights,
# llama-spm vocabulary; same model file, same threads, same closed-loop client as bench/peer.sh
# (bench/serve_bench.py, non-streaming completions, token-id prompts, ignore_eos). The families
# differ in what the layer does around the same products: Gemma's post-norms and GELU, its
# tied (bigger-looking) output, Qwen 3's head norms, windows, SmolLM3's unrotated layers,
# Granite's four scalars, ERNIE 4.5's (llama's block), LFM2's short convolutions in place of
# attention on 14 of the 22 layers (their B*x rows in the paged cache), OLMo 2's post-norms, Mistral 3's attention temperature. Writes its section of
# docs/BENCHMARKS.md (one per CPU kind) and prints it.
#   decode: 1 client, PROMPT-token prompts, OUT generated tokens each (N1 requests)
#   prefill: 512-token prompts, 1 generated token, 1 client (NPP requests)
# Environment: BUILD (build), THREADS (nproc), SHAPE (tinyllama-1.1b), FAMILIES (the thirteen dense),
# OUT (64), PROMPT (32), N1 (2), NPP (2), PEER (../shared/peer/llama.cpp/bin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/peer_lib.sh
. bench/peer_lib.sh
SHAPE=${SHAPE:-tinyllama-1.1b}
FAMILIES=${FAMILIES:-llama qwen2 qwen3 gemma2 gemma3 gemma3n phi3 smollm3 granite ernie4_5 lfm2 olmo2 mistral3}
OUT=${OUT:-64}
PROMPT=${PROMPT:-32}
N1=${N1:-2}
NPP=${NPP:-2}
peer_setup "$KVSERVE" "$MKMODEL" --peer llama-server --vocab

# serve kvserve|llama MODEL PORT -> "decode-tok/s prefill-tok/s"
serve() {
    start_server "$1" "$2" "$3" "$TMP/$1-$3.log"
    bench "$3" 1 1 8 4 >/dev/null # warm-up
    local dec pp
    dec=$(bench "$3" 1 "$N1" "$PROMPT" "$OUT" | cut -d' ' -f1)
    pp=$(bench "$3" 1 "$NPP" 512 1 | cut -d' ' -f2)
    stop_server
    echo "$dec $pp"
}

rows=()
for fam in $FAMILIES; do
    f="$TMP/$fam.gguf"
    extra=()
    case $fam in gemma2|gemma3|gemma3n) extra=(--sliding-window 512) ;; esac
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

SECTION="$TMP/section.md"
{
    echo "<!-- families.sh begin -->"
    echo "## Model families (bench/families.sh)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of $(cpu_desc), $THREADS threads for both,"
    echo "kvserve $(git rev-parse --short HEAD), llama.cpp from ../shared/peer; shape $SHAPE F16 (random weights,"
    echo "llama-spm vocabulary; gemma files tied, windows of 512); decode: 1 client, $PROMPT-token prompts,"
    echo "$OUT tokens, $N1 requests; prefill: 512-token prompts, $NPP requests; one run of each."
    echo "Load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg). Command:"
    echo
    echo '```'
    echo "THREADS=$THREADS SHAPE=$SHAPE FAMILIES=\"$FAMILIES\" OUT=$OUT PROMPT=$PROMPT N1=$N1 NPP=$NPP bench/families.sh"
    echo '```'
    echo
    echo "| family | kvserve decode tok/s | llama-server | ratio | kvserve prefill tok/s | llama-server | ratio |"
    echo "|---|---:|---:|---:|---:|---:|---:|"
    printf '%s\n' "${rows[@]}"
    echo "<!-- families.sh end -->"
} >"$SECTION"
# per CPU kind (bench/doc_section.py): each kind's figures stay beside the others
python3 bench/doc_section.py --per-cpu docs/BENCHMARKS.md families.sh <"$SECTION"
cat "$SECTION"
