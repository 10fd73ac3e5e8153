#!/usr/bin/env bash
# bench/image.sh: the container image's decode speed against the native build's, same machine,
# same run: `kvserve generate` (one sequence, paged KV cache) on a 110m-shape F16 model from
# kvs-mkmodel, natively (BUILD's binary) and inside the image built by tools/image.sh from
# docker/Dockerfile (a portable -Dnative=false build). Also a portable build outside the image
# when PORTABLE_BUILD names one (meson setup build-portable -Dnative=false). Median of REPEATS
# runs each, interleaved. Writes the "image.sh" section of docs/BENCHMARKS.md.
# Environment: BUILD (build), REPEATS (3), TOKENS (128), THREADS (nproc), PORTABLE_BUILD.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
REPEATS=${REPEATS:-3}
TOKENS=${TOKENS:-128}
THREADS=${THREADS:-$(nproc)}
PORTABLE_BUILD=${PORTABLE_BUILD:-}
VOCAB=${VOCAB:-../shared/models/vocab/ggml-vocab-llama-spm.gguf}
MKMODEL="$BUILD/tools/kvs-mkmodel"
KVSERVE="$BUILD/server/kvserve"
[ -x "$KVSERVE" ] && [ -x "$MKMODEL" ] || { echo "image.sh: build first (ninja -C $BUILD)" >&2; exit 1; }
[ -f "$VOCAB" ] || { echo "image.sh: vocabulary $VOCAB not found" >&2; exit 1; }
TAG=localhost/kvserve:bench
bash tools/image.sh "$TAG" >/dev/null
TMP=$(mktemp -d /tmp/kvs-bench-image.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP" # the image runs as an unprivileged user
"$MKMODEL" --shape 110m --type f16 --vocab "$VOCAB" -o "$TMP/110m-f16.gguf" >&2
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
P=(podman --runtime /usr/sbin/runc)
L=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
GEN=(generate -m /models/110m-f16.gguf -p "Once upon a time" -n "$TOKENS" --threads "$THREADS")

median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
rate() { grep -o 'decode [0-9.]* tok/s' | awk '{print $2}'; }
kernels() { grep -o 'kernels: [^ ,;]*' | head -1 | cut -d' ' -f2; }

: >"$TMP/native" ; : >"$TMP/image" ; : >"$TMP/portable"
for i in $(seq "$REPEATS"); do
    echo "image.sh: run $i/$REPEATS" >&2
    "$KVSERVE" "${GEN[@]/\/models/$TMP}" >/dev/null 2>"$TMP/native.log"
    rate <"$TMP/native.log" >>"$TMP/native"
    "${P[@]}" run --rm --network host "${L[@]}" -v "$TMP:/models:ro" --entrypoint kvserve "$TAG" \
        "${GEN[@]}" >/dev/null 2>"$TMP/image.log"
    rate <"$TMP/image.log" >>"$TMP/image"
    if [ -n "$PORTABLE_BUILD" ]; then
        "$PORTABLE_BUILD/server/kvserve" "${GEN[@]/\/models/$TMP}" >/dev/null 2>"$TMP/portable.log"
        rate <"$TMP/portable.log" >>"$TMP/portable"
    fi
done
nat=$(median <"$TMP/native")
img=$(median <"$TMP/image")
k_nat=$(kernels <"$TMP/native.log" || true)
k_img=$(kernels <"$TMP/image.log" || true)
native=$(meson introspect "$BUILD" --buildoptions |
    python3 -c 'import json,sys; print(str([o["value"] for o in json.load(sys.stdin) if o["name"] == "native"][0]).lower())')
rows=("| this machine's build (\`$BUILD\`, -Dnative=$native) | ${k_nat:-?} | $nat | 1.00 |"
      "| the image (podman, docker/Dockerfile, -Dnative=false) | ${k_img:-?} | $img | $(awk -v a="$img" -v b="$nat" 'BEGIN{printf "%.2f", a/b}') |")
if [ -n "$PORTABLE_BUILD" ]; then
    por=$(median <"$TMP/portable")
    k_por=$(kernels <"$TMP/portable.log" || true)
    rows+=("| portable build outside the image (\`$PORTABLE_BUILD\`) | ${k_por:-?} | $por | $(awk -v a="$por" -v b="$nat" 'BEGIN{printf "%.2f", a/b}') |")
fi

CPU=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
SECTION="$TMP/section.md"
{
    echo "<!-- image.sh begin -->"
    echo "## The container image against the native build (bench/image.sh)"
    echo
    echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores of ${CPU}, $THREADS engine threads, kvserve"
    echo "$(git rev-parse --short HEAD); \`kvserve generate\` of $TOKENS tokens on a 110m-shape F16 model"
    echo "(kvs-mkmodel), one sequence, median of $REPEATS interleaved runs. Load average before:"
    echo "$LOAD_BEFORE. Command:"
    echo
    echo '```'
    echo "REPEATS=$REPEATS TOKENS=$TOKENS THREADS=$THREADS${PORTABLE_BUILD:+ PORTABLE_BUILD=$PORTABLE_BUILD} bench/image.sh"
    echo '```'
    echo
    echo "| binary | kernels picked | decode tok/s | vs native |"
    echo "|---|---|---:|---:|"
    printf '%s\n' "${rows[@]}"
    echo "<!-- image.sh end -->"
} >"$SECTION"
python3 bench/doc_section.py --per-cpu docs/BENCHMARKS.md image.sh <"$SECTION"
cat "$SECTION"
