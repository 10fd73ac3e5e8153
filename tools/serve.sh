#!/usr/bin/env bash
# Quick start: set up, build and serve. Usage: tools/serve.sh [MODEL.gguf] [kvserve serve flags]
# Without a model it serves ../shared/models/stories260K.gguf when present, otherwise a
# random-weight model of the same shape that the project generates (and says so).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/build.sh
model=""
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
    model="$1"
    shift
fi
if [ -z "$model" ]; then
    if [ -f ../shared/models/stories260K.gguf ]; then
        model=../shared/models/stories260K.gguf
        echo "serve: using $model (the trained TinyStories model)" >&2
    else
        model=build/stories260K-random.gguf
        [ -f "$model" ] || ./build/tools/kvs-mkmodel --shape stories260K --seed 1 -o "$model" >&2
        echo "serve: ../shared/models/stories260K.gguf not found; serving $model," \
             "a RANDOM-WEIGHT model of the same shape (its text is noise)" >&2
    fi
fi
exec ./build/server/kvserve serve -m "$model" "$@"
