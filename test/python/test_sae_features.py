"""sae-features: every figure of features.h5 against a brute-force numpy reference.

The SAEs' weights are replaced (h5py) by dyadic values (x in halves, W_enc in eighths, b_enc a
distinct multiple of 2^-10 per latent) so that every pre-activation is exact in float32 in any
summation order: saetrain's BLAS and numpy's float64 agree bit for bit, no two latents of a row
tie, and the reference's top rows, counts and histograms must be equal, not close.

- a TopK SAE (sparse activations) and a ReLU SAE (dense) trained in one sweep, then read on 1,
  2 and 3 ranks: frequency, fire counts, mean and max activation, histogram, top rows and
  activations (ties: the lower row first), a uniform sample of each latent's firings (the rows
  of smallest hash key), token windows bounded by their contexts (contexts cross shard and
  rank boundaries) and the latent's activations on them, decoder neighbours; the ranks' files
  equal;
- shards without token_ids: every statistic and top row, no windows, the reason in the file;
- the logit tables: with an unembedding.h5 beside the data (found) or given, each latent's
  promoted and suppressed tokens against numpy's (dyadic W_dec and W_U: exact, ties to the lower
  token id) on 1 and 3 ranks; without one, none and why; a W_U of the wrong width is one line;
- refusals: an SAE whose d_model differs from the data's, an SAE outside a run without --out.

    SAETRAIN_BIN_DIR=build/cpu/apps .venv/bin/python -m pytest test/python/test_sae_features.py
"""
import os
import shutil
import subprocess

import numpy as np
import pytest

from strict import need_module, skip_module  # noqa: E402

need_module("h5py")
import h5py  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BIN = os.path.abspath(os.environ.get("SAETRAIN_BIN_DIR", "")) if os.environ.get("SAETRAIN_BIN_DIR") else ""
if not (BIN and os.path.exists(os.path.join(BIN, "sae-features"))):
    skip_module("SAETRAIN_BIN_DIR does not hold the built saetrain apps")

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
D, EXPANSION, K, TOP, CONTEXT, NEIGHBOURS, SAMPLES = 16, 4, 4, 7, 3, 5, 6
N = D * EXPANSION
SHARD_ROWS = (700, 500, 800)


def _run(cmd, ok=True, cwd=None):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV,
                       timeout=300, cwd=cwd)
    if ok:
        assert r.returncode == 0, " ".join(map(str, cmd)) + "\n" + r.stdout + r.stderr
    return r


def _mpirun(n, *cmd):
    return ["mpirun", "--oversubscribe", "-np", str(n), *cmd]


def write_data(out, rng, token_ids=True, d=D):
    """Shards of dyadic rows; contexts of random lengths run across the shards."""
    total = sum(SHARD_ROWS)
    x = rng.integers(-4, 5, size=(total, d)).astype(np.float32) / 2
    lengths = rng.integers(5, 40, size=total)
    positions = np.concatenate([np.arange(n) for n in lengths])[:total].astype(np.int16)
    tokens = rng.integers(0, 1000, size=total).astype(np.int32)
    os.makedirs(out, exist_ok=True)
    first = 0
    for i, rows in enumerate(SHARD_ROWS):
        with h5py.File(os.path.join(out, f"shard_{i:05d}.h5"), "w") as f:
            f.create_dataset("activations", data=x[first:first + rows])
            if token_ids:
                f.create_dataset("token_ids", data=tokens[first:first + rows])
                f.create_dataset("positions", data=positions[first:first + rows])
        first += rows
    return x, tokens, positions


def set_weights(path, rng):
    """Dyadic W_enc, b_enc (distinct per latent), b_dec 0; random W_dec. Returns them."""
    w = {"W_enc": rng.integers(-4, 5, size=(D, N)).astype(np.float32) / 8,
         "b_enc": (-0.5 + np.arange(N) / 1024).astype(np.float32),
         "b_dec": np.zeros(D, np.float32),
         "W_dec": rng.standard_normal((N, D)).astype(np.float32)}
    with h5py.File(path, "r+") as f:
        for k, v in w.items():
            assert f[k].shape == v.shape, (k, f[k].shape)
            f[k][...] = v
    return w


