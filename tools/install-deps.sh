#!/usr/bin/env bash
# Installs saetrain's build and test dependencies from Debian's packages (run as root or with
# sudo). Nothing else is downloaded: the build and the tests need no network.
set -euo pipefail
pkgs=(cmake g++ make pkg-config clang-format
      libopenmpi-dev openmpi-bin libhdf5-dev libyaml-cpp-dev libopenblas-openmp-dev
      libcli11-dev libfmt-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev libxxhash-dev
      libcurl4-openssl-dev libxml2-dev  # s3:// data: HTTP + SigV4 signing, S3's XML
      bc util-linux  # bc, setpriv: tools/fault-matrix.sh and tools/soak.sh
      slurm-wlm munge  # tools/slurm-local.sh: the one-node cluster of ctest -L slurm
      iproute2 procps  # tools/cluster-local.sh: the two hosts of ctest -L multinode (ip, pgrep)
      libboost-dev  # sae-serve: Boost.Beast and Asio (header-only)
      chromium  # test/serve: the live page loaded in headless Chromium
      python3-matplotlib  # tools/sae-report (its plots need nothing else: no .venv)
      python3-h5py)  # tools/sae-report: the feature pages read sae-features' features.h5
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#pkgs[@]} packages present"
    exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
