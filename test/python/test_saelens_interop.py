"""Every architecture saetrain trains, exported with `sae-export`, loads with the library's own
loader and computes saetrain's function there, row by row: on 2000 held-out rows (never trained
on), the library's decode(encode(x)) equals saetrain's own C++ reconstruction of the same rows
(test/sae_forward.cpp: the final.h5 in a SaeTrainer, the inference pass of its held-out
evaluation) within RECON_BOUND, and gives the FVU and L0 of saetrain's own evaluation
(summary.csv eval_fvu, eval_l0).

- SAELens (SAE.load_from_disk): relu as `standard`, topk, batchtopk as `jumprelu` with its
  learned inference threshold, jumprelu with its threshold, gated; and topk trained with
  data.normalize, whose scale the export folds into the weights (normalize_activations none);
- sparsify (SparseCoder.load_from_disk): topk, with and without data.normalize.
tools/splice_eval.py's forward agrees with SAELens's.

    SAETRAIN_BIN_DIR=build/cpu/apps SAETRAIN_TEST_BIN_DIR=build/cpu/test \
        .venv/bin/python -m pytest test/python/test_saelens_interop.py
"""
import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from strict import need_module, skip_module  # noqa: E402

h5py = need_module("h5py")
torch = need_module("torch")
need_module("sae_lens")
need_module("sparsify")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
BIN = os.environ.get("SAETRAIN_BIN_DIR", "")
if not (BIN and os.path.exists(os.path.join(BIN, "saetrain"))):
    skip_module("SAETRAIN_BIN_DIR does not hold the built saetrain apps")
TEST_BIN = os.environ.get("SAETRAIN_TEST_BIN_DIR", os.path.join(BIN, "..", "test"))
FORWARD = os.path.join(TEST_BIN, "sae_forward")
if not os.path.exists(FORWARD):
    skip_module(f"{FORWARD} is not built (SAETRAIN_TEST_BIN_DIR)")

# How far a library's reconstruction may be from saetrain's: ||x_hat_lib - x_hat||_F /
# ||x_hat||_F. Both compute the same float32 function of the same weights; only the order of
# the GEMMs' sums differs (OpenBLAS against PyTorch's CPU kernels), about 1e-7 relative per
# value at d 24 and 96 latents. A latent chosen differently (another top-k member, a
# pre-activation on the other side of a threshold) would cost about 1e-2 and fail it.
RECON_BOUND = 1e-5

# (id suffix, saetrain --set overrides)
CASES = {
    "relu": ["sae.arch=relu", "sae.l1_coeff=0.3"],
    "topk": ["sae.arch=topk"],
    "batchtopk": ["sae.arch=batchtopk"],
    "jumprelu": ["sae.arch=jumprelu", "train.l0_coeff=0.1", "sae.jumprelu_bandwidth=0.05",
                 "sae.jumprelu_init_threshold=0.05"],
    "gated": ["sae.arch=gated", "sae.l1_coeff=1"],
    "topk-normalized": ["sae.arch=topk", "data.normalize=expected_average_only_in"],
}


