#!/usr/bin/env bash
# bench/quant.sh: kvserve against llama.cpp's llama-server on quantized GGUFs, side by side in
# one run: kvs-mkmodel writes the TinyLlama-1.1B shape in F16 (random weights, llama-spm
# vocabulary), ../shared/peer's llama-quantize makes each file type of TYPES from it, and both
# servers serve the same file with the same threads to the same closed-loop client
# (bench/serve_bench.py, non-streaming completions, token-id prompts, ignore_eos), at 1 and 16
# clients, and prompt processing (NPP 512-token prompts, 1 output token, 1 client: prompt tokens
# per second); in each round both servers are up at once and each load level is measured on both
# back to back, in alternating order. Also: the machine's read bandwidth (kvs-bench-machine, same run) and the batch-1 bound
# it gives (bandwidth / file bytes per token), and kvserve's resident size after the run against
# the file's size. Writes the "quant.sh" section of docs/BENCHMARKS.md.
# Environment: BUILD (build), THREADS (nproc), SHAPE (tinyllama-1.1b), TYPES ("Q4_K_M Q4_0
# Q5_K_M Q6_K Q8_0"), OUT (64), PROMPT (32), N1 (3 requests at 1 client), N16 (16 requests at 16
# clients), NPP (2 prompts of 512 tokens), F32_TYPES (the types also served with --activations f32, default all of TYPES, "" none; the
# others show "-" in the f32 columns), REPEATS (1: rounds per type, both servers in each, so both
# see the same minutes of a shared machine; the table gives each figure's median and every
# round's ratios follow it; the f32 columns are measured in the first round only),
# PEER (../shared/peer/llama.cpp/bin), KV_MB (128: kvserve's --kv-cache-mb; a 7B shape wants
# 512 for 16 clients), MODELS (a directory that keeps the F16 file and each type's file as
# SHAPE-TYPE.gguf and reuses them when present: a 7B shape takes minutes to write and quantize;
# default: made afresh in a temporary directory). A SHAPE other than tinyllama-1.1b writes its own
# section ("quant.sh-SHAPE").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/peer_lib.sh
. bench/peer_lib.sh
SHAPE=${SHAPE:-tinyllama-1.1b}
TYPES=${TYPES:-Q4_K_M Q4_0 Q5_K_M Q6_K Q8_0}
F32_TYPES=${F32_TYPES-$TYPES} # set and empty: no f32 runs
OUT=${OUT:-64}
PROMPT=${PROMPT:-32}
N1=${N1:-3}
N16=${N16:-16}
NPP=${NPP:-2}
KV_MB=${KV_MB:-128}
REPEATS=${REPEATS:-1}
peer_setup "$KVSERVE" "$MKMODEL" "$MACHINE" --peer llama-server llama-quantize --vocab
PORT=18710

# serve kvserve|llama MODEL PORT [kvserve args] -> "tok/s@1 tok/s@16 rss-MiB"
serve() {
    local who=$1 model=$2 port=$3
    shift 3
    start_server "$who" "$model" "$port" "$TMP/$who-$port.log" "$@"
    bench "$port" 1 1 "$PROMPT" "$OUT" >/dev/null # warm-up
    local one sixteen rss
    one=$(bench "$port" 1 "$N1" "$PROMPT" "$OUT" | cut -d' ' -f1)
    sixteen=$(bench "$port" 16 "$N16" "$PROMPT" "$OUT" | cut -d' ' -f1)
    rss=$(awk '/^VmRSS:/ {printf "%.0f", $2 / 1024}' "/proc/$SERVER_PID/status")
    stop_server
    echo "$one $sixteen $rss"
}

