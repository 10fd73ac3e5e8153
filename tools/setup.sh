#!/usr/bin/env bash
# Installs what kvserve needs to build and test on Debian 12 (run as root, or with sudo).
# Idempotent: skips apt when every package is already installed.
set -euo pipefail
PKGS=(build-essential meson ninja-build pkg-config
      libmicrohttpd-dev libcjson-dev libopenblas-dev libcmocka-dev libpcre2-dev
      python3 curl clang libclang-rt-dev)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
echo "setup: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
