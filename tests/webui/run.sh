#!/usr/bin/env bash
# meson test 'webui': the page in Debian's chromium through playwright-core (webui.test.mjs).
# Exits 77 (meson's "skipped") with the reason when node, chromium, playwright-core, the model
# or the binaries are missing. Environment: KVSERVE_BIN, KVS_MKMODEL, KVS_SHARED_MODELS
# (tests/meson.build).
set -uo pipefail
cd "$(dirname "$0")"
skip() { echo "SKIP: $*"; exit 77; }
command -v node >/dev/null || skip "node not found (tools/setup.sh installs nodejs and npm)"
chrome=${CHROMIUM:-/usr/bin/chromium}
[ -x "$chrome" ] || skip "$chrome not found (tools/setup.sh installs Debian's chromium)"
[ -f node_modules/playwright-core/package.json ] ||
    skip "tests/webui/node_modules/playwright-core missing: run tools/setup.sh (npm ci in tests/webui)"
models=${KVS_SHARED_MODELS:-../../../shared/models}
[ -f "$models/vocab/ggml-vocab-llama-spm.gguf" ] ||
    skip "$models/vocab/ggml-vocab-llama-spm.gguf not found (see MODELS.md)"
[ -x "${KVSERVE_BIN:-}" ] || skip "KVSERVE_BIN not set or not executable"
[ -x "${KVS_MKMODEL:-}" ] || skip "KVS_MKMODEL not set or not executable"
export CHROMIUM=$chrome
exec node --test --test-reporter=spec webui.test.mjs
