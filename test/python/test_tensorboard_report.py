"""What researchers open after a run: out_dir/tb/ read by TensorBoard's own loader, and
sae-report's plots and page.

TensorBoard (its EventMultiplexer and EventAccumulator, the loaders behind its UI):
- tb/ holds one run per SAE (tb/<id>/, nothing at the top, so no run "."), every run with the
  same tags (train/*, perf/*, held_out/*), so a sweep overlays on one chart per tag, carrying
  the values and steps of metrics.jsonl (float32 rounding apart);
- each run has a text summary "config" (TensorBoard's text plugin): the SAE's settings and the
  resolved config.yaml;
- a run killed mid-way and resumed has each step once, in increasing order, equal to the cut
  and continued metrics.jsonl; a copy of an event file torn inside its last record still loads
  every complete record.

sae-report (tools/sae_report.py):
- PNG + SVG plots whose SVGs carry one series per SAE, in one colour per SAE on every plot;
  held-out curves beside the training ones; the loss split per architecture and titled with
  its objective; dead % from 0, token axes in K/M, log axes labelled;
- the lr plot is every step of the schedule, and that schedule (lr_at, a copy of
  src/core/schedule.cpp) equals the LR saetrain logged at every step, for cosine, linear and
  cosine_restarts schedules with warm-up;
- the page: version, dates, hosts, data path and the resolved config; the summary with the
  columns empty for every SAE left out; each failing gate with the console's reason; nothing
  linked outside report/, so report/ copied alone works;
- the run's state from disk: running, stopped (a real SIGTERM, exit 75), killed (SIGKILL),
  failed (exit 1, with the error), complete; a run in progress and a directory that is not a
  run;
- sae-report runs without the .venv (Debian's python3-matplotlib, tools/install-deps.sh) and
  never imports PyTorch.

    SAETRAIN_BIN_DIR=build/cpu/apps .venv/bin/python -m pytest \
        test/python/test_tensorboard_report.py
"""
import csv
import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pytest

from strict import STRICT, need_module, skip_module  # noqa: E402

need_module("tensorboard")
need_module("matplotlib")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
BIN = os.environ.get("SAETRAIN_BIN_DIR", "")
if not (BIN and os.path.exists(os.path.join(BIN, "saetrain"))):
    skip_module("SAETRAIN_BIN_DIR does not hold the built saetrain apps")

import sae_report  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
PLOTS = ["loss", "fvu", "l0", "dead", "lr", "frontier", "density"]
SAETRAIN = os.path.join(BIN, "saetrain")
REPORT = os.path.join(BIN, "sae-report")


def _run(*cmd, env=None, ok=True):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env or ENV,
                       timeout=300)
    if ok:
        assert r.returncode == 0, " ".join(map(str, cmd)) + "\n" + r.stdout + r.stderr
    return r


def _config(root, out, extra="", log="log: {every_steps: 10, eval_every_steps: 50}\n",
            data_extra=""):
    cfg = root / f"cfg-{out.name}.yaml"
    cfg.write_text(
        f"run: {{out_dir: {out}}}\n"
        f"data: {{path: {root / 'synth'}, batch_size: 64, epochs: 1, eval_rows: 1000"
        f"{data_extra}}}\n"
        "sae: {expansion: 4, k: 4}\n"
        "train: {lr: 0.01}\n"
        f"{log}{extra}")
    return cfg


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tbreport")
    _run(os.path.join(BIN, "sae-synth"), "--out", root / "synth", "--d-model", "16",
         "--features", "48", "--rows", "8000", "--shards", "2", "--seed", "3")
    return root


@pytest.fixture(scope="module")
def sweep(root):
    """A finished 2-SAE sweep (TopK and BatchTopK, one per rank), and its console output."""
    out = root / "sweep"
    cfg = _config(root, out, "checkpoint: {every_steps: 1000}\n")
    r = _run("mpirun", "--oversubscribe", "-np", "2", SAETRAIN, cfg,
             "--set", "sae.arch=[topk, batchtopk]")
    (root / "sweep.console").write_text(r.stdout)
    return out


@pytest.fixture(scope="module")
def report(sweep):
    r = _run(REPORT, sweep)
    assert "index.html" in r.stdout
    return sweep / "report"


