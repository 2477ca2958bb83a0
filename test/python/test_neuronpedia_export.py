"""tools/neuronpedia_export.py: features.h5 as Neuronpedia's batch files, read back with
SAEDashboard's own classes (sae_dashboard.neuronpedia.neuronpedia_dashboard).

- every batch file builds a NeuronpediaDashboardBatch (whose constructor takes no key it does
  not know) and its to_dict() gives the file back, so the layout is SAEDashboard's exactly;
- every latent's fields hold features.h5's figures: frequency, histogram counts, neighbours,
  the logit tables (pos_str / neg_str as text), each top row's window, and the sampled
  firings as interval groups as the vocabulary's text with the latent's activations;
- refusals in one line: shards without token ids, no vocabulary, an --out already used.

    SAETRAIN_BIN_DIR=build/cpu/apps .venv/bin/python -m pytest test/python/test_neuronpedia_export.py
"""
import json
import os
import subprocess
import sys

import numpy as np

from strict import need_module  # noqa: E402

need_module("h5py")
need_module("sae_dashboard")
import h5py  # noqa: E402
from sae_dashboard.neuronpedia.neuronpedia_dashboard import NeuronpediaDashboardBatch  # noqa

from test_features_page import make_run  # noqa: E402
from test_sae_features import ROOT  # noqa: E402

TOOL = os.path.join(ROOT, "tools", "neuronpedia_export.py")


def export(*args):
    return subprocess.run([sys.executable, TOOL, *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_batches_load_with_saedashboard_and_hold_the_features(tmp_path):
    run, sae = make_run(tmp_path, token_ids=True)
    path = run / "features" / sae / "features.h5"
    out = tmp_path / "np"
    r = export(path, "--out", out, "--model-id", "tiny", "--layer", 3, "--sae-set", "test",
               "--features-per-batch", 20)
    assert r.returncode == 0, r.stderr
    with h5py.File(path) as f:
        h = {k: f[k][()] for k in f}
        rows = int(f.attrs["rows"])
    vocab = json.loads((tmp_path / "data" / "vocab.json").read_text())
    n = len(h["frequency"])
    names = sorted(os.listdir(out), key=lambda s: int(s.split("-")[1].split(".")[0]))
    assert names == [f"batch-{b}.json" for b in range(-(-n // 20))]
    seen = []
    for name in names:
        d = json.loads((out / name).read_text())
        batch = NeuronpediaDashboardBatch(**d)
        assert batch.to_dict() == d, name
        assert (d["model_id"], d["layer"], d["sae_set"]) == ("tiny", 3, "test")
        for feat in d["features"]:
            i = feat["feature_index"]
            seen.append(i)
            assert feat["frac_nonzero"] == h["frequency"][i]
            assert sum(feat["freq_hist_data_bar_heights"]) == h["fire_count"][i]
            assert feat["correlated_features_indices"] == h["neighbours"][i].tolist()
            assert feat["n_prompts_total"] == rows and feat["n_tokens_in_prompt"] == 7
            k = int((h["top_rows"][i] >= 0).sum())
            top = [x for x in feat["activations"] if x["bin_min"] == -1]
            assert len(top) == k and feat["activations"][:k] == top
            # The sample as interval groups: every sampled firing once, in the tenth of
            # [0, max] its activation falls in, highest first; the shares sum to 1.
            groups = feat["activations"][k:]
            sampled = h["sample_acts"][i][h["sample_rows"][i] >= 0]
            assert len(groups) == len(sampled)
            mx = float(h["max_act"][i])
            assert sorted(g["values"][g["qualifying_token_index"]] for g in groups) == \
                sorted(round(float(v), 3) for v in sampled)
            for g in groups:
                v = g["values"][g["qualifying_token_index"]]
                assert g["bin_min"] - 1e-3 <= v <= g["bin_max"] + 1e-3
                assert np.isclose(g["bin_max"] - g["bin_min"], mx / 10, atol=2e-3)
            assert [g["bin_min"] for g in groups] == sorted((g["bin_min"] for g in groups),
                                                            reverse=True)
            shares = {g["bin_min"]: g["bin_contains"] for g in groups}
            if groups and min(shares) == 0:
                assert np.isclose(sum(shares.values()), 1, atol=1e-5)
            for j, act in enumerate(top):
                toks = h["top_context_tokens"][i, j]
                keep = toks >= 0
                assert act["tokens"] == [vocab[t] for t in toks[keep]]
                assert np.allclose(act["values"], h["top_context_acts"][i, j][keep], atol=1e-3)
                assert act["bin_min"] == -1 and act["bin_contains"] == -1
                q = act["qualifying_token_index"]
                assert act["values"][q] == round(float(h["top_acts"][i, j]), 3)
            # The logit tables (an unembedding.h5 beside the shards), as the vocabulary's text.
            assert feat["pos_str"] == [vocab[t] for t in h["logit_pos_ids"][i]]
            assert feat["neg_str"] == [vocab[t] for t in h["logit_neg_ids"][i]]
            assert np.allclose(feat["pos_values"], h["logit_pos_values"][i], atol=1e-3)
            assert np.allclose(feat["neg_values"], h["logit_neg_values"][i], atol=1e-3)
            assert feat["pos_values"][0] > 0 > feat["neg_values"][0]
    assert seen == list(range(n))
    # An --out used already is refused, not mixed with another export.
    r = export(path, "--out", out)
    assert r.returncode == 1 and "holds batch files already" in r.stderr


def test_refusals_are_one_line(tmp_path):
    run, sae = make_run(tmp_path, token_ids=False)
    path = run / "features" / sae / "features.h5"
    r = export(path, "--out", tmp_path / "np")
    assert r.returncode == 1 and "no token windows" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "np").exists()
    r = export(run / "config.yaml", "--out", tmp_path / "np")
    assert r.returncode == 1 and "not readable HDF5" in r.stderr
