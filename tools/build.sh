#!/usr/bin/env bash
# Configures (once) and builds the release tree in build/. Extra args go to meson setup.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/build.ninja ] || meson setup build "$@" >/dev/null
ninja -C build >/dev/null