def _metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _summary(out):
    with open(out / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


# --- TensorBoard -------------------------------------------------------------------------------

PERF = {"tokens_per_s", "read_MBps", "wait_frac", "elapsed_s", "tflops", "mfu",
        "gpu_mem_peak_GB", "host_mem_peak_GB", "cpu_threads"}


def _tag(key):
    """tensorboard.h's tag for a metrics.jsonl key."""
    key = key.replace("_fraction", "_frac")
    if key.startswith("eval_"):
        return "held_out/" + key[5:]
    return ("perf/" if key in PERF else "train/") + key


def _mux(out):
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.backend.event_processing import event_multiplexer as em

    mux = em.EventMultiplexer(size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    mux.AddRunsFromDirectory(str(out / "tb"))
    mux.Reload()
    return mux


def _tb_runs(out):
    """{run: {tag: [(step, value)]}} as TensorBoard sees out/tb."""
    mux = _mux(out)
    return {run: {tag: [(e.step, e.value) for e in mux.Scalars(run, tag)]
                  for tag in tags["scalars"]}
            for run, tags in mux.Runs().items()}


def _expected(rows):
    """{sae: {tag: [(step, value)]}} from metrics.jsonl rows. The end of a run logs its last
    step again with the held-out figures (the later line wins): in TensorBoard each tag has
    that step once."""
    want = {}
    for r in rows:
        for key, v in r.items():
            if key in ("sae", "step"):
                continue
            want.setdefault(r["sae"], {}).setdefault(_tag(key), {})[r["step"]] = float(v)
    return {sae: {tag: sorted(pts.items()) for tag, pts in tags.items()}
            for sae, tags in want.items()}


def _assert_same(got, want):
    assert sorted(got) == sorted(want)
    for tag, pts in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in pts], tag
        for (_, g), (_, w) in zip(got[tag], pts):
            assert g == pytest.approx(w, rel=1e-6, abs=1e-30), tag  # simple_value is a float


def test_tensorboard_has_one_run_per_sae_with_shared_tags(sweep):
    rows = _metrics(sweep)
    saes = sorted({r["sae"] for r in rows})
    assert sorted(os.listdir(sweep / "tb")) == saes  # no event file at the top: no run "."
    for sae in saes:
        files = os.listdir(sweep / "tb" / sae)
        assert len(files) == 1 and files[0].startswith("events.out.tfevents."), files
    runs = _tb_runs(sweep)
    assert sorted(runs) == saes
    want = _expected(rows)
    for sae in saes:
        _assert_same(runs[sae], want[sae])
    tags = {sae: set(runs[sae]) for sae in saes}
    assert tags[saes[0]] == tags[saes[1]]  # a sweep overlays: the same tags in every run
    for tag in ("train/fvu", "train/l0", "train/dead_frac", "train/lr", "train/loss",
                "perf/tokens_per_s", "held_out/fvu", "held_out/l0", "held_out/dead_frac",
                "held_out/dense_frac"):
        assert tag in tags[saes[0]], tag
    # Held-out scalars under their own tags, at the evaluated steps only (every 50 and the end).
    evaluated = sorted({r["step"] for r in rows if r["sae"] == saes[0] and "eval_fvu" in r})
    assert evaluated[:2] == [50, 100] and len(evaluated) == 3
    assert [s for s, _ in runs[saes[0]]["held_out/fvu"]] == evaluated


def test_tensorboard_has_the_config_as_a_text_summary(sweep):
    mux = _mux(sweep)
    config = (sweep / "config.yaml").read_text()
    for sae in sorted(os.listdir(sweep / "tb")):
        assert mux.Runs()[sae]["tensors"] == ["config"]
        assert mux.SummaryMetadata(sae, "config").plugin_data.plugin_name == "text"
        events = mux.Tensors(sae, "config")
        assert [e.step for e in events] == [0]
        text = events[0].tensor_proto.string_val[0].decode()
        assert f"**{sae}**" in text
        assert f"| arch | {sae.split('-')[0]} |" in text
        assert "```yaml\n" + config + "```" in text


def test_resumed_run_has_each_step_once(root):
    out = root / "resumed"
    cfg = _config(root, out, "checkpoint: {every_steps: 40}\n")
    # Stopped by SIGUSR1 at iteration 45: a checkpoint is committed there (exit 75), 10..40
    # logged. Resumed, then SIGKILLed at iteration 75, before the next checkpoint (80): 50..70
    # are logged after the checkpoint the next resume continues from.
    r = _run(SAETRAIN, cfg, env=dict(ENV, SAETRAIN_FAULT="0:45:USR1"), ok=False)
    assert r.returncode == 75, r.stdout + r.stderr
    r = _run(SAETRAIN, cfg, env=dict(ENV, SAETRAIN_FAULT="0:75:KILL"), ok=False)
    assert r.returncode != 0
    before = _tb_runs(out)["topk-x4-k4"]
    logged = [s for s, _ in before["train/fvu"]]
    assert logged[-3:] == [50, 60, 70], logged  # (the stop logs its own step too)
    r = _run(SAETRAIN, cfg)
    m = re.search(r"resumed from the checkpoint at step (\d+)", r.stdout)
    assert m, r.stdout
    at = int(m.group(1))
    assert 45 <= at < 50
    runs = _tb_runs(out)
    got = runs["topk-x4-k4"]
    steps = [s for s, _ in got["train/fvu"]]
    assert steps == sorted(set(steps)) and steps[-1] == 110, steps  # each once, increasing
    assert steps == [s for s in logged if s <= at] + list(range(50, 111, 10))
    assert os.listdir(out / "tb") == ["topk-x4-k4"]
    assert len(os.listdir(out / "tb" / "topk-x4-k4")) == 1
    _assert_same(got, _expected(_metrics(out))["topk-x4-k4"])
    # The steps up to the checkpoint kept their first run's values.
    kept = len([s for s in logged if s <= at])
    assert got["train/fvu"][:kept] == before["train/fvu"][:kept]
    # The config text of each start: the first run's (step 0) and the resume's.
    texts = _mux(out).Tensors("topk-x4-k4", "config")
    assert [e.step for e in texts] == [0, at]


def test_torn_event_file_loads_its_complete_records(sweep, tmp_path):
    sae = sorted(os.listdir(sweep / "tb"))[0]
    src = sweep / "tb" / sae / os.listdir(sweep / "tb" / sae)[0]
    torn = tmp_path / "torn"
    (torn / "tb" / sae).mkdir(parents=True)
    data = src.read_bytes()
    (torn / "tb" / sae / src.name).write_bytes(data[:-7])  # inside the last record's payload
    full, cut = _tb_runs(sweep)[sae], _tb_runs(torn)[sae]
    assert sorted(full) == sorted(cut)
    n_full = sum(len(v) for v in full.values())
    n_cut = sum(len(v) for v in cut.values())
    # Exactly the torn last event's values are lost (events as TensorBoard's raw loader reads
    # them, file-version event first).
    from tensorboard.backend.event_processing import event_file_loader

    events = list(event_file_loader.EventFileLoader(str(src)).Load())
    assert events[0].file_version == "brain.Event:2"
    assert len(list(event_file_loader.EventFileLoader(str(torn / "tb" / sae / src.name))
                    .Load())) == len(events) - 1
    assert n_full - n_cut == len(events[-1].summary.value) > 0
    for tag, pts in cut.items():
        assert pts == full[tag][:len(pts)]


# --- the report's plots ------------------------------------------------------------------------

def _svg_group(path, gid):
    """The SVG text of the element with id `gid` (its whole subtree), or None."""
    for el in ET.parse(path).iter():
        if el.get("id") == gid:
            return ET.tostring(el, encoding="unicode")
    return None


def _series_in_svg(path):
    return path.read_text(encoding="utf-8").count('id="series-')


def test_report_plots_carry_one_series_per_sae_in_one_colour(sweep, report):
    manifest = json.loads((report / "manifest.json").read_text())
    plots, colors = manifest["plots"], manifest["colors"]
    assert list(plots) == PLOTS
    saes = sorted({row["sae"] for row in _metrics(sweep)})
    assert sorted(colors) == saes and len(set(colors.values())) == len(saes)
    index = {sae: i for i, sae in enumerate(colors)}  # series-<n>: the SAE's place in the run
    for name in PLOTS:
        assert sorted(plots[name]["series"]) == saes, name
        assert plots[name]["colors"] == {s: colors[s] for s in plots[name]["series"]}, name
        assert (report / f"{name}.png").stat().st_size > 1000
        svg = report / f"{name}.svg"
        assert _series_in_svg(svg) == len(saes), name
        for sae in saes:  # the SVG draws the SAE's series in its colour
            group = _svg_group(svg, f"series-{index[sae]}")
            assert group is not None and colors[sae] in group, (name, sae)
    # Held-out curves beside the training ones, dashed, in the SAE's colour.
    for name in ("fvu", "l0", "dead"):
        assert sorted(plots[name]["held_out"]) == saes, name
        for sae in saes:
            group = _svg_group(report / f"{name}.svg", f"held-out-{index[sae]}")
            assert group is not None and colors[sae] in group, (name, sae)
            assert "stroke-dasharray" in group, (name, sae)


def test_report_axes(report):
    plots = json.loads((report / "manifest.json").read_text())["plots"]
    for name in ("loss", "fvu", "l0", "dead", "lr"):
        for ax in plots[name]["axes"]:
            assert ax["xlabel"] == "training tokens", name
            labels = ax["xticklabels"]
            assert labels and all(re.fullmatch(r"\d+(\.\d+)?[KMB]?", t) for t in labels), \
                (name, labels)
            assert any(t.endswith("K") for t in labels), (name, labels)  # 7000, not 7K: raw
            if ax["yscale"] == "log":
                assert ax["ylabel"].endswith("(log scale)"), (name, ax["ylabel"])
    assert all(ax["yscale"] == "log" for ax in plots["fvu"]["axes"] + plots["l0"]["axes"])
    dead = plots["dead"]["axes"][0]
    assert dead["ylim"][0] == 0 and dead["ylim"][1] >= 1.0  # a percentage, from 0
    frontier = plots["frontier"]["axes"][0]
    assert frontier["xscale"] == "log" and "(log scale)" in frontier["xlabel"]


def test_report_splits_the_loss_per_architecture(sweep, report):
    loss = json.loads((report / "manifest.json").read_text())["plots"]["loss"]
    archs = {row["sae"]: row["arch"] for row in _summary(sweep)}
    assert {a: sorted(s) for a, s in loss["panels"].items()} == \
        {a: sorted(s for s in archs if archs[s] == a) for a in set(archs.values())}
    titles = sorted(ax["title"] for ax in loss["axes"])
    assert titles == sorted(f"{a}: {sae_report.OBJECTIVES[a][0]}" for a in loss["panels"])
    page = (report / "index.html").read_text()
    for a in loss["panels"]:
        assert html.escape(sae_report.OBJECTIVES[a][1]) in page


# --- the learning-rate schedule ----------------------------------------------------------------

@pytest.mark.parametrize("train", [
    "{lr: 0.01, warmup_steps: 7, lr_decay: cosine, decay_start: 0.5, lr_min_ratio: 0.1}",
    "{lr: 0.02, warmup_fraction: 0.05, lr_decay: linear, decay_start: 0.3}",
    "{lr: 0.01, warmup_steps: 5, lr_decay: cosine_restarts, restart_steps: 9, "
    "restart_mult: 1.5, lr_min_ratio: 0.05}",
])
def test_lr_schedule_equals_the_lr_of_every_step(root, tmp_path, train):
    out = tmp_path / "lr"
    cfg = root / f"cfg-lr-{abs(hash(train))}.yaml"
    cfg.write_text(f"run: {{out_dir: {out}}}\n"
                   f"data: {{path: {root / 'synth'}, batch_size: 64, epochs: 1}}\n"
                   f"sae: {{expansion: 2, k: 4}}\ntrain: {train}\n"
                   "log: {every_steps: 1}\ncheckpoint: {every_steps: 1000}\n")
    _run(SAETRAIN, cfg)
    info = json.loads((out / "run.json").read_text())
    rows = _metrics(out)
    sae = rows[0]["sae"]
    total = info["total_steps"]
    assert [r["step"] for r in rows] == list(range(1, total + 1))
    sched = sae_report.lr_schedule(info, sae)
    assert len(sched) == total
    # The row of step s reports the LR of its last step, 0-based s - 1. The same formula, up
    # to an ulp or two: the C++ build (-march=native) may fuse a multiply-add that Python
    # rounds twice.
    assert [r["lr"] for r in rows] == pytest.approx(sched, rel=1e-13, abs=0)
    warmup = info["saes"][sae]["lr"]["warmup_steps"]
    assert warmup > 0 and sched[warmup - 1] == pytest.approx(float(train.split("lr: ")[1]
                                                                   .split(",")[0]))
    manifest = sae_report.build_report(str(out))
    assert manifest["lr"]["source"] == {sae: "schedule"}
    assert manifest["lr"]["steps"] == {sae: total}


# --- the page ----------------------------------------------------------------------------------

class _Page(HTMLParser):
    """The links, images and table headers of a page, and its text."""

    def __init__(self):
        super().__init__()
        self.refs, self.headers, self.text, self._th = [], [], [], None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k in ("href", "src"):
            if a.get(k):
                self.refs.append(a[k])
        if tag == "th":
            self._th = ""
        if tag == "table":
            self.headers.append([])

    def handle_endtag(self, tag):
        if tag == "th" and self._th is not None:
            self.headers[-1].append(self._th.strip())
            self._th = None

    def handle_data(self, data):
        self.text.append(data)
        if self._th is not None:
            self._th += data


def _page(path):
    p = _Page()
    p.feed(path.read_text(encoding="utf-8"))
    p.text = " ".join(" ".join(p.text).split())
    return p


def test_report_page_describes_the_run(sweep, report):
    page = _page(report / "index.html")
    info = json.loads((sweep / "run.json").read_text())
    assert info["state"] == "complete" and info["exit_code"] == 0
    for fact in (info["version"], info["started"], info["ended"],
                 f"{info['ranks']} rank(s) on {info['hosts']} host(s)",
                 str(sweep.parent / "synth")):  # data.path
        assert fact in page.text, fact
    assert html.unescape(" ".join((sweep / "config.yaml").read_text().split())) in page.text
    assert "complete (exit 0)" in page.text


def test_report_summary_drops_empty_columns_and_gives_gate_reasons(root, sweep, report):
    page = _page(report / "index.html")
    summary = _summary(sweep)
    main = page.headers[1]  # facts, summary, gates
    empty = [c for c in summary[0] if not any(r[c] for r in summary)]
    assert {"l1_coeff", "l0_coeff", "n_experts", "balance_coeff"} <= set(empty)
    for c in empty:
        assert c not in main, c
    assert "held-out fvu" in main and "k" in main
    for r in summary:
        assert r["sae"] in page.text and sae_report.fmt(r["eval_fvu"]) in page.text
    # Each gate verdict is the console's: "PASS" or "FAIL: <reason>" on the SAE's line.
    console = (root / "sweep.console").read_text().splitlines()
    for r in summary:
        line = next(ln for ln in console if ln.startswith(r["sae"] + " ")
                    and ("PASS" in ln or "FAIL" in ln))
        verdict = line[line.index("PASS" if r["gates"] == "PASS" else "FAIL"):]
        assert verdict == sae_report.gate_verdict(r)
        assert verdict in page.text, verdict
        if r["gates"] == "FAIL":  # an earlier summary.csv without gates_failed: recomputed
            assert verdict == sae_report.gate_verdict({**r, "gates_failed": ""})
    # A failing SAE, to check the reasons on: the fixture's tiny SAEs fail rel_recon_err.
    assert any(r["gates"] == "FAIL" for r in summary)


def test_report_directory_copied_alone_works(sweep, report, tmp_path):
    alone = tmp_path / "elsewhere" / "report"
    shutil.copytree(report, alone)
    page = _page(alone / "index.html")
    assert page.refs
    for ref in page.refs:
        assert "://" not in ref and not ref.startswith("/") and ".." not in ref, ref
        assert (alone / ref).is_file(), ref
    assert (alone / "summary.csv").read_text() == (sweep / "summary.csv").read_text()
    assert (alone / "config.yaml").read_text() == (sweep / "config.yaml").read_text()


def test_report_script_finds_a_python_with_matplotlib(sweep, tmp_path):
    """`python3 tools/sae_report.py` run by an interpreter without matplotlib (here Python
    with its site-packages switched off, as a pyenv or conda python3 first on PATH would be)
    hands itself to one that has it instead of stopping."""
    script = os.path.join(os.path.dirname(sae_report.__file__), "sae_report.py")
    bare = [sys.executable, "-S", "-c", "import matplotlib"]
    assert subprocess.run(bare, capture_output=True).returncode != 0  # -S hides matplotlib
    env = {k: v for k, v in ENV.items() if k != "SAETRAIN_PYTHON"}
    r = _run(sys.executable, "-S", script, sweep, "--out", tmp_path / "r", env=env)
    assert (tmp_path / "r" / "index.html").is_file(), r.stdout + r.stderr
    # An interpreter the user chose is used as it is: the same run is a one-line error.
    r = _run(sys.executable, "-S", script, sweep, "--out", tmp_path / "r2", ok=False,
             env=dict(env, SAETRAIN_PYTHON=sys.executable))
    assert r.returncode == 1 and "matplotlib is not installed" in r.stderr, r.stderr


# --- the run's state ---------------------------------------------------------------------------

def _state(out):
    sae_report.build_report(str(out))
    m = json.loads((out / "report" / "manifest.json").read_text())
    return m["state"], m["state_text"], (out / "report" / "index.html").read_text()


def _wait_for_rows(out, proc, n=2):
    for _ in range(600):
        if proc.poll() is not None:
            pytest.fail(f"saetrain ended early: {proc.communicate()}")
        path = out / "metrics.jsonl"
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    pytest.fail("no metrics rows after 30 s")


def _long_run(root, name):
    """A run far longer than the test waits: 8000 rows x 2000 epochs at batch 64."""
    out = root / name
    cfg = _config(root, out, "checkpoint: {every_steps: 100}\n",
                  log="log: {every_steps: 20}\n")
    text = cfg.read_text().replace("epochs: 1", "epochs: 2000")
    cfg.write_text(text)
    proc = subprocess.Popen([SAETRAIN, str(cfg)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_rows(out, proc)
    return out, proc


def test_state_running_then_stopped_by_sigterm(root):
    out, proc = _long_run(root, "term")
    try:
        state, text, _ = _state(out)
        assert state == "running", text
        assert f"pid {proc.pid}" in text
    finally:
        proc.send_signal(signal.SIGTERM)  # what Slurm sends at the time limit
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 75, stdout + stderr
    state, text, page = _state(out)
    info = json.loads((out / "run.json").read_text())
    assert state == "stopped" and info["exit_code"] == 75, text
    step = max(int(p[5:-7]) for p in os.listdir(out / "checkpoints"))
    assert f"exit 75" in text and f"resumes from the checkpoint at step {step}" in text, text
    assert 'data-state="stopped"' in page and "in progress" not in page


def test_state_killed(root):
    out, proc = _long_run(root, "kill")
    proc.kill()
    proc.communicate(timeout=60)
    state, text, _ = _state(out)
    assert json.loads((out / "run.json").read_text())["state"] == "running"  # never ended
    assert state == "killed", text
    assert f"pid {proc.pid}" in text and "has ended" in text


def test_state_failed_with_the_error(root):
    out = root / "full"
    cfg = _config(root, out)
    r = _run(SAETRAIN, cfg, env=dict(ENV, SAETRAIN_FAULT_DISK_FULL="final.h5:0"), ok=False)
    assert r.returncode == 1
    error = r.stderr.strip().splitlines()[-1]
    assert error.startswith("saetrain: error: ")
    state, text, _ = _state(out)
    step = max(int(p[5:-7]) for p in os.listdir(out / "checkpoints"))  # the run's end
    assert state == "failed" and text == (f"failed (exit 1): {error}; a rerun of the same "
                                          f"command resumes from the checkpoint at step {step}")


def test_report_on_a_run_in_progress(sweep, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(sweep, live, ignore=shutil.ignore_patterns("report"))
    for f in ("summary.csv", "COMPLETE"):
        (live / f).unlink()
    for d in (live / "sae").iterdir():
        (d / "feature_density.csv").unlink()
    # As the live run's run.json reads: training, this process (alive, but not saetrain).
    info = json.loads((live / "run.json").read_text())
    info.update(state="running", exit_code=None, ended=None, pid=os.getpid())
    (live / "run.json").write_text(json.dumps(info))
    text = (live / "metrics.jsonl").read_text()
    (live / "metrics.jsonl").write_text(text[: len(text) - 40])  # torn last line
    manifest = sae_report.build_report(str(live))
    saes = sorted({json.loads(line)["sae"] for line in text.splitlines()})
    for name in ["loss", "fvu", "l0", "dead", "lr", "frontier"]:
        assert sorted(manifest[name]["series"]) == saes
        assert _series_in_svg(live / "report" / f"{name}.svg") == len(saes)
    assert manifest["density"]["series"] == []
    page = (live / "report" / "index.html").read_text()
    assert "last logged interval" in page
    assert "measured at the end of the run" in page
    # A pid that is no saetrain (here: pytest) is a run that ended without recording it.
    state = json.loads((live / "report" / "manifest.json").read_text())["state"]
    assert state == "killed"


def test_report_errors_are_one_line(tmp_path):
    for target, needle in [(tmp_path / "absent", "no such directory"),
                           (tmp_path, "metrics.jsonl")]:
        r = _run(REPORT, target, ok=False)
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("sae-report: error:"), r.stderr
        assert needle in lines[0]
    (tmp_path / "metrics.jsonl").write_text("")
    r = _run(REPORT, tmp_path, ok=False)
    assert r.returncode == 1 and "no metrics rows yet" in r.stderr


def test_links_in_a_run_directory_are_refused_and_nothing_is_written_through_them(sweep,
                                                                                  tmp_path):
    """A run never writes a symlink: one planted where sae-report reads (config.yaml, an SAE's
    density file) or writes (report/, a file in it) is refused by name, and nothing is read
    through it into the page or written where it points."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not the run's")
    secret.chmod(0o600)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "index.html").write_text("kept")
    sae = sorted(os.listdir(sweep / "sae"))[0]
    cases = [("config.yaml", secret), ("report", outside), ("report/fvu.svg", secret),
             (f"sae/{sae}/feature_density.csv", secret)]
    for name, target in cases:
        run = tmp_path / ("run-" + name.replace("/", "-"))
        shutil.copytree(sweep, run, ignore=shutil.ignore_patterns("report"))
        link = run / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.exists():
            link.unlink()
        link.symlink_to(target)
        r = _run(REPORT, run, ok=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1, r.stderr
        assert lines[0] == (f"sae-report: error: {link} is a symlink: sae-report reads and "
                            "writes only a run's own files, and a run never writes a link; "
                            "remove it"), lines[0]
        assert not (run / "report" / "index.html").exists() or name.startswith("report")
    assert sorted(os.listdir(outside)) == ["index.html"]
    assert (outside / "index.html").read_text() == "kept"
    assert secret.read_text() == "not the run's"


# --- no .venv needed ---------------------------------------------------------------------------

DEBIAN_PYTHON = "/usr/bin/python3"


def _debian_matplotlib():
    return os.path.exists(DEBIAN_PYTHON) and subprocess.run(
        [DEBIAN_PYTHON, "-c", "import matplotlib"], capture_output=True).returncode == 0


def test_sae_report_runs_without_the_venv_or_torch(sweep, tmp_path):
    if not _debian_matplotlib():
        msg = f"{DEBIAN_PYTHON} has no matplotlib: run bash tools/install-deps.sh"
        if STRICT:
            pytest.fail(msg)
        pytest.skip(msg)
    # The launcher with no .venv to fall back on.
    env = dict(ENV, SAETRAIN_VENV=str(tmp_path / "no-venv"))
    env.pop("SAETRAIN_PYTHON", None)
    r = _run(REPORT, sweep, "--out", tmp_path / "r", env=env)
    assert "7 plots" in r.stdout
    # Debian's interpreter, isolated from the user's site-packages: PyTorch is never imported.
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import sae_report; "
             "sae_report.build_report(sys.argv[2], sys.argv[3]); "
             "print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    r = _run(DEBIAN_PYTHON, "-I", "-c", probe, os.path.join(ROOT, "tools"), sweep,
             tmp_path / "r2")
    assert r.stdout.split() == ["False", "True"]
