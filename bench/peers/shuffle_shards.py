#!/usr/bin/env python3
"""Shuffles a dataset of activation shards once, globally, so every trainer of the peer
benchmark can then read it in order and see the same batches.

    python bench/peers/shuffle_shards.py IN_DIR OUT_DIR [--seed 0] [--rows-per-shard 131072]
    python bench/peers/shuffle_shards.py IN_DIR OUT_DIR --target IN_TARGET OUT_TARGET [...]

Reads every *.h5 shard of IN_DIR in name order (2-D dataset `activations` [rows, d_model] of
float32, float16, or bfloat16 stored as uint16 with attribute dtype="bfloat16"), applies one
random permutation of all rows (numpy.random.default_rng(seed).permutation) and writes float32
shards OUT_DIR/shard-00000.h5, shard-00001.h5, ... (dataset `activations`, with the attributes
model, hook and d_model of the first input shard copied and dtype="float32"). Output row j
is input row perm[j] of the concatenation of the input shards. The per-row datasets
`token_ids` and `positions`, when every input shard has them, are permuted alongside.

--target (transcoders: IN_DIR an MLP's input, IN_TARGET its output): the ONE permutation is
applied to both sets, which must hold the same number of rows (and, where both have
token_ids, the same token in every row: the pairs are checked before anything is written);
OUT_DIR and OUT_TARGET then hold the same shards of the same rows in the same order, with the
token ids saetrain's paired-set check (data.target_path) compares.

All input rows of one set are held in memory as float32 (rows x d_model x 4 bytes: 1.5 GB for
1M rows of d_model 384; the sets of a pair one after the other); each output shard is gathered
from them in turn. Any existing shard-*.h5 in an output directory is removed first, so a
smaller re-run leaves no stale shards behind.
"""
import argparse
import glob
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sae_eval import read_rows, shard_info  # noqa: E402

ROW_COLUMNS = ("token_ids", "positions")  # per-row datasets carried through the permutation


def read_column(path, name):
    """The 1-D per-row dataset `name` of every shard, concatenated; None if a shard lacks it."""
    import h5py

    parts = []
    for f, rows, _, _ in shard_info(path):
        with h5py.File(f, "r") as h:
            if name not in h or h[name].shape != (rows,):
                return None
            parts.append(h[name][:])
    return np.concatenate(parts)


def write_shuffled(in_dir, out_dir, perm, rows_per_shard, seed):
    """Writes the rows of in_dir permuted by perm as float32 shards in out_dir; the shard count."""
    import h5py

    attrs = shard_info(in_dir)[0][3]
    rows = read_rows(in_dir)
    if rows.shape[0] != len(perm):
        raise SystemExit(f"{in_dir}: {rows.shape[0]} rows, the permutation has {len(perm)}")
    columns = {name: read_column(in_dir, name) for name in ROW_COLUMNS}
    d = rows.shape[1]
    os.makedirs(out_dir, exist_ok=True)
    for old in glob.glob(os.path.join(out_dir, "shard-*.h5")):
        os.remove(old)
    n_out = 0
    for s, lo in enumerate(range(0, len(perm), rows_per_shard)):
        take = perm[lo:lo + rows_per_shard]
        path = os.path.join(out_dir, f"shard-{s:05d}.h5")
        tmp = path + ".tmp"
        with h5py.File(tmp, "w") as f:
            ds = f.create_dataset("activations", data=rows[take])
            for key in ("model", "hook"):
                if key in attrs:
                    v = attrs[key]
                    ds.attrs[key] = v.decode() if isinstance(v, bytes) else str(v)
            ds.attrs["d_model"] = np.int64(d)
            ds.attrs["dtype"] = "float32"
            ds.attrs["shuffle_seed"] = np.int64(seed)
            for name, col in columns.items():
                if col is not None:
                    f.create_dataset(name, data=col[take])
        os.replace(tmp, path)
        n_out += 1
    return n_out, rows.shape


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("in_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--target", nargs=2, metavar=("IN_TARGET", "OUT_TARGET"),
                    help="a paired set (an MLP's output beside its input in IN_DIR), "
                    "shuffled by the same permutation")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows-per-shard", type=int, default=131072)
    a = ap.parse_args()
    if a.rows_per_shard < 1:
        raise SystemExit("--rows-per-shard must be >= 1")

    t0 = time.time()
    info = shard_info(a.in_dir)
    n = sum(r for _, r, _, _ in info)
    if a.target:
        t_info = shard_info(a.target[0])
        t_n = sum(r for _, r, _, _ in t_info)
        if t_n != n:
            raise SystemExit(f"{a.target[0]} holds {t_n} rows, but {a.in_dir} holds {n}: "
                             "not a pair of one extraction")
        ta, tb = read_column(a.in_dir, "token_ids"), read_column(a.target[0], "token_ids")
        if ta is not None and tb is not None and not np.array_equal(ta, tb):
            row = int(np.flatnonzero(ta != tb)[0])
            raise SystemExit(f"{a.target[0]}: row {row} is token id {tb[row]}, but row {row} "
                             f"of {a.in_dir} is token id {ta[row]}: the rows are not aligned")
    perm = np.random.default_rng(a.seed).permutation(n)
    n_out, (_, d) = write_shuffled(a.in_dir, a.out_dir, perm, a.rows_per_shard, a.seed)
    print(f"shuffle_shards: {n} rows x {d} from {len(info)} shard(s) of {a.in_dir} -> "
          f"{n_out} float32 shard(s) in {a.out_dir} (seed {a.seed}, {time.time() - t0:.1f} s)")
    if a.target:
        n_out, (_, d) = write_shuffled(a.target[0], a.target[1], perm, a.rows_per_shard, a.seed)
        print(f"shuffle_shards: {n} rows x {d} from {len(t_info)} shard(s) of {a.target[0]} -> "
              f"{n_out} float32 shard(s) in {a.target[1]} (the same permutation, "
              f"{time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
