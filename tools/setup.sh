#!/usr/bin/env bash
# Installs what kvserve needs to build and test on Debian 12 (run as root, or with sudo), then
# the Node test suites' packages (npm ci from their committed package-lock.json files).
# Idempotent: skips apt when every package is already installed, npm when the SDK is in place.
# Test-only tools: node+npm (tests/sdk, tests/webui), promtool from prometheus (tests/deploy),
# nginx, chromium (tests/webui), python3-numpy (tests/test_dequant.py runs gguf-py's reference
# dequantizer with it).
# libopenblas-dev: only kvs-bench-engine's sgemm yardstick (optional; the engine does not use it).
# libsimde-dev: header-only, for the tests only: the AVX-512 kernels compiled over its portable
# intrinsics and held to the reference on CPUs without AVX-512 (tests/test_kernels.c).
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential meson ninja-build pkg-config
      libmicrohttpd-dev libcjson-dev libopenblas-dev libcmocka-dev libpcre2-dev
      python3 python3-yaml python3-numpy curl clang clang-format libclang-rt-dev prometheus
      nginx wrk chromium libsimde-dev)
# shellcheck source=tools/lib.sh
. tools/lib.sh
# node may come from elsewhere (e.g. a newer build that bundles npm): only ask apt when the
# commands are missing, since Debian's npm conflicts with such a nodejs.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    PKGS+=(nodejs npm)
fi
kvs_apt_need setup "${PKGS[@]}"

# The Node test suites' node_modules (the OpenAI SDK; playwright-core for the page in
# chromium): reinstall when the lock file changed since the last install.
for spec in tests/sdk:openai:sdk tests/webui:playwright-core:webui; do
    dir=${spec%%:*} rest=${spec#*:}
    pkg=${rest%%:*} suite=${rest#*:}
    if [ ! -f "$dir/node_modules/$pkg/package.json" ] ||
       [ "$dir/package-lock.json" -nt "$dir/node_modules/.package-lock.json" ]; then
        echo "setup: npm ci in $dir" >&2
        # A failure here only costs that suite (it skips and says why): warn, don't stop.
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
            echo "setup: WARNING: npm ci in $dir failed; the '$suite' test will skip" >&2
    fi
done
exit 0
