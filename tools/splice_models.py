"""The models tools/splice_eval.py splices into a language model: SAELens-format SAEs (SaeSpec,
Sae) and cross-layer transcoders in circuit-tracer's layout (CltSpec, Clt and the CltPass that
runs one through a spliced forward pass), with the module lookup both use (resolve_hook). The
formats and the math are described in splice_eval.py's docstring; errors raise Fail, which the
tool prints as one line.
"""
import json
import re
from pathlib import Path

from extract_activations import Fail

ARCHS = ("standard", "relu", "topk", "jumprelu", "batchtopk", "gated")
NORMS = ("none", "expected_average_only_in", "constant_norm_rescale")
TOKEN_CHUNK = 2048  # tokens per SAE matmul, bounds the [tokens, d_sae] temporaries

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
                       "sae_weights.safetensors, from sae-export --format saelens; or a "
                       "circuit-tracer CLT export with config.yaml)")
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
# Cross-layer transcoders (circuit-tracer's export layout)

CLT_KIND = "cross_layer_transcoder"
CLT_CONFIG_KEYS = ("model_kind", "feature_input_hook", "feature_output_hook")
# MiniLM's MLP input (the attention block's output, after its LayerNorm) and MLP output (before
# the residual add and LayerNorm): where tools/extract_activations.py takes a CLT's rows.
CLT_INPUT_HOOK = "encoder.layer.{l}.attention.output"
CLT_OUTPUT_HOOK = "encoder.layer.{l}.output.dense"


def is_clt_dir(directory):
    d = Path(directory)
    return (d / "config.yaml").is_file() and not (d / "cfg.json").is_file()


def layer_hook(template, layer):
    return template.replace("{l}", str(layer))


