#!/usr/bin/env python3
"""Writes the h5py-made test fixtures in test/data (committed; re-run only to regenerate).

Shards written by plain h5py must load in saetrain. Both files hold a 37x16 array with
value[i, j] = i * 0.5 - j, which is exact in float16 too, so tests compare with the formula.
  h5py_plain.h5        float32, contiguous, no attributes: exactly create_dataset(data=arr)
  h5py_f16_chunked.h5  float16, chunks (8, 16), h5py's variable-length string attributes
"""
import os

import h5py
import numpy as np

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "data")
os.makedirs(here, exist_ok=True)
i, j = np.meshgrid(np.arange(37), np.arange(16), indexing="ij")
arr = (i * 0.5 - j).astype(np.float32)

with h5py.File(os.path.join(here, "h5py_plain.h5"), "w") as f:
    f.create_dataset("activations", data=arr)

with h5py.File(os.path.join(here, "h5py_f16_chunked.h5"), "w") as f:
    f.attrs["model"] = "gpt2-small"
    d = f.create_dataset("activations", data=arr.astype(np.float16), chunks=(8, 16))
    d.attrs["hook"] = "blocks.6.hook_resid_post"
