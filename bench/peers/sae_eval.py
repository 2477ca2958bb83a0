#!/usr/bin/env python3
"""The one evaluator every SAE of the peer benchmark goes through, and the shard reader.

evaluate(W_enc, b_enc, W_dec, b_dec, arch, rows, k=...) computes, on held-out rows, with no
gradient and in batches:

  eval_fvu             sum_t ||x_t - x_hat_t||^2 / sum_t ||x_t - mean||^2, mean over the whole
                       evaluation set (not per batch), sums in float64
  eval_l0              mean number of non-zero latents per token
  eval_dead_fraction   fraction of latents that never fire (never non-zero) on the set
  eval_dense_fraction  fraction of latents non-zero on more than 10% of the tokens

The SAE is given in the SAELens layout: W_enc [d, n], b_enc [n], W_dec [n, d], b_dec [d], with
  pre   = (x - b_dec) W_enc + b_enc      (x W_enc + b_enc when apply_b_dec_to_input is False)
  topk: z = ReLU of the k largest entries of pre, zeros elsewhere
  relu: z = ReLU(pre)
  x_hat = z W_dec + b_dec
which is the forward of saetrain (its sae-export --format saelens writes exactly this),
of SAELens's topk/standard SAEs (after folding rescale_acts_by_decoder_norm, which SAELens
itself does when it saves an inference model) and of sparsify's SparseCoder (ReLU before the
top-k there, the same selection and values: W_enc = encoder.weight^T).

Transcoders (target=y rows, row for row with x; apply_b_dec_to_input=False):
  y_hat = TopK(x W_enc + b_enc) W_dec + b_dec  (+ x W_skip^T with W_skip [d_out, d_in])
and every metric above is taken against y: eval_fvu = sum ||y - y_hat||^2 / sum ||y - mean(y)||^2.
That is saetrain's transcoder and skip_transcoder forward and sparsify's SparseCoder with
transcode=True (no b_dec at the input) and skip_connection. evaluate_sparsify_dir reads either
kind (SAE or transcoder) from a sparsify-format directory (cfg.json + sae.safetensors), as
sparsify's save_to_disk and saetrain's `sae-export --format sparsify` write it.

read_rows(path) reads a dataset the way saetrain does: a directory (every *.h5 in name
order), a glob or one file; 2-D dataset `activations` of float32, float16, or bfloat16 stored
as uint16 with attribute dtype="bfloat16"; returned as one float32 array.
"""
import glob
import math
import os

import numpy as np

DENSE_THRESHOLD = 0.1


def shard_paths(path):
    """The shards of a dataset: a directory (its *.h5, name order), a glob, or one file."""
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.h5")))
    elif any(c in path for c in "*?["):
        files = sorted(glob.glob(path))
    else:
        files = [path] if os.path.exists(path) else []
    files = [f for f in files if os.path.basename(f) != "ground_truth.h5"]
    if not files:
        raise SystemExit(f"{path}: no .h5 shards")
    return files


def _as_float32(ds, lo=0, hi=None):
    """Rows [lo, hi) of an `activations` dataset as float32 (bf16 words widened exactly)."""
    a = ds[lo:hi]
    kind = ds.attrs.get("dtype", b"")
    if isinstance(kind, bytes):
        kind = kind.decode()
    if str(kind) == "bfloat16":
        if a.dtype != np.uint16:
            raise SystemExit(f"{ds.file.filename}: dtype attribute bfloat16 but data is {a.dtype}")
        return (a.astype(np.uint32) << 16).view(np.float32)
    if a.dtype not in (np.float32, np.float16, np.float64):
        raise SystemExit(f"{ds.file.filename}: unsupported activations dtype {a.dtype}")
    return a.astype(np.float32, copy=False)


def shard_info(path, dataset="activations"):
    """[(file, rows, d_model, attrs)] for every shard of the dataset."""
    import h5py

    out = []
    for f in shard_paths(path):
        with h5py.File(f, "r") as h:
            if dataset not in h:
                raise SystemExit(f"{f}: no dataset '{dataset}'")
            ds = h[dataset]
            if ds.ndim != 2:
                raise SystemExit(f"{f}: '{dataset}' is {ds.ndim}-D, not [rows, d_model]")
            out.append((f, ds.shape[0], ds.shape[1], dict(ds.attrs) | dict(h.attrs)))
    dims = {d for _, _, d, _ in out}
    if len(dims) != 1:
        raise SystemExit(f"{path}: shards disagree on d_model: {sorted(dims)}")
    return out