def sample_key(latent, rows):
    """feature_sample_key (src/core/features.cpp): splitmix64's finalizer of the pair."""
    m = np.uint64(0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = (rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
             + np.uint64(latent) * np.uint64(0xD1B54A32D192ED03) + np.uint64(0x9E3779B97F4A7C15)) & m
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & m
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & m
    return z ^ (z >> np.uint64(31))


def windows_of(z, tokens, positions, rows_of, n_rows):
    """Each kept row's window: the latent's activations (0 outside the data) and, with token
    ids, the tokens of its context (-1 elsewhere)."""
    ctx = (np.concatenate([[0], np.cumsum(positions[1:] <= positions[:-1])])
           if tokens is not None else None)
    acts = np.zeros(rows_of.shape + (2 * CONTEXT + 1,), np.float32)
    toks = np.full(rows_of.shape + (2 * CONTEXT + 1,), -1, np.int32)
    for i in range(rows_of.shape[0]):
        for j, r in enumerate(rows_of[i]):
            if r < 0:
                continue
            for o in range(-CONTEXT, CONTEXT + 1):
                q = r + o
                if 0 <= q < n_rows:
                    acts[i, j, o + CONTEXT] = z[q, i]
                    if ctx is not None and ctx[q] == ctx[r]:
                        toks[i, j, o + CONTEXT] = tokens[q]
    return acts, toks


def reference(x, w, arch, tokens, positions, edges):
    pre = (x.astype(np.float64) - w["b_dec"]) @ w["W_enc"].astype(np.float64) + w["b_enc"]
    assert np.array_equal(pre.astype(np.float32).astype(np.float64), pre), "not exact"
    if arch == "topk":
        z = np.zeros_like(pre)
        keep = np.argsort(-pre, axis=1, kind="stable")[:, :K]
        rows = np.arange(len(x))[:, None]
        z[rows, keep] = np.maximum(pre[rows, keep], 0)
    else:
        z = np.maximum(pre, 0)
    z = z.astype(np.float32)
    fired = z != 0
    ref = {"fire_count": fired.sum(0), "max_act": np.where(fired, z, -np.inf).max(0)}
    ref["max_act"] = np.where(ref["fire_count"] > 0, ref["max_act"], 0).astype(np.float32)
    ref["frequency"] = ref["fire_count"] / len(x)
    sums = np.where(fired, z.astype(np.float64), 0).sum(0)
    ref["mean_act"] = np.where(ref["fire_count"] > 0, sums / np.maximum(ref["fire_count"], 1), 0)
    hist = np.zeros((N, len(edges) - 1), np.int64)
    for i in range(N):
        v = z[fired[:, i], i]
        b = np.clip(np.searchsorted(edges, v, side="right") - 1, 0, len(edges) - 2)
        np.add.at(hist[i], b, 1)
    ref["hist"] = hist
    top_rows = np.full((N, TOP), -1, np.int64)
    top_acts = np.zeros((N, TOP), np.float32)
    for i in range(N):
        r = np.nonzero(fired[:, i])[0]
        order = np.lexsort((r, -z[r, i]))[:TOP]
        top_rows[i, :len(order)] = r[order]
        top_acts[i, :len(order)] = z[r[order], i]
    ref["top_rows"], ref["top_acts"] = top_rows, top_acts
    # The uniform sample: the SAMPLES firings of smallest key, then by decreasing activation.
    s_rows = np.full((N, SAMPLES), -1, np.int64)
    s_acts = np.zeros((N, SAMPLES), np.float32)
    for i in range(N):
        r = np.nonzero(fired[:, i])[0]
        r = r[np.lexsort((r, sample_key(i, r)))[:SAMPLES]]
        r = r[np.lexsort((r, -z[r, i]))]
        s_rows[i, :len(r)], s_acts[i, :len(r)] = r, z[r, i]
    ref["sample_rows"], ref["sample_acts"] = s_rows, s_acts
    ref["top_context_acts"], toks = windows_of(z, tokens, positions, top_rows, len(x))
    ref["sample_context_acts"], s_toks = windows_of(z, tokens, positions, s_rows, len(x))
    if tokens is not None:
        ref["top_context_tokens"], ref["sample_context_tokens"] = toks, s_toks
    u = w["W_dec"].astype(np.float64)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    cos = u @ u.T
    np.fill_diagonal(cos, -np.inf)
    ref["neighbours"] = np.argsort(-cos, axis=1, kind="stable")[:, :NEIGHBOURS]
    ref["neighbour_cosine"] = np.take_along_axis(cos, ref["neighbours"], 1)
    return ref


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A TopK and a ReLU SAE of one sweep, their weights replaced by dyadic ones."""
    tmp = tmp_path_factory.mktemp("features")
    rng = np.random.default_rng(7)
    data = tmp / "data"
    x, tokens, positions = write_data(str(data), rng)
    run = tmp / "run"
    _run(_mpirun(2, os.path.join(BIN, "saetrain"), os.path.join(ROOT, "configs/quickstart.yaml"),
                 "--overwrite", "--set", f"run.out_dir={run}", "--set", f"data.path={data}",
                 "--set", "sae.arch=[topk, relu]", "--set", f"sae.expansion={EXPANSION}",
                 "--set", f"sae.k={K}", "--set", "data.epochs=1", "--set", "data.batch_size=250",
                 "--set", "data.shuffle_buffer_rows=0", "--set", "checkpoint.every_steps=1000"),
         cwd=str(tmp))
    saes = {}
    for arch in ("topk", "relu"):
        (sae_dir,) = [p for p in (run / "sae").iterdir() if p.name.startswith(arch + "-")]
        saes[arch] = (sae_dir, set_weights(str(sae_dir / "final.h5"), rng))
    return tmp, data, x, tokens, positions, saes


def read(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][()] for k in f}, dict(f.attrs)


@pytest.mark.parametrize("arch", ["topk", "relu"])
def test_features_equal_the_numpy_reference_on_1_2_and_3_ranks(trained, arch):
    tmp, data, x, tokens, positions, saes = trained
    sae_dir, w = saes[arch]
    outs = []
    for ranks in (1, 2, 3):
        out = tmp / f"features-{arch}-{ranks}"
        r = _run(_mpirun(ranks, os.path.join(BIN, "sae-features"), sae_dir, "--out", out,
                         "--top", TOP, "--context", CONTEXT, "--neighbours", NEIGHBOURS,
                         "--samples", SAMPLES))
        assert f"wrote {out}/features.h5" in r.stdout, r.stdout
        outs.append(read(out / "features.h5"))
    got, attrs = outs[0]
    assert attrs["format"] == "saetrain-features 1" and attrs["contexts"] == "token_ids"
    assert attrs["rows"] == len(x) and attrs["n_latents"] == N and attrs["top"] == TOP
    edges = got["hist_edges"]
    assert np.allclose(edges, 10.0 ** (np.arange(81) / 10 - 4), rtol=1e-6)
    ref = reference(x, w, arch, tokens, positions, edges)
    for key in ("fire_count", "max_act", "hist", "top_rows", "top_acts", "top_context_tokens",
                "top_context_acts", "sample_rows", "sample_acts", "sample_context_tokens",
                "sample_context_acts"):
        assert np.array_equal(got[key], ref[key]), key
    # The sample reaches below the top rows: latents that fired on more rows than it keeps
    # have sampled rows that are not among their top ones.
    assert any(set(got["sample_rows"][i]) - set(got["top_rows"][i])
               for i in range(N) if ref["fire_count"][i] > TOP + SAMPLES)
    assert np.array_equal(got["top_context_acts"][:, :, CONTEXT], got["top_acts"])
    assert np.allclose(got["frequency"], ref["frequency"], rtol=0, atol=1e-15)
    assert np.allclose(got["mean_act"], ref["mean_act"], rtol=1e-6)
    assert got["hist"].sum(1).tolist() == ref["fire_count"].tolist()
    # Neighbours: float32 against float64 cosines, so the order only where it is clear.
    assert np.allclose(got["neighbour_cosine"], ref["neighbour_cosine"], atol=1e-5)
    gaps = np.diff(-np.sort(-ref["neighbour_cosine"], axis=1), axis=1)
    clear = np.all(np.abs(gaps) > 1e-5, axis=1)
    assert clear.sum() > N // 2
    assert np.array_equal(got["neighbours"][clear], ref["neighbours"][clear])
    # The sweep's latents did fire and some rows' windows were cut by their context.
    assert (ref["fire_count"] > 0).sum() > N // 2
    assert ((ref["top_context_tokens"] == -1) & (ref["top_rows"][..., None] >= 0)).any()
    for other, other_attrs in outs[1:]:
        assert other_attrs["ranks"] in (2, 3)
        for key in got:
            assert np.array_equal(other[key], got[key]), key


def test_any_rank_count_writes_the_same_bits_on_rows_that_round(trained):
    """Rows of real-valued activations (not exact in float32): each row is encoded at the same
    place of a batch of the same shape on any number of ranks, so the files are bitwise equal
    even where the ranks' ranges cut batches (--batch-rows 96 against ranges of 667 rows)."""
    tmp = trained[0]
    data, wide = tmp / "real", 384  # OpenBLAS's kernels round by a row's place at this width
    rng = np.random.default_rng(3)
    data.mkdir()
    for i, rows in enumerate(SHARD_ROWS):
        with h5py.File(data / f"shard_{i:05d}.h5", "w") as f:
            f.create_dataset("activations", data=rng.standard_normal((rows, wide), np.float32))
    run = tmp / "run-real"
    _run([os.path.join(BIN, "saetrain"), os.path.join(ROOT, "configs/quickstart.yaml"),
          "--overwrite", "--set", f"run.out_dir={run}", "--set", f"data.path={data}", "--set",
          "sae.expansion=16", "--set", "sae.k=32", "--set", "data.epochs=1", "--set",
          "data.batch_size=500", "--set", "checkpoint.every_steps=1000"], cwd=str(tmp))
    (sae_dir,) = list((run / "sae").iterdir())
    files = []
    for ranks in (1, 3):
        out = tmp / f"features-real-{ranks}"
        _run(_mpirun(ranks, os.path.join(BIN, "sae-features"), sae_dir, "--data", data, "--out",
                     out, "--batch-rows", 96))
        files.append(read(out / "features.h5")[0])
    assert files[0].keys() == files[1].keys()
    for key in files[0]:
        assert np.array_equal(files[0][key], files[1][key]), key


def test_shards_without_token_ids_get_every_statistic_and_no_windows(trained):
    tmp, _, _, _, _, saes = trained
    sae_dir, w = saes["topk"]
    data = tmp / "no-tokens"
    x, _, _ = write_data(str(data), np.random.default_rng(7), token_ids=False)
    out = tmp / "features-no-tokens"
    r = _run(_mpirun(2, os.path.join(BIN, "sae-features"), sae_dir, "--data", data, "--out", out,
                     "--top", TOP, "--context", CONTEXT, "--neighbours", NEIGHBOURS,
                         "--samples", SAMPLES))
    assert "has no 'token_ids' dataset" in r.stdout
    got, attrs = read(out / "features.h5")
    assert "top_context_tokens" not in got
    assert attrs["contexts"].startswith("none: ") and "token_ids" in attrs["contexts"]
    ref = reference(x, w, "topk", None, None, got["hist_edges"])
    for key in ("fire_count", "max_act", "hist", "top_rows", "top_acts", "top_context_acts",
                "sample_rows", "sample_acts", "sample_context_acts"):
        assert np.array_equal(got[key], ref[key]), key
    assert "sample_context_tokens" not in got


def test_refusals_are_one_line(trained):
    tmp, _, _, _, _, saes = trained
    sae_dir, _ = saes["topk"]
    narrow = tmp / "narrow"
    write_data(str(narrow), np.random.default_rng(1), d=8)
    r = _run(_mpirun(2, os.path.join(BIN, "sae-features"), sae_dir, "--data", narrow, "--out",
                     tmp / "x"), ok=False)
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("sae-features: error:")]
    assert len(lines) == 1 and "d_model 16" in lines[0] and "rows of 8 values" in lines[0], r.stderr
    r = _run([os.path.join(BIN, "sae-features"), sae_dir, "--out", tmp / "x", "--context", 40,
              "--batch-rows", 32], ok=False)
    assert r.returncode == 1 and "--context 40 is more than --batch-rows 32" in r.stderr, r.stderr
    loose = tmp / "loose.h5"
    shutil.copy(sae_dir / "final.h5", loose)
    r = _run([os.path.join(BIN, "sae-features"), loose], ok=False)
    assert r.returncode == 1 and "give --out DIR" in r.stderr, r.stderr
    assert not (tmp / "x").exists()


