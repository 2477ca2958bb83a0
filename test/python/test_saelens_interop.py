"""Every architecture saetrain trains, exported with `sae-export --format saelens`, loads with
SAELens's own loader (SAE.load_from_disk) and computes the same function there: SAELens's
encode/decode on the held-out rows gives the FVU and L0 that saetrain's own evaluation reported
for them (summary.csv eval_fvu, eval_l0), and tools/splice_eval.py's forward agrees. TopK also
goes through sparsify's loader. One case trains with data.normalize, whose scale the export
folds into the weights.

    SAETRAIN_BIN_DIR=build/cpu/apps .venv/bin/python -m pytest test/python/test_saelens_interop.py
"""
import csv
import os
import subprocess
import sys

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
torch = pytest.importorskip("torch")
pytest.importorskip("sae_lens")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
BIN = os.environ.get("SAETRAIN_BIN_DIR", "")
if not (BIN and os.path.exists(os.path.join(BIN, "saetrain"))):
    pytest.skip("SAETRAIN_BIN_DIR does not hold the built saetrain apps", allow_module_level=True)

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


def _train_and_export(root, name):
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


def _fvu_l0(x, x_hat, z):
    sse = ((x_hat - x) ** 2).sum().item()
    sst = ((x - x.mean(0)) ** 2).sum().item()
    return sse / sst, (z != 0).sum(1).float().mean().item()


@pytest.mark.parametrize("name", list(CASES))
def test_saelens_loads_every_architecture(data, name):
    from sae_lens.saes.sae import SAE

    row, export = _train_and_export(data, name)
    sae = SAE.load_from_disk(str(export))
    x = _held_out_rows(data)
    with torch.no_grad():
        z = sae.encode(x)
        fvu, l0 = _fvu_l0(x, sae.decode(z), z)
    assert fvu == pytest.approx(float(row["eval_fvu"]), rel=2e-3, abs=1e-5), row
    assert l0 == pytest.approx(float(row["eval_l0"]), rel=2e-3), row
    assert fvu < 0.5, f"{name}: the SAE learned little (fvu {fvu})"
    # tools/splice_eval.py, which splices exports into a model, computes the same forward.
    import splice_eval as se

    mine = se.Sae(se.SaeSpec(str(export)), "cpu")
    x_hat, _ = mine.reconstruct(x)
    with torch.no_grad():
        assert torch.allclose(x_hat, sae.decode(sae.encode(x)), atol=1e-4), name


def test_sparsify_loads_topk(data):
    os.environ.setdefault("SPARSIFY_DISABLE_TRITON", "1")
    from sparsify import SparseCoder

    row, _ = _train_and_export(data, "topk")
    out = data / "run-topk"
    export = data / "export-topk-sparsify"
    _run(os.path.join(BIN, "sae-export"), str(out / "sae" / row["sae"]), "--format", "sparsify",
         "--out", str(export))
    sae = SparseCoder.load_from_disk(str(export), device="cpu")
    x = _held_out_rows(data)
    with torch.no_grad():
        enc = sae.encode(x)
        x_hat = sae.decode(enc.top_acts, enc.top_indices)
    z = torch.zeros(x.shape[0], sae.num_latents).scatter_(1, enc.top_indices, enc.top_acts)
    fvu, l0 = _fvu_l0(x, x_hat, z)
    assert fvu == pytest.approx(float(row["eval_fvu"]), rel=2e-3, abs=1e-5)
    assert l0 == pytest.approx(float(row["eval_l0"]), rel=2e-3)