def read_rows(path, max_rows=0, dataset="activations"):
    """All rows of the dataset (the first max_rows when > 0), in order, as float32 [N, d]."""
    import h5py

    info = shard_info(path, dataset)
    total = sum(r for _, r, _, _ in info)
    if max_rows > 0:
        total = min(total, max_rows)
    d = info[0][2]
    out = np.empty((total, d), dtype=np.float32)
    at = 0
    for f, rows, _, _ in info:
        if at >= total:
            break
        take = min(rows, total - at)
        step = 1 << 16
        with h5py.File(f, "r") as h:
            ds = h[dataset]
            for lo in range(0, take, step):
                hi = min(take, lo + step)
                out[at + lo:at + hi] = _as_float32(ds, lo, hi)
        at += take
    return out


def evaluate(W_enc, b_enc, W_dec, b_dec, arch, rows, k=None, apply_b_dec_to_input=True,
             batch_size=4096, device="cpu", dense_threshold=DENSE_THRESHOLD, target=None,
             W_skip=None):
    """Held-out FVU, L0, dead and dense fractions of one SAE (see the module docstring).

    Weights: numpy arrays or torch tensors in the SAELens layout. arch: "topk" (with k) or
    "relu" ("standard" is accepted as SAELens's name for it). rows: [N, d] float32.
    A transcoder: target [N, d_out], the rows to reconstruct (else rows themselves), and
    optionally W_skip [d_out, d] (y_hat += x W_skip^T).
    """
    import torch

    if arch == "standard":
        arch = "relu"
    if arch not in ("topk", "relu"):
        raise ValueError(f"unknown arch {arch!r}: topk or relu")
    if arch == "topk" and not k:
        raise ValueError("topk needs k")

    def t(a):
        a = torch.as_tensor(a) if not isinstance(a, torch.Tensor) else a.detach()
        return a.to(device=device, dtype=torch.float32)

    W_enc, b_enc, W_dec, b_dec = t(W_enc), t(b_enc), t(W_dec), t(b_dec)
    d, n = W_enc.shape
    d_out = W_dec.shape[1] if W_dec.ndim == 2 else -1
    if target is None:
        d_out = d
    if W_dec.shape != (n, d_out) or b_enc.shape != (n,) or b_dec.shape != (d_out,):
        raise ValueError(f"shapes: W_enc {tuple(W_enc.shape)} b_enc {tuple(b_enc.shape)} "
                         f"W_dec {tuple(W_dec.shape)} b_dec {tuple(b_dec.shape)}")
    if W_skip is not None:
        W_skip = t(W_skip)
        if W_skip.shape != (d_out, d):
            raise ValueError(f"W_skip {tuple(W_skip.shape)}: expected [d_out, d_in] = "
                             f"[{d_out}, {d}]")
    rows = torch.as_tensor(rows)
    if rows.ndim != 2 or rows.shape[1] != d:
        raise ValueError(f"eval rows {tuple(rows.shape)} do not match d_in {d}")
    N = rows.shape[0]
    if N == 0:
        raise ValueError("no eval rows")
    if target is not None:
        target = torch.as_tensor(target)
        if tuple(target.shape) != (N, d_out):
            raise ValueError(f"eval target {tuple(target.shape)}: expected [{N}, {d_out}], "
                             "row for row with the input rows")

    sse = 0.0
    sum_x = torch.zeros(d_out, dtype=torch.float64)
    sum_sq = 0.0
    nnz = 0
    fires = torch.zeros(n, dtype=torch.int64)
    with torch.no_grad():
        for lo in range(0, N, batch_size):
            x = rows[lo:lo + batch_size].to(device=device, dtype=torch.float32)
            xin = x - b_dec if apply_b_dec_to_input else x
            pre = torch.addmm(b_enc, xin, W_enc)
            if arch == "topk":
                vals, idx = pre.topk(int(k), dim=1, sorted=False)
                vals = vals.relu()
                z = torch.zeros_like(pre).scatter_(1, idx, vals)
            else:
                z = pre.relu_()
            x_hat = torch.addmm(b_dec, z, W_dec)
            if W_skip is not None:
                x_hat.addmm_(x, W_skip.T)
            if target is not None:  # a transcoder: judged against its target rows
                x = target[lo:lo + batch_size].to(device=device, dtype=torch.float32)
            on = z > 0
            nnz += int(on.sum())
            fires += on.sum(0).cpu()
            sse += float((x_hat - x).double().pow(2).sum())
            xd = x.double()
            sum_x += xd.sum(0).cpu()
            sum_sq += float(xd.pow(2).sum())
    sst = sum_sq - float(sum_x.pow(2).sum()) / N  # sum ||x - mean||^2
    return {
        "eval_rows": int(N),
        "eval_fvu": sse / sst if sst > 0 else math.nan,
        "eval_l0": nnz / N,
        "eval_dead_fraction": float((fires == 0).double().mean()),
        "eval_dense_fraction": float((fires > dense_threshold * N).double().mean()),
    }


