#!/usr/bin/env bash
# Optional: installs what the fuzz build needs (cmake --preset fuzz, docs/fuzzing.md) from
# Debian's packages: clang with libFuzzer and the ASan/UBSan runtimes (libclang-rt-14-dev) and
# llvm-symbolizer (llvm) for readable sanitizer stack traces. Run tools/install-deps.sh first;
# the normal build and tests need none of this.
set -euo pipefail
pkgs=(clang libclang-rt-dev llvm)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-fuzz-deps: all ${#pkgs[@]} packages present ($(clang --version | head -1))"
    exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-fuzz-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