def safetensors_shapes(path):
    """{tensor name: shape} from a safetensors file's header, without reading the tensors."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= 100_000_000:
                raise ValueError(f"header length {n}")
            header = json.loads(f.read(n))
        return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise Fail(f"{path}: not a readable safetensors file ({e})")


class CltSpec:
    """A circuit-tracer cross-layer transcoder export (`sae-export --format circuit_tracer` of a
    CLT): config.yaml, and per layer l W_enc_l.safetensors (W_enc_l [F, d_in], b_enc_l [F],
    b_dec_l [d_out], threshold_l [F]) and W_dec_l.safetensors (W_dec_l [F, L - l, d_out]).
    Read and checked from the headers, without torch; the widths against the model later."""

    def __init__(self, directory, input_template=CLT_INPUT_HOOK, output_template=CLT_OUTPUT_HOOK):
        import yaml

        d = Path(directory)
        self.dir = d
        self.name = d.resolve().name or str(d)
        self.cfg_path = d / "config.yaml"
        try:
            cfg = yaml.safe_load(self.cfg_path.read_text())
        except (OSError, yaml.YAMLError) as e:
            raise Fail(f"{self.cfg_path}: not readable YAML ({str(e).splitlines()[0]})")
        if not isinstance(cfg, dict):
            raise Fail(f"{self.cfg_path}: not a YAML mapping")
        for key in CLT_CONFIG_KEYS:
            if not isinstance(cfg.get(key), str) or not cfg[key]:
                raise Fail(f"{self.cfg_path}: no '{key}' (a circuit-tracer CLT config names "
                           f"{', '.join(CLT_CONFIG_KEYS)})")
        if cfg["model_kind"] != CLT_KIND:
            raise Fail(f"{self.cfg_path}: model_kind '{cfg['model_kind']}' is not supported "
                       f"(splice_eval reads model_kind {CLT_KIND}, or a SAELens export)")
        self.cfg = cfg
        self.model_name = cfg.get("model_name")
        self.feature_input_hook = cfg["feature_input_hook"]
        self.feature_output_hook = cfg["feature_output_hook"]
        self.input_template, self.output_template = input_template, output_template

        found = set()
        for p in d.iterdir():
            m = re.fullmatch(r"W_(?:enc|dec)_(\d+)\.safetensors", p.name)
            if m:
                found.add(int(m.group(1)))
        if not found:
            raise Fail(f"{self.enc_path(0)}: no such file (a CLT export has W_enc_<l> and "
                       "W_dec_<l>.safetensors for every layer l)")
        L = max(found) + 1
        for l in range(L):
            for p in (self.enc_path(l), self.dec_path(l)):
                if not p.is_file():
                    raise Fail(f"{p}: no such file (the export's layer files go up to layer "
                               f"{L - 1}, so every layer 0..{L - 1} needs W_enc_<l> and W_dec_<l>)")
        self.n_layers = L
        enc = [safetensors_shapes(self.enc_path(l)) for l in range(L)]
        dec = [safetensors_shapes(self.dec_path(l)) for l in range(L)]
        w0 = enc[0].get("W_enc_0")
        if w0 is None or len(w0) != 2:
            raise Fail(f"{self.enc_path(0)}: no 2-d tensor 'W_enc_0' [F, d]")
        self.d_transcoder, self.d_in = w0
        b0 = enc[0].get("b_dec_0")
        if b0 is None or len(b0) != 1:
            raise Fail(f"{self.enc_path(0)}: no 1-d tensor 'b_dec_0' [d]")
        self.d_out = b0[0]
        # circuit-tracer's load_clt: JumpReLU when layer 0 has a threshold, ReLU otherwise.
        self.jumprelu = "threshold_0" in enc[0]
        F, di, do = self.d_transcoder, self.d_in, self.d_out
        for l in range(L):
            want = {f"W_enc_{l}": (F, di), f"b_enc_{l}": (F,), f"b_dec_{l}": (do,)}
            if self.jumprelu:
                want[f"threshold_{l}"] = (F,)
            for name, shape in want.items():
                if name not in enc[l]:
                    raise Fail(f"{self.enc_path(l)}: no tensor '{name}'")
                if enc[l][name] != shape:
                    raise Fail(f"{self.enc_path(l)}: {name} is {list(enc[l][name])}, expected "
                               f"{list(shape)} (layer 0's F {F}, d_in {di}, d_out {do})")
            if not self.jumprelu and f"threshold_{l}" in enc[l]:
                raise Fail(f"{self.enc_path(l)}: has threshold_{l} but layer 0 has none")
            name, shape = f"W_dec_{l}", (F, L - l, do)
            if name not in dec[l]:
                raise Fail(f"{self.dec_path(l)}: no tensor '{name}'")
            if dec[l][name] != shape:
                raise Fail(f"{self.dec_path(l)}: {name} is {list(dec[l][name])}, expected "
                           f"[F, L - l, d] = {list(shape)} (layer {l} of {L})")
        self.arch = "clt-jumprelu" if self.jumprelu else "clt-relu"
        self.input_hooks = [layer_hook(input_template, l) for l in range(L)]
        self.output_hooks = [layer_hook(output_template, l) for l in range(L)]

    def enc_path(self, layer):
        return self.dir / f"W_enc_{layer}.safetensors"

    def dec_path(self, layer):
        return self.dir / f"W_dec_{layer}.safetensors"

    def check_layers(self, model):
        """The CLT's layers against the model's, and its hooks resolve."""
        n = getattr(getattr(model, "config", None), "num_hidden_layers", None)
        L = self.n_layers
        if isinstance(n, int) and L > n:
            raise Fail(f"{self.enc_path(L - 1)}: the CLT has {L} layers (0..{L - 1}), the model "
                       f"only {n}")
        for name in self.input_hooks:
            resolve_hook(model, name, "--clt-input-hook")
        for name in self.output_hooks:
            resolve_hook(model, name, "--clt-output-hook")

    def check_widths(self, widths):
        """W_enc_l and W_dec_l against the widths of the model's hooks ({name: width})."""
        for l in range(self.n_layers):
            w_in, w_out = widths[self.input_hooks[l]], widths[self.output_hooks[l]]
            if w_in != self.d_in:
                raise Fail(f"{self.enc_path(l)}: W_enc_{l} is [{self.d_transcoder}, {self.d_in}], "
                           f"but the model's '{self.input_hooks[l]}' is {w_in} wide")
            if w_out != self.d_out:
                raise Fail(f"{self.dec_path(l)}: W_dec_{l} writes {self.d_out} wide outputs, but "
                           f"the model's '{self.output_hooks[l]}' is {w_out} wide")


