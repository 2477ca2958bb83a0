#!/usr/bin/env python3
"""Trains one SAE with a peer library (SAELens or sparsify), each with its own SAE class,
loss, optimizer and trainer, on the rows of a dataset in their stored order, times the
training loop and evaluates the result on held-out rows with bench/peers/sae_eval.py.

    python bench/peers/train_peer.py --tool saelens|sparsify --arch topk|relu \\
        --train DIR --eval DIR [--batch-size 4096 --expansion 16 --k 32 --l1-coeff 5 \\
        --lr 4e-4 --threads 2 --max-tokens N] --json OUT
    python bench/peers/train_peer.py --tool sparsify --arch transcoder|skip_transcoder \\
        --train X_DIR --train-target Y_DIR --eval X_DIR --eval-target Y_DIR [...] --json OUT

Data: the first --max-tokens rows of --train (0: all; transcoders: and of --train-target, row
for row), read into memory first (not timed),
then fed in order in batches of --batch-size rows with no shuffling, --epochs times; the last
batch of each pass may be partial and is trained (both tools, as saetrain does). Run bench/peers/shuffle_shards.py on
the data once beforehand so every tool sees the same shuffled order.

What each tool runs (README.md beside this file has the full list of defaults):
  saelens   sae_lens.training.sae_trainer.SAETrainer(cfg, sae, data_provider).fit(), the
            trainer LanguageModelSAETrainingRunner uses, with an iterator of the in-memory
            batches as its data provider (as sae_lens.synthetic.train_toy_sae does).
            SAE: TopKTrainingSAE(TopKTrainingSAEConfig(k=...)) or
            StandardTrainingSAE(StandardTrainingSAEConfig(l1_coefficient=...)); every
            other field at its SAELens default. SAETrainerConfig filled from the defaults of
            LanguageModelSAERunnerConfig (constant lr, no warm-up, lr_end = lr / 10, Adam
            0.9/0.999, dead_feature_window 1000, feature_sampling_window 2000).
  sparsify  sparsify.Trainer(TrainConfig(SparseCoderConfig(expansion_factor, k), ...),
            dataset, model).fit(): sparsify's own training loop, unchanged. It trains SAEs
            on a transformer's hidden states through a forward hook; here the "model" is a
            stand-in whose hooked module returns the cached rows named by the batch's
            "input_ids" (one dataset item = one batch of row indices), so the Trainer's
            b_dec init, decoder normalization, gradient projection, loss (fvu + auxk_alpha *
            auxk_loss), dead-latent tracking, optimizer and schedule all run as written.
            --optimizer adam (default here: Adam at --lr, sparsify's linear warm-up over
            lr_warmup_steps then linear decay to 0) or signum (sparsify's own default:
            ScheduleFree SignSGD; --lr auto gives its default 5e-3 / sqrt(n / 2^14)).
            Transcoders (sparsify only: SparseCoderConfig(transcode=True,
            skip_connection=False|True)): the hooked module stands in for an MLP, called
            with the cached input rows x and returning the cached output rows y of the
            same tokens, so the Trainer's hook takes x as the module's input and y as its
            output, as it does on a real MLP. The trained coder is written with sparsify's
            own SparseCoder.save_to_disk (--export-dir) and evaluated from that directory
            by sae_eval.evaluate_sparsify_dir, the evaluator saetrain's sparsify exports
            go through.

Output (--json): {tool, arch, k or l1_coeff, expansion, n_latents, lr, tokens, steps,
seconds, tokens_per_s, eval_fvu, eval_l0, eval_dead_fraction, eval_dense_fraction,
train_fvu_last, ...}. seconds: wall time of the trainer's fit() (the loop from the first step
to the last, with the tool's own per-step bookkeeping; checkpoint writing is off).
"""
import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sae_eval import evaluate, evaluate_sparsify_dir, read_rows  # noqa: E402


def batches_of(x, batch_size):
    """The in-order batches of x (views, no copies); the last one may be partial."""
    return [x[i:i + batch_size] for i in range(0, x.shape[0], batch_size)]


