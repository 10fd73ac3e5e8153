#!/usr/bin/env bash
# Installs what kvserve needs to build and test on Debian 12 (run as root, or with sudo), then
# the OpenAI Node SDK for tests/sdk (npm ci from the committed package-lock.json).
# Idempotent: skips apt when every package is already installed, npm when the SDK is in place.
# Test-only tools: node+npm (tests/sdk), promtool from prometheus (tests/deploy), nginx,
# python3-numpy (tests/test_dequant.py runs gguf-py's reference dequantizer with it).
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(build-essential meson ninja-build pkg-config
      libmicrohttpd-dev libcjson-dev libopenblas-dev libcmocka-dev libpcre2-dev
      python3 python3-yaml python3-numpy curl clang clang-format libclang-rt-dev prometheus
      nginx wrk)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node may come from elsewhere (e.g. a newer build that bundles npm): only ask apt when the
# commands are missing, since Debian's npm conflicts with such a nodejs.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    missing+=(nodejs npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The SDK test's node_modules: reinstall when the lock file changed since the last install.
sdk=tests/sdk
if [ ! -f "$sdk/node_modules/openai/package.json" ] ||
   [ "$sdk/package-lock.json" -nt "$sdk/node_modules/.package-lock.json" ]; then
    echo "setup: npm ci in $sdk" >&2
    # A failure here only costs the 'sdk' test (it skips and says why): warn, don't stop.
    (cd "$sdk" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) ||
        echo "setup: WARNING: npm ci in $sdk failed; the 'sdk' test will skip" >&2
fi
exit 0