def load_saelens_dir(path):
    """(weights dict, cfg dict) of a SAELens-format directory: cfg.json and
    sae_weights.safetensors, weights converted to the plain forward above (a topk SAE saved
    with rescale_acts_by_decoder_norm gets its decoder norms folded in, as SAELens does)."""
    import json

    from safetensors.numpy import load_file

    with open(os.path.join(path, "cfg.json")) as f:
        cfg = json.load(f)
    w = load_file(os.path.join(path, "sae_weights.safetensors"))
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        if name not in w:
            raise SystemExit(f"{path}: sae_weights.safetensors has no {name}")
    w = {name: w[name].astype(np.float32) for name in ("W_enc", "b_enc", "W_dec", "b_dec")}
    norm = cfg.get("normalize_activations", "none")
    if norm not in (None, "none"):
        raise SystemExit(f"{path}: normalize_activations={norm!r} is not supported here")
    arch = cfg.get("architecture", "standard")
    if arch not in ("topk", "standard"):
        raise SystemExit(f"{path}: architecture {arch!r}: this evaluator knows topk and standard")
    if arch == "topk" and cfg.get("rescale_acts_by_decoder_norm", False):
        s = np.maximum(np.linalg.norm(w["W_dec"], axis=1), 1e-8)  # SAELens's _fold_norm_topk
        w["W_enc"] = w["W_enc"] * s[None, :]
        w["b_enc"] = w["b_enc"] * s
        w["W_dec"] = w["W_dec"] / s[:, None]
    return w, cfg


def evaluate_saelens_dir(path, rows, batch_size=4096, device="cpu"):
    w, cfg = load_saelens_dir(path)
    arch = "topk" if cfg.get("architecture") == "topk" else "relu"
    return evaluate(w["W_enc"], w["b_enc"], w["W_dec"], w["b_dec"], arch, rows,
                    k=cfg.get("k"), apply_b_dec_to_input=cfg.get("apply_b_dec_to_input", True),
                    batch_size=batch_size, device=device), cfg


def load_sparsify_dir(path):
    """(weights dict in the layout evaluate() takes, cfg dict) of a sparsify-format directory:
    cfg.json and sae.safetensors with encoder.weight [n, d], encoder.bias [n], W_dec [n, d_out],
    b_dec [d_out] and, with skip_connection, W_skip [d_out, d]. sparsify's SparseCoder.forward
    (sparse_coder.py, 1.3.3): x - b_dec into the encoder unless transcode, ReLU then top-k,
    embedding-bag decoder + b_dec, + x W_skip^T."""
    import json

    from safetensors.numpy import load_file

    with open(os.path.join(path, "cfg.json")) as f:
        cfg = json.load(f)
    w = load_file(os.path.join(path, "sae.safetensors"))
    names = ["encoder.weight", "encoder.bias", "W_dec", "b_dec"]
    if cfg.get("skip_connection"):
        names.append("W_skip")
    for name in names:
        if name not in w:
            raise SystemExit(f"{path}: sae.safetensors has no {name} (cfg.json: "
                             f"skip_connection={cfg.get('skip_connection')})")
    if cfg.get("activation", "topk") != "topk":
        raise SystemExit(f"{path}: activation {cfg.get('activation')!r}: this evaluator knows "
                         "topk")
    if cfg.get("multi_topk"):
        raise SystemExit(f"{path}: multi_topk is a training loss; its inference is plain top-k, "
                         "but this evaluator does not expect it")
    out = {"W_enc": np.ascontiguousarray(w["encoder.weight"].astype(np.float32).T),
           "b_enc": w["encoder.bias"].astype(np.float32),
           "W_dec": w["W_dec"].astype(np.float32), "b_dec": w["b_dec"].astype(np.float32),
           "W_skip": w["W_skip"].astype(np.float32) if "W_skip" in names else None}
    return out, cfg


def evaluate_sparsify_dir(path, rows, target=None, batch_size=4096, device="cpu"):
    """evaluate() on a sparsify-format directory; target: the y rows a transcoder
    (cfg transcode: true) is judged against (required for one, refused for an SAE)."""
    w, cfg = load_sparsify_dir(path)
    transcode = bool(cfg.get("transcode", False))
    if transcode and target is None:
        raise SystemExit(f"{path} is a transcoder (transcode: true): give its target rows")
    if not transcode and target is not None:
        raise SystemExit(f"{path} is an autoencoder (transcode: false), but target rows were "
                         "given")
    if not transcode and w["W_skip"] is not None:
        raise SystemExit(f"{path}: a skip connection on an autoencoder is not supported here")
    return evaluate(w["W_enc"], w["b_enc"], w["W_dec"], w["b_dec"], "topk", rows,
                    k=cfg.get("k"), apply_b_dec_to_input=not transcode, batch_size=batch_size,
                    device=device, target=target, W_skip=w["W_skip"]), cfg