# --------------------------------------------------------------------------------------------
# SAELens
# --------------------------------------------------------------------------------------------
def train_saelens(a, x, device):
    import torch
    from sae_lens.config import LoggingConfig, SAETrainerConfig
    from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
    from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.training.sae_trainer import SAETrainer

    d = x.shape[1]
    n = d * a.expansion
    torch.manual_seed(a.seed)
    if a.arch == "topk":
        sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d, d_sae=n, k=a.k, dtype="float32",
                                                    device=device))
    else:
        sae = StandardTrainingSAE(StandardTrainingSAEConfig(
            d_in=d, d_sae=n, l1_coefficient=a.l1_coeff, dtype="float32", device=device))
    lr = 3e-4 if a.lr == "auto" else float(a.lr)  # LanguageModelSAERunnerConfig.lr default
    tokens = x.shape[0] * a.epochs
    cfg = SAETrainerConfig(
        total_training_samples=tokens,
        train_batch_size_samples=a.batch_size,
        lr=lr,
        lr_end=lr / 10,  # what LanguageModelSAERunnerConfig.__post_init__ sets (unused: constant)
        device=device,
        autocast=a.autocast,
        n_checkpoints=0,
        checkpoint_path=None,
        save_final_checkpoint=False,
        logger=LoggingConfig(log_to_wandb=False),
    )
    xt = torch.from_numpy(x).to(device)  # in the device's memory before the clock starts
    batches = batches_of(xt, a.batch_size) * a.epochs
    provider = iter(batches)
    trainer = SAETrainer(cfg=cfg, sae=sae, data_provider=provider)
    last = {}
    step = trainer.step

    def step_keep_last(batch):  # the trainer's own step; keeps the last batch's input and
        out = step(batch)       # output (small: [batch, d]) for its fvu, nothing larger
        last["io"] = (out.sae_in, out.sae_out.detach())
        return out

    trainer.step = step_keep_last
    t0 = time.perf_counter()
    trainer.fit()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    steps = trainer.n_training_steps
    trained = trainer.n_training_samples

    with torch.no_grad():
        sd = {k: v.detach().clone() for k, v in sae.state_dict().items()}
        # SAELens's own conversion to the inference layout (folds the decoder norms into the
        # encoder for TopK SAEs trained with rescale_acts_by_decoder_norm).
        sae.process_state_dict_for_saving_inference(sd)
        train_fvu = None
        if "io" in last:
            x_in, x_out = (t.double() for t in last["io"])
            sse = (x_out - x_in).pow(2).sum()
            sst = (x_in - x_in.mean(0)).pow(2).sum()
            train_fvu = float(sse / sst)
    weights = (sd["W_enc"], sd["b_enc"], sd["W_dec"], sd["b_dec"])
    info = {
        "tool_version": __import__("sae_lens").__version__,
        "trainer": "sae_lens.training.sae_trainer.SAETrainer.fit",
        "sae_class": type(sae).__name__,
        "lr_scheduler": cfg.lr_scheduler_name,
        "autocast": cfg.autocast,
        "lr_warm_up_steps": cfg.lr_warm_up_steps,
        "dead_feature_window": cfg.dead_feature_window,
        "apply_b_dec_to_input": sae.cfg.apply_b_dec_to_input,
        "decoder_init_norm": sae.cfg.decoder_init_norm,
    }
    if a.arch == "topk":
        info["aux_loss_coefficient"] = sae.cfg.aux_loss_coefficient
        info["rescale_acts_by_decoder_norm"] = sae.cfg.rescale_acts_by_decoder_norm
        info["dead_latents_at_end"] = int(trainer.dead_neurons.sum())
    return dict(lr=lr, n_latents=n, tokens=trained, steps=steps, seconds=seconds,
                train_fvu_last=train_fvu, weights=weights,
                apply_b_dec_to_input=bool(sae.cfg.apply_b_dec_to_input), info=info)


