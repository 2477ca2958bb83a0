#!/usr/bin/env python3
"""Loads an sae-export directory with the reference safetensors library (pip install safetensors
numpy) and checks it against what SAELens / sparsify expect: tensor names, shapes, dtype, and
that the encoder and decoder agree with the cfg. Prints one line; exit 1 on a mismatch.

    python3 tools/check_export.py DIR [--sae-file H5]   # H5: compare values with the source
"""
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1].startswith("-"):
        print("usage: check_export.py DIR [--sae-file H5]", file=sys.stderr)
        return 2
    d = Path(sys.argv[1])
    try:
        cfg = json.loads((d / "cfg.json").read_text())
    except (OSError, ValueError) as e:
        print(f"check_export: error: {d / 'cfg.json'}: {getattr(e, 'strerror', None) or e} "
              "(not an sae-export directory?)", file=sys.stderr)
        return 1
    if (d / "sae_weights.safetensors").exists():
        t = load_file(str(d / "sae_weights.safetensors"))
        d_in, d_sae = cfg["d_in"], cfg["d_sae"]
        want = {"W_enc": (d_in, d_sae), "b_enc": (d_sae,), "W_dec": (d_sae, d_in), "b_dec": (d_in,)}
        enc = t["W_enc"]
        kind = f"saelens {cfg['architecture']}"
    else:
        t = load_file(str(d / "sae.safetensors"))
        d_in, n = cfg["d_in"], cfg["num_latents"]
        want = {"encoder.weight": (n, d_in), "encoder.bias": (n,), "W_dec": (n, d_in), "b_dec": (d_in,)}
        enc = t["encoder.weight"].T
        kind = f"sparsify {cfg['activation']}"
    for name, shape in want.items():
        if name not in t or t[name].shape != shape or t[name].dtype != np.float32:
            print(f"{d}: {name} missing or not float32 {shape}")
            return 1
    if len(sys.argv) > 3 and sys.argv[2] == "--sae-file":
        import h5py
        with h5py.File(sys.argv[3], "r") as f:
            b_enc = t["b_enc"] if "b_enc" in t else t["encoder.bias"]
            same = (np.array_equal(f["W_enc"][:], enc) and np.array_equal(f["W_dec"][:], t["W_dec"])
                    and np.array_equal(f["b_enc"][:], b_enc) and np.array_equal(f["b_dec"][:], t["b_dec"]))
            k = cfg.get("k")
            if k is not None and int(f.attrs["k"]) != k:
                same = False
            if not same:
                print(f"{d}: weights differ from {sys.argv[3]}")
                return 1
    norms = np.linalg.norm(t["W_dec"], axis=1)
    print(f"{d}: {kind} ok, d_in {d_in}, {t['W_dec'].shape[0]} latents, "
          f"decoder row norms {norms.min():.4f}-{norms.max():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
