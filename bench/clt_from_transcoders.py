#!/usr/bin/env python3
"""Writes a set of per-layer transcoders as one cross-layer transcoder with no cross-layer
decoders, in circuit-tracer's CLT layout, so that tools/splice_eval.py splices the set the way it
splices a CLT (every layer at once: the replacement model; and each layer alone).

    clt_from_transcoders.py OUT_DIR SET_DIR

SET_DIR is circuit-tracer's transcoder set as `sae-export --format circuit_tracer --layer l`
writes it, one export per layer into the same directory: layer_<l>.safetensors for l = 0..L-1,
each with W_enc [F, d], b_enc [F], W_dec [F, d], b_dec [d] and activation_function.threshold
[F] (a BatchTopK or JumpReLU transcoder; a TopK one has no threshold and is refused). OUT_DIR
gets per layer l W_enc_l.safetensors (W_enc_l [F, d], b_enc_l, b_dec_l, threshold_l) and
W_dec_l.safetensors (W_dec_l [F, L - l, d], the transcoder's decoder in block 0 and zeros for
the later layers), and config.yaml (model_kind: cross_layer_transcoder), as `sae-export --format
circuit_tracer` writes a CLT. Errors print one line `clt_from_transcoders: error: ...`, exit 1.
"""
import glob
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

PROG = "clt_from_transcoders"


def fail(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(1)


THRESHOLD = "activation_function.threshold"


def load_layer(path):
    """One layer's transcoder: W_enc [F, d], b_enc, W_dec [F, d], b_dec, threshold."""
    t = load_file(path)
    for name in ("W_enc", "b_enc", "W_dec", "b_dec", THRESHOLD):
        if name not in t:
            why = " (a TopK transcoder has no threshold: train BatchTopK or JumpReLU)" \
                if name == THRESHOLD else ""
            fail(f"{path}: no tensor '{name}'{why}")
    f, d = t["W_enc"].shape
    if t["W_dec"].shape != (f, d) or t["b_enc"].shape != (f,) or t["b_dec"].shape != (d,) \
            or t[THRESHOLD].shape != (f,):
        fail(f"{path}: shapes W_enc {t['W_enc'].shape}, W_dec {t['W_dec'].shape}, b_enc "
             f"{t['b_enc'].shape}, b_dec {t['b_dec'].shape}, threshold {t[THRESHOLD].shape} "
             f"are not one transcoder's")
    t["threshold"] = t.pop(THRESHOLD)
    return t


def main(argv):
    if len(argv) != 2 or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 1
    out, src = argv
    paths = []
    while os.path.exists(os.path.join(src, f"layer_{len(paths)}.safetensors")):
        paths.append(os.path.join(src, f"layer_{len(paths)}.safetensors"))
    if not paths:
        fail(f"{src}: no layer_0.safetensors (give a `sae-export --format circuit_tracer --layer "
             "l` directory)")
    extra = sorted(set(glob.glob(os.path.join(src, "layer_*.safetensors"))) - set(paths))
    if extra:
        fail(f"{extra[0]}: the layers are not 0..{len(paths) - 1} without a gap")
    layers = [load_layer(p) for p in paths]
    shape = layers[0]["W_enc"].shape
    for p, t in zip(paths, layers):
        if t["W_enc"].shape != shape:
            fail(f"{p}: W_enc {t['W_enc'].shape}, layer 0's {shape}: every layer needs the same "
                 "width and features")
    os.makedirs(out, exist_ok=True)
    n_layers = len(layers)
    for l, t in enumerate(layers):
        f, d = t["W_dec"].shape
        w_dec = np.zeros((f, n_layers - l, d), dtype=np.float32)
        w_dec[:, 0, :] = t["W_dec"]
        save_file({f"W_enc_{l}": t["W_enc"].astype(np.float32),
                   f"b_enc_{l}": t["b_enc"].astype(np.float32),
                   f"b_dec_{l}": t["b_dec"].astype(np.float32),
                   f"threshold_{l}": t["threshold"].astype(np.float32)},
                  os.path.join(out, f"W_enc_{l}.safetensors"))
        save_file({f"W_dec_{l}": w_dec}, os.path.join(out, f"W_dec_{l}.safetensors"))
    with open(os.path.join(out, "config.yaml"), "w") as fh:
        fh.write("# per-layer transcoders as a cross-layer transcoder with no cross-layer "
                 "decoders\n# (bench/clt_from_transcoders.py)\n")
        fh.write("model_kind: cross_layer_transcoder\nscan: saetrain-transcoders\n")
        fh.write("feature_input_hook: mlp.hook_in\nfeature_output_hook: hook_mlp_out\n")
    print(f"wrote {out}: {n_layers} layers of {shape[0]} features, d {shape[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
