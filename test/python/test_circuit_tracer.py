"""saetrain's transcoders, exported with `sae-export --format circuit_tracer`, load with
circuit-tracer's own loaders and compute saetrain's function there: on 2000 held-out pairs
(never trained on), circuit-tracer's decode(encode(x), x) equals saetrain's own C++
reconstruction of the same rows (test/sae_forward.cpp) within RECON_BOUND, and gives the FVU
and L0 of saetrain's own held-out evaluation (summary.csv eval_fvu, eval_l0). The export's
config.yaml loads as a transcoder set (load_transcoder_set) with one transcoder per layer
exported into the directory; a TopK transcoder, and an export without --layer, are refused
with one line. A CLT with per-layer TopK exports through each layer's threshold, which keeps
circuit-tracer's per-layer L0 near k on the held-out rows.

    SAETRAIN_BIN_DIR=build/cpu/apps SAETRAIN_TEST_BIN_DIR=build/cpu/test \\
        .venv/bin/python -m pytest test/python/test_circuit_tracer.py
"""
import csv
import os
import subprocess

import numpy as np
import pytest

from strict import need_module, skip_module  # noqa: E402

h5py = need_module("h5py")
torch = need_module("torch")
yaml = need_module("yaml")
need_module("circuit_tracer.transcoder")

BIN = os.environ.get("SAETRAIN_BIN_DIR", "")
if not (BIN and os.path.exists(os.path.join(BIN, "saetrain"))):
    skip_module("SAETRAIN_BIN_DIR does not hold the built saetrain apps")
TEST_BIN = os.environ.get("SAETRAIN_TEST_BIN_DIR", os.path.join(BIN, "..", "test"))
FORWARD = os.path.join(TEST_BIN, "sae_forward")
if not os.path.exists(FORWARD):
    skip_module(f"{FORWARD} is not built (SAETRAIN_TEST_BIN_DIR)")

# As test_saelens_interop.py: the same float32 function of the same weights, only the GEMMs'
# summation order differs; a latent on the other side of its threshold would cost ~1e-2.
RECON_BOUND = 1e-5

# (sae.arch, sae.transcoder_activation, further --set overrides)
CASES = {
    "transcoder-batchtopk": ("transcoder", "batchtopk", []),
    "skip_transcoder-batchtopk": ("skip_transcoder", "batchtopk", []),
    "transcoder-jumprelu": ("transcoder", "jumprelu",
                            ["train.l0_coeff=0.1", "sae.jumprelu_bandwidth=0.05",
                             "sae.jumprelu_init_threshold=0.05"]),
    "skip_transcoder-jumprelu": ("skip_transcoder", "jumprelu",
                                 ["train.l0_coeff=0.1", "sae.jumprelu_bandwidth=0.05",
                                  "sae.jumprelu_init_threshold=0.05"]),
}