class Clt:
    """A CLT's forward in float32, as circuit-tracer's CrossLayerTranscoder computes it: layer l's
    features a_l = act(x_l W_enc_l^T + b_enc_l) (no b_dec subtracted from the input), act
    JumpReLU pre * (pre > threshold_l) or ReLU without thresholds, and layer m's output
    y_hat_m = sum_{l <= m} a_l W_dec_l[:, m - l] + b_dec_m."""

    def __init__(self, spec, device):
        import torch
        from safetensors.torch import load_file

        self.spec = spec
        f32 = dict(device=device, dtype=torch.float32)
        self.W_enc, self.b_enc, self.b_dec, self.threshold, self.W_dec = [], [], [], [], []
        for l in range(spec.n_layers):
            try:
                enc = load_file(str(spec.enc_path(l)), device="cpu")
                dec = load_file(str(spec.dec_path(l)), device="cpu")
            except Exception as e:  # noqa: BLE001 -- a corrupt file is a user error
                raise Fail(f"{spec.dir}: layer {l}'s files are not readable safetensors ({e})")
            self.W_enc.append(enc[f"W_enc_{l}"].to(**f32))  # [F, d_in]
            self.b_enc.append(enc[f"b_enc_{l}"].to(**f32))  # [F]
            self.b_dec.append(enc[f"b_dec_{l}"].to(**f32))  # [d_out]
            self.threshold.append(enc[f"threshold_{l}"].to(**f32) if spec.jumprelu else None)
            w = dec[f"W_dec_{l}"].to(**f32)  # [F, L - l, d_out]
            self.W_dec.append([w[:, i].contiguous() for i in range(w.shape[1])])  # [F, d_out] each

    def encode(self, layer, x):
        """x: [N, d_in] float32. Returns a_layer [N, F]."""
        import torch

        pre = x @ self.W_enc[layer].T + self.b_enc[layer]
        thr = self.threshold[layer]
        return torch.relu(pre) if thr is None else pre * (pre > thr)


class CltPass:
    """A CLT's state in one spliced forward pass over one batch. The input hooks of layers
    0..max(write) hand their evaluated rows to read(); each of those layers' features adds its
    decoders' share to every output layer in `write`, and the output hook of layer m in `write`
    takes the sum (write_output). Inputs are whatever the pass computes there: with earlier
    layers replaced, the running ones."""

    def __init__(self, clt, write):
        self.clt = clt
        self.write = sorted(write)
        self.acc = {m: None for m in self.write}  # m -> [N, d_out], the sum so far
        self.seen = set()
        self.l0 = [0] * clt.spec.n_layers  # active features of each layer read, summed over tokens

    def read(self, layer, x):
        outs = [m for m in self.write if m >= layer]
        if not outs:
            return
        import torch

        x = x.float()
        for m in outs:
            if self.acc[m] is None:
                self.acc[m] = torch.zeros(x.shape[0], self.clt.spec.d_out, device=x.device)
        for lo in range(0, x.shape[0], TOKEN_CHUNK):
            a = self.clt.encode(layer, x[lo:lo + TOKEN_CHUNK])
            self.l0[layer] += int((a != 0).sum())
            for m in outs:
                self.acc[m][lo:lo + TOKEN_CHUNK] += a @ self.clt.W_dec[layer][m - layer]
        self.seen.add(layer)

    def write_output(self, layer):
        missing = [l for l in range(layer + 1) if l not in self.seen]
        if missing:  # the model ran layer m's output before an input it reads from
            raise Fail(f"CLT {self.clt.spec.name}: the output hook of layer {layer} ran before "
                       f"the input hook of layer {missing[0]}; check --clt-input-hook and "
                       "--clt-output-hook")
        return self.acc[layer] + self.clt.b_dec[layer]


class CltWrite:
    """A Splice mode: layer `layer`'s output from a CltPass (the Sae interface: reconstruct)."""

    def __init__(self, clt_pass, layer):
        self.clt_pass, self.layer = clt_pass, layer

    def reconstruct(self, y):
        return self.clt_pass.write_output(self.layer), 0


class CltRead:
    """A forward hook on a CLT input module (layer `layer`): hands the evaluated rows of its
    output to the active CltPass, if any; never changes the output."""

    def __init__(self, name, module, layer):
        self.name, self.layer = name, layer
        self.clt_pass = None
        self.eval_mask = None
        self.handle = module.register_forward_hook(self._hook)

    def remove(self):
        self.handle.remove()

    def _hook(self, module, inputs, output):
        if self.clt_pass is not None:
            self.clt_pass.read(self.layer, _hidden(output)[self.eval_mask])
        return None


def _hidden(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def resolve_hook(model, name, option="--hook"):
    """The module called `name`, trying it with and without the model's base prefix; `option`
    is the one to name when there is none."""
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
    raise Fail(f"unknown hook '{name}': not a module of the model{example}; pass {option}")
