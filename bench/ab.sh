#!/usr/bin/env bash
# bench/ab.sh: two builds of one benchmark binary against each other, in interleaved pairs.
#   bench/ab.sh A_BIN B_BIN PAIRS ARGS...
# runs "A_BIN ARGS" and "B_BIN ARGS" PAIRS times each, alternating which goes first, and takes
# one figure from each run's last CSV line (FIELD, 1-based; by default field 11, Gweights/s, for
# kvs-bench-qmatmul TYPE ..., field 3, tok/s, for kvs-bench-engine batch and field 4, rows/s, for
# its prefill). Prints both medians, the median of the pairs' B/A ratios and their range, and each
# build's best figure.
# Why pairs: on these shared VMs one core runs the same binary at two speeds (one Zen 4 core gave
# 33 or 44 Gweights/s for one Q6_K kernel as its sibling thread was busy or not), and the machine's
# memory bandwidth moves by 2x within minutes, so two figures taken minutes apart compare the
# machine's hours, not the builds. A kernel that read 33 -> 43 in two separate runs measured 0.96x
# here (docs/ARCHITECTURE.md, Q6_K's one-row form).
# Environment: PIN (a CPU list for taskset, e.g. 1; unset: not pinned), FIELD, whatever the
# binary reads (KVS_BENCH_PROMPT, KVS_BENCH_SGEMM=0, ...), and A_ENV / B_ENV: VAR=value words set
# for one side's runs only, so one binary can be compared with itself under two settings
# (B_ENV=KVS_BENCH_KERNELS=avx512 with A and B the same kvs-bench-engine: the table picked by
# CPUID against the zmm one forced).
# Example: PIN=1 bench/ab.sh /tmp/qm-old build/bench/kvs-bench-qmatmul 12 Q6_K 2048 2048 1 1 20 avx512 q8
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,4p' "$0" | sed 's/^# //' >&2
    exit 2
fi
A=$1 B=$2 PAIRS=$3
shift 3
for bin in "$A" "$B"; do
    [ -x "$bin" ] || { echo "ab.sh: $bin is not an executable" >&2; exit 2; }
done
case "$PAIRS" in '' | *[!0-9]*) echo "ab.sh: PAIRS must be a number" >&2; exit 2 ;; esac
if [ -z "${FIELD:-}" ]; then
    case "$1" in
    batch) FIELD=3 ;;        # kvs-bench-engine batch: tok/s
    prefill) FIELD=4 ;;      # kvs-bench-engine prefill: rows/s
    [A-Z]*) FIELD=11 ;;      # kvs-bench-qmatmul TYPE ...: Gweights/s
    *) echo "ab.sh: set FIELD (the CSV field to compare) for '$1'" >&2; exit 2 ;;
    esac
fi
PINCMD=()
[ -n "${PIN:-}" ] && PINCMD=(taskset -c "$PIN")
OUT=$(mktemp /tmp/kvs-ab.XXXXXX)
trap 'rm -f "$OUT"' EXIT

read -ra AENV <<<"${A_ENV:-}"
read -ra BENV <<<"${B_ENV:-}"

one() { # one run of side $1 (A or B) with the arguments after it: its figure, or nothing
    local bin=$A envs=("${AENV[@]}")
    [ "$1" = B ] && bin=$B envs=("${BENV[@]}")
    env "${envs[@]}" "${PINCMD[@]}" "$bin" "${@:2}" 2>/dev/null | grep ',' | tail -1 |
        cut -d, -f"$FIELD"
}

for i in $(seq "$PAIRS"); do
    if [ $((i % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
    for v in $order; do
        if [ "$v" = A ]; then bin=$A; else bin=$B; fi
        fig=$(one "$v" "$@") || true
        [ -n "$fig" ] || { echo "ab.sh: $bin $* printed no figure in field $FIELD" >&2; exit 1; }
        echo "$i $v $fig" >>"$OUT"
    done
done

python3 - "$OUT" "${A_ENV:+$A_ENV }$A" "${B_ENV:+$B_ENV }$B" <<'PY'
import statistics as st, sys
runs = {}
for line in open(sys.argv[1]):
    i, v, fig = line.split()
    runs.setdefault(i, {})[v] = float(fig)
a = [r["A"] for r in runs.values()]
b = [r["B"] for r in runs.values()]
ratios = [r["B"] / r["A"] for r in runs.values()]
print(f"A {sys.argv[2]}: median {st.median(a):.2f}, best {max(a):.2f}")
print(f"B {sys.argv[3]}: median {st.median(b):.2f}, best {max(b):.2f}")
print(f"B/A over {len(ratios)} pairs: median {st.median(ratios):.3f} "
      f"(range {min(ratios):.3f} - {max(ratios):.3f}); best B / best A {max(b) / max(a):.3f}")
PY
