#!/usr/bin/env python3
"""One TopK (and ReLU-L1) SAE training step written in plain PyTorch, timed on a GPU: the
reference saetrain's CUDA step is measured against (bench/bench_step --backend cuda).

Variants, each a full step (forward, backward, gradient clipping, fused Adam, unit-norm decoder
rows), on the same shapes as bench_step:
  topk-dense   encoder GEMM, torch.topk, scatter into a dense [B, n] code, dense decoder GEMM
               (what a first implementation writes)
  topk-sparse  encoder GEMM, torch.topk, decoder as F.embedding_bag over the k picks (the
               sparse decoder EleutherAI's sparsify falls back to without its Triton kernel)
  relu         ReLU SAE with the decoder-norm-weighted L1 penalty, all dense
Precision: fp32 (TF32 off), tf32 (TF32 matmuls), bf16 (autocast; fp32 parameters and Adam).
Times are medians over CUDA events after warm-up; inputs are random, never zeros.

Usage: python3 tools/bench_torch_sae.py [--d-model 768 --latents 24576 --k 32 --batch 4096]
       [--reps 30] [--precisions fp32,tf32,bf16] [--json]
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def make_params(d, n, device):
    w_dec = torch.randn(n, d, device=device)
    w_dec /= w_dec.norm(dim=1, keepdim=True)
    return {
        "w_enc": torch.nn.Parameter(w_dec.clone()),  # [n, d], encoder = decoder^T at init
        "b_enc": torch.nn.Parameter(torch.zeros(n, device=device)),
        "w_dec": torch.nn.Parameter(w_dec),  # [n, d]
        "b_dec": torch.nn.Parameter(torch.zeros(d, device=device)),
    }


def loss_of(variant, p, x, k, l1):
    pre = F.linear(x - p["b_dec"], p["w_enc"], p["b_enc"])  # [B, n]
    if variant == "relu":
        z = F.relu(pre)
        x_hat = z @ p["w_dec"] + p["b_dec"]
        l1_term = (z * p["w_dec"].norm(dim=1)).sum(dim=1).mean()
        return (x_hat - x).pow(2).sum(dim=1).mean() + l1 * l1_term
    vals, idx = pre.topk(k, dim=1, sorted=False)
    vals = F.relu(vals)
    if variant == "topk-dense":
        z = torch.zeros_like(pre).scatter(1, idx, vals)
        x_hat = z @ p["w_dec"] + p["b_dec"]
    else:
        x_hat = F.embedding_bag(idx, p["w_dec"], per_sample_weights=vals.to(p["w_dec"].dtype),
                                mode="sum") + p["b_dec"]
    return (x_hat.float() - x).pow(2).sum(dim=1).mean()


def time_step(variant, precision, d, n, k, batch, reps, device):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.manual_seed(0)
    p = make_params(d, n, device)
    opt = torch.optim.Adam(p.values(), lr=4e-4, fused=True)
    xs = [torch.randn(batch, d, device=device) for _ in range(4)]  # rotate: no cache effects

    def step(x):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = loss_of(variant, p, x, k, 5.0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(p.values(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            p["w_dec"] /= p["w_dec"].norm(dim=1, keepdim=True)
        return loss

    for i in range(5):
        step(xs[i % 4])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(xs[i % 4])
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    torch.cuda.reset_peak_memory_stats()
    step(xs[0])
    torch.cuda.synchronize()
    return statistics.median(times), torch.cuda.max_memory_allocated() / 1e9


def time_gemm(precision, m, n, k, reps, device):
    """Rate of the encoder-shaped GEMM [m, k] x [k, n] in torch at this precision."""
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(n, k, device=device, dtype=dtype)
    for _ in range(3):
        a @ b.T
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        a @ b.T
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    return 2.0 * m * n * k / statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d-model", type=int, default=768)
    ap.add_argument("--latents", type=int, default=24576)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--variants", default="topk-dense,topk-sparse,relu")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_torch_sae: no CUDA device visible to PyTorch")
    dev = torch.device("cuda")
    d, n, k, batch = a.d_model, a.latents, a.k, a.batch
    print(f"bench_torch_sae | {torch.cuda.get_device_name()} | torch {torch.__version__} | "
          f"d_model {d} n_latents {n} k {k} batch {batch} | median of {a.reps}")
    print(f"{'':6}{'variant':<13}{'prec':<6}{'step ms':>10}{'tokens/s':>12}{'GPU GB':>8}"
          f"{'enc GEMM TF/s':>15}")
    rows = []
    for prec in a.precisions.split(","):
        gemm = time_gemm(prec, batch, n, d, a.reps, dev)
        for var in a.variants.split(","):
            try:
                sec, mem = time_step(var, prec, d, n, k, batch, a.reps, dev)
            except Exception as e:  # one variant failing must not hide the others
                print(f"torch {var:<13}{prec:<6} failed: {e}")
                continue
            rows.append({"variant": var, "precision": prec, "step_ms": sec * 1e3,
                         "tokens_per_s": batch / sec, "gpu_mem_GB": mem,
                         "gemm_TFLOPs": gemm / 1e12})
            print(f"torch {var:<13}{prec:<6}{sec * 1e3:>10.3f}{batch / sec:>12.0f}{mem:>8.2f}"
                  f"{gemm / 1e12:>15.1f}", flush=True)
    if a.json:
        print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "shape": {"d_model": d, "n_latents": n, "k": k, "batch": batch},
                          "results": rows}))


if __name__ == "__main__":
    main()
