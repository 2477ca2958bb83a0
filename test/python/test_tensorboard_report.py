"""What researchers open after a run: out_dir/tb/ read by TensorBoard's own loader, and
sae-report's plots and page.

- TensorBoard (EventAccumulator, the loader behind its UI) reads every scalar of a 2-SAE sweep
  with the values and steps of metrics.jsonl (float32 rounding apart);
- a run killed mid-way and resumed has each step once, in increasing order, equal to the cut
  and continued metrics.jsonl;
- a copy of the event file torn inside its last record still loads every complete record;
- sae-report writes PNG + SVG plots whose SVGs carry one series per SAE (loss, fvu, l0, dead,
  lr, frontier, density) and an index.html with the summary and the gates; it works on a run in
  progress (torn metrics.jsonl, no summary.csv, no density files yet) and ends with one clear
  line on a directory that is not a run.

    SAETRAIN_BIN_DIR=build/cpu/apps .venv/bin/python -m pytest test/python/test_tensorboard_report.py
"""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from strict import need_module, skip_module  # noqa: E402

need_module("tensorboard")
need_module("matplotlib")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
BIN = os.environ.get("SAETRAIN_BIN_DIR", "")
if not (BIN and os.path.exists(os.path.join(BIN, "saetrain"))):
    skip_module("SAETRAIN_BIN_DIR does not hold the built saetrain apps")

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
PLOTS = ["loss", "fvu", "l0", "dead", "lr", "frontier", "density"]


def _run(*cmd, env=None, ok=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env or ENV,
                       timeout=300)
    if ok:
        assert r.returncode == 0, " ".join(map(str, cmd)) + "\n" + r.stdout + r.stderr
    return r


def _config(root, out, extra=""):
    cfg = root / f"cfg-{out.name}.yaml"
    cfg.write_text(
        f"run: {{out_dir: {out}}}\n"
        f"data: {{path: {root / 'synth'}, batch_size: 64, epochs: 1, eval_rows: 1000}}\n"
        "sae: {expansion: 4, k: 4}\n"
        "train: {lr: 0.01}\n"
        f"log: {{every_steps: 10, eval_every_steps: 50}}\n{extra}")
    return cfg


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tbreport")
    _run(os.path.join(BIN, "sae-synth"), "--out", root / "synth", "--d-model", "16",
         "--features", "48", "--rows", "8000", "--shards", "2", "--seed", "3")
    return root


