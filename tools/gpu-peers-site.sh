#!/usr/bin/env bash
# gpu-peers-site.sh — packs SAELens, sparsify and every package they import that the lent GPU
# machine lacks (it has PyTorch, transformers, numpy, h5py, safetensors and the rest of
# /work/.library/device/KINDS.md's list, Python 3.12, and no network) into one archive,
# .peers/peers-site.tar.xz, that tools/gpu-run.sh's `peers` step unpacks onto PYTHONPATH.
#
#   bash tools/gpu-peers-site.sh        # here, after tools/setup-venv.sh; ~10 MiB
#
# The dependency closure is read from .venv (the pinned sae-lens and eai-sparsify of
# tools/requirements.txt); each package the GPU machine does not list is fetched from PyPI as
# a Python 3.12 x86-64 wheel (transformers-stream-generator has only a source release: it is
# built here) and unpacked. Two parts that the benchmark never runs are left out to fit the
# device tool's 64 MiB: wandb's service binaries (wandb/bin: started only by wandb.init, and
# the peers run with W&B off) and plotly's JavaScript bundles (figures are never drawn).
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || { echo "gpu-peers-site: run tools/setup-venv.sh first" >&2; exit 1; }
# The GPU machine's Python packages (KINDS.md, read 2026-11-17), by normalized name.
device="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx
optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp"
need=$("$py" - "$device" <<'PY'
import importlib.metadata as md, re, sys
have = set(sys.argv[1].split())
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
seen, stack = {}, ["sae-lens", "eai-sparsify"]
while stack:
    name = norm(stack.pop())
    if name in seen or name in have or name.startswith("nvidia-"):
        continue
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:  # a dependency for another Python or platform
        continue
    seen[name] = dist.version
    for r in dist.requires or []:
        if "extra ==" not in r:
            stack.append(re.match(r"[A-Za-z0-9_.\-]+", r).group(0))
print(" ".join(f"{k}=={v}" for k, v in sorted(seen.items())))
PY
)
wheels=$(mktemp -d) site=$(mktemp -d)
trap 'rm -rf "$wheels" "$site"' EXIT
plat=()
for p in manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 \
    manylinux_2_35 manylinux2014 manylinux1; do plat+=(--platform "${p}_x86_64"); done
for spec in $need; do
    if ! "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp "${plat[@]}" --platform any -d "$wheels" "$spec" 2>/dev/null; then
        "$py" -m pip wheel -q --no-deps -w "$wheels" "$spec"  # a source-only release
    fi
done
for w in "$wheels"/*.whl; do "$py" -m zipfile -e "$w" "$site"; done
rm -rf "$site/wandb/bin" "$site/plotly/labextension" "$site"/plotly/package_data/*.js
find "$site" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .peers
tar -C "$site" -cJf .peers/peers-site.tar.xz .
echo "gpu-peers-site: .peers/peers-site.tar.xz, $(($(stat -c %s .peers/peers-site.tar.xz) / 1048576)) MiB," \
    "$(echo "$need" | wc -w) packages: $need"
