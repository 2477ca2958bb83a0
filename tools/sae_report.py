#!/usr/bin/env python3
"""sae-report: plots and one HTML page for a saetrain run directory (run.out_dir).

    sae-report RUN_DIR [--out DIR]        # writes RUN_DIR/report/ (or DIR)

Needs only matplotlib (Debian's python3-matplotlib, which tools/install-deps.sh installs, or
the project's .venv): no PyTorch.

Writes, as PNG and SVG, one colour per SAE on every plot:
  loss      the training loss per SAE against training tokens, one panel per architecture
            titled with its objective (the architectures minimize different losses)
  fvu, l0   the training batches' figures (solid) with the held-out rows' (dashed, diamonds)
            where the run evaluated them
  dead      dead latents in % (training; held-out dashed), from 0
  lr        the learning rate of every step, from the schedule saetrain resolved (run.json,
            the formula of src/core/schedule.cpp: lr_at in saereport/plots.py), the logged
            values as dots
  frontier  the sweep's sparsity/fidelity frontier: L0 (log axis) against FVU, one labelled
            point per SAE, one marker per architecture; held-out figures when the run
            evaluated on held-out rows, else the last log interval's training figures
  density   log10 feature-density histograms, one per SAE (sae/<id>/feature_density.csv,
            written at the end of a run)
and, for each RUN/features/<id>/features.h5 that sae-features wrote, a page to browse its
latents in features/<id>/ (saereport/features.py; needs h5py), listed in features/index.html
and index.html: the run's state (running, complete, stopped by a signal, failed, killed: from
run.json, COMPLETE and the checkpoints), version, dates, hosts, data path, the resolved config,
the summary table and the quality gates with each failure's reason. index.html links nothing
outside the report directory (summary.csv and config.yaml are copied beside it), so report/
copied alone still works. A run still in progress (a partial metrics.jsonl, no summary.csv yet)
and a resumed one (metrics.jsonl cut at the checkpoint, then continued) both work: the table then
holds the last logged row per SAE. report/manifest.json lists every plot with its series and
colours, which the tests check against the SVGs (each SAE's series is an SVG group with id
"series-<n>", its held-out series "held-out-<n>").

Every bad input ends with one line on stderr and exit code 1.

The code: saereport/read.py reads the run (never through a link) and tells its state,
saereport/plots.py draws the plots, saereport/page.py writes index.html; this file puts them
together (build_report) and is the command line.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from collections import OrderedDict

# saereport/ beside this file, also where Python leaves the script's directory off sys.path
# (python -I, python -P).
_TOOLS = os.path.dirname(os.path.realpath(__file__))
if _TOOLS not in sys.path:
    sys.path.insert(0, _TOOLS)

# defines: write_features (report/features/: the feature pages of sae-features' output)
from saereport.features import write_features  # noqa: E402
# defines: write_index (index.html), fmt and gate_verdict (its table cells)
from saereport.page import fmt, gate_verdict, write_index  # noqa: E402
# defines: OBJECTIVES, lr_at and lr_schedule, sae_colors and the plot_* functions, one per plot
from saereport.plots import (OBJECTIVES, lr_at, lr_schedule, plot_curves,  # noqa: E402
                             plot_density, plot_frontier, plot_loss, plot_lr, sae_colors)
# defines: ReportError, ReportDir, refuse_links, open_run_file, read_*, arch_of, run_state
from saereport.read import (ReportDir, ReportError, arch_of, open_run_file,  # noqa: E402
                            read_metrics, read_run_json, read_summary, read_text, refuse_links,
                            run_state)

# What `import sae_report` offers: the tests use the objectives, the schedule and the cells;
# docs/outputs.md names sae_report.lr_at.
__all__ = ["OBJECTIVES", "ReportError", "build_report", "fmt", "gate_verdict", "lr_at",
           "lr_schedule", "main"]


def build_report(run_dir, out_dir=None):
    """Writes the report; returns the manifest {plot: {kind, series, colors, files, ...}}."""
    if not os.path.isdir(run_dir):
        raise ReportError(f"{run_dir}: no such directory")
    refuse_links(run_dir, out_dir or os.path.join(run_dir, "report"))
    metrics = read_metrics(run_dir)
    summary = read_summary(run_dir)
    info = read_run_json(run_dir)
    config_text = read_text(os.path.join(run_dir, "config.yaml"))
    out_dir = out_dir or os.path.join(run_dir, "report")
    try:
        os.makedirs(out_dir, exist_ok=True)
        out_dir = ReportDir(out_dir)
    except OSError as e:
        raise ReportError(f"{out_dir}: cannot create the report directory: {e.strerror}")
    try:
        import matplotlib
    except ImportError:
        raise ReportError(f"matplotlib is not installed for {sys.executable}; run bash "
                          "tools/install-deps.sh (Debian's python3-matplotlib)")
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "saetrain"  # stable SVG ids from run to run
    import matplotlib.pyplot as plt

    by_id = {r["sae"]: r for r in summary or []}
    archs = OrderedDict((sae, arch_of(sae, by_id.get(sae), info)) for sae in metrics)
    colors = sae_colors(plt, list(metrics))
    manifest = OrderedDict()
    plot_loss(plt, metrics, archs, colors, out_dir, manifest)
    plot_curves(plt, metrics, colors, out_dir, manifest)
    plot_lr(plt, metrics, info, colors, out_dir, manifest)
    plot_frontier(plt, metrics, summary, archs, colors, out_dir, manifest)
    plot_density(plt, run_dir, metrics, colors, out_dir, manifest)
    last_step = max(rows[-1]["step"] for rows in metrics.values())
    state = run_state(run_dir, info, last_step)
    # The page links only files inside out_dir: it works wherever report/ is copied.
    for name in ("summary.csv", "config.yaml"):
        src = os.path.join(run_dir, name)
        if os.path.isfile(src):
            with open_run_file(src, "rb") as f, out_dir.open(name, "wb") as g:
                shutil.copyfileobj(f, g)
    features = write_features(run_dir, out_dir)
    write_index(run_dir, out_dir, metrics, summary, manifest, info, config_text, state,
                colors, archs, features)
    with out_dir.open("manifest.json", "w", encoding="utf-8") as f:
        json.dump({"run_dir": os.path.abspath(run_dir), "state": state[0],
                   "state_text": state[1], "complete": state[0] == "complete",
                   "colors": colors, "plots": manifest}, f, indent=1)
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(prog="sae-report", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", help="a saetrain run directory (run.out_dir)")
    ap.add_argument("--out", help="report directory (default RUN_DIR/report)")
    args = ap.parse_args(argv)
    if os.environ.get("SAETRAIN_PARSE_ONLY") == "1":  # tools/check-readme.py: the line parses
        return 0
    try:
        manifest = build_report(args.run_dir, args.out)
    except ReportError as e:
        print(f"sae-report: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # an unreadable run file, a report directory we cannot write
        print(f"sae-report: error: {e.filename or args.run_dir}: {e.strerror}", file=sys.stderr)
        return 1
    out = args.out or os.path.join(args.run_dir, "report")
    n = max(len(m["series"]) for m in manifest.values()) if manifest else 0
    print(f"sae-report: wrote {os.path.join(out, 'index.html')} ({len(manifest)} plots, "
          f"{n} SAE(s))")
    return 0


def python_with_matplotlib():
    """None when this interpreter has matplotlib, else the first that does of those
    tools/sae-report tries: Debian's /usr/bin/python3 (install-deps.sh installs
    python3-matplotlib for it) and the project's .venv (None when none has). So
    `python3 tools/sae_report.py` works where the first python3 on PATH is a pyenv or conda
    build without matplotlib, as on many clusters."""
    try:
        import matplotlib  # noqa: F401
        return None
    except ImportError:
        pass
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    venv = os.environ.get("SAETRAIN_VENV", os.path.join(root, ".venv"))
    for candidate in ("/usr/bin/python3", os.path.join(venv, "bin", "python")):
        if not os.access(candidate, os.X_OK):
            continue
        probe = subprocess.run([candidate, "-c", "import matplotlib"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        if probe.returncode == 0:
            return candidate
    return None


if __name__ == "__main__":
    # Once only (the variable), and never over an interpreter the user chose (SAETRAIN_PYTHON).
    if "SAETRAIN_PYTHON" not in os.environ and "SAETRAIN_REPORT_REEXEC" not in os.environ:
        py = python_with_matplotlib()
        if py is not None:
            os.environ["SAETRAIN_REPORT_REEXEC"] = "1"
            os.execv(py, [py, os.path.realpath(__file__)] + sys.argv[1:])
    sys.exit(main())