@pytest.fixture(scope="module")
def sweep(root):
    """A finished 2-SAE sweep (TopK and BatchTopK, one per rank)."""
    out = root / "sweep"
    cfg = _config(root, out, "checkpoint: {every_steps: 1000}\n")
    _run("mpirun", "--oversubscribe", "-np", "2", os.path.join(BIN, "saetrain"), cfg,
         "--set", "sae.arch=[topk, batchtopk]")
    return out


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _tb_scalars(out):
    """{tag: [(step, value)]} as TensorBoard's loader sees tb/."""
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(str(out / "tb"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _expected(rows):
    """{tag: [(step, value)]} from metrics.jsonl rows, with tensorboard.h's tag names. The end
    of a run logs its last step again with the held-out figures (the later line wins): in
    TensorBoard each tag has that step once."""
    want = {}
    for r in rows:
        for key, v in r.items():
            if key in ("sae", "step"):
                continue
            pts = want.setdefault(f"{r['sae']}/{key.replace('_fraction', '_frac')}", {})
            pts[r["step"]] = float(v)
    return {tag: sorted(pts.items()) for tag, pts in want.items()}


def _assert_same(got, want):
    assert sorted(got) == sorted(want)
    for tag, pts in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in pts], tag
        for (_, g), (_, w) in zip(got[tag], pts):
            assert g == pytest.approx(w, rel=1e-6, abs=1e-30), tag  # simple_value is a float


def test_tensorboard_reads_the_sweep_as_metrics_jsonl(sweep):
    files = os.listdir(sweep / "tb")
    assert len(files) == 1 and files[0].startswith("events.out.tfevents."), files
    got = _tb_scalars(sweep)
    rows = _metrics(sweep)
    _assert_same(got, _expected(rows))
    for sae in {r["sae"] for r in rows}:
        for m in ("fvu", "l0", "dead_frac", "lr", "tokens_per_s", "eval_fvu"):
            assert f"{sae}/{m}" in got, (sae, m)


def test_resumed_run_has_each_step_once(root):
    out = root / "resumed"
    cfg = _config(root, out, "checkpoint: {every_steps: 40}\n")
    saetrain = os.path.join(BIN, "saetrain")
    # Stopped by SIGUSR1 at iteration 45: a checkpoint is committed there (exit 75), 10..40
    # logged. Resumed, then SIGKILLed at iteration 75, before the next checkpoint (80): 50..70
    # are logged after the checkpoint the next resume continues from.
    r = _run(saetrain, cfg, env=dict(ENV, SAETRAIN_FAULT="0:45:USR1"), ok=False)
    assert r.returncode == 75, r.stdout + r.stderr
    r = _run(saetrain, cfg, env=dict(ENV, SAETRAIN_FAULT="0:75:KILL"), ok=False)
    assert r.returncode != 0
    before = _tb_scalars(out)
    logged = [s for s, _ in before["topk-x4-k4/fvu"]]
    assert logged[-3:] == [50, 60, 70], logged  # (the stop logs its own step too)
    r = _run(saetrain, cfg)
    m = re.search(r"resumed from the checkpoint at step (\d+)", r.stdout)
    assert m, r.stdout
    at = int(m.group(1))
    assert 45 <= at < 50
    got = _tb_scalars(out)
    steps = [s for s, _ in got["topk-x4-k4/fvu"]]
    assert steps == sorted(set(steps)) and steps[-1] == 110, steps  # each once, increasing
    assert steps == [s for s in logged if s <= at] + list(range(50, 111, 10))
    assert len(os.listdir(out / "tb")) == 1
    _assert_same(got, _expected(_metrics(out)))
    # The steps up to the checkpoint kept their first run's values.
    kept = len([s for s in logged if s <= at])
    assert got["topk-x4-k4/fvu"][:kept] == before["topk-x4-k4/fvu"][:kept]


def test_torn_event_file_loads_its_complete_records(sweep, tmp_path):
    src = sweep / "tb" / os.listdir(sweep / "tb")[0]
    torn = tmp_path / "torn"
    (torn / "tb").mkdir(parents=True)
    data = src.read_bytes()
    (torn / "tb" / src.name).write_bytes(data[:-7])  # inside the last record's payload
    full, cut = _tb_scalars(sweep), _tb_scalars(torn)
    assert sorted(full) == sorted(cut)
    n_full = sum(len(v) for v in full.values())
    n_cut = sum(len(v) for v in cut.values())
    # Exactly the torn last event's values are lost (events as TensorBoard's raw loader reads
    # them, file-version event first).
    from tensorboard.backend.event_processing import event_file_loader

    events = list(event_file_loader.EventFileLoader(str(src)).Load())
    assert events[0].file_version == "brain.Event:2"
    assert len(list(event_file_loader.EventFileLoader(str(torn / "tb" / src.name)).Load())) \
        == len(events) - 1
    assert n_full - n_cut == len(events[-1].summary.value) > 0
    for tag, pts in cut.items():
        assert pts == full[tag][:len(pts)]


def _series_in_svg(path):
    return path.read_text(encoding="utf-8").count('id="series-')


def test_report_plots_carry_one_series_per_sae(sweep):
    r = _run(os.path.join(BIN, "sae-report"), sweep)
    assert "index.html" in r.stdout
    report = sweep / "report"
    manifest = json.loads((report / "manifest.json").read_text())["plots"]
    assert list(manifest) == PLOTS
    saes = sorted({row["sae"] for row in _metrics(sweep)})
    for name in PLOTS:
        assert sorted(manifest[name]["series"]) == saes, name
        assert (report / f"{name}.png").stat().st_size > 1000
        assert _series_in_svg(report / f"{name}.svg") == len(saes), name
    page = (report / "index.html").read_text(encoding="utf-8")
    for name in PLOTS:
        assert f'src="{name}.svg"' in page
    for sae in saes:
        assert sae in page
    assert "Quality gates" in page and ("PASS" in page or "FAIL" in page)


def test_report_on_a_run_in_progress(sweep, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(sweep, live, ignore=shutil.ignore_patterns("report"))
    for f in ("summary.csv", "COMPLETE"):
        (live / f).unlink()
    for d in (live / "sae").iterdir():
        (d / "feature_density.csv").unlink()
    text = (live / "metrics.jsonl").read_text()
    (live / "metrics.jsonl").write_text(text[: len(text) - 40])  # torn last line
    from sae_report import build_report

    manifest = build_report(str(live))
    saes = sorted({json.loads(line)["sae"] for line in text.splitlines()})
    for name in ["loss", "fvu", "l0", "dead", "lr", "frontier"]:
        assert sorted(manifest[name]["series"]) == saes
        assert _series_in_svg(live / "report" / f"{name}.svg") == len(saes)
    assert manifest["density"]["series"] == []
    assert "in progress" in (live / "report" / "index.html").read_text()


def test_report_errors_are_one_line(tmp_path):
    for target, needle in [(tmp_path / "absent", "no such directory"),
                           (tmp_path, "metrics.jsonl")]:
        r = _run(os.path.join(BIN, "sae-report"), target, ok=False)
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sae-report: error:"), r.stderr
        assert needle in lines[0]
    (tmp_path / "metrics.jsonl").write_text("")
    r = _run(os.path.join(BIN, "sae-report"), tmp_path, ok=False)
    assert r.returncode == 1 and "no metrics rows yet" in r.stderr
