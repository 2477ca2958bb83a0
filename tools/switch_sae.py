"""A Switch SAE exported by saetrain (`sae-export --format saelens` on a switch SAE), in plain
PyTorch. SAELens and sparsify have no Switch architecture; the export keeps SAELens's file
names and tensor layout (cfg.json, sae_weights.safetensors: W_enc [d, n], b_enc [n],
W_dec [n, d], b_dec [d]) and adds the router, W_router [d, E] and b_router [E], with "k" and
"n_experts" in cfg.json. Expert e owns latents e*n/E .. (e+1)*n/E - 1.

    from switch_sae import SwitchSae
    sae = SwitchSae("exports/switch-x16-k32-e16")
    z = sae.encode(x)            # [tokens, n], at most k non-zero per token
    x_hat = sae.decode(z)        # = z @ W_dec + b_dec
"""
import json
import os

import torch
from safetensors.torch import load_file


class SwitchSae(torch.nn.Module):
    def __init__(self, path, device="cpu"):
        super().__init__()
        with open(os.path.join(path, "cfg.json")) as f:
            cfg = json.load(f)
        if cfg.get("architecture") != "switch":
            raise ValueError(f"{path}: cfg.json architecture is {cfg.get('architecture')!r}, "
                             "not 'switch'")
        t = load_file(os.path.join(path, "sae_weights.safetensors"), device=device)
        for name in ("W_enc", "b_enc", "W_dec", "b_dec", "W_router", "b_router"):
            self.register_buffer(name, t[name])
        self.k, self.n_experts = int(cfg["k"]), int(cfg["n_experts"])

    @torch.no_grad()
    def encode(self, x):
        """Latent activations f = p_e * TopK(expert e's pre-activations), e the routed expert."""
        xc = x - self.b_dec
        p = torch.softmax(xc @ self.W_router + self.b_router, dim=-1)
        expert = p.argmax(dim=-1)  # ties: the lower index, as saetrain
        n = self.W_enc.shape[1]
        size = n // self.n_experts
        f = torch.zeros(x.shape[0], n, dtype=x.dtype, device=x.device)
        for e in range(self.n_experts):
            rows = (expert == e).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            lo = e * size
            pre = xc[rows] @ self.W_enc[:, lo:lo + size] + self.b_enc[lo:lo + size]
            val, idx = pre.topk(self.k, dim=-1)
            f[rows.unsqueeze(1), lo + idx] = p[rows, e].unsqueeze(1) * val.relu()
        return f

    @torch.no_grad()
    def decode(self, f):
        return f @ self.W_dec + self.b_dec

    def forward(self, x):
        return self.decode(self.encode(x))
