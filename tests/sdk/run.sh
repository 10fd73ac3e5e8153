#!/usr/bin/env bash
# meson test 'sdk': runs sdk.test.mjs (the OpenAI SDK) and frameworks.test.mjs (Vercel AI SDK,
# LangChain) with node's built-in test runner. Exits 77 (meson's
# "skipped") with the reason when node, the installed SDK or the model is missing.
# Environment: KVSERVE_BIN, KVS_SHARED_MODELS (set by tests/meson.build).
set -uo pipefail
cd "$(dirname "$0")"
skip() { echo "SKIP: $*"; exit 77; }
command -v node >/dev/null || skip "node not found (tools/setup.sh installs nodejs and npm)"
major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[ "$major" -ge 18 ] || skip "node $(node --version) is older than 18 (the SDK needs fetch)"
for pkg in openai zod ai @ai-sdk/openai @langchain/openai; do
    [ -f "node_modules/$pkg/package.json" ] ||
        skip "tests/sdk/node_modules/$pkg missing: run tools/setup.sh (npm ci in tests/sdk)"
done
models=${KVS_SHARED_MODELS:-../../../shared/models}
[ -f "$models/stories260K.gguf" ] && [ -f "$models/reference/stories260K-greedy.json" ] ||
    skip "$models/stories260K.gguf or its reference not found (see MODELS.md)"
[ -n "${KVSERVE_URL:-}" ] || [ -x "${KVSERVE_BIN:-}" ] || skip "KVSERVE_BIN not set or not executable"
exec node --test --test-reporter=spec sdk.test.mjs frameworks.test.mjs
