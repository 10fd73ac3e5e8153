#!/usr/bin/env bash
# bench/peer.sh: kvserve against llama.cpp's llama-server (../shared/peer), side by side in one
# run, same model file, same threads, same closed-loop client (bench/serve_bench.py,
# non-streaming completions, token-id prompts, ignore_eos), plus the machine's limits from the
# same run (kvs-bench-machine: memory read bandwidth, FMA peak per ISA) and kvserve's engine
# alone at 64 rows (kvs-bench-engine). Models: kvs-mkmodel's 110m shape and TinyLlama-1.1B's
# shape, F16 (random weights, llama-spm vocabulary). Writes the "peer.sh" section of
# docs/BENCHMARKS.md. In each round both servers are up at once and each load level is measured
# on both back to back, in alternating order.
#   decode: 1 client and 16 clients, PROMPT-token prompts, OUT generated tokens each
#   prefill: 512-token prompts, 1 generated token, 1 client (prompt tokens per second)
# Environment: BUILD (build), THREADS (nproc), SHAPES ("110m tinyllama-1.1b"), OUT (64),
# PROMPT (32), N1 (4 requests at 1 client), N16 (32 requests at 16 clients), NPP (4),
# REPEATS (1: rounds per shape, both servers in each, so that both see the same minutes of a
# shared machine; the table gives each figure's median over the rounds and every round's ratios
# below it), PEER (../shared/peer/llama.cpp/bin).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
# shellcheck source=bench/peer_lib.sh
. bench/peer_lib.sh
SHAPES=${SHAPES:-110m tinyllama-1.1b}
OUT=${OUT:-64}
PROMPT=${PROMPT:-32}
N1=${N1:-4}
N16=${N16:-32}
NPP=${NPP:-4}
REPEATS=${REPEATS:-1}
peer_setup "$KVSERVE" "$MKMODEL" "$MACHINE" "$ENGINE" --peer llama-server --vocab
PORT=18610

bws=$("$MACHINE" read-bw "$THREADS" 2>/dev/null | cut -d, -f4)
peaks=$("$MACHINE" fma "$THREADS" 2>/dev/null)
peak_avx2=$(grep ',avx2,' <<<"$peaks" | cut -d, -f4 || true)
peak_avx512=$(grep ',avx512,' <<<"$peaks" | cut -d, -f4 || true)

rows=()
erows=()
rounds=()
for shape in $SHAPES; do
    f="$TMP/$shape-f16.gguf"
    "$MKMODEL" --shape "$shape" --type f16 --vocab "$VOCAB" -o "$f" >&2
    bytes=$(stat -c %s "$f")
    K1=() K16=() KPP=() L1=() L16=() LPP=()
    for r in $(seq "$REPEATS"); do
        echo "peer.sh: $shape kvserve and llama-server (round $r of $REPEATS)" >&2
        # two ports (incremented here: $((PORT++)) inside $(...) would not reach this shell)
        read -r k1 k16 kpp _ l1 l16 lpp _ <<<"$(pair_round "$f" "$PORT" $((PORT + 1)) "$r")"
        PORT=$((PORT + 2))
        K1+=("$k1") K16+=("$k16") KPP+=("$kpp") L1+=("$l1") L16+=("$l16") LPP+=("$lpp")
        rounds+=("| $shape F16 | $r | $(ratio "$k1" "$l1")x | $(ratio "$k16" "$l16")x | $(ratio "$kpp" "$lpp")x |")
        bws+=" $("$MACHINE" read-bw "$THREADS" 2>/dev/null | cut -d, -f4)"
    done
    k1=$(median <<<"${K1[*]}") k16=$(median <<<"${K16[*]}") kpp=$(median <<<"${KPP[*]}")
    l1=$(median <<<"${L1[*]}") l16=$(median <<<"${L16[*]}") lpp=$(median <<<"${LPP[*]}")
    bw=$(median <<<"$bws")
    bound=$(awk -v b="$bw" -v s="$bytes" 'BEGIN{printf "%.1f", b * 1e9 / s}')
    # kvserve's engine at 64 rows: GFLOP/s of the products against the FMA peak
    E64=()
    for r in $(seq "$REPEATS"); do
        "$ENGINE" batch "$f" 8 64 "$THREADS" >"$TMP/eng.csv" 2>"$TMP/eng.log" || true
        E64+=("$(awk -F, '$1 == 64 {print $3}' "$TMP/eng.csv" | head -1)")
    done
    tps=$(median <<<"${E64[*]}")
    kern=$(grep -o 'kernels: [^ ,;]*' "$TMP/eng.log" | head -1 | cut -d' ' -f2 || true)
    # multiply-adds per token: every parameter but the embedding table (a lookup)
    params=$(grep -o '[0-9.]*M params' "$TMP/eng.log" | head -1 | sed 's/M params//')
    dim=$(grep -o 'dim [0-9]*' "$TMP/eng.log" | head -1 | cut -d' ' -f2)
    vocab=$(grep -o 'vocab [0-9]*' "$TMP/eng.log" | head -1 | cut -d' ' -f2)
    if [ -n "$tps" ] && [ -n "$params" ] && [ -n "$dim" ] && [ -n "$vocab" ]; then
        gf=$(awk -v t="$tps" -v p="$params" -v d="$dim" -v v="$vocab" \
            'BEGIN{printf "%.0f", 2 * (p * 1e6 - d * v) * t / 1e9}')
        # against the tight-loop peak of the ISA whose instructions run the panels: AVX2's
        # where the avx512 table keeps AVX2's panel products (Zen 4, kern_avx512_halves_ops)
        if [ "$kern" = avx512 ] && grep -q "panels on AVX2's" "$TMP/eng.log"; then
            erows+=("| $shape F16 | avx512, AVX2 panels | $tps | $gf | $(ratio "$gf" "$peak_avx2") of AVX2's $peak_avx2 |")
        elif [ "$kern" = avx512 ] && [ -n "$peak_avx512" ]; then
            erows+=("| $shape F16 | $kern | $tps | $gf | $(ratio "$gf" "$peak_avx512") of AVX-512's $peak_avx512 |")
        else
            erows+=("| $shape F16 | ${kern:-?} | $tps | $gf | $(ratio "$gf" "$peak_avx2") of AVX2's $peak_avx2 |")
        fi
    fi
    # The compute-bound loads against the machine's FMA peak (the better ISA's tight loop), for
    # both servers: what a ratio between them can be at most. Multiply-adds of the products
    # only (attention left out): a generated token's through every matrix, a prompt token's
    # without the output projection (logits only at a prompt's last token).
    f16c=() fpp=()
    peak=$(awk -v a="${peak_avx2:-0}" -v b="${peak_avx512:-0}" 'BEGIN{print (a > b ? a : b)}')
    if [ -n "$params" ] && [ -n "$dim" ] && [ -n "$vocab" ] && [ "$peak" != 0 ]; then
        for t in "$k16" "$l16"; do
            f16c+=("$(awk -v t="$t" -v p="$params" -v d="$dim" -v v="$vocab" -v pr="$PROMPT" \
                -v o="$OUT" -v pk="$peak" 'BEGIN{g = 2 * (p * 1e6 - d * v); q = g - 2 * d * v
                printf "%.2f", t * (g + pr / o * q) / 1e9 / pk}')")
        done
        for t in "$kpp" "$lpp"; do
            fpp+=("$(awk -v t="$t" -v p="$params" -v d="$dim" -v v="$vocab" -v pk="$peak" \
                'BEGIN{printf "%.2f", t * 2 * (p * 1e6 - 2 * d * v) / 1e9 / pk}')")
        done
    fi
    rows+=("| $shape F16 ($((bytes / 1048576)) MiB) | 1 client | $k1 | $l1 | $(ratio "$k1" "$l1")x | $(ratio "$k1" "$bound") of $bound | |")
    rows+=("| | 16 clients | $k16 | $l16 | $(ratio "$k16" "$l16")x | | ${f16c[0]:-?} / ${f16c[1]:-?} |")
    rows+=("| | prefill, 512-token prompts (prompt tok/s) | $kpp | $lpp | $(ratio "$kpp" "$lpp")x | | ${fpp[0]:-?} / ${fpp[1]:-?} |")
    rm -f "$f"