def _run(*cmd):
    r = subprocess.run(list(cmd), capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert r.returncode == 0, " ".join(cmd) + "\n" + r.stdout + r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("interop")
    _run(os.path.join(BIN, "sae-synth"), "--out", str(root / "synth"), "--d-model", "24",
         "--features", "64", "--rows", "12000", "--shards", "2", "--seed", "4")
    return root


_TRAINED = {}


def _train_and_export(root, name):
    """Trains case `name` once per module and exports it for SAELens."""
    if name not in _TRAINED:
        _TRAINED[name] = _train_and_export_once(root, name)
    return _TRAINED[name]


def _train_and_export_once(root, name):
    out = root / f"run-{name}"
    cfg = root / "cfg.yaml"
    cfg.write_text(
        f"run: {{out_dir: {out}}}\n"
        f"data: {{path: {root / 'synth'}, batch_size: 256, epochs: 2, eval_rows: 2000}}\n"
        "sae: {expansion: 4, k: 4}\n"
        "train: {lr: 0.01}\n"
        "log: {every_steps: 10}\ncheckpoint: {every_steps: 1000}\n")
    _run(os.path.join(BIN, "saetrain"), str(cfg), *sum([["--set", s] for s in CASES[name]], []))
    with open(out / "summary.csv", newline="") as f:
        row = next(csv.DictReader(f))
    export = root / f"export-{name}"
    _run(os.path.join(BIN, "sae-export"), str(out / "sae" / row["sae"]), "--format", "saelens",
         "--out", str(export))
    return row, export


def _held_out_rows(root):
    # data.eval_rows without eval_path: the last 2000 rows of data.path, in shard order.
    rows = []
    for shard in sorted((root / "synth").glob("shard_*.h5")):
        with h5py.File(shard, "r") as f:
            rows.append(f["activations"][:])
    return torch.from_numpy(np.concatenate(rows)[-2000:].astype(np.float32))


def _saetrain_reconstruction(root, name, row, x):
    """saetrain's own x_hat of the rows x: its C++ forward on the SAE's final.h5."""
    rows, x_hat = root / f"rows-{name}.f32", root / f"xhat-{name}.f32"
    x.numpy().astype("<f4").tofile(rows)
    _run(FORWARD, str(root / f"run-{name}" / "sae" / row["sae"] / "final.h5"), str(rows),
         str(x_hat))
    return torch.from_numpy(np.fromfile(x_hat, dtype="<f4").reshape(x.shape))


def _relative_error(x_hat, ref):
    return ((x_hat - ref).norm() / ref.norm()).item()


def _fvu_l0(x, x_hat, z):
    sse = ((x_hat - x) ** 2).sum().item()
    sst = ((x - x.mean(0)) ** 2).sum().item()
    return sse / sst, (z != 0).sum(1).float().mean().item()


# The SAELens architecture each case is exported as.
SAELENS_ARCH = {"relu": "standard", "topk": "topk", "batchtopk": "jumprelu",
                "jumprelu": "jumprelu", "gated": "gated", "topk-normalized": "topk"}


@pytest.mark.parametrize("name", list(CASES))
def test_saelens_loads_every_architecture(data, name):
    import json

    from sae_lens.saes.sae import SAE

    row, export = _train_and_export(data, name)
    cfg = json.loads((export / "cfg.json").read_text())
    assert cfg["architecture"] == SAELENS_ARCH[name]
    # data.normalize's scale is folded into the weights: SAELens must not rescale.
    assert cfg["normalize_activations"] == "none"
    sae = SAE.load_from_disk(str(export))
    if cfg["architecture"] == "jumprelu":  # the thresholds travel, one per latent
        assert tuple(sae.threshold.shape) == (cfg["d_sae"],)
        if name == "batchtopk":  # its one learned inference threshold, for every latent
            assert torch.all(sae.threshold == sae.threshold[0]) and sae.threshold[0] > 0
    x = _held_out_rows(data)
    with torch.no_grad():
        z = sae.encode(x)
        x_hat = sae.decode(z)
        fvu, l0 = _fvu_l0(x, x_hat, z)
    err = _relative_error(x_hat, _saetrain_reconstruction(data, name, row, x))
    print(f"sae_lens {name}: relative reconstruction difference to saetrain {err:.2e}")
    assert err <= RECON_BOUND, f"{name}: SAELens's reconstruction differs from saetrain's by {err}"
    assert fvu == pytest.approx(float(row["eval_fvu"]), rel=2e-3, abs=1e-5), row
    assert l0 == pytest.approx(float(row["eval_l0"]), rel=2e-3), row
    assert fvu < 0.5, f"{name}: the SAE learned little (fvu {fvu})"
    # tools/splice_eval.py, which splices exports into a model, computes the same forward.
    import splice_eval as se

    mine = se.Sae(se.SaeSpec(str(export)), "cpu")
    x_hat, _ = mine.reconstruct(x)
    with torch.no_grad():
        assert torch.allclose(x_hat, sae.decode(sae.encode(x)), atol=1e-4), name


@pytest.mark.parametrize("name", ["topk", "topk-normalized"])
def test_sparsify_loads_topk(data, name):
    os.environ.setdefault("SPARSIFY_DISABLE_TRITON", "1")
    from sparsify import SparseCoder

    row, _ = _train_and_export(data, name)
    out = data / f"run-{name}"
    export = data / f"export-{name}-sparsify"
    _run(os.path.join(BIN, "sae-export"), str(out / "sae" / row["sae"]), "--format", "sparsify",
         "--out", str(export))
    sae = SparseCoder.load_from_disk(str(export), device="cpu")
    x = _held_out_rows(data)
    with torch.no_grad():
        enc = sae.encode(x)
        x_hat = sae.decode(enc.top_acts, enc.top_indices)
    z = torch.zeros(x.shape[0], sae.num_latents).scatter_(1, enc.top_indices, enc.top_acts)
    fvu, l0 = _fvu_l0(x, x_hat, z)
    err = _relative_error(x_hat, _saetrain_reconstruction(data, name, row, x))
    print(f"sparsify {name}: relative reconstruction difference to saetrain {err:.2e}")
    assert err <= RECON_BOUND, f"{name}: sparsify's reconstruction differs from saetrain's by {err}"
    assert fvu == pytest.approx(float(row["eval_fvu"]), rel=2e-3, abs=1e-5)
    assert l0 == pytest.approx(float(row["eval_l0"]), rel=2e-3)
