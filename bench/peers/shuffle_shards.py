#!/usr/bin/env python3
"""Shuffles a dataset of activation shards once, globally, so every trainer of the peer
benchmark can then read it in order and see the same batches.

    python bench/peers/shuffle_shards.py IN_DIR OUT_DIR [--seed 0] [--rows-per-shard 131072]

Reads every *.h5 shard of IN_DIR in name order (2-D dataset `activations` [rows, d_model] of
float32, float16, or bfloat16 stored as uint16 with attribute dtype="bfloat16"), applies one
random permutation of all rows (numpy.random.default_rng(seed).permutation) and writes float32
shards OUT_DIR/shard-00000.h5, shard-00001.h5, ... (dataset `activations`, with the attributes
model, hook and d_model of the first input shard copied and dtype="float32"). Output row j
is input row perm[j] of the concatenation of the input shards.

All input rows are held in memory as float32 (rows x d_model x 4 bytes: 1.5 GB for 1M rows of
d_model 384); each output shard is gathered from them in turn. Any existing shard-*.h5 in
OUT_DIR is removed first, so a smaller re-run leaves no stale shards behind.
"""
import argparse
import glob
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sae_eval import read_rows, shard_info  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("in_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows-per-shard", type=int, default=131072)
    a = ap.parse_args()
    if a.rows_per_shard < 1:
        raise SystemExit("--rows-per-shard must be >= 1")
    import h5py

    t0 = time.time()
    info = shard_info(a.in_dir)
    attrs = info[0][3]
    rows = read_rows(a.in_dir)
    n, d = rows.shape
    perm = np.random.default_rng(a.seed).permutation(n)

    os.makedirs(a.out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(a.out_dir, "shard-*.h5")):
        os.remove(old)
    n_out = 0
    for s, lo in enumerate(range(0, n, a.rows_per_shard)):
        block = rows[perm[lo:lo + a.rows_per_shard]]
        path = os.path.join(a.out_dir, f"shard-{s:05d}.h5")
        tmp = path + ".tmp"
        with h5py.File(tmp, "w") as f:
            ds = f.create_dataset("activations", data=block)
            for key in ("model", "hook"):
                if key in attrs:
                    v = attrs[key]
                    ds.attrs[key] = v.decode() if isinstance(v, bytes) else str(v)
            ds.attrs["d_model"] = np.int64(d)
            ds.attrs["dtype"] = "float32"
            ds.attrs["shuffle_seed"] = np.int64(a.seed)
        os.replace(tmp, path)
        n_out += 1
    print(f"shuffle_shards: {n} rows x {d} from {len(info)} shard(s) of {a.in_dir} -> "
          f"{n_out} float32 shard(s) in {a.out_dir} (seed {a.seed}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
