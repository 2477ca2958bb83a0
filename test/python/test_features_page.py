"""The feature pages sae-report writes from sae-features' output, read in headless Chromium.

A TopK SAE is trained on shards with token ids (test_sae_features' fixture data), sae-features
writes RUN/features/<id>/features.h5, and sae-report writes report/features/. The test then
checks, in Chromium and against features.h5:
- the run's report links the feature page, and the page lists every latent, sorted by frequency
  (and by max activation when asked), 100 a page;
- a click on a latent shows its top rows, activations and token windows (each token with the
  latent's activation on it), its sample of firings and its neighbours, as the file holds them;
  #latent=ID opens one;
- tokens shown as text from the vocab.json beside the shards; a search by latent id, by token
  id and by token text (latents whose top rows are that token) lists exactly the latents the
  file says; dead latents are listed;
- the tokens each latent promotes and suppresses (an unembedding.h5 beside the shards), as text;
- shards without token ids: the page says why it shows no tokens (nor logit tables: no
  unembedding).

    SAETRAIN_BIN_DIR=build/cpu/apps .venv/bin/python -m pytest test/python/test_features_page.py
"""
import json
import os
import sys

import numpy as np
import pytest

from strict import need_module  # noqa: E402

need_module("h5py")
import h5py  # noqa: E402

from test_sae_features import BIN, ROOT, _mpirun, _run, write_data  # noqa: E402
from chromium import Chromium, wait_for  # noqa: E402

REPORT = os.path.join(ROOT, "tools", "sae_report.py")


def make_run(tmp, token_ids):
    data = tmp / "data"
    write_data(str(data), np.random.default_rng(11), token_ids=token_ids)
    if token_ids:  # a vocabulary beside the shards and an unembedding in their parent, as
        # tools/extract_activations.py --unembedding writes them
        (data / "vocab.json").write_text(json.dumps([f"w{i}" for i in range(1000)]))
        with h5py.File(tmp / "unembedding.h5", "w") as f:  # the data's parent
            f.create_dataset("W_U", data=np.random.default_rng(12).standard_normal(
                (1000, 16)).astype(np.float32))
    run = tmp / "run"
    _run(_mpirun(1, os.path.join(BIN, "saetrain"), os.path.join(ROOT, "configs/quickstart.yaml"),
                 "--overwrite", "--set", f"run.out_dir={run}", "--set", f"data.path={data}",
                 "--set", "sae.expansion=16", "--set", "sae.k=4", "--set", "data.epochs=2",
                 "--set", "data.batch_size=250", "--set", "data.shuffle_buffer_rows=0",
                 "--set", "checkpoint.every_steps=1000"), cwd=str(tmp))
    (sae_dir,) = list((run / "sae").iterdir())
    _run([os.path.join(BIN, "sae-features"), sae_dir, "--top", 7, "--context", 3], cwd=str(tmp))
    _run([sys.executable, REPORT, run])
    return run, sae_dir.name


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    b = Chromium(str(tmp_path_factory.mktemp("chromium")))
    yield b
    b.close()


def open_page(browser, url):
    browser.call("Page.navigate", url=url)
    wait_for(lambda: browser.eval("document.body && document.body.dataset.ready") == "1",
             f"{url} to load")


LIST = """[...document.querySelectorAll('#latents tbody tr')].map(
  (tr) => [...tr.cells].map((c) => c.textContent))"""
DETAIL = """(() => {
  const d = document.getElementById('detail');
  if (d.dataset.ready !== '1') return null;
  return {latent: Number(d.dataset.latent),
          rows: [...d.querySelectorAll('#top tr[data-row]')].map((tr) => Number(tr.dataset.row)),
          acts: [...d.querySelectorAll('#top tr[data-row]')].map((tr) => Number(tr.cells[1].textContent)),
          tokens: [...d.querySelectorAll('#top tr[data-row]')].map((tr) =>
            [...tr.querySelectorAll('.tok')].map((s) => s.textContent)),
          here: [...d.querySelectorAll('#top .tok.here')].map((s) => s.textContent),
          shade: [...d.querySelectorAll('#top tr[data-row]')].map((tr) =>
            [...tr.querySelectorAll('.tok')].map((s) => Number(s.dataset.act))),
          neighbours: [...d.querySelectorAll('#neighbours a.lat')].map((a) => Number(a.dataset.latent)),
          bars: [...d.querySelectorAll('#hist rect')].map((r) => Number(r.dataset.count)),
          sample: [...d.querySelectorAll('#sample tr[data-row]')].map((tr) => Number(tr.dataset.row)),
          promotes: [...d.querySelectorAll('#logits .pos .tok')].map((s) => s.textContent),
          suppresses: [...d.querySelectorAll('#logits .neg .tok')].map((s) => s.textContent),
          no_logits: d.querySelector('#no-logits')?.textContent ?? null,
          no_text: d.querySelector('#no-text')?.textContent ?? null};
})()"""


