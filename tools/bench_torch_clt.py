#!/usr/bin/env python3
"""One cross-layer transcoder (CLT) training step written in plain PyTorch, timed: the reference
saetrain's CLT step (`sae.arch: clt`) is measured against, as tools/bench_torch_sae.py is for
the single-layer SAE step.

The model (docs/architectures.md, "Cross-layer transcoders"): L layers of d values each, F
features a layer. A batch is B tokens of inputs x [B, L, d] (each layer's MLP input) and targets
y [B, L, d] (each layer's MLP output). The parameters are in circuit-tracer's compact per-layer
form:
  w_enc      [L, F, d]            w_enc[l] reads x_l
  b_enc      [L, F]
  w_dec[l]   [F, L - l, d]        feature f of layer l writes w_dec[l][f, m - l] to layer m >= l
  b_dec      [L, d]
  log_threshold [L, F]            JumpReLU only
  pre_l = x_l w_enc[l]^T + b_enc[l];  a = act(pre) over all L F features of a token;
  y_hat_m = sum_{l <= m} a_l w_dec[l][:, m - l] + b_dec[m];
  loss = mean over the batch of sum over the L d outputs of (y_hat - y)^2  (saetrain's CLT loss)
Parameter count: L F d + L (L + 1) / 2 F d + L F + L d (+ L F thresholds for JumpReLU).

Activations (--activation):
  topk        the k L largest pre-activations of a token over all L F features, ReLU'd
              (saetrain's CLT TopK: sae.k = k per token and layer on average)
  topk-layer  the k largest of each layer, per token
  batchtopk   the k L B largest over the whole batch, ReLU'd
  jumprelu    z = pre H(pre - theta), theta = exp(log_threshold) per feature, plus the penalty
              l0_coeff * (features firing a token, batch mean). The step has no derivative:
              theta trains through the straight-through pseudo-derivatives with the rectangle
              kernel K of width eps = --bandwidth (0.001, the JumpReLU SAE papers'),
              dz/dtheta = -(theta / eps) K((pre - theta) / eps), dH/dtheta = -(1 / eps) K(...),
              as saetrain's include/saetrain/sae_math.h; dz/dpre = H(pre - theta). Thresholds
              start where k of F features fire for unit-variance pre-activations (the inputs
              are N(0, 1) and encoder rows unit norm). Dense decoding only.
Variants (--variants), each a full step: forward, backward, gradient-norm clipping at 1.0 over
all parameters, torch.optim.Adam (fused where this torch has it for the device, foreach
otherwise; the header says which), then every feature's decoder row w_dec[l][f] renormalized to
unit norm over all the layers it writes to.
  dense   scatter the selection into a dense code [B, L, F]; per source layer l one matmul of
          a_l [B, F] with w_dec[l] viewed [F, (L - l) d]  (what a first implementation writes)
  sparse  per source layer, F.embedding_bag over that layer's selected features of w_dec[l]
          viewed [F, (L - l) d] with the values as per_sample_weights: only active rows are
          read, like sparsify's fallback decoder. The selections are ordered by (layer, token)
          so each layer's are one contiguous block; the block sizes cost one host sync a step
          (on CUDA), which saetrain's kernels do not pay.
The encoder is the same dense batched GEMM in both variants.

Output: one header line (device or CPU model, torch version, threads, Adam kind, shape), then per
(activation, variant) the median step time over --reps after --warmup (time.perf_counter;
torch.cuda.synchronize around every step on CUDA), tokens/s = batch / median step, peak memory
and the parameter count. Peak memory on CUDA is torch.cuda.max_memory_allocated (this step's
tensors, the parameters, Adam's moments and the inputs); on the CPU it is the whole process's
peak RSS (resource.getrusage: the interpreter and torch included), reset before each row through
/proc/self/clear_refs where Linux allows it, else the peak so far (the column says which).
--json prints one JSON object a line instead: the header, then one per row. Inputs are random
normal (never zeros), seeded; two batches alternate.

Against saetrain: compare tokens/s with saetrain's `tok/s` for `sae.arch: clt` at the same L,
d, F (`sae.expansion` = F / d), k (`sae.k`), batch (`data.batch_size`) and
`sae.transcoder_activation`, on the same device and threads. The two do not hold the same tensors,
and the comparison's notes must say so: saetrain's CLT holds this script's compact encoder
(W_enc [L F, d], one GEMM a layer) but its decoder is still the block upper-triangular
W_dec [L F, L d] of a transcoder of L d values in and out, the blocks to earlier layers held at
zero (their gradient zeroed every step): it and its Adam moments hold (L - 1) / 2L zeros, and its
sparse decoder kernels read whole L d rows, zeros included, where this script's sparse variant
reads only the (L - l) d values a layer-l feature writes (and on a GPU its sparse backward
writes the encoder's gradient through a transient dense [L F, L d] buffer).
topk-layer is saetrain's `sae.k_scope: layer`.

--check (3 layers, d 8, F 16, k 2, 6 tokens, float64; the variants on --device, the reference
on the CPU; a few seconds) verifies that dense and sparse give the same loss and gradients for
topk, topk-layer and batchtopk; that every (activation, variant)'s loss and its gradients of
w_enc, b_enc, w_dec and b_dec equal those of a plain-loop computation (every pre-activation a
dot product, the selection by sorting Python lists, y_hat per token, target layer, source layer
and active feature, differentiated by autograd through the loops); that JumpReLU's threshold
gradient equals the pseudo-derivatives written out by loops (with a kernel width of 0.5 there,
so that some pre-activations fall in the window); and that a full step of each runs and leaves
unit decoder rows. b_enc is set about -1 for the selections so that some picks are negative and
the ReLU matters. A mismatch is one line `bench_torch_clt: error: ...` and exit status 1.

bf16 (CUDA only): autocast around the forward; parameters, Adam and the loss stay fp32. The
sparse variant's embedding_bag is not autocast, so it gathers fp32 rows with the bf16 values
cast up; JumpReLU compares bf16 pre-activations with fp32 thresholds.

Usage:
  python3 tools/bench_torch_clt.py --check [--device cuda]
  python3 tools/bench_torch_clt.py --device cpu --threads 2 --layers 6 --d-model 384 \\
      --features 3072 --k 16 --batch 4096 --activation topk,batchtopk --variants dense,sparse
  python3 tools/bench_torch_clt.py --device cuda --dtype bf16 --activation topk,jumprelu --json
"""
import argparse
import json
import math
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