bw=$("$MACHINE" read-bw "$THREADS" 2>/dev/null | cut -d, -f4)
MODELS=${MODELS:-$TMP}
mkdir -p "$MODELS"
base="$MODELS/$SHAPE-f16.gguf"
[ -s "$base" ] || "$MKMODEL" --shape "$SHAPE" --type f16 --vocab "$VOCAB" -o "$base" >&2
NAME=quant.sh
[ "$SHAPE" = tinyllama-1.1b ] || NAME="quant.sh-$SHAPE"
N_TYPES=$(wc -w <<<"$TYPES")
write_section() { # DONE-TYPES-COUNT
    local SECTION="$TMP/section.md"
    {
    echo "<!-- $NAME begin -->"
    echo "## Quantized GGUFs against llama-server (bench/quant.sh)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of $(cpu_desc), $THREADS threads for both"
    echo "servers, kvserve $(git rev-parse --short HEAD), llama.cpp from ../shared/peer. The $SHAPE shape"
    echo "(random weights) in F16, quantized by llama-quantize to each type; closed-loop clients of"
    echo "bench/serve_bench.py, non-streaming completions, $PROMPT-token prompts, $OUT output tokens"
    echo "(ignore_eos); prefill: $NPP 512-token prompts, 1 output token, 1 client (prompt tokens per second)."
    if [ "$REPEATS" -gt 1 ]; then
        echo "Medians of $REPEATS rounds (both servers up at once in each, every load level measured on"
        echo "both back to back, kvserve first in odd rounds, llama-server first in even ones; every round's ratios"
        echo "below the table); load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg)"
    else
        echo "One run of each; load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg)"
    fi
    echo "(the machine is shared)."
    echo "Read bandwidth, same run: $bw GB/s ($THREADS threads, kvs-bench-machine; the median of its readings: $bws). kvserve's resident"
    echo "size after the run includes its $KV_MB MiB KV cache (as touched). Command:"
    echo
    echo '```'
    echo "THREADS=$THREADS SHAPE=$SHAPE KV_MB=$KV_MB TYPES=\"$TYPES\" F32_TYPES=\"$F32_TYPES\" OUT=$OUT PROMPT=$PROMPT N1=$N1 N16=$N16 NPP=$NPP REPEATS=$REPEATS bench/quant.sh"
    echo '```'
    echo
    echo "kvserve runs with --activations q8 (the default: the integer path for Q8_0, Q4_0 .. Q5_1,"
    echo "Q2_K .. Q6_K, IQ4_NL, IQ4_XS) and, in the f32 columns, --activations f32 (exact F32 panels"
    echo "for every type)."
    echo
    echo "| file type | kvserve 1 client tok/s | f32 | llama-server | ratio | batch 1 vs bandwidth / file bytes | kvserve 16 clients | f32 | llama-server | ratio | kvserve prefill tok/s | llama-server | ratio | kvserve RSS MiB |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    printf '%s\n' "${rows[@]}"
    [ "$1" = "$N_TYPES" ] || echo "(Partial: the run stopped after $1 of $N_TYPES file types.)"
    if [ "$REPEATS" -gt 1 ]; then
        echo
        echo "Each round's kvserve / llama-server:"
        echo
        echo "| file type | round | 1 client | 16 clients | prefill |"
        echo "|---|---:|---:|---:|---:|"
        printf '%s\n' "${rounds[@]}"
    fi
    echo "<!-- $NAME end -->"
    } >"$SECTION"
    python3 bench/doc_section.py --per-cpu docs/BENCHMARKS.md "$NAME" <"$SECTION"
}
bws=$bw
rows=()
rounds=()
for t in $TYPES; do
    f="$MODELS/$SHAPE-$t.gguf"
    [ -s "$f" ] || "$PEER/llama-quantize" "$base" "$f" "$t" "$THREADS" >/dev/null 2>&1
    bytes=$(stat -L -c %s "$f")
    # a port each (incremented here: $((PORT++)) inside $(...) would not reach this shell)
    e1=- e16=-
    K1=() K16=() KPP=() L1=() L16=() LPP=()
    for r in $(seq "$REPEATS"); do
        echo "quant.sh: $t kvserve and llama-server (round $r of $REPEATS)" >&2
        read -r k1 k16 kpp krss l1 l16 lpp _ <<<"$(pair_round "$f" "$PORT" $((PORT + 1)) "$r" \
            --kv-cache-mb "$KV_MB" --activations q8)"
        PORT=$((PORT + 2))
        if [ "$r" = 1 ] && [[ " $F32_TYPES " == *" $t "* ]]; then
            echo "quant.sh: $t kvserve --activations f32" >&2
            read -r e1 e16 _ <<<"$(serve kvserve "$f" "$PORT" --kv-cache-mb "$KV_MB" --activations f32)"
            PORT=$((PORT + 1))
        fi
        K1+=("$k1") K16+=("$k16") KPP+=("$kpp") L1+=("$l1") L16+=("$l16") LPP+=("$lpp")
        rounds+=("| $t | $r | $(ratio "$k1" "$l1")x | $(ratio "$k16" "$l16")x | $(ratio "$kpp" "$lpp")x |")
        bws+=" $("$MACHINE" read-bw "$THREADS" 2>/dev/null | cut -d, -f4)"
    done
    k1=$(median <<<"${K1[*]}") k16=$(median <<<"${K16[*]}") kpp=$(median <<<"${KPP[*]}")
    l1=$(median <<<"${L1[*]}") l16=$(median <<<"${L16[*]}") lpp=$(median <<<"${LPP[*]}")
    bw=$(median <<<"$bws")
    bound=$(awk -v b="$bw" -v s="$bytes" 'BEGIN{printf "%.1f", b * 1e9 / s}')
    mib=$((bytes / 1048576))
    rows+=("| $t ($mib MiB) | $k1 | $e1 | $l1 | $(ratio "$k1" "$l1")x | $(ratio "$k1" "$bound") of $bound | $k16 | $e16 | $l16 | $(ratio "$k16" "$l16")x | $kpp | $lpp | $(ratio "$kpp" "$lpp")x | $krss ($(ratio "$krss" "$mib")x file) |")
    echo "quant.sh: ${rows[-1]}" >&2
    rm -f "$f"
    write_section "${#rows[@]}" # each row recorded as soon as measured
done
cat "$TMP/section.md"
rm -f "$base"