def _run(*cmd, ok=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    if ok:
        assert r.returncode == 0, " ".join(map(str, cmd)) + "\n" + r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("circuit_tracer")
    _run(os.path.join(BIN, "sae-synth"), "--out", root / "x", "--target", root / "y",
         "--d-model", "24", "--features", "64", "--rows", "12000", "--shards", "2", "--seed", "5")
    return root


def _train(root, arch, activation, extra):
    out = root / f"run-{arch}-{activation}"
    if not (out / "summary.csv").exists():
        cfg = root / "cfg.yaml"
        cfg.write_text(
            f"run: {{out_dir: {out}}}\n"
            f"data: {{path: {root / 'x'}, target_path: {root / 'y'}, batch_size: 256, "
            "epochs: 2, eval_rows: 2000}\n"
            "sae: {expansion: 4, k: 4}\n"
            "train: {lr: 0.01}\n"
            "log: {every_steps: 10}\ncheckpoint: {every_steps: 1000}\n")
        sets = [f"sae.arch={arch}", f"sae.transcoder_activation={activation}", *extra]
        _run(os.path.join(BIN, "saetrain"), cfg, *sum([["--set", s] for s in sets], []))
    with open(out / "summary.csv", newline="") as f:
        row = next(csv.DictReader(f))
    return row, out / "sae" / row["sae"]


def _held_out(root, name):
    # data.eval_rows without eval_path: the last 2000 rows of both sets, in shard order.
    rows = []
    for shard in sorted((root / name).glob("shard_*.h5")):
        with h5py.File(shard, "r") as f:
            rows.append(f["activations"][:])
    return torch.from_numpy(np.concatenate(rows)[-2000:].astype(np.float32))


def _saetrain_y_hat(root, sae_dir, x):
    rows, y_hat = root / "rows.f32", root / "yhat.f32"
    x.numpy().astype("<f4").tofile(rows)
    _run(FORWARD, sae_dir / "final.h5", rows, y_hat)
    return torch.from_numpy(np.fromfile(y_hat, dtype="<f4").reshape(x.shape))


@pytest.mark.parametrize("name", list(CASES))
def test_circuit_tracer_loads_transcoders(data, name):
    from circuit_tracer.transcoder.activation_functions import JumpReLU
    from circuit_tracer.transcoder.single_layer_transcoder import load_relu_transcoder

    arch, activation, extra = CASES[name]
    row, sae_dir = _train(data, arch, activation, extra)
    export = data / f"export-{name}"
    _run(os.path.join(BIN, "sae-export"), sae_dir, "--format", "circuit_tracer", "--layer", "0",
         "--out", export)
    tc = load_relu_transcoder(str(export / "layer_0.safetensors"), 0, device=torch.device("cpu"),
                              lazy_encoder=False, lazy_decoder=False)
    assert isinstance(tc.activation_function, JumpReLU)
    assert (tc.W_skip is not None) == (arch == "skip_transcoder")
    thresholds = tc.activation_function.threshold
    assert tuple(thresholds.shape) == (int(row["n_latents"]),) and bool((thresholds > 0).all())
    if activation == "batchtopk":  # its one learned inference threshold, for every latent
        assert bool((thresholds == thresholds[0]).all())
    else:  # JumpReLU's own, one per latent
        assert len(set(thresholds.tolist())) > 1
    x, y = _held_out(data, "x"), _held_out(data, "y")
    with torch.no_grad():
        z = tc.encode(x)
        y_hat = tc.decode(z, x)
    err = ((y_hat - (mine := _saetrain_y_hat(data, sae_dir, x))).norm() / mine.norm()).item()
    print(f"circuit-tracer {name}: relative reconstruction difference to saetrain {err:.2e}")
    assert err <= RECON_BOUND, f"{name}: circuit-tracer's y_hat differs from saetrain's by {err}"
    fvu = (((y_hat - y) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()).item()
    l0 = (z != 0).sum(1).float().mean().item()
    assert fvu == pytest.approx(float(row["eval_fvu"]), rel=2e-3, abs=1e-5), row
    assert l0 == pytest.approx(float(row["eval_l0"]), rel=2e-3), row
    assert fvu < 0.8, f"{name}: the transcoder learned little (fvu {fvu})"


def test_config_yaml_loads_as_a_transcoder_set(data):
    from circuit_tracer.transcoder.single_layer_transcoder import load_transcoder_set

    _, sae_dir = _train(data, "transcoder", "batchtopk", [])
    export = data / "export-set"
    for layer in (1, 0):  # any order: the set lists the layers in order
        _run(os.path.join(BIN, "sae-export"), sae_dir, "--format", "circuit_tracer", "--layer",
             str(layer), "--out", export, "--model-name", "m")
    cfg = yaml.safe_load((export / "config.yaml").read_text())
    assert cfg["model_kind"] == "transcoder_set" and cfg["model_name"] == "m"
    assert cfg["transcoders"] == [str(export / f"layer_{i}.safetensors") for i in (0, 1)]
    # What circuit-tracer's load_transcoders does with such a config.
    s = load_transcoder_set(dict(enumerate(cfg["transcoders"])), scan=cfg["scan"],
                            feature_input_hook=cfg["feature_input_hook"],
                            feature_output_hook=cfg["feature_output_hook"],
                            device=torch.device("cpu"), lazy_encoder=False, lazy_decoder=False)
    assert len(s.transcoders) == 2
    assert torch.equal(s.transcoders[0].W_dec, s.transcoders[1].W_dec)


def test_topk_transcoders_and_saes_are_refused(data):
    _, sae_dir = _train(data, "transcoder", "topk", [])
    r = _run(os.path.join(BIN, "sae-export"), sae_dir, "--format", "circuit_tracer", "--layer",
             "0", "--out", data / "refused", ok=False)
    assert r.returncode == 1 and "ReLU or JumpReLU" in r.stderr, r.stderr
    assert not (data / "refused" / "layer_0.safetensors").exists()
    _, sae_dir = _train(data, "transcoder", "batchtopk", [])
    r = _run(os.path.join(BIN, "sae-export"), sae_dir, "--format", "circuit_tracer", "--out",
             data / "refused", ok=False)
    assert r.returncode == 1 and "--layer" in r.stderr, r.stderr


# Cross-layer transcoders: (sae.transcoder_activation, further --set overrides)
CLT_LAYERS = 3
CLT_CASES = {
    "clt-batchtopk": ("batchtopk", []),
    "clt-jumprelu": ("jumprelu", ["train.l0_coeff=0.1", "sae.jumprelu_bandwidth=0.05",
                                  "sae.jumprelu_init_threshold=0.05"]),
}


@pytest.fixture(scope="module")
def clt_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("circuit_tracer_clt")
    for layer in range(CLT_LAYERS):
        _run(os.path.join(BIN, "sae-synth"), "--out", root / f"x{layer}", "--target",
             root / f"y{layer}", "--d-model", "16", "--features", "32", "--rows", "8000",
             "--shards", "2", "--seed", str(layer + 1))
    return root


def _train_clt(root, activation, extra, tag=None):
    out = root / f"run-clt-{tag or activation}"
    if not (out / "summary.csv").exists():
        layers = range(CLT_LAYERS)
        cfg = root / "cfg.yaml"
        cfg.write_text(
            f"run: {{out_dir: {out}}}\n"
            f"data: {{path: [{', '.join(str(root / f'x{l}') for l in layers)}], "
            f"target_path: [{', '.join(str(root / f'y{l}') for l in layers)}], "
            "batch_size: 256, epochs: 2, eval_rows: 2000}\n"
            "sae: {arch: clt, expansion: 2, k: 4}\n"
            "train: {lr: 0.01}\n"
            "log: {every_steps: 10}\ncheckpoint: {every_steps: 1000}\n")
        sets = [f"sae.transcoder_activation={activation}", *extra]
        _run(os.path.join(BIN, "saetrain"), cfg, *sum([["--set", s] for s in sets], []))
    with open(out / "summary.csv", newline="") as f:
        row = next(csv.DictReader(f))
    return row, out / "sae" / row["sae"]


@pytest.mark.parametrize("name", list(CLT_CASES))
def test_circuit_tracer_loads_a_cross_layer_transcoder(clt_data, name):
    """load_clt reads the export's per-layer files, and its forward over the held-out rows of
    every layer equals saetrain's own reconstruction, with saetrain's held-out FVU and L0."""
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

    activation, extra = CLT_CASES[name]
    row, sae_dir = _train_clt(clt_data, activation, extra)
    export = clt_data / f"export-{name}"
    _run(os.path.join(BIN, "sae-export"), sae_dir, "--format", "circuit_tracer", "--out",
         export)
    config = yaml.safe_load((export / "config.yaml").read_text())
    assert config["model_kind"] == "cross_layer_transcoder"
    clt = load_clt(str(export), config["feature_input_hook"], config["feature_output_hook"],
                   device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=False)
    F = int(row["n_latents"]) // CLT_LAYERS
    assert (clt.n_layers, clt.d_transcoder, clt.d_model) == (CLT_LAYERS, F, 16)
    threshold = clt.activation_function.threshold
    assert bool((threshold > 0).all())
    if activation == "batchtopk":  # its one inference threshold, for every feature
        assert bool((threshold == threshold.flatten()[0]).all())
    x = torch.stack([_held_out(clt_data, f"x{layer}") for layer in range(CLT_LAYERS)])
    y = torch.stack([_held_out(clt_data, f"y{layer}") for layer in range(CLT_LAYERS)])
    with torch.no_grad():
        z = clt.encode(x)  # [L, rows, F]
        y_hat = clt.decode(z.to_sparse())  # [L, rows, d]
    rows = x.shape[1]
    mine = _saetrain_y_hat(clt_data, sae_dir, x.permute(1, 0, 2).reshape(rows, -1))
    mine = mine.reshape(rows, CLT_LAYERS, 16).permute(1, 0, 2)
    err = ((y_hat - mine).norm() / mine.norm()).item()
    print(f"circuit-tracer {name}: relative reconstruction difference to saetrain {err:.2e}")
    assert err <= RECON_BOUND, f"{name}: circuit-tracer's y_hat differs from saetrain's by {err}"
    # saetrain's held-out figures: FVU over every layer's values as one vector of L d, L0 per
    # token over every layer's features.
    flat = lambda t: t.permute(1, 0, 2).reshape(rows, -1)  # noqa: E731
    fvu = (((flat(y_hat) - flat(y)) ** 2).sum() / ((flat(y) - flat(y).mean(0)) ** 2).sum()).item()
    l0 = (z != 0).sum((0, 2)).float().mean().item()
    assert fvu == pytest.approx(float(row["eval_fvu"]), rel=2e-3, abs=1e-5), row
    assert l0 == pytest.approx(float(row["eval_l0"]), rel=2e-3), row
    assert fvu < 0.8, f"{name}: the CLT learned little (fvu {fvu})"
    # And per layer (summary.csv's eval_*_layer<l>): each layer's target block, its features.
    for layer in range(CLT_LAYERS):
        yl, el = y[layer], y_hat[layer] - y[layer]
        fvu_l = ((el ** 2).sum() / ((yl - yl.mean(0)) ** 2).sum()).item()
        fired = (z[layer] != 0)
        assert fvu_l == pytest.approx(float(row[f"eval_fvu_layer{layer}"]), rel=2e-3), row
        assert fired.sum(1).float().mean().item() == pytest.approx(
            float(row[f"eval_l0_layer{layer}"]), rel=2e-3), row
        assert (fired.sum(0) == 0).float().mean().item() == pytest.approx(
            float(row[f"eval_dead_layer{layer}"]), abs=1e-9), row


def test_a_per_layer_topk_clt_exports_through_each_layers_threshold(clt_data):
    """sae.k_scope: layer: TopK keeps each layer's k largest a token. circuit-tracer's CLTs are
    JumpReLU, so the export gives each feature its layer's threshold (the running batch threshold
    of the layer's k B largest pre-activations); on the held-out rows circuit-tracer's L0 is then
    near k in every layer and its FVU near saetrain's own."""
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

    row, sae_dir = _train_clt(clt_data, "topk", ["sae.k_scope=layer"], tag="topk-layer")
    assert row["sae"].endswith("-layer"), row
    export = clt_data / "export-clt-topk-layer"
    _run(os.path.join(BIN, "sae-export"), sae_dir, "--format", "circuit_tracer", "--out",
         export)
    config = yaml.safe_load((export / "config.yaml").read_text())
    clt = load_clt(str(export), config["feature_input_hook"], config["feature_output_hook"],
                   device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=False)
    threshold = clt.activation_function.threshold.reshape(CLT_LAYERS, -1)
    assert bool((threshold > 0).all())
    assert bool((threshold == threshold[:, :1]).all()), "one threshold a layer"
    x = torch.stack([_held_out(clt_data, f"x{layer}") for layer in range(CLT_LAYERS)])
    y = torch.stack([_held_out(clt_data, f"y{layer}") for layer in range(CLT_LAYERS)])
    with torch.no_grad():
        z = clt.encode(x)  # [L, rows, F]
        y_hat = clt.decode(z.to_sparse())
    rows = x.shape[1]
    flat = lambda t: t.permute(1, 0, 2).reshape(rows, -1)  # noqa: E731
    fvu = (((flat(y_hat) - flat(y)) ** 2).sum() / ((flat(y) - flat(y).mean(0)) ** 2).sum()).item()
    l0 = [(z[layer] != 0).sum(1).float().mean().item() for layer in range(CLT_LAYERS)]
    print(f"per-layer TopK through thresholds: held-out L0 {l0} (k 4), FVU {fvu:.4f} "
          f"(saetrain's TopK {float(row['eval_fvu']):.4f})")
    # 4.89, 4.71 and 4.53 when written: the running threshold lags a 62-step run's growing
    # pre-activations, as per-layer BatchTopK's inference threshold does.
    for layer, value in enumerate(l0):
        assert value == pytest.approx(4.0, rel=0.3), (layer, l0)
    assert fvu == pytest.approx(float(row["eval_fvu"]), rel=0.25), (fvu, row["eval_fvu"])


def test_a_topk_clt_and_a_layer_for_a_clt_are_refused(clt_data):
    _, topk_dir = _train_clt(clt_data, "topk", [])
    r = _run(os.path.join(BIN, "sae-export"), topk_dir, "--format", "circuit_tracer", "--out",
             clt_data / "refused-topk", ok=False)
    assert r.returncode != 0 and "per-token top-k" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    _, sae_dir = _train_clt(clt_data, "batchtopk", [])
    r = _run(os.path.join(BIN, "sae-export"), sae_dir, "--format", "circuit_tracer", "--layer",
             "1", "--out", clt_data / "refused-layer", ok=False)
    assert r.returncode != 0 and "spans every layer" in r.stderr, r.stderr
    assert not (clt_data / "refused-layer" / "W_enc_0.safetensors").exists()