PROG = "bench_torch_clt"
ACTIVATIONS = ("topk", "topk-layer", "batchtopk", "jumprelu")
VARIANTS = ("dense", "sparse")


def fail(message):
    print(f"{PROG}: error: {message}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------------------------------------
# Parameters


def make_params(L, d, n_feat, k, activation, device, dtype, gen):
    """The compact per-layer CLT (shapes in the module docstring), initialized as saetrain does:
    decoder rows unit norm over all their target layers, each encoder row its own layer's block of
    the decoder row at unit norm, b_enc = b_dec = 0 (saetrain's b_enc = -W_enc mean(x) is about 0
    on N(0, 1) inputs)."""
    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=dtype).to(device)

    w_dec = []
    for l in range(L):
        w = randn(n_feat, L - l, d)
        w_dec.append(w / w.flatten(1).norm(dim=1)[:, None, None])
    w_enc = torch.stack([w[:, 0, :] / w[:, 0, :].norm(dim=1, keepdim=True) for w in w_dec])
    p = {
        "w_enc": torch.nn.Parameter(w_enc),  # [L, F, d]
        "b_enc": torch.nn.Parameter(torch.zeros(L, n_feat, device=device, dtype=dtype)),
        "b_dec": torch.nn.Parameter(torch.zeros(L, d, device=device, dtype=dtype)),
    }
    for l in range(L):
        p[f"w_dec{l}"] = torch.nn.Parameter(w_dec[l])  # [F, L - l, d]
    if activation == "jumprelu":
        # Unit-variance pre-activations exceed theta0 with probability k / F.
        theta0 = math.sqrt(2.0) * torch.erfinv(torch.tensor(1.0 - 2.0 * k / n_feat)).item()
        p["log_threshold"] = torch.nn.Parameter(
            torch.full((L, n_feat), math.log(theta0), device=device, dtype=dtype))  # [L, F]
    return p


