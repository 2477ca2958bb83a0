#!/usr/bin/env python3
"""How much of an SAE's held-out FVU is its decoder's, and how much its encoder's.

For one trained saetrain SAE (final.h5 or a checkpoint, arch relu or topk), keep the encoder as
it is (so every token's active latents and L0 stay the same) and fit, on the training rows, by
least squares:

  scale    one gain per latent on its decoder row: min ||x - b_dec - z diag(s) W_dec||^2
           (what an L1 penalty's shrinkage costs: Wright and Sharkey 2024 fine-tune these gains)
  decoder  the whole decoder: min ||x - b_dec - z D||^2, the best any decoder can do for
           these codes

and report the held-out FVU of each beside the SAE's own (sae_eval.evaluate, the peer
benchmark's evaluator). A gap that the decoder refit closes is the training's; one it leaves is
the encoder's (which latents fire on which tokens). Both fits need z^T z [n, n] in float64:
n_latents up to 16384 (2 GiB).

  .venv/bin/python bench/peers/refit_decoder.py --sae RUN/sae/ID/final.h5 \\
      --train DATA/train --eval DATA/eval/encoder.layer.3
"""
import argparse
import sys
import time

import numpy as np

import sae_eval

MAX_LATENTS = 16384


def load_sae(path):
    import h5py

    try:
        h = h5py.File(path, "r")
    except OSError as e:
        raise SystemExit(f"{path}: cannot open as HDF5 ({e.strerror or e})")
    with h:
        for key in ("W_enc", "b_enc", "W_dec", "b_dec"):
            if key not in h:
                raise SystemExit(f"{path}: no dataset '{key}' (not a saetrain SAE file)")
        arch = h.attrs.get("arch", b"")
        arch = arch.decode() if isinstance(arch, bytes) else str(arch)
        k = int(h.attrs.get("k", 0))
        w = {key: h[key][:].astype(np.float32) for key in ("W_enc", "b_enc", "W_dec", "b_dec")}
    if arch not in ("relu", "topk"):
        raise SystemExit(f"{path}: arch '{arch}': this refit knows relu and topk encoders")
    d, n = w["W_enc"].shape
    if w["W_dec"].shape != (n, d):
        raise SystemExit(f"{path}: W_dec {w['W_dec'].shape}, expected ({n}, {d}): an SAE, "
                         "not a transcoder")
    if n > MAX_LATENTS:
        raise SystemExit(f"{path}: {n} latents: z^T z would need {n * n * 8 / 2**30:.0f} GiB "
                         f"(at most {MAX_LATENTS})")
    return arch, k, w


def codes(x, w, arch, k):
    """The SAE's sparse codes z for rows x, as a scipy CSR matrix (float64)."""
    import scipy.sparse as sp

    pre = (x - w["b_dec"]) @ w["W_enc"] + w["b_enc"]
    if arch == "topk":
        idx = np.argpartition(pre, -k, axis=1)[:, -k:]
        vals = np.maximum(np.take_along_axis(pre, idx, axis=1), 0)
        rows = np.repeat(np.arange(x.shape[0]), k)
        z = sp.csr_matrix((vals.ravel(), (rows, idx.ravel())), shape=pre.shape)
        z.eliminate_zeros()
    else:
        z = sp.csr_matrix(np.maximum(pre, 0))
    return z.astype(np.float64)


def refit(arch, k, w, train, max_rows=0, chunk=32768, log=None):
    """Least-squares fits on the training rows with the encoder held: (rows seen, the whole
    decoder D [n, d], one gain per latent s [n]). See the module docstring."""
    import h5py

    d, n = w["W_enc"].shape
    gram = np.zeros((n, n))
    cross = np.zeros((n, d))
    seen = 0
    t0 = time.time()
    for f, count, dm, _ in sae_eval.shard_info(train):
        if dm != d:
            raise SystemExit(f"{f}: d_model {dm}, the SAE's is {d}")
        with h5py.File(f, "r") as h:
            ds = h["activations"]
            for lo in range(0, count, chunk):
                hi = min(count, lo + chunk)
                if max_rows > 0:
                    hi = min(hi, lo + max_rows - seen)
                if hi <= lo:
                    break
                x = sae_eval._as_float32(ds, lo, hi)
                z = codes(x, w, arch, k)
                gram += (z.T @ z).toarray()
                cross += z.T @ (x - w["b_dec"]).astype(np.float64)
                seen += hi - lo
        if log:
            log(f"  {f}: {seen} training rows, {time.time() - t0:.0f} s")
        if max_rows > 0 and seen >= max_rows:
            break
    if seen == 0:
        raise SystemExit(f"{train}: no training rows")
    # A ridge of 1e-6 of the mean diagonal keeps latents that never fired at zero.
    ridge = 1e-6 * max(np.trace(gram) / n, 1e-30) * np.eye(n)
    D = np.linalg.solve(gram + ridge, cross)
    W = w["W_dec"].astype(np.float64)
    s = np.linalg.solve(gram * (W @ W.T) + ridge, np.einsum("ij,ij->i", cross, W))
    return seen, D, s, np.diag(gram) > 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sae", required=True, help="a saetrain SAE file (final.h5 or checkpoint)")
    ap.add_argument("--train", required=True, help="the training rows (directory, glob, file)")
    ap.add_argument("--eval", required=True, help="held-out rows (directory, glob, file)")
    ap.add_argument("--max-train-rows", type=int, default=0, help="0: all")
    ap.add_argument("--chunk", type=int, default=32768, help="rows per chunk")
    a = ap.parse_args()

    arch, k, w = load_sae(a.sae)
    d, n = w["W_enc"].shape
    rows = sae_eval.read_rows(a.eval)
    kw = {"k": k} if arch == "topk" else {}

    def held_out(W_dec):
        return sae_eval.evaluate(w["W_enc"], w["b_enc"], W_dec, w["b_dec"], arch, rows, **kw)

    base = held_out(w["W_dec"])
    print(f"{a.sae}: {arch}, d {d}, n {n}; held-out {base['eval_rows']} rows: "
          f"fvu {base['eval_fvu']:.4f} at L0 {base['eval_l0']:.1f}", flush=True)
    seen, D, s, fired = refit(arch, k, w, a.train, a.max_train_rows, a.chunk,
                              lambda m: print(m, flush=True))
    W = w["W_dec"].astype(np.float64)
    fits = [("as trained", base),
            ("scale refit", held_out((s[:, None] * W).astype(np.float32))),
            ("decoder refit", held_out(D.astype(np.float32)))]
    print(f"\nfitted on {seen} training rows (median gain {np.median(s[fired]):.3f} over the "
          f"{int(fired.sum())} latents that fired)")
    print(f"{'decoder':<14} {'held-out fvu':>12} {'/ as trained':>13}")
    for name, r in fits:
        print(f"{name:<14} {r['eval_fvu']:>12.4f} {r['eval_fvu'] / base['eval_fvu']:>13.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