done

SECTION="$TMP/section.md"
{
    echo "<!-- peer.sh begin -->"
    echo "## kvserve against llama-server (bench/peer.sh)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of $(cpu_desc), $THREADS threads for both"
    echo "servers, kvserve $(git rev-parse --short HEAD), llama.cpp from ../shared/peer (its CPU variant chosen at"
    echo "run time). Closed-loop clients of bench/serve_bench.py, non-streaming completions,"
    echo "$PROMPT-token prompts, $OUT output tokens (ignore_eos); prefill: 512-token prompts, 1 output token."
    if [ "$REPEATS" -gt 1 ]; then
        echo "Medians of $REPEATS rounds (both servers up at once in each, every load level measured on both back"
        echo "to back, kvserve first in odd rounds, llama-server first in even ones; every round's ratios below);"
    else
        echo "One run of each;"
    fi
    echo "load average before: $LOAD_BEFORE. Machine, same run: memory read"
    echo "bandwidth $bw GB/s ($THREADS threads; median of its readings: $bws), FMA peak AVX2 ${peak_avx2:-n/a} / AVX-512 ${peak_avx512:-n/a} GFLOP/s"
    echo "(kvs-bench-machine). Command:"
    echo
    echo '```'
    echo "THREADS=$THREADS SHAPES=\"$SHAPES\" OUT=$OUT PROMPT=$PROMPT N1=$N1 N16=$N16 NPP=$NPP REPEATS=$REPEATS bench/peer.sh"
    echo '```'
    echo
    echo "| model | load | kvserve tok/s | llama-server tok/s | kvserve / llama-server | batch 1 vs bandwidth / file bytes | of the FMA peak, kvserve / llama-server |"
    echo "|---|---|---:|---:|---:|---:|---:|"
    printf '%s\n' "${rows[@]}"
    echo
    echo "The last column: each server's multiply-adds per second in the products (2 x parameters"
    echo "but the embedding per generated token, less the output projection per prompt token;"
    echo "attention left out) over the machine's FMA peak ($peak GFLOP/s, the better ISA's tight"
    echo "loop): a ratio between the servers can be at most 1 over llama-server's figure."
    echo
    if [ "$REPEATS" -gt 1 ]; then
        echo "Each round's kvserve / llama-server:"
        echo
        echo "| model | round | 1 client | 16 clients | prefill |"
        echo "|---|---:|---:|---:|---:|"
        printf '%s\n' "${rounds[@]}"
        echo
    fi
    echo "kvserve's engine alone at 64 rows (kvs-bench-engine batch, 8 steps; median of $REPEATS):"
    echo
    echo "| model | kernels | tok/s | GFLOP/s (2 x non-embedding params x tok/s) | of the FMA peak |"
    echo "|---|---|---:|---:|---:|"
    printf '%s\n' "${erows[@]}"
    echo "<!-- peer.sh end -->"
} >"$SECTION"
python3 bench/doc_section.py --per-cpu docs/BENCHMARKS.md peer.sh <"$SECTION"
cat "$SECTION"