def w_dec_of(p, L):
    return [p[f"w_dec{l}"] for l in range(L)]


def param_count(p):
    return sum(t.numel() for t in p.values())


# ---------------------------------------------------------------------------------------------
# JumpReLU's straight-through pseudo-derivatives (include/saetrain/sae_math.h)


def rectangle(v, theta, eps):
    return ((v - theta).abs() < eps / 2).to(v.dtype)


class JumpReLU(torch.autograd.Function):
    """z = v H(v - theta); dz/dv = H(v - theta), dz/dtheta = -(theta / eps) K((v - theta) / eps)."""

    @staticmethod
    def forward(ctx, v, theta, eps):  # v [B, L, F], theta [L, F]
        ctx.save_for_backward(v, theta)
        ctx.eps = eps
        return v * (v > theta)

    @staticmethod
    def backward(ctx, dz):
        v, theta = ctx.saved_tensors
        dv = dz * (v > theta)
        dtheta = (-(theta / ctx.eps) * rectangle(v, theta, ctx.eps) * dz).sum(0)
        return dv.to(v.dtype), dtheta.to(theta.dtype), None


class Step(torch.autograd.Function):
    """H(v - theta) for the L0 penalty; dH/dv = 0, dH/dtheta = -(1 / eps) K((v - theta) / eps)."""

    @staticmethod
    def forward(ctx, v, theta, eps):
        ctx.save_for_backward(v, theta)
        ctx.eps = eps
        return (v > theta).to(v.dtype)

    @staticmethod
    def backward(ctx, g):
        v, theta = ctx.saved_tensors
        dtheta = (-(1.0 / ctx.eps) * rectangle(v, theta, ctx.eps) * g).sum(0)
        return None, dtheta.to(theta.dtype), None


# ---------------------------------------------------------------------------------------------
# The step


def select(activation, pre, k):
    """The sparse activations' picks: (flat index into pre's B L F values, ReLU'd value)."""
    B, L, n_feat = pre.shape
    if activation == "topk":
        vals, idx = pre.reshape(B, L * n_feat).topk(k * L, dim=1, sorted=False)
        flat = idx + torch.arange(B, device=pre.device)[:, None] * (L * n_feat)
    elif activation == "topk-layer":
        vals, idx = pre.topk(k, dim=2, sorted=False)  # [B, L, k]
        flat = idx + torch.arange(B * L, device=pre.device).view(B, L, 1) * n_feat
    else:  # batchtopk
        vals, flat = pre.reshape(-1).topk(k * L * B, sorted=False)
    return flat.reshape(-1), F.relu(vals).reshape(-1)


def decode_dense(code, w_dec, b_dec):
    """y_hat [B, L, d] from a dense code [B, L, F]: one matmul per source layer."""
    B, L, n_feat = code.shape
    d = b_dec.shape[1]
    y_hat = b_dec.unsqueeze(0).repeat(B, 1, 1)
    for l in range(L):
        y_hat[:, l:] += (code[:, l] @ w_dec[l].view(n_feat, (L - l) * d)).view(B, L - l, d)
    return y_hat


