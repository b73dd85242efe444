#!/usr/bin/env bash
# Build dependencies of the native helpers, for CI and developer machines (Debian/Ubuntu, as root or via sudo):
#   gcc                    compiles the proxy's C loops on first use (arxtune/runtime/native.py)
#   libibverbs-dev         <infiniband/verbs.h>, which the native verbs step (graph/serve_verbs.c) includes
#   gcc-aarch64-linux-gnu, libc6-dev-arm64-cross  the aarch64 build check (tests/unit/test_native_build.py): GB10 hosts are aarch64
# Idempotent: installs only what is missing.
set -euo pipefail
PKGS=(gcc libibverbs-dev gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
done
((${#missing[@]} == 0)) && exit 0
SUDO=$([[ $(id -u) == 0 ]] || echo sudo)
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