# --------------------------------------------------------------------------------------------
# sparsify
# --------------------------------------------------------------------------------------------
def train_sparsify(a, x, device, y=None):
    if a.arch == "relu":
        raise SystemExit("train_peer: sparsify has no ReLU-L1 SAE (its activations are topk "
                         "and groupmax); use --arch topk")
    transcode = a.arch in TRANSCODERS
    os.environ.setdefault("SPARSIFY_DISABLE_TRITON", "0" if device.startswith("cuda") else "1")
    import torch
    from torch import nn

    import sparsify
    from sparsify import SparseCoderConfig, TrainConfig, Trainer

    acts = torch.from_numpy(x).to(device)
    N, d = acts.shape
    targets = torch.from_numpy(y).to(device) if transcode else None

    class CachedRows(nn.Module):
        """The hooked module: returns the cached rows a batch's input_ids name, [B, S, d]."""

        def forward(self, input_ids):
            return acts[input_ids]

    class CachedMlp(nn.Module):
        """The hooked module of a transcoder, standing in for an MLP: called with the cached
        input rows x of a batch, it returns the cached output rows y of the same tokens. The
        Trainer's hook reads its input (x) and its output (y), as on a real MLP."""

        def forward(self, x_rows, input_ids):
            return targets[input_ids]

    class CachedActivationsModel(nn.Module):
        """Stands in for a transformer: sparsify's Trainer hooks `rows` and trains on what it
        outputs, the cached activations, exactly as it would on a layer's hidden states
        (a transcoder: on the input and output of `rows`, a CachedMlp)."""

        def __init__(self):
            super().__init__()
            self.rows = CachedMlp() if transcode else CachedRows()
            self.config = type("Cfg", (), {"num_hidden_layers": 1})()

        @property
        def base_model(self):
            return self

        @property
        def device(self):
            return torch.device(device)

        @property
        def dummy_inputs(self):
            return {"input_ids": torch.zeros(1, 1, dtype=torch.long)}

        def forward(self, input_ids, **_):
            if transcode:
                return self.rows(acts[input_ids], input_ids)
            return self.rows(input_ids)

    class BatchIndexDataset(torch.utils.data.Dataset):
        """Item i: {"input_ids": row indices of batch i}; the Trainer's DataLoader uses
        batch_size 1 (one item per step), so the last, partial batch is trained too."""

        def __init__(self, batch_size):
            self.b = batch_size

        def __len__(self):
            return a.epochs * ((N + self.b - 1) // self.b)

        def __getitem__(self, i):
            lo = (i % ((N + self.b - 1) // self.b)) * self.b
            return {"input_ids": torch.arange(lo, min(N, lo + self.b), dtype=torch.long)}

    sae_cfg = SparseCoderConfig(expansion_factor=a.expansion, k=a.k, transcode=transcode,
                                skip_connection=a.arch == "skip_transcoder")
    kw = dict(sae=sae_cfg, batch_size=1, hookpoints=["rows"], optimizer=a.optimizer,
              log_to_wandb=False, save_dir=os.path.join(a.tmp_dir, "sparsify-checkpoints"),
              init_seeds=[a.seed])
    if a.lr != "auto":
        kw["lr"] = float(a.lr)
    if a.auxk_alpha is not None:
        kw["auxk_alpha"] = a.auxk_alpha
    if a.warmup_steps is not None:
        kw["lr_warmup_steps"] = a.warmup_steps
    cfg = TrainConfig(**kw)
    model = CachedActivationsModel()
    trainer = Trainer(cfg, BatchIndexDataset(a.batch_size), model)
    trainer.save = lambda: None  # no checkpoint files (save_every, and the one at the end)
    (name, sae), = trainer.saes.items()
    last = {}
    sae.register_forward_hook(lambda _m, _i, out: last.__setitem__("fvu", out.fvu.detach()))
    steps_before = trainer.global_step
    t0 = time.perf_counter()
    trainer.fit()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    steps = trainer.global_step - steps_before
    # fit() set torch.set_float32_matmul_precision("high") (TF32 on GPUs); the evaluation
    # runs at full fp32 like every other tool's.
    torch.set_float32_matmul_precision("highest")

    opt = trainer.optimizers[0]
    if cfg.optimizer == "signum":
        opt.eval()  # ScheduleFree: the evaluation weights, as sparsify saves them
    lr = opt.param_groups[0].get("initial_lr", opt.param_groups[0]["lr"])
    if a.lr != "auto":
        lr = float(a.lr)
    elif cfg.optimizer == "signum":
        lr = 5e-3 / (sae.num_latents / (2**14)) ** 0.5
    export_dir = None
    if transcode:  # evaluated from sparsify's own file, as saetrain's sparsify export is
        export_dir = a.export_dir or os.path.join(a.tmp_dir, f"sparsify-{a.arch}")
        sae.save_to_disk(export_dir)
    with torch.no_grad():
        weights = (sae.encoder.weight.detach().T.contiguous(), sae.encoder.bias.detach().clone(),
                   sae.W_dec.detach().clone(), sae.b_dec.detach().clone())
    dead = trainer.num_tokens_since_fired[name] > cfg.dead_feature_threshold
    info = {
        "tool_version": sparsify.__version__,
        "trainer": "sparsify.Trainer.fit",
        "optimizer": cfg.optimizer + (" (" + type(opt).__name__ + ")"),
        "lr_warmup_steps": cfg.lr_warmup_steps if cfg.optimizer == "adam" else None,
        "lr_schedule": ("transformers.get_linear_schedule_with_warmup: linear warm-up, then "
                        "linear decay to 0 at the last step") if cfg.optimizer == "adam"
        else "schedule-free (no schedule)",
        "auxk_alpha": cfg.auxk_alpha,
        "dead_feature_threshold": cfg.dead_feature_threshold,
        "dead_latents_at_end": int(dead.sum()),
        "normalize_decoder": sae_cfg.normalize_decoder,
        "decoder_impl": sparsify.sparse_coder.decoder_impl.__name__,
    }
    if transcode:
        info["transcode"] = True
        info["skip_connection"] = sae_cfg.skip_connection
        info["init"] = ("W_dec = 0, b_enc = -mean(x of the first batch) W_enc^T, b_dec = "
                        "mean(y of the first batch); no decoder normalization or gradient "
                        "projection (sparsify skips both when transcoding)")
        info["export_dir"] = os.path.abspath(export_dir)
    return dict(lr=lr, n_latents=sae.num_latents, tokens=N * a.epochs, steps=steps,
                seconds=seconds,
                train_fvu_last=float(last["fvu"]) if "fvu" in last else None,
                weights=weights, apply_b_dec_to_input=True, export_dir=export_dir, info=info)


TRANSCODERS = ("transcoder", "skip_transcoder")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, choices=["saelens", "sparsify"])
    ap.add_argument("--arch", required=True, choices=["topk", "relu", *TRANSCODERS])
    ap.add_argument("--train", required=True, help="shards to train on, read in order "
                    "(a transcoder's input, e.g. an MLP's input)")
    ap.add_argument("--train-target", help="transcoders: the target shards (the MLP's output), "
                    "row for row with --train")
    ap.add_argument("--eval", required=True, help="held-out shards to evaluate on")
    ap.add_argument("--eval-target", help="transcoders: the held-out target shards, row for "
                    "row with --eval")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--expansion", type=int, default=16)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--l1-coeff", type=float, default=5.0)
    ap.add_argument("--lr", default="4e-4", help="learning rate, or 'auto': the tool's default")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    ap.add_argument("--max-tokens", type=int, default=0, help="train rows to use (0: all)")
    ap.add_argument("--epochs", type=int, default=1,
                    help="passes over the train rows, in the same order each time")
    ap.add_argument("--eval-max-rows", type=int, default=0, help="eval rows to use (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="torch seed for the SAE's init")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--optimizer", default="adam", choices=["adam", "signum"],
                    help="sparsify only: adam (at --lr) or signum (sparsify's default)")
    ap.add_argument("--autocast", action="store_true",
                    help="saelens only: SAETrainerConfig.autocast (bf16 mixed precision; "
                    "SAELens's default is off)")
    ap.add_argument("--auxk-alpha", type=float, default=None,
                    help="sparsify only: TrainConfig.auxk_alpha (default: sparsify's)")
    ap.add_argument("--warmup-steps", type=int, default=None,
                    help="sparsify only: TrainConfig.lr_warmup_steps (default: sparsify's)")
    ap.add_argument("--tmp-dir", default=None, help="scratch (default: next to --json)")
    ap.add_argument("--export-dir", default=None, help="transcoders: where sparsify's "
                    "save_to_disk writes the trained coder (default: TMP_DIR/sparsify-ARCH)")
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.tool == "sparsify" and a.arch == "relu":
        raise SystemExit("train_peer: sparsify has no ReLU-L1 SAE (its activations are topk "
                         "and groupmax); use --arch topk")
    transcode = a.arch in TRANSCODERS
    if transcode and a.tool != "sparsify":
        raise SystemExit("train_peer: SAELens's transcoders are ReLU or JumpReLU, not TopK; "
                         "--arch transcoder|skip_transcoder runs with --tool sparsify")
    if transcode and not (a.train_target and a.eval_target):
        raise SystemExit(f"train_peer: --arch {a.arch} needs --train-target and --eval-target "
                         "(the MLP's output rows beside its input rows)")
    if not transcode and (a.train_target or a.eval_target):
        raise SystemExit(f"train_peer: --train-target/--eval-target are for transcoders, not "
                         f"--arch {a.arch}")
    if a.lr != "auto":
        float(a.lr)
    if a.tmp_dir is None:
        a.tmp_dir = os.path.join(os.path.dirname(os.path.abspath(a.json)), ".scratch")

    import numpy as np
    import torch

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    x = read_rows(a.train, a.max_tokens)
    ev = read_rows(a.eval, a.eval_max_rows)
    x = np.ascontiguousarray(x)
    y = ev_y = None
    if transcode:
        y = np.ascontiguousarray(read_rows(a.train_target, a.max_tokens))
        ev_y = read_rows(a.eval_target, a.eval_max_rows)
        if y.shape[0] != x.shape[0] or ev_y.shape[0] != ev.shape[0]:
            raise SystemExit(f"train_peer: the targets hold {y.shape[0]} train and "
                             f"{ev_y.shape[0]} eval rows, the inputs {x.shape[0]} and "
                             f"{ev.shape[0]}: not row for row")
    print(f"train_peer: {a.tool} {a.arch}: {x.shape[0]} train rows x {x.shape[1]}"
          f"{' -> ' + str(y.shape[1]) if transcode else ''}, "
          f"{ev.shape[0]} eval rows (read in {time.perf_counter() - t0:.1f} s), "
          f"batch {a.batch_size}, {a.threads} thread(s)", flush=True)

    if a.tool == "saelens":
        r = train_saelens(a, x, a.device)
    else:
        r = train_sparsify(a, x, a.device, y)
    if transcode:
        m, _ = evaluate_sparsify_dir(r["export_dir"], ev, target=ev_y,
                                     batch_size=a.batch_size, device=a.device)
    else:
        W_enc, b_enc, W_dec, b_dec = r["weights"]
        m = evaluate(W_enc, b_enc, W_dec, b_dec, a.arch, ev,
                     k=a.k if a.arch == "topk" else None,
                     apply_b_dec_to_input=r["apply_b_dec_to_input"], batch_size=a.batch_size,
                     device=a.device)
    out = {"tool": a.tool, "arch": a.arch}
    if a.arch != "relu":
        out["k"] = a.k
    else:
        out["l1_coeff"] = a.l1_coeff
    if a.tool == "saelens" and a.autocast:
        out["setting_extra"] = "autocast bf16"
    if a.tool == "sparsify":
        out["optimizer"] = a.optimizer
        extra = []
        if a.warmup_steps is not None:
            extra.append(f"warmup={a.warmup_steps}")
        if a.auxk_alpha is not None:
            extra.append(f"auxk_alpha={a.auxk_alpha:g}")
        if extra:
            out["setting_extra"] = ", ".join(extra)
    out.update({
        "expansion": a.expansion, "n_latents": r["n_latents"], "lr": r["lr"],
        "batch_size": a.batch_size, "threads": a.threads, "device": a.device,
        "tokens": int(r["tokens"]), "steps": int(r["steps"]), "seconds": r["seconds"],
        "tokens_per_s": r["tokens"] / r["seconds"] if r["seconds"] > 0 else math.nan,
        **m,
        "train_fvu_last": r["train_fvu_last"],
        "torch_version": torch.__version__,
        "details": r["info"],
    })
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"train_peer: {a.tool} {a.arch}: {out['steps']} steps, {out['tokens']} tokens in "
          f"{out['seconds']:.2f} s = {out['tokens_per_s']:.0f} tok/s; eval fvu "
          f"{m['eval_fvu']:.4f} l0 {m['eval_l0']:.1f} dead {100 * m['eval_dead_fraction']:.1f}% "
          f"dense {100 * m['eval_dense_fraction']:.1f}% -> {a.json}")


if __name__ == "__main__":
    main()