def test_the_page_lists_sorts_opens_and_searches_latents(tmp_path, browser):
    run, sae = make_run(tmp_path, token_ids=True)
    with h5py.File(run / "features" / sae / "features.h5") as f:
        h = {k: f[k][()] for k in f}
    n = len(h["frequency"])
    index = (run / "report" / "index.html").read_text()
    assert f'href="features/{sae}/index.html"' in index
    open_page(browser, f"file://{run}/report/features/{sae}/index.html")
    rows = browser.eval(LIST)
    by_freq = sorted(range(n), key=lambda i: (-h["frequency"][i], i))
    assert [int(r[0]) for r in rows] == by_freq[:100]
    assert browser.eval("document.getElementById('count').textContent") == f"{n} of {n} latents"
    browser.eval("document.getElementById('sort').value = 'max';"
                 "document.getElementById('sort').onchange()")
    by_max = sorted(range(n), key=lambda i: (-h["max_act"][i], i))
    assert [int(r[0]) for r in browser.eval(LIST)] == by_max[:100]
    # A click on a latent's row opens it: its top rows as the file holds them.
    latent = by_freq[3]
    browser.eval(f"document.querySelector('#latents tr[data-latent=\"{latent}\"]').click()")
    d = wait_for(lambda: (lambda x: x if x and x["latent"] == latent else None)(
        browser.eval(DETAIL)), "the latent's top rows")
    k = int((h["top_rows"][latent] >= 0).sum())
    assert d["rows"] == h["top_rows"][latent][:k].tolist()
    assert np.allclose(d["acts"], h["top_acts"][latent][:k], rtol=1e-3)
    want = [["\u00b7" if t < 0 else f"w{t}" for t in w] for w in h["top_context_tokens"][latent][:k]]
    assert d["tokens"] == want
    assert d["here"] == [f"w{t}" for t in h["top_context_tokens"][latent][:k, 3]]
    assert np.allclose(d["shade"], h["top_context_acts"][latent][:k], rtol=1e-3)
    assert d["neighbours"] == h["neighbours"][latent].tolist()
    assert d["bars"] == h["hist"][latent].tolist() and d["no_text"] is None
    assert d["sample"] == h["sample_rows"][latent][h["sample_rows"][latent] >= 0].tolist()
    assert len(d["sample"]) > 0
    # Its logit tables, as text: the tokens it promotes and suppresses most.
    assert d["promotes"] == [f"w{t}" for t in h["logit_pos_ids"][latent]]
    assert d["suppresses"] == [f"w{t}" for t in h["logit_neg_ids"][latent]]
    assert len(d["promotes"]) == 10 and d["no_logits"] is None
    # #latent=ID opens one directly; a neighbour's link opens the neighbour.
    other = int(h["neighbours"][latent][0])
    browser.eval(f"document.querySelector('#neighbours a.lat[data-latent=\"{other}\"]').click()")
    d = wait_for(lambda: (lambda x: x if x and x["latent"] == other else None)(
        browser.eval(DETAIL)), "the neighbour's page")
    assert d["rows"] == h["top_rows"][other][h["top_rows"][other] >= 0].tolist()
    # Search by id, then by token: the latents whose top rows are that token.
    search = ("(q) => { const s = document.getElementById('search'); s.value = q; s.oninput(); "
              "return document.getElementById('count').textContent; }")
    assert browser.eval(f"({search})('{latent}')") == f"1 of {n} latents"
    assert [int(r[0]) for r in browser.eval(LIST)] == [latent]
    token = int(h["top_context_tokens"][latent][0, 3])
    centre = h["top_context_tokens"][:, :, 3]
    have = [i for i in by_max if token in centre[i][h["top_rows"][i] >= 0].tolist()]
    assert browser.eval(f"({search})('token:{token}')") == f"{len(have)} of {n} latents"
    assert [int(r[0]) for r in browser.eval(LIST)] == have[:100]
    assert browser.eval(f"({search})('token:w{token}')") == f"{len(have)} of {n} latents"
    dead = [i for i in range(n) if h["fire_count"][i] == 0]
    assert browser.eval("document.getElementById('dead-count').textContent") == str(len(dead))


def test_without_token_ids_the_page_says_why(tmp_path, browser):
    run, sae = make_run(tmp_path, token_ids=False)
    open_page(browser, f"file://{run}/report/features/{sae}/index.html#latent=0")
    d = wait_for(lambda: browser.eval(DETAIL), "latent 0's page")
    assert d["latent"] == 0 and d["tokens"] == [[] for _ in d["rows"]]
    assert "has no 'token_ids' dataset" in d["no_text"]
    assert d["promotes"] == [] and "no unembedding.h5 beside the data" in d["no_logits"]
    listing = (run / "report" / "features" / "index.html").read_text()
    assert f'href="{sae}/index.html"' in listing


def test_a_damaged_features_file_is_one_line(tmp_path):
    run, sae = make_run(tmp_path, token_ids=False)
    path = run / "features" / sae / "features.h5"
    with h5py.File(path, "r+") as f:
        del f["top_rows"]
    r = _run([sys.executable, REPORT, run], ok=False)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "damaged features file" in lines[0] and str(path) in lines[0]

