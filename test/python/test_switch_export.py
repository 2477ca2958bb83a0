"""A Switch SAE exported with `sae-export --format saelens` loads with tools/switch_sae.py (plain
PyTorch and safetensors: neither SAELens nor sparsify has the architecture) and computes the
function saetrain evaluated: its FVU and L0 on the held-out rows equal summary.csv's eval_fvu
and eval_l0. sparsify's format is refused with one line.

    SAETRAIN_BIN_DIR=build/cpu/apps .venv/bin/python -m pytest test/python/test_switch_export.py
"""
import csv
import os
import subprocess
import sys

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
BIN = os.environ.get("SAETRAIN_BIN_DIR", "")
if not (BIN and os.path.exists(os.path.join(BIN, "saetrain"))):
    pytest.skip("SAETRAIN_BIN_DIR does not hold the built saetrain apps", allow_module_level=True)


def _run(*cmd, ok=True):
    r = subprocess.run(list(cmd), capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if ok:
        assert r.returncode == 0, " ".join(cmd) + "\n" + r.stdout + r.stderr
    return r


@pytest.mark.parametrize("normalize", ["none", "expected_average_only_in"])
def test_switch_export_reconstructs_as_saetrain(tmp_path, normalize):
    from switch_sae import SwitchSae

    _run(os.path.join(BIN, "sae-synth"), "--out", str(tmp_path / "synth"), "--d-model", "24",
         "--features", "64", "--rows", "12000", "--shards", "2", "--seed", "4")
    out = tmp_path / "run"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        f"run: {{out_dir: {out}}}\n"
        f"data: {{path: {tmp_path / 'synth'}, batch_size: 256, epochs: 2, eval_rows: 2000, "
        f"normalize: {normalize}}}\n"
        "sae: {arch: switch, expansion: 8, k: 4, n_experts: 4}\n"
        "train: {lr: 0.01, balance_coeff: 0.1}\n"
        "log: {every_steps: 10}\ncheckpoint: {every_steps: 1000}\n")
    _run(os.path.join(BIN, "saetrain"), str(cfg))
    with open(out / "summary.csv", newline="") as f:
        row = next(csv.DictReader(f))
    assert row["arch"] == "switch" and float(row["expert_load_max"]) < 2 / 4, row
    export = tmp_path / "export"
    _run(os.path.join(BIN, "sae-export"), str(out / "sae" / row["sae"]), "--format", "saelens",
         "--out", str(export))
    sae = SwitchSae(str(export))
    assert sae.n_experts == 4 and sae.W_router.shape == (24, 4)
    rows = []
    for shard in sorted((tmp_path / "synth").glob("shard_*.h5")):
        with h5py.File(shard, "r") as f:
            rows.append(f["activations"][:])
    x = torch.from_numpy(np.concatenate(rows)[-2000:].astype(np.float32))
    z = sae.encode(x)
    x_hat = sae.decode(z)
    fvu = (((x_hat - x) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()).item()
    l0 = (z != 0).sum(1).float().mean().item()
    assert fvu == pytest.approx(float(row["eval_fvu"]), rel=2e-3, abs=1e-5), row
    assert l0 == pytest.approx(float(row["eval_l0"]), rel=2e-3), row
    assert fvu < 0.6, f"the Switch SAE learned little (fvu {fvu})"
    # sparsify has no Switch SAE: one clear line, non-zero exit.
    r = _run(os.path.join(BIN, "sae-export"), str(out / "sae" / row["sae"]), "--format",
             "sparsify", "--out", str(tmp_path / "sp"), ok=False)
    assert r.returncode != 0 and "sparsify has no Switch SAE" in r.stderr, r.stderr