def test_logit_tables_equal_the_numpy_reference(trained):
    """W_dec and W_U in quarters: every dot product is exact in float32, so the tables must be
    equal, ties (many among 1,000 tokens) broken to the lower token id as a stable sort does."""
    tmp, data, _, _, _, saes = trained
    sae_dir, _ = saes["topk"]
    rng = np.random.default_rng(5)
    sae = tmp / "logits-sae.h5"
    shutil.copy(sae_dir / "final.h5", sae)
    w_dec = rng.integers(-4, 5, size=(N, D)).astype(np.float32) / 4
    with h5py.File(sae, "r+") as f:
        f["W_dec"][...] = w_dec
    vocab, T = 1000, 9
    w_u = rng.integers(-8, 9, size=(vocab, D)).astype(np.float32) / 4
    logits = w_dec.astype(np.float64) @ w_u.T.astype(np.float64)
    pos = np.argsort(-logits, axis=1, kind="stable")[:, :T]
    neg = np.argsort(logits, axis=1, kind="stable")[:, :T]
    assert (np.diff(np.sort(logits, axis=1), axis=1) == 0).any()  # ties to break
    # As tools/extract_activations.py lays them out: DIR/unembedding.h5 beside DIR/<hook>/.
    beside = tmp / "logits-data"
    shutil.copytree(data, beside / "hook")
    with h5py.File(beside / "unembedding.h5", "w") as f:
        f.create_dataset("W_U", data=w_u)
    outs = []
    for ranks, extra in ((1, []), (3, ["--unembedding", beside / "unembedding.h5",
                                       "--data", data])):
        out = tmp / f"features-logits-{ranks}"
        args = extra or ["--data", beside / "hook"]
        r = _run(_mpirun(ranks, os.path.join(BIN, "sae-features"), sae, *args, "--out", out,
                         "--logits", T))
        assert "logit tables from" in r.stdout, r.stdout
        got, attrs = read(out / "features.h5")
        assert attrs["logits"] == str((beside / "unembedding.h5").resolve()), attrs["logits"]
        assert np.array_equal(got["logit_pos_ids"], pos)
        assert np.array_equal(got["logit_neg_ids"], neg)
        assert np.array_equal(got["logit_pos_values"], np.take_along_axis(logits, pos, 1))
        assert np.array_equal(got["logit_neg_values"], np.take_along_axis(logits, neg, 1))
        outs.append(got)
    for key in outs[0]:
        assert np.array_equal(outs[0][key], outs[1][key]), key
    # Nothing beside the data: no tables, and the file says why.
    out = tmp / "features-no-logits"
    r = _run([os.path.join(BIN, "sae-features"), sae, "--data", data, "--out", out])
    got, attrs = read(out / "features.h5")
    assert "logit_pos_ids" not in got
    assert attrs["logits"].startswith("none: no unembedding.h5 beside the data"), attrs["logits"]
    # A W_U of another width: one line naming the file, nothing written.
    bad = tmp / "bad-unembedding.h5"
    with h5py.File(bad, "w") as f:
        f.create_dataset("W_U", data=np.zeros((vocab, D + 1), np.float32))
    r = _run(_mpirun(2, os.path.join(BIN, "sae-features"), sae, "--data", data, "--out",
                     tmp / "y", "--unembedding", bad), ok=False)
    assert r.returncode == 1
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("sae-features: error:")]
    assert len(lines) == 1 and f"{bad}: W_U is [1000, 17]; expected [vocab, 16]" in lines[0], \
        r.stderr
    assert not (tmp / "y").exists()
