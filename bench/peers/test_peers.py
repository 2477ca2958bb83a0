"""Tests of the peer benchmark's Python side on tiny data (a few seconds of training):

    .venv/bin/python -m pytest bench/peers/test_peers.py

- shuffle_shards.py writes exactly the permuted rows (float32, float16 and bf16 inputs);
- sae_eval.evaluate equals each peer's own forward (SAELens TopK with decoder-norm rescaling,
  SAELens standard, sparsify SparseCoder) and SAELens's own loader of a SAELens-format dir;
- train_peer.py trains with both tools (and both archs for SAELens), every row once, the last
  partial batch included; eval_export.py and table.py run on the results;
- frontier.py: saetrain's frontier-*/summary.csv rows and the peers' frontier-*.json into the
  CSV, the PNG and the table (other runs ignored; a run without a held-out evaluation refused);
- transcoders: the paired shuffle (one permutation for input and target, token ids checked),
  the evaluator on sparsify-format directories against sparsify's own transcoder forward
  (with and without W_skip), and train_peer.py --tool sparsify --arch transcoder and
  skip_transcoder with eval_export.py and table.py --reference sparsify (skipped without
  sparsify);
- refit_decoder.py: its codes are the evaluator's forward (ReLU and TopK) and its two fits are
  numpy's least squares on them.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("SPARSIFY_DISABLE_TRITON", "1")
from sae_eval import evaluate, evaluate_saelens_dir, evaluate_sparsify_dir, read_rows  # noqa: E402

D = 16


def _rows(rng, n):
    f = rng.standard_normal((40, D))
    f /= np.linalg.norm(f, axis=1, keepdims=True)
    z = (rng.random((n, 40)) < 0.1) * rng.exponential(1.0, (n, 40))
    return (z @ f + 0.05 * rng.standard_normal((n, D)) + 0.2).astype(np.float32)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers")
    rng = np.random.default_rng(0)
    raw, ev = root / "raw", root / "eval"
    raw.mkdir()
    ev.mkdir()
    a, b, c = _rows(rng, 700), _rows(rng, 500).astype(np.float16), _rows(rng, 300)
    cb = (c.view(np.uint32) >> 16).astype(np.uint16)
    with h5py.File(raw / "s0.h5", "w") as f:
        ds = f.create_dataset("activations", data=a)
        ds.attrs["model"], ds.attrs["hook"] = "fake", "h"
    with h5py.File(raw / "s1.h5", "w") as f:
        f.create_dataset("activations", data=b)
    with h5py.File(raw / "s2.h5", "w") as f:
        f.create_dataset("activations", data=cb).attrs["dtype"] = "bfloat16"
    with h5py.File(ev / "e.h5", "w") as f:
        f.create_dataset("activations", data=_rows(rng, 400))
    orig = np.concatenate([a, b.astype(np.float32), (cb.astype(np.uint32) << 16).view(np.float32)])
    shuf = root / "shuf"
    subprocess.run([sys.executable, os.path.join(HERE, "shuffle_shards.py"), str(raw), str(shuf),
                    "--seed", "3", "--rows-per-shard", "600"], check=True)
    return {"root": root, "orig": orig, "shuf": shuf, "eval": ev, "raw": raw}


def _run(*args):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_shuffle_is_one_permutation(data):
    perm = np.random.default_rng(3).permutation(len(data["orig"]))
    names = sorted(os.listdir(data["shuf"]))
    assert names == ["shard-00000.h5", "shard-00001.h5", "shard-00002.h5"]  # 600, 600, 300
    got = read_rows(str(data["shuf"]))
    assert got.dtype == np.float32 and np.array_equal(got, data["orig"][perm])
    with h5py.File(data["shuf"] / names[0]) as f:
        assert f["activations"].attrs["dtype"] == "float32"
        assert f["activations"].attrs["model"] == "fake"
        assert int(f["activations"].attrs["d_model"]) == D


def _ref(x, x_hat, z):
    x, x_hat = x.double(), x_hat.double()
    fvu = float((x_hat - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
    return fvu, float((z != 0).sum(1).double().mean())


def test_evaluator_matches_each_tools_forward(data):
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sparsify import SparseCoder, SparseCoderConfig

    torch.manual_seed(0)
    x = torch.from_numpy(read_rows(str(data["eval"])))
    for arch in ("topk", "relu"):
        sae = (TopKTrainingSAE(TopKTrainingSAEConfig(d_in=D, d_sae=64, k=6)) if arch == "topk"
               else StandardTrainingSAE(StandardTrainingSAEConfig(d_in=D, d_sae=64)))
        with torch.no_grad():
            for p in sae.parameters():
                p.add_(0.1 * torch.randn_like(p))
            sae.W_dec.mul_(torch.rand(64, 1) + 0.5)  # decoder norms away from 1
            z = sae.encode(x)
            want = _ref(x, sae.decode(z), z)
        sd = {k: v.clone() for k, v in sae.state_dict().items()}
        sae.process_state_dict_for_saving_inference(sd)
        m = evaluate(sd["W_enc"], sd["b_enc"], sd["W_dec"], sd["b_dec"], arch, x, k=6,
                     batch_size=97)
        assert m["eval_fvu"] == pytest.approx(want[0], rel=1e-5)
        assert m["eval_l0"] == pytest.approx(want[1])
    sc = SparseCoder(D, SparseCoderConfig(expansion_factor=4, k=6))
    with torch.no_grad():
        for p in sc.parameters():
            p.add_(0.1 * torch.randn_like(p))
        out = sc(x)
        z = torch.zeros(len(x), 64).scatter_(1, out.latent_indices, out.latent_acts)
        want = _ref(x, out.sae_out, z)
    m = evaluate(sc.encoder.weight.T, sc.encoder.bias, sc.W_dec, sc.b_dec, "topk", x, k=6)
    assert m["eval_fvu"] == pytest.approx(want[0], rel=1e-5)
    assert m["eval_fvu"] == pytest.approx(float(out.fvu), rel=1e-4)  # sparsify's own fvu
    assert m["eval_l0"] == pytest.approx(want[1])


def _write_saelens_dir(path, arch, rng, n=64):
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    w_dec = rng.standard_normal((n, D)).astype(np.float32)
    w_dec /= np.linalg.norm(w_dec, axis=1, keepdims=True)
    save_file({"W_enc": np.ascontiguousarray(w_dec.T), "b_enc": np.full(n, -0.1, np.float32),
               "W_dec": w_dec, "b_dec": np.full(D, 0.2, np.float32)},
              str(path / "sae_weights.safetensors"))
    cfg = {"architecture": arch, "d_in": D, "d_sae": n, "dtype": "float32", "device": "cpu",
           "apply_b_dec_to_input": True, "normalize_activations": "none",
           "reshape_activations": "none",
           "metadata": {"saetrain_id": "x", "saetrain_step": 3, "saetrain_tokens": 1500}}
    if arch == "topk":
        cfg.update(k=6, rescale_acts_by_decoder_norm=False)
    (path / "cfg.json").write_text(json.dumps(cfg))


def test_saelens_dir_matches_saelens_loader(data):
    from sae_lens.saes.sae import SAE

    x = torch.from_numpy(read_rows(str(data["eval"])))
    rng = np.random.default_rng(5)
    for arch in ("topk", "standard"):
        d = data["root"] / f"export-{arch}"
        _write_saelens_dir(d, arch, rng)
        m, _ = evaluate_saelens_dir(str(d), x.numpy())
        sae = SAE.load_from_disk(str(d))
        with torch.no_grad():
            z = sae.encode(x)
            want = _ref(x, sae.decode(z), z)
        assert m["eval_fvu"] == pytest.approx(want[0], rel=1e-5)
        assert m["eval_l0"] == pytest.approx(want[1])


def test_train_peers_eval_export_and_table(data):
    res = data["root"] / "results"
    runs = [("saelens", "topk", []), ("saelens", "relu", ["--l1-coeff", "1"]),
            ("sparsify", "topk", ["--optimizer", "adam"]),
            ("sparsify", "topk", ["--optimizer", "signum", "--lr", "auto"])]
    for i, (tool, arch, extra) in enumerate(runs):
        out = res / f"{tool}-{arch}-{i}.json"
        _run(os.path.join(HERE, "train_peer.py"), "--tool", tool, "--arch", arch,
             "--train", str(data["shuf"]), "--eval", str(data["eval"]), "--batch-size", "256",
             "--expansion", "4", "--k", "6", "--threads", "1", "--json", str(out), *extra)
        r = json.loads(out.read_text())
        assert r["tokens"] == 1500 and r["steps"] == 6  # 5 full batches + the partial one
        assert r["n_latents"] == 4 * D and r["eval_rows"] == 400
        assert np.isfinite(r["eval_fvu"]) and r["tokens_per_s"] > 0
        if arch == "topk":
            assert 0 < r["eval_l0"] <= 6
    summary = data["root"] / "summary.csv"
    summary.write_text("sae,arch,n_latents,k,l1_coeff,lr,steps,tokens,fvu,l0,tokens_per_s,"
                       "eval_fvu,eval_l0\nx,topk,64,6,,0.0004,6,1500,0.5,6,1000,0.25,6\n")
    _run(os.path.join(HERE, "eval_export.py"), str(data["root"] / "export-topk"),
         "--eval", str(data["eval"]), "--summary", str(summary), "--threads", "1",
         "--json", str(res / "saetrain-topk.json"))
    r = json.loads((res / "saetrain-topk.json").read_text())
    assert r["tool"] == "saetrain" and r["cpp_eval_fvu"] == 0.25 and r["tokens_per_s"] == 1000
    table = _run(os.path.join(HERE, "table.py"), str(res))
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert len(lines) == 1 + 5 and "speed vs SAELens" in lines[0]
    assert any(ln.startswith("| saetrain | topk | k=6, x4, lr 0.0004 |") for ln in lines)
    assert "saelens ReLU-L1: eval L0" in table


def test_frontier_csv_plot_and_table(tmp_path):
    import csv
    runs, res = tmp_path / "saetrain", tmp_path / "results"
    # frontier-topk-signum: run.sh's FRONTIER_TAG, a variant plotted as its own series
    for name, arch, key, rows in [("topk", "topk", "k", [(16, 15.9, 0.20), (64, 63.5, 0.10)]),
                                  ("topk-signum", "topk", "k", [(32, 31.8, 0.15)]),
                                  ("relu", "relu", "target_l0", [(32, 30.2, 0.21)])]:
        d = runs / f"frontier-{name}"
        d.mkdir(parents=True)
        lines = ["sae,arch,k,target_l0,l0,tokens,tokens_per_s,eval_fvu,eval_l0,"
                 "eval_dead_fraction"]
        for aim, l0, fvu in rows:
            k, t = (aim, "") if key == "k" else ("", aim)
            lines.append(f"{arch}-{aim},{arch},{k},{t},{l0 + 0.5},1000,50,{fvu},{l0},0.125")
        (d / "summary.csv").write_text("\n".join(lines) + "\n")
    (runs / "topk-k32").mkdir()  # not a frontier run: ignored
    (runs / "topk-k32" / "summary.csv").write_text("sae,arch\nx,topk\n")
    res.mkdir()
    (res / "frontier-sparsify-topk-k16-signum.json").write_text(json.dumps(
        {"tool": "sparsify", "arch": "topk", "k": 16, "optimizer": "signum", "tokens": 1000,
         "eval_fvu": 0.18, "eval_l0": 16.0, "eval_dead_fraction": 0.5}))
    (res / "saelens-topk-k32.json").write_text(json.dumps(  # not a frontier run: ignored
        {"tool": "saelens", "arch": "topk", "k": 32, "eval_fvu": 0.1, "eval_l0": 32.0}))
    out_csv, png = tmp_path / "f.csv", tmp_path / "f.png"
    table = _run(os.path.join(HERE, "frontier.py"), "--saetrain-runs", str(runs), "--results",
                 str(res), "--csv", str(out_csv), "--png", str(png))
    rows = list(csv.DictReader(out_csv.open()))
    assert [(r["tool"], r["arch"], r["setting"]) for r in rows] == [
        ("saetrain", "relu", "target_l0=32"), ("saetrain", "topk", "k=16"),
        ("saetrain", "topk", "k=64"), ("saetrain", "topk", "k=32, signum"),
        ("sparsify", "topk", "k=16, signum")]
    assert float(rows[2]["eval_fvu"]) == 0.10 and float(rows[2]["eval_l0"]) == 63.5
    assert float(rows[0]["eval_dead_pct"]) == 12.5 and float(rows[0]["train_l0"]) == 30.7
    assert float(rows[4]["eval_dead_pct"]) == 50.0 and rows[4]["train_l0"] == ""
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| saetrain | topk | k=64 | 63.5 | 0.1000 | 12.5 | 64.0 |" in table
    # A saetrain run without a held-out evaluation cannot be placed on the plot: one line.
    (runs / "frontier-gated").mkdir()
    (runs / "frontier-gated" / "summary.csv").write_text("sae,arch,target_l0,l0,eval_fvu\n"
                                                         "g,gated,32,30,\n")
    r = subprocess.run([sys.executable, os.path.join(HERE, "frontier.py"), "--saetrain-runs",
                        str(runs), "--results", str(res), "--csv", str(out_csv)],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "frontier-gated/summary.csv: SAE g has no held-out" in r.stderr
    (runs / "frontier-gated" / "summary.csv").unlink()
    # --previous: an earlier CSV's points join, except those a run here replaces.
    prev = tmp_path / "prev.csv"
    prev.write_text("tool,arch,setting,target,eval_l0,eval_fvu,eval_dead_pct,train_l0,tokens,"
                    "tokens_per_s\n"
                    "saetrain,topk,k=16,16,16,0.99,0,16,1000,50\n"      # replaced by the run
                    "saetrain,gated,target_l0=32,32,29,0.14,48.8,28.8,1000,50\n"  # kept
                    "saelens,topk,k=32,32,32,0.17,41,,1000,9\n")       # kept
    _run(os.path.join(HERE, "frontier.py"), "--saetrain-runs", str(runs), "--results", str(res),
         "--csv", str(out_csv), "--previous", str(prev))
    rows = {(r["tool"], r["arch"], r["setting"]): r for r in csv.DictReader(out_csv.open())}
    assert len(rows) == 7
    assert float(rows[("saetrain", "topk", "k=16")]["eval_fvu"]) == 0.20  # this run's
    assert float(rows[("saetrain", "gated", "target_l0=32")]["eval_dead_pct"]) == 48.8
    assert rows[("saelens", "topk", "k=32")]["train_l0"] == ""
    prev.write_text("a,b\n1,2\n")
    r = subprocess.run([sys.executable, os.path.join(HERE, "frontier.py"), "--saetrain-runs",
                        str(runs), "--results", str(res), "--csv", str(out_csv), "--previous",
                        str(prev)], capture_output=True, text=True)
    assert r.returncode != 0 and "is not a frontier CSV (no column tool" in r.stderr


def test_sparsify_has_no_relu(data, tmp_path):
    r = subprocess.run([sys.executable, os.path.join(HERE, "train_peer.py"), "--tool",
                        "sparsify", "--arch", "relu", "--train", str(data["shuf"]), "--eval",
                        str(data["eval"]), "--json", str(tmp_path / "x.json")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "no ReLU-L1" in r.stderr


def _write_sae_h5(path, arch, k, W_enc, b_enc, W_dec, b_dec):
    with h5py.File(path, "w") as f:
        for name, a in (("W_enc", W_enc), ("b_enc", b_enc), ("W_dec", W_dec), ("b_dec", b_dec)):
            f.create_dataset(name, data=a.astype(np.float32))
        f.attrs["arch"], f.attrs["k"] = arch, k


@pytest.mark.parametrize("arch", ["relu", "topk"])
def test_refit_decoder_is_least_squares(data, tmp_path, arch):
    import refit_decoder

    rng = np.random.default_rng(5)
    n = 24
    W_enc = rng.standard_normal((D, n)) / np.sqrt(D)
    b_enc = -0.1 * np.ones(n)
    W_dec = 0.4 * rng.standard_normal((n, D)) / np.sqrt(D)  # a shrunken, wrong decoder
    b_dec = 0.2 * np.ones(D)
    path = tmp_path / "final.h5"
    _write_sae_h5(path, arch, 4, W_enc, b_enc, W_dec, b_dec)
    got_arch, k, w = refit_decoder.load_sae(str(path))
    assert (got_arch, k) == (arch, 4)
    seen, Dfit, s, fired = refit_decoder.refit(arch, k, w, str(data["raw"]), chunk=256)
    x = data["orig"]
    assert seen == x.shape[0] and fired.all()
    # The codes equal the evaluator's forward, and the fits equal numpy's least squares on them.
    z = refit_decoder.codes(x, w, arch, k).toarray()
    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if arch == "topk":
        keep = np.argsort(-pre, axis=1)[:, :4]
        ref = np.zeros_like(pre)
        np.put_along_axis(ref, keep, np.maximum(np.take_along_axis(pre, keep, 1), 0), 1)
    else:
        ref = np.maximum(pre, 0)
    np.testing.assert_allclose(z, ref, rtol=1e-6, atol=1e-7)
    r = (x - w["b_dec"]).astype(np.float64)
    want = np.linalg.lstsq(z, r, rcond=None)[0]
    np.testing.assert_allclose(Dfit, want, rtol=1e-3, atol=1e-4)
    A = np.stack([z[:, i:i + 1] * W_dec[i] for i in range(n)], axis=2).reshape(-1, n)
    want_s = np.linalg.lstsq(A, r.reshape(-1), rcond=None)[0]
    np.testing.assert_allclose(s, want_s, rtol=1e-3, atol=1e-4)
    # The CLI prints the three held-out FVUs, the refits no worse than the decoder trained.
    out = _run(os.path.join(HERE, "refit_decoder.py"), "--sae", str(path), "--train",
               str(data["raw"]), "--eval", str(data["eval"]))
    fvu = {ln[:14].strip(): float(ln.split()[-2]) for ln in out.splitlines()
           if ln[:14].strip() in ("as trained", "scale refit", "decoder refit")}
    assert len(fvu) == 3
    assert fvu["decoder refit"] <= fvu["scale refit"] <= fvu["as trained"]


def test_refit_decoder_refuses_other_archs(tmp_path):
    path = tmp_path / "g.h5"
    z = np.zeros
    _write_sae_h5(path, "gated", 0, z((D, 8)), z(8), z((8, D)), z(D))
    r = subprocess.run([sys.executable, os.path.join(HERE, "refit_decoder.py"), "--sae", str(path),
                        "--train", str(path), "--eval", str(path)], capture_output=True, text=True)
    assert r.returncode != 0 and "arch 'gated': this refit knows relu and topk" in r.stderr


# --- transcoders ------------------------------------------------------------------------------
def _pair(rng, n, mix):
    """Input rows x and target rows y = an MLP-like map of x (plus noise), with token ids."""
    x = _rows(rng, n)
    y = (np.maximum(x @ mix[0], 0) @ mix[1] + 0.05 * rng.standard_normal((n, D)))
    return x, y.astype(np.float32), rng.integers(0, 1000, n).astype(np.int32)


def _write_pair(dirs, parts):
    for d in dirs:
        d.mkdir()
    for i, (x, y, ids) in enumerate(parts):
        for d, rows in zip(dirs, (x, y)):
            with h5py.File(d / f"s{i}.h5", "w") as f:
                f.create_dataset("activations", data=rows.astype(np.float16))
                f.create_dataset("token_ids", data=ids)


@pytest.fixture(scope="module")
def paired(tmp_path_factory):
    root = tmp_path_factory.mktemp("peers-tc")
    rng = np.random.default_rng(1)
    mix = (rng.standard_normal((D, 2 * D)) / 4, rng.standard_normal((2 * D, D)) / 4)
    train = [_pair(rng, 700, mix), _pair(rng, 800, mix)]
    _write_pair([root / "x-raw", root / "y-raw"], train)
    _write_pair([root / "x-eval", root / "y-eval"], [_pair(rng, 400, mix)])
    subprocess.run([sys.executable, os.path.join(HERE, "shuffle_shards.py"), str(root / "x-raw"),
                    str(root / "x"), "--target", str(root / "y-raw"), str(root / "y"),
                    "--seed", "4", "--rows-per-shard", "600"], check=True)
    cat = [np.concatenate([p[i] for p in train]) for i in range(3)]
    return {"root": root, "x_orig": cat[0].astype(np.float16).astype(np.float32),
            "y_orig": cat[1].astype(np.float16).astype(np.float32), "ids": cat[2]}


def test_paired_shuffle_is_one_permutation(paired):
    root = paired["root"]
    perm = np.random.default_rng(4).permutation(1500)
    assert np.array_equal(read_rows(str(root / "x")), paired["x_orig"][perm])
    assert np.array_equal(read_rows(str(root / "y")), paired["y_orig"][perm])
    for side in ("x", "y"):
        ids = np.concatenate([h5py.File(root / side / f"shard-0000{i}.h5")["token_ids"][:]
                              for i in range(3)])
        assert np.array_equal(ids, paired["ids"][perm])
    # a target whose token ids differ from the input's is refused before anything is written
    bad = root / "y-bad"
    bad.mkdir()
    for i in range(2):
        with h5py.File(root / "y-raw" / f"s{i}.h5") as f, h5py.File(bad / f"s{i}.h5", "w") as g:
            g.create_dataset("activations", data=f["activations"][:])
            g.create_dataset("token_ids", data=np.roll(f["token_ids"][:], 1))
    r = subprocess.run([sys.executable, os.path.join(HERE, "shuffle_shards.py"),
                        str(root / "x-raw"), str(root / "x2"), "--target", str(bad),
                        str(root / "y2")], capture_output=True, text=True)
    assert r.returncode != 0 and "not aligned" in r.stderr and not (root / "x2").exists()


def test_evaluator_matches_sparsify_transcoder(paired, tmp_path):
    sparsify = pytest.importorskip("sparsify")
    root = paired["root"]
    x = torch.from_numpy(read_rows(str(root / "x-eval")))
    y = torch.from_numpy(read_rows(str(root / "y-eval")))
    torch.manual_seed(0)
    for skip in (False, True):
        sc = sparsify.SparseCoder(D, sparsify.SparseCoderConfig(
            expansion_factor=4, k=6, transcode=True, skip_connection=skip))
        with torch.no_grad():
            for p in sc.parameters():
                p.add_(0.1 * torch.randn_like(p))
            out = sc(x, y)
            z = torch.zeros(len(x), 64).scatter_(1, out.latent_indices, out.latent_acts)
            y_hat = out.sae_out
            want = (float((y_hat - y).double().pow(2).sum() /
                          (y - y.mean(0)).double().pow(2).sum()),
                    float((z != 0).sum(1).double().mean()))
        sc.save_to_disk(tmp_path / f"tc-{skip}")
        m, cfg = evaluate_sparsify_dir(str(tmp_path / f"tc-{skip}"), x.numpy(), target=y.numpy(),
                                       batch_size=97)
        assert cfg["transcode"] and cfg["skip_connection"] == skip
        assert m["eval_fvu"] == pytest.approx(want[0], rel=1e-5)
        assert m["eval_fvu"] == pytest.approx(float(out.fvu), rel=1e-4)  # sparsify's own fvu
        assert m["eval_l0"] == pytest.approx(want[1])
        with pytest.raises(SystemExit, match="target rows"):
            evaluate_sparsify_dir(str(tmp_path / f"tc-{skip}"), x.numpy())


def test_train_peer_sparsify_transcoders_eval_export_and_table(paired):
    pytest.importorskip("sparsify")
    root = paired["root"]
    res = root / "results"
    for arch in ("transcoder", "skip_transcoder"):
        out = res / f"sparsify-{arch}.json"
        _run(os.path.join(HERE, "train_peer.py"), "--tool", "sparsify", "--arch", arch,
             "--train", str(root / "x"), "--train-target", str(root / "y"),
             "--eval", str(root / "x-eval"), "--eval-target", str(root / "y-eval"),
             "--batch-size", "256", "--expansion", "4", "--k", "6", "--threads", "1",
             "--warmup-steps", "1", "--lr", "1e-2",
             "--export-dir", str(root / f"export-{arch}"),
             "--json", str(out))
        r = json.loads(out.read_text())
        assert r["arch"] == arch and r["tokens"] == 1500 and r["steps"] == 6
        assert r["eval_rows"] == 400 and 0 < r["eval_l0"] <= 6
        assert 0 < r["eval_fvu"] < 1  # it learned something of y from x
        cfg = json.loads((root / f"export-{arch}" / "cfg.json").read_text())
        assert cfg["transcode"] and cfg["skip_connection"] == (arch == "skip_transcoder")
    # eval_export.py reads the same sparsify directory (as it reads saetrain's export)
    summary = root / "summary.csv"
    summary.write_text("sae,arch,n_latents,k,lr,steps,tokens,fvu,l0,tokens_per_s,eval_fvu,"
                       "eval_l0\nt,skip_transcoder,64,6,0.0004,6,1500,0.5,6,3000,0.25,6\n")
    _run(os.path.join(HERE, "eval_export.py"), str(root / "export-skip_transcoder"),
         "--eval", str(root / "x-eval"), "--eval-target", str(root / "y-eval"),
         "--summary", str(summary), "--threads", "1", "--json", str(res / "saetrain-tc.json"))
    r = json.loads((res / "saetrain-tc.json").read_text())
    peer = json.loads((res / "sparsify-skip_transcoder.json").read_text())
    assert r["arch"] == "skip_transcoder" and r["tokens_per_s"] == 3000
    assert r["eval_fvu"] == pytest.approx(peer["eval_fvu"], rel=1e-9)
    table = _run(os.path.join(HERE, "table.py"), str(res), "--reference", "sparsify")
    lines = [ln for ln in table.splitlines() if ln.startswith("| ")]
    assert len(lines) == 1 + 3 and "speed vs sparsify" in lines[0]
    assert any(ln.startswith("| saetrain | skip_transcoder | k=6, x4") for ln in lines)


def test_transcoders_need_targets_and_sparsify(paired, tmp_path):
    root = paired["root"]
    for tool, extra, says in (("sparsify", [], "needs --train-target"),
                              ("saelens", ["--train-target", str(root / "y"), "--eval-target",
                                           str(root / "y-eval")], "--tool sparsify")):
        r = subprocess.run([sys.executable, os.path.join(HERE, "train_peer.py"), "--tool", tool,
                            "--arch", "transcoder", "--train", str(root / "x"), "--eval",
                            str(root / "x-eval"), "--json", str(tmp_path / "x.json"), *extra],
                           capture_output=True, text=True)
        assert r.returncode != 0 and says in r.stderr, r.stderr