def decode_sparse(flat, vals, B, L, n_feat, w_dec, b_dec):
    """y_hat [B, L, d] from the picks: per source layer one embedding_bag over its picks' rows."""
    d = b_dec.shape[1]
    row = flat // (L * n_feat)
    layer = (flat // n_feat) % L
    feat = flat % n_feat
    key = layer * B + row  # (layer, token): each layer's picks one block, in token order
    order = key.argsort()
    counts = torch.bincount(key, minlength=L * B).view(L, B)  # picks per (layer, token)
    bag_starts = counts.cumsum(1) - counts  # each token's offset in its layer's block
    block_sizes = counts.sum(1).tolist()  # the one host sync
    feats = feat[order].split(block_sizes)
    weights = vals[order].split(block_sizes)
    y_hat = b_dec.unsqueeze(0).repeat(B, 1, 1)
    for l in range(L):
        if block_sizes[l] == 0:
            continue
        table = w_dec[l].view(n_feat, (L - l) * d)
        out = F.embedding_bag(feats[l], table, offsets=bag_starts[l], mode="sum",
                              per_sample_weights=weights[l].to(table.dtype))
        y_hat[:, l:] += out.view(B, L - l, d)
    return y_hat


def encode(p, x):
    """pre [B, L, F]: one batched GEMM over the layers."""
    pre = torch.baddbmm(p["b_enc"].unsqueeze(1), x.transpose(0, 1), p["w_enc"].transpose(1, 2))
    return pre.transpose(0, 1)


def loss_of(activation, variant, p, x, y, k, l0_coeff, bandwidth):
    """The step's loss: summed squared error over the L d outputs, batch mean (+ JumpReLU's L0)."""
    B, L, _ = x.shape
    pre = encode(p, x)
    n_feat = pre.shape[2]
    w_dec = w_dec_of(p, L)
    penalty = 0.0
    if activation == "jumprelu":
        theta = p["log_threshold"].exp()
        code = JumpReLU.apply(pre, theta, bandwidth)
        fires = Step.apply(pre, theta, bandwidth)  # [B, L, F]
        # Counted in fp32: bf16 (autocast) holds integers exactly only up to 256.
        count_dtype = torch.promote_types(fires.dtype, torch.float32)
        penalty = l0_coeff * fires.sum(dim=(1, 2), dtype=count_dtype).mean()
        y_hat = decode_dense(code, w_dec, p["b_dec"])
    else:
        flat, vals = select(activation, pre, k)
        if variant == "dense":
            code = torch.zeros(B * L * n_feat, device=pre.device, dtype=vals.dtype)
            code = code.scatter(0, flat, vals).view(B, L, n_feat)
            y_hat = decode_dense(code, w_dec, p["b_dec"])
        else:
            y_hat = decode_sparse(flat, vals, B, L, n_feat, w_dec, p["b_dec"])
    return (y_hat - y).pow(2).sum(dim=(1, 2)).mean() + penalty


def make_optimizer(p, lr):
    try:
        return torch.optim.Adam(p.values(), lr=lr, fused=True), "fused"
    except (RuntimeError, ValueError):
        return torch.optim.Adam(p.values(), lr=lr, foreach=True), "foreach"


def train_step(activation, variant, p, opt, x, y, k, l0_coeff, bandwidth, autocast_bf16):
    L = x.shape[1]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast_bf16):
        loss = loss_of(activation, variant, p, x, y, k, l0_coeff, bandwidth)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(p.values(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        for w in w_dec_of(p, L):
            w /= w.flatten(1).norm(dim=1)[:, None, None]
    return loss


# ---------------------------------------------------------------------------------------------
# Timing


def reset_peak_rss():
    """Linux resets the process's RSS high-water mark (ru_maxrss) on '5' to clear_refs."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def time_row(activation, variant, a, device):
    cuda = device.type == "cuda"
    gen = torch.Generator().manual_seed(a.seed)
    p = make_params(a.layers, a.d_model, a.features, a.k, activation, device, torch.float32, gen)
    opt, _ = make_optimizer(p, a.lr)
    shape = (a.batch, a.layers, a.d_model)
    batches = [(torch.randn(*shape, generator=gen).to(device),
                torch.randn(*shape, generator=gen).to(device)) for _ in range(2)]
    bf16 = a.dtype == "bf16"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        rss_reset = False
    else:
        rss_reset = reset_peak_rss()
    times = []
    for i in range(a.warmup + a.reps):
        x, y = batches[i % 2]
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_step(activation, variant, p, opt, x, y, a.k, a.l0_coeff, a.bandwidth, bf16)
        if cuda:
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    if cuda:
        peak, peak_kind = torch.cuda.max_memory_allocated(), "cuda_max_allocated"
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        peak_kind = "process_peak_rss" if rss_reset else "process_peak_rss_so_far"
    return statistics.median(times), peak, peak_kind, param_count(p)


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def bench(a):
    device = torch.device(a.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            fail("--device cuda, but no CUDA device is visible to PyTorch; use --device cpu")
        torch.set_float32_matmul_precision("highest")  # fp32 means no TF32; bf16 is autocast
    activations, variants = a.activation.split(","), a.variants.split(",")
    _, adam_kind = make_optimizer({"w": torch.nn.Parameter(torch.zeros(1, device=device))}, 1e-3)
    header = {"kind": "header", "device": device_name(device), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "adam": adam_kind, "dtype": a.dtype,
              "layers": a.layers, "d_model": a.d_model, "features": a.features, "k": a.k,
              "batch": a.batch, "reps": a.reps, "warmup": a.warmup}
    if a.json:
        print(json.dumps(header), flush=True)
    else:
        print(f"{PROG} | {header['device']} | torch {torch.__version__} | threads "
              f"{header['threads']} | adam {adam_kind} | {a.dtype} | L {a.layers} d {a.d_model} "
              f"F {a.features} k {a.k} batch {a.batch} | median of {a.reps} after {a.warmup}")
        print(f"{'activation':<12}{'variant':<8}{'step':>10}{'tokens/s':>12}{'peak mem':>10}"
              f"{'params':>12}  peak mem is")
        print(f"{'':<12}{'':<8}{'ms':>10}{'1/s':>12}{'MiB':>10}{'':>12}")
    for act in activations:
        for var in variants:
            if act == "jumprelu" and var != "dense":
                continue  # JumpReLU's code is dense by nature
            sec, peak, peak_kind, n_params = time_row(act, var, a, device)
            row = {"kind": "row", "activation": act, "variant": var, "step_ms": sec * 1e3,
                   "tokens_per_s": a.batch / sec, "peak_mem_bytes": peak,
                   "peak_mem_kind": peak_kind, "params": n_params, "device": header["device"],
                   "threads": header["threads"], "dtype": a.dtype, "layers": a.layers,
                   "d_model": a.d_model, "features": a.features, "k": a.k, "batch": a.batch}
            if a.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{act:<12}{var:<8}{sec * 1e3:>10.2f}{a.batch / sec:>12.0f}"
                      f"{peak / 2**20:>10.0f}{n_params:>12}  {peak_kind}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# --check: the variants against each other and against plain loops


def reference_loss(activation, p, x, y, k, l0_coeff):
    """The loss by loops, differentiable (autograd through the loops is the gradients'
    reference): every pre-activation a dot product, the selection by sorting Python lists of
    their values, y_hat per token, target layer, source layer and active feature. Returns the
    loss tensor and the pre-activations' values {(token, layer, feature): float}."""
    B, L, d = x.shape
    n_feat = p["b_enc"].shape[1]
    pre = {(b, l, f): torch.dot(x[b, l], p["w_enc"][l, f]) + p["b_enc"][l, f]
           for b in range(B) for l in range(L) for f in range(n_feat)}
    value = {key: v.detach().item() for key, v in pre.items()}
    picked = []  # keys of the selection
    if activation == "topk":
        for b in range(B):
            picked += sorted((key for key in value if key[0] == b), key=value.get)[-k * L:]
    elif activation == "topk-layer":
        for b in range(B):
            for l in range(L):
                picked += sorted((key for key in value if key[:2] == (b, l)),
                                 key=value.get)[-k:]
    elif activation == "batchtopk":
        picked = sorted(value, key=value.get)[-k * L * B:]
    else:
        theta = p["log_threshold"].detach().exp()
        picked = [key for key, v in value.items() if v > float(theta[key[1], key[2]])]
    relu = activation != "jumprelu"
    clamped = sum(value[key] < 0 for key in picked)
    if relu and not 0 < clamped < len(picked):
        fail(f"{activation}: {clamped} of {len(picked)} picks negative; the check needs both")
    active = {key: (pre[key].clamp(min=0.0) if relu else pre[key]) for key in picked}
    loss = 0.0
    for b in range(B):
        for m in range(L):
            y_hat = p["b_dec"][m]
            for l in range(m + 1):
                for f in range(n_feat):
                    if (b, l, f) in active:
                        y_hat = y_hat + active[(b, l, f)] * p[f"w_dec{l}"][f, m - l]
            loss = loss + (y_hat - y[b, m]).pow(2).sum()
    loss = loss / B
    if activation == "jumprelu":
        loss = loss + l0_coeff * len(active) / B
    return loss, value


def reference_threshold_grad(p, x, y, pre, l0_coeff, eps):
    """dloss/dlog_threshold by loops from the pseudo-derivatives: for each token and feature in
    the kernel's window, -(1/eps) (theta dloss/dz + l0_coeff / B), times theta for the log."""
    B, L, d = x.shape
    n_feat = p["b_enc"].shape[1]
    theta = p["log_threshold"].detach().exp()
    w_dec = [w.detach() for w in w_dec_of(p, L)]
    resid = y.neg() + p["b_dec"].detach()  # [B, L, d]: y_hat - y, by loops
    for (b, l, f), v in pre.items():
        if v > float(theta[l, f]):
            for m in range(l, L):
                resid[b, m] += v * w_dec[l][f, m - l]
    grad = torch.zeros(L, n_feat, dtype=x.dtype)
    for (b, l, f), v in pre.items():
        t = float(theta[l, f])
        if abs(v - t) < eps / 2:
            dz = sum(float(2.0 * torch.dot(resid[b, m], w_dec[l][f, m - l]))
                     for m in range(l, L)) / B
            grad[l, f] += -(1.0 / eps) * (t * dz + l0_coeff / B) * t
    return grad


def check(a):
    """Small float64 shapes, the variants on --device, the loops on the CPU; exits 1 naming the
    first mismatch."""
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but no CUDA device is visible to PyTorch; use --device cpu")
    L, d, n_feat, k, B = 3, 8, 16, 2, 6
    l0_coeff = 0.01
    eps = 0.5  # wide enough that some pre-activations fall in the kernel's window
    rtol, atol = 1e-9, 1e-11  # float64: the variants sum the same terms in another order
    gen = torch.Generator().manual_seed(a.seed)
    x = torch.randn(B, L, d, generator=gen, dtype=torch.float64)
    y = torch.randn(B, L, d, generator=gen, dtype=torch.float64)
    for act in ACTIVATIONS:
        base = make_params(L, d, n_feat, k, act, "cpu", torch.float64,
                           torch.Generator().manual_seed(a.seed + 1))
        with torch.no_grad():  # biases off zero so their paths are checked too; for the
            # selections b_enc about -1, so that some picks are negative and the ReLU matters
            base["b_enc"].normal_(0.0 if act == "jumprelu" else -1.0, 0.3, generator=gen)
            base["b_dec"].normal_(0.0, 0.3, generator=gen)
        results = {}
        for var in VARIANTS if act != "jumprelu" else ("dense",):
            p = {name: torch.nn.Parameter(t.detach().clone().to(device))
                 for name, t in base.items()}
            loss = loss_of(act, var, p, x.to(device), y.to(device), k, l0_coeff, eps)
            loss.backward()
            grads = {name: None if t.grad is None else t.grad.cpu() for name, t in p.items()}
            results[var] = (loss.item(), grads, p)
        ref_p = {name: torch.nn.Parameter(t.detach().clone()) for name, t in base.items()}
        ref_loss, pre = reference_loss(act, ref_p, x, y, k, l0_coeff)
        ref_loss.backward()
        ref = ref_loss.item()
        for var, (loss, grads, _) in results.items():
            if not math.isclose(loss, ref, rel_tol=rtol, abs_tol=atol):
                fail(f"{act} {var}: loss {loss!r}, the plain loops give {ref!r}")
            for name, t in ref_p.items():
                if name == "log_threshold":
                    continue  # no derivative in the loops: reference_threshold_grad below
                want = t.grad if t.grad is not None else torch.zeros_like(t)
                if grads[name] is None or not torch.allclose(grads[name], want, rtol=rtol,
                                                              atol=atol):
                    err = "none" if grads[name] is None else \
                        f"max {(grads[name] - want).abs().max().item():.3g}"
                    fail(f"{act} {var}: gradient of {name} differs from the loops' ({err})")
        if "sparse" in results:
            (ld, gd, _), (ls, gs, _) = results["dense"], results["sparse"]
            if not math.isclose(ld, ls, rel_tol=rtol, abs_tol=atol):
                fail(f"{act}: dense loss {ld!r}, sparse {ls!r}")
            for name in gd:
                if gd[name] is None or gs[name] is None:
                    fail(f"{act}: {name} has no gradient in one of dense and sparse")
                if not torch.allclose(gd[name], gs[name], rtol=rtol, atol=atol):
                    err = (gd[name] - gs[name]).abs().max().item()
                    fail(f"{act}: dense and sparse gradients of {name} differ (max {err:.3g})")
        if act == "jumprelu":
            got = results["dense"][1]["log_threshold"]
            want = reference_threshold_grad(base, x, y, pre, l0_coeff, eps)
            if not want.any():
                fail("jumprelu: no pre-activation in the kernel's window; the check tests nothing")
            if not torch.allclose(got, want, rtol=rtol, atol=atol):
                err = (got - want).abs().max().item()
                fail(f"jumprelu: log_threshold gradient differs from the loops' (max {err:.3g})")
        for var, (_, _, p) in results.items():  # a full step runs and leaves unit decoder rows
            opt, _ = make_optimizer(p, 1e-3)
            train_step(act, var, p, opt, x.to(device), y.to(device), k, l0_coeff, eps, False)
            norms = torch.cat([w.flatten(1).norm(dim=1) for w in w_dec_of(p, L)]).cpu()
            if not torch.allclose(norms, torch.ones_like(norms)):
                fail(f"{act} {var}: decoder rows are not unit norm after the step")
        print(f"{PROG} --check: {act:<10} ok ({', '.join(results)} on {device.type}; "
              f"loss {ref:.6f} and gradients = loops)")
    print(f"{PROG} --check: passed")


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--features", type=int, default=3072, help="features per layer (F)")
    ap.add_argument("--k", type=int, default=16, help="active features per token and layer")
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--activation", default="topk", help=",".join(ACTIVATIONS))
    ap.add_argument("--variants", default="dense,sparse", help="dense,sparse (jumprelu: dense)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's own)")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"),
                    help="bf16: autocast, CUDA only; parameters and Adam stay fp32")
    ap.add_argument("--l0-coeff", type=float, default=0.01, help="JumpReLU's L0 penalty")
    ap.add_argument("--bandwidth", type=float, default=0.001, help="JumpReLU's kernel width")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON object a line")
    ap.add_argument("--check", action="store_true",
                    help="verify the variants and activations at a small float64 shape, exit")
    a = ap.parse_args()
    for name in a.activation.split(","):
        if name not in ACTIVATIONS:
            ap.error(f"--activation {name}: not one of {', '.join(ACTIVATIONS)}")
    for name in a.variants.split(","):
        if name not in VARIANTS:
            ap.error(f"--variants {name}: not one of {', '.join(VARIANTS)}")
    if a.dtype == "bf16" and a.device != "cuda":
        ap.error("--dtype bf16 is autocast on CUDA only; use --dtype fp32 with --device cpu")
    for name in ("layers", "d_model", "features", "k", "batch", "reps"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if a.warmup < 0:
        ap.error("--warmup must be at least 0")
    if 2 * a.k >= a.features:
        ap.error(f"--k {a.k} must be under half of --features {a.features}")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.check:
        check(a)
    else:
        bench(a)


if __name__ == "__main__":
    main()
