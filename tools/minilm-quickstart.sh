#!/usr/bin/env bash
# The quickstart on real activations: extracts all-MiniLM-L6-v2 block-3 activations from the
# Python documentation (Debian's python3.11-doc, installed when missing) into data/minilm/,
# training text and held-out text from different files, then trains configs/minilm.yaml.
#
#   bash tools/minilm-quickstart.sh [TOKENS]     # TOKENS: training tokens (default 1000000)
#
# Needs the build (cmake --preset cpu && cmake --build --preset cpu -j2) and the Python
# environment (bash tools/setup-venv.sh). Extraction resumes where it stopped.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
tokens="${1:-1000000}"
text=/usr/share/doc/python3.11/html/_sources
if [ ! -d "$text" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends python3.11-doc
fi
[ -x .venv/bin/python ] || { echo "minilm-quickstart: run bash tools/setup-venv.sh first" >&2; exit 1; }
[ -x build/cpu/apps/saetrain ] || { echo "minilm-quickstart: build saetrain first (cmake --preset cpu && cmake --build --preset cpu -j2)" >&2; exit 1; }
# Every 10th file (in name order) is held-out text.
mapfile -t files < <(find "$text" -type f -name '*.rst.txt' | LC_ALL=C sort)
train=() held=()
for i in "${!files[@]}"; do
    if (( i % 10 == 9 )); then held+=("${files[$i]}"); else train+=("${files[$i]}"); fi
done
extract() {  # OUT TOKENS FILES...
    local out="$1" n="$2"
    shift 2
    .venv/bin/python tools/extract_activations.py --model minilm --hook encoder.layer.3 \
        --context 128 --dtype float16 --max-tokens "$n" --unembedding --out "$out" --text "$@"
}
extract data/minilm/train "$tokens" "${train[@]}"
extract data/minilm/eval "$((tokens / 10))" "${held[@]}"
./build/cpu/apps/saetrain configs/minilm.yaml --overwrite
