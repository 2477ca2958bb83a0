#!/usr/bin/env python3
"""features_page_bench.py: how long a feature page takes to open in headless Chromium.

    .venv/bin/python bench/features_page_bench.py [--latents 24576] [--screenshot PNG]
    .venv/bin/python bench/features_page_bench.py --page runs/minilm/report/features/topk-x16-k32

Without --page it writes a features.h5 of --latents latents (random figures, 20 top rows of 17
tokens each, 8 neighbours: the shapes sae-features writes) and sae-report's page for it, then
opens the page 3 times: the time from navigation to the list drawn (the page's own
performance.now() at the end of its start-up, data-load-ms), and to a latent's top rows shown
after a click, beside the target of 2 s.
"""
import argparse
import base64
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "python"))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from chromium import Chromium, wait_for  # noqa: E402


def fake_set(path, n, top=20, w=8, m=8, rows=1_000_000):
    import h5py
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        fires = rng.integers(0, rows // 10, n)
        f["frequency"] = fires / rows
        f["fire_count"] = fires
        f["mean_act"] = rng.random(n, np.float32)
        f["max_act"] = rng.random(n, np.float32) * 10
        f["hist"] = rng.integers(0, 1000, (n, 80))
        f["hist_edges"] = (10.0 ** (np.arange(81) / 10 - 4)).astype(np.float32)
        f["top_rows"] = rng.integers(0, rows, (n, top))
        f["top_acts"] = -np.sort(-rng.random((n, top), np.float32), axis=1)
        f["top_context_tokens"] = rng.integers(0, 30522, (n, top, 2 * w + 1), np.int32)
        f["neighbours"] = rng.integers(0, n, (n, m), np.int32)
        f["neighbour_cosine"] = rng.random((n, m), np.float32)
        for k, v in dict(format="saetrain-features 1", sae="fake", sae_id="fake", arch="topk",
                         data="fake", dataset="activations", contexts="token_ids").items():
            f.attrs[k] = v
        for k, v in dict(d_model=768, n_latents=n, rows=rows, ranks=1, top=top,
                         context=w).items():
            f.attrs[k] = v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latents", type=int, default=24576)
    ap.add_argument("--page", help="an existing feature page directory instead")
    ap.add_argument("--screenshot", help="write a PNG of the page with a latent open")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="features-page-")
    page = a.page
    if not page:
        from saereport.features import write_feature_set
        from saereport.read import ReportDir
        import h5py
        fake_set(os.path.join(tmp, "features.h5"), a.latents)
        os.makedirs(os.path.join(tmp, "page"))
        write_feature_set(h5py, "fake", os.path.join(tmp, "features.h5"),
                          ReportDir(os.path.join(tmp, "page")))
        page = os.path.join(tmp, "page")
    url = "file://" + os.path.abspath(os.path.join(page, "index.html"))
    b = Chromium(os.path.join(tmp, "chromium"))
    try:
        n = None
        for rep in range(3):
            t = time.monotonic()
            b.call("Page.navigate", url="about:blank")
            wait_for(lambda: b.eval("location.href") == "about:blank", "a blank page")
            t = time.monotonic()
            b.call("Page.navigate", url=url + f"?rep={rep}")
            wait_for(lambda: b.eval("document.body && document.body.dataset.ready") == "1",
                     "the page")
            listed = time.monotonic() - t
            own = float(b.eval("document.body.dataset.loadMs"))
            n = b.eval("document.getElementById('count').textContent")
            t = time.monotonic()
            b.eval("document.querySelector('#latents tbody tr').click()")
            wait_for(lambda: b.eval("document.getElementById('detail').dataset.ready") == "1",
                     "a latent's top rows")
            opened = time.monotonic() - t
            print(f"open {rep + 1}: list drawn {listed:.2f} s after navigation (the page's own "
                  f"start-up {own / 1e3:.2f} s), a latent's top rows {opened:.2f} s after its "
                  f"click; target 2 s; {n}")
        if a.screenshot:
            shot = b.call("Page.captureScreenshot", format="png")["result"]["data"]
            with open(a.screenshot, "wb") as f:
                f.write(base64.b64decode(shot))
            print(f"wrote {a.screenshot}")
    finally:
        b.close()


if __name__ == "__main__":
    main()
