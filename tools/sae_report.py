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
            the formula of src/core/schedule.cpp: lr_at below), the logged values as dots
  frontier  the sweep's sparsity/fidelity frontier: L0 (log axis) against FVU, one labelled
            point per SAE, one marker per architecture; held-out figures when the run
            evaluated on held-out rows, else the last log interval's training figures
  density   log10 feature-density histograms, one per SAE (sae/<id>/feature_density.csv,
            written at the end of a run)
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
"""
import argparse
import csv
import datetime
import html
import json
import math
import os
import shutil
import socket
import subprocess
import sys
from collections import OrderedDict

# The curves against tokens: (file name, metrics key, held-out key, axis label, scale, log y).
CURVES = [
    ("fvu", "fvu", "eval_fvu", "FVU (fraction of variance unexplained)", 1.0, True),
    ("l0", "l0", "eval_l0", "L0 (active latents per token)", 1.0, True),
    ("dead", "dead_fraction", "eval_dead_fraction", "dead latents (%)", 100.0, False),
]
MARKERS = {"relu": "o", "topk": "s", "batchtopk": "D", "jumprelu": "^", "gated": "v",
           "switch": "P"}
# What each architecture's `loss` is (per token: trainer.cpp divides the summed loss by the
# batch's rows), as src/core/arch/*.cpp compute it; (matplotlib mathtext, plain text).
RECON = r"\|x-\hat{x}\|^2"
OBJECTIVES = {
    "relu": (rf"${RECON} + \lambda_1 \sum_i z_i \|W_{{dec,i}}\|$",
             "||x - x_hat||^2 + l1_coeff * sum_i z_i ||W_dec,i|| (l1 ramped in)"),
    "topk": (rf"${RECON}$ + AuxK", "||x - x_hat||^2 + AuxK (train.auxk_coeff)"),
    "batchtopk": (rf"${RECON}$ + AuxK", "||x - x_hat||^2 + AuxK (train.auxk_coeff)"),
    "jumprelu": (rf"${RECON} + \lambda_0 L_0$",
                 "||x - x_hat||^2 + l0_coeff * L0 (l0_coeff ramped in)"),
    "gated": (rf"${RECON} + \lambda_1 \sum_i$ relu$(g_i)\|W_{{dec,i}}\| + $ aux. recon.",
              "||x - x_hat||^2 + l1_coeff * sum_i relu(g_i) ||W_dec,i|| (l1 ramped in) + the "
              "gate path's reconstruction"),
    "switch": (rf"${RECON}$ + AuxK + load balancing",
               "||x - x_hat||^2 + AuxK per expert + balance_coeff * load balancing"),
}
HELD_OUT_STYLE = dict(linestyle="--", marker="D", markersize=4, linewidth=1.1)


class ReportError(Exception):
    pass


def _no_follow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_run_file(path, mode="r", **kw):
    """A run's file, opened for reading without following a link at its name."""
    return open(path, mode, opener=_no_follow, **kw)


# What sae-report reads in a run directory, and the report directory it writes; every one must be
# the run's own file or directory, not a symlink (a run never writes one: a link was planted).
RUN_FILES = ("metrics.jsonl", "summary.csv", "run.json", "config.yaml", "COMPLETE",
             ".saetrain.lock", "checkpoints", "sae")


def refuse_links(run_dir, out_dir):
    """ReportError naming the first symlink among what sae-report would read or write."""
    def check(path):
        if os.path.islink(path):
            raise ReportError(f"{path} is a symlink: sae-report reads and writes only a run's own "
                              "files, and a run never writes a link; remove it")
    for name in RUN_FILES:
        check(os.path.join(run_dir, name))
    sae = os.path.join(run_dir, "sae")
    if os.path.isdir(sae):
        for name in sorted(os.listdir(sae)):
            check(os.path.join(sae, name))
            check(os.path.join(sae, name, "feature_density.csv"))
    check(out_dir)
    if os.path.isdir(out_dir):
        for name in sorted(os.listdir(out_dir)):
            check(os.path.join(out_dir, name))


class ReportDir(str):
    """The report directory (its path, as a str), held open: every file is created in it by
    name from its descriptor, never through a link planted at the name."""

    def __new__(cls, path):
        self = super().__new__(cls, path)
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        return self

    def open(self, name, mode="w", **kw):
        def opener(path, flags):
            return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=self.fd)
        return open(name, mode, opener=opener, **kw)


# --- reading the run ---------------------------------------------------------------------------

def read_metrics(run_dir):
    """Rows of metrics.jsonl by SAE, in step order. A torn last line (a run writing it right
    now) is skipped; a step logged twice keeps its last row."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ReportError(f"{path}: no such file; give a saetrain run directory (its "
                          "run.out_dir) that has logged at least one interval")
    by_sae = OrderedDict()
    with open_run_file(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(row, dict) or not isinstance(row.get("sae"), str) \
                    or not isinstance(row.get("step"), int):
                continue
            by_sae.setdefault(row["sae"], {})[row["step"]] = row
    if not by_sae:
        raise ReportError(f"{path}: no metrics rows yet (the first is written after "
                          "log.every_steps steps)")
    return OrderedDict((sae, [steps[s] for s in sorted(steps)]) for sae, steps in by_sae.items())


def read_summary(run_dir):
    path = os.path.join(run_dir, "summary.csv")
    if not os.path.isfile(path):
        return None
    with open_run_file(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_run_json(run_dir):
    """run.json (saetrain writes it when training starts and when it ends), or None: a run of
    an earlier saetrain, or one that never started training."""
    path = os.path.join(run_dir, "run.json")
    if not os.path.isfile(path):
        return None
    try:
        with open_run_file(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def read_text(path):
    try:
        with open_run_file(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def yaml_value(text, section, key):
    """`section.key` of config.yaml as saetrain writes it (a block map of block maps, yaml-cpp's
    emitter): enough to show data.path without a YAML library."""
    current = None
    for line in (text or "").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            current = line.split(":", 1)[0].strip()
            continue
        if current == section and ":" in line:
            k, v = line.strip().split(":", 1)
            if k.strip() == key:
                v = v.strip()
                if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                    v = v[1:-1]
                return v
    return None


def read_density(run_dir, sae):
    """(bin lower edges, counts, latents that never fired) or None."""
    path = os.path.join(run_dir, "sae", sae, "feature_density.csv")
    if not os.path.isfile(path):
        return None
    lo, counts, never = [], [], 0
    try:
        with open_run_file(path, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                if r["log10_density_lo"] == "-inf":
                    never = int(r["latents"])
                else:
                    lo.append(float(r["log10_density_lo"]))
                    counts.append(int(r["latents"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{path}: not a feature-density histogram as saetrain writes it "
                          f"(log10_density_lo,log10_density_hi,latents): {e}")
    return (lo, counts, never) if lo else None


def committed_steps(run_dir):
    """The steps of checkpoints/step-<N>.commit: the checkpoints a rerun resumes from."""
    steps = []
    try:
        names = os.listdir(os.path.join(run_dir, "checkpoints"))
    except OSError:
        return steps
    for name in names:
        if name.startswith("step-") and name.endswith(".commit"):
            try:
                steps.append(int(name[5:-7]))
            except ValueError:
                pass
    return sorted(steps)


def arch_of(sae, summary_row=None, info=None):
    if summary_row and summary_row.get("arch"):
        return summary_row["arch"]
    arch = (((info or {}).get("saes") or {}).get(sae) or {}).get("arch")
    if isinstance(arch, str) and arch:
        return arch
    return sae.split("-x")[0].split("-")[0]  # ids are "<arch>-x<expansion>-..."


def number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# --- the run's state ---------------------------------------------------------------------------

def pid_alive(pid, host):
    """True/False for a saetrain process `pid` on this host; None when `host` is another one
    (nothing can be checked from here)."""
    if host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, someone else's
    except (OSError, TypeError, ValueError):
        return False
    try:  # a reused pid: alive, but not saetrain
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0]
        return os.path.basename(argv0) == b"saetrain"
    except OSError:
        return True


def lock_holder(run_dir):
    """(pid, host) from .saetrain.lock ("pid N on HOST"), as an earlier saetrain leaves it."""
    text = read_text(os.path.join(run_dir, ".saetrain.lock")) or ""
    parts = text.split()
    if len(parts) >= 4 and parts[0] == "pid" and parts[2] == "on":
        try:
            return int(parts[1]), parts[3]
        except ValueError:
            pass
    return None


def age_text(seconds):
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def run_state(run_dir, info, last_step):
    """(key, sentence): key is one of running, complete, stopped, failed, killed, unknown."""
    commits = committed_steps(run_dir)
    resumable = (f"a rerun of the same command resumes from the checkpoint at step {commits[-1]}"
                 if commits else "no checkpoint was committed: a rerun starts over")
    complete = os.path.exists(os.path.join(run_dir, "COMPLETE"))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    idle = age_text(datetime.datetime.now().timestamp() - os.path.getmtime(metrics)) \
        if os.path.exists(metrics) else "?"
    if info and isinstance(info.get("state"), str):
        st, code = info["state"], info.get("exit_code")
        pid, host = info.get("pid"), info.get("host", "?")
        if st == "complete":
            return "complete", f"complete (exit 0) after {last_step} steps"
        if st == "stopped":
            return "stopped", (f"stopped by a signal (exit {code}) after step {last_step}; "
                               f"{resumable}")
        if st == "failed":
            msg = info.get("message") or "see the console output"
            return "failed", f"failed (exit {code}): saetrain: error: {msg}; {resumable}"
        if st == "running":
            alive = pid_alive(pid, host)
            if alive:
                return "running", (f"running (pid {pid} on {host}; last metrics line "
                                   f"{idle} ago)")
            if alive is False:
                return "killed", ("ended without recording an exit (saetrain's pid {} on {} "
                                  "has ended): "
                                  "killed (SIGKILL, out of memory, node loss) or aborted for "
                                  "another rank's failure; {}".format(pid, host, resumable))
            return "running", (f"running on {host} (pid {pid}) as far as run.json says: "
                               f"this host cannot check; last metrics line {idle} ago")
    # A run of an earlier saetrain (no run.json): COMPLETE, then the lock file's holder.
    if complete:
        return "complete", f"complete (COMPLETE marker) after {last_step} steps"
    holder = lock_holder(run_dir)
    alive = pid_alive(*holder) if holder else None
    if alive:
        return "running", f"running (pid {holder[0]}; last metrics line {idle} ago)"
    return "unknown", (f"not complete and not running here (no run.json: stopped, failed or "
                       f"killed); {resumable}")


# --- the learning-rate schedule ----------------------------------------------------------------

def _llround(x):
    """C's llround: halves away from zero (Python's round() rounds them to even)."""
    return int(math.floor(x + 0.5)) if x >= 0 else -int(math.floor(-x + 0.5))


def lr_at(p, step, total_steps):
    """src/core/schedule.cpp's lr_at for 0-based `step`, operation for operation (the same
    doubles up to the multiply-adds a C++ compiler may fuse), from run.json's resolved schedule
    `p` (warmup_steps and restart_steps already resolved by warmup_steps_for and
    restart_steps_for)."""
    lr, warmup = float(p["lr"]), int(p["warmup_steps"])
    if warmup > 0 and step < warmup:
        return lr * float(step + 1) / float(warmup)
    lo = lr * float(p["lr_min_ratio"])
    if p["lr_decay"] == "cosine_restarts":
        t_cur, t_i = step - max(warmup, 0), int(p["restart_steps"])
        mult = float(p["restart_mult"])
        if mult == 1.0:
            t_cur %= t_i
        while t_cur >= t_i:
            t_cur -= t_i
            t_i = max(1, _llround(float(t_i) * mult))
        return lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * float(t_cur) / float(t_i)))
    hold_until = max(warmup, _llround(float(p["decay_start"]) * float(total_steps)))
    decay_steps = max(1, total_steps - hold_until)
    t = min(max(float(step - hold_until) / float(decay_steps), 0.0), 1.0)
    if p["lr_decay"] == "cosine":
        return lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * t))
    if p["lr_decay"] == "linear":
        return lr + (lo - lr) * t
    return lr  # constant


def lr_schedule(info, sae):
    """[lr of step 0, 1, ..., total_steps - 1] for `sae` from run.json, or None."""
    try:
        p = info["saes"][sae]["lr"]
        total = int(info["total_steps"])
        return [lr_at(p, s, total) for s in range(total)]
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


# --- plots -------------------------------------------------------------------------------------

def sae_colors(plt, saes):
    """One colour per SAE, the same on every plot: tab10, tab20 for more, then evenly spaced."""
    n = len(saes)
    if n <= 10:
        cols = plt.rcParams["axes.prop_cycle"].by_key()["color"][:10]
        if len(cols) < n:
            cols = [plt.matplotlib.colors.to_hex(c) for c in
                    plt.matplotlib.colormaps["tab10"].colors]
    elif n <= 20:
        cols = [plt.matplotlib.colors.to_hex(c) for c in plt.matplotlib.colormaps["tab20"].colors]
    else:
        cmap = plt.matplotlib.colormaps["turbo"]
        cols = [plt.matplotlib.colors.to_hex(cmap(i / max(n - 1, 1))) for i in range(n)]
    return OrderedDict((sae, cols[i]) for i, sae in enumerate(saes))


def si(x, _pos=None):
    """Tick text with K/M/B units (thousands, millions, billions): 0, 500, 200K, 1.5M."""
    if x == 0:
        return "0"
    for div, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _token_axis(plt, ax):
    ax.xaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(si))
    ax.set_xlabel("training tokens")
    ax.set_xlim(left=0)


def _log_y(plt, ax, label):
    ax.set_yscale("log")
    plain = plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.set_ylabel(f"{label} (log scale)")


def _save(fig, out_dir, name, series, kind, manifest, colors, **extra):
    for ext in ("png", "svg"):  # "tight": legends placed beside the axes stay in
        with out_dir.open(f"{name}.{ext}", "wb") as f:
            fig.savefig(f, format=ext, dpi=110 if ext == "png" else None, bbox_inches="tight")
    # What each panel shows, as drawn (tick labels exist once the figure is drawn): for the
    # tests, and for anyone scripting over reports.
    axes = [{"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
             "xscale": ax.get_xscale(), "yscale": ax.get_yscale(),
             "ylim": [float(v) for v in ax.get_ylim()],
             "xticklabels": [t.get_text() for t in ax.get_xticklabels() if t.get_text()]}
            for ax in fig.axes if ax.get_visible()]
    entry = {"kind": kind, "series": series, "colors": {s: colors[s] for s in series},
             "files": [f"{name}.png", f"{name}.svg"], "axes": axes}
    entry.update(extra)
    manifest[name] = entry


def _legend_beside(plt, ax, saes, colors, styles=()):
    """One entry per SAE (its colour) and one per line style, beside the axes: the legend
    never hides a curve, and a long sweep's list stays readable."""
    lines = plt.matplotlib.lines
    handles = [lines.Line2D([], [], color=colors[s], linewidth=2, label=s) for s in saes]
    handles += [lines.Line2D([], [], color="#555555", label=label, **style)
                for label, style in styles]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              borderaxespad=0.0)


def _points(rows, key, scale=1.0):
    pts = [(number(r.get("tokens")), number(r.get(key))) for r in rows]
    return [(t, v * scale) for t, v in pts if t is not None and v is not None]


def plot_loss(plt, metrics, archs, colors, out_dir, manifest):
    """One panel per architecture: each minimizes its own objective, so losses compare only
    within a panel (FVU compares across them)."""
    groups = OrderedDict()
    for sae in metrics:
        groups.setdefault(archs[sae], []).append(sae)
    n = len(groups)
    cols = 1 if n == 1 else 2
    rows_n = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(7 if cols == 1 else 11, 3.6 * rows_n),
                             squeeze=False)
    series, index = [], {sae: i for i, sae in enumerate(metrics)}
    for ax, (arch, saes) in zip(axes.flat, groups.items()):
        for sae in saes:
            pts = _points(metrics[sae], "loss")
            if not pts:
                continue
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".",
                              markersize=3, linewidth=1.3, label=sae, color=colors[sae])
            line.set_gid(f"series-{index[sae]}")
            series.append(sae)
        values = [v for line in ax.get_lines() for v in line.get_ydata()]
        if values and all(v > 0 for v in values):
            _log_y(plt, ax, "loss per token")
        else:
            ax.set_ylabel("loss per token")
        objective = OBJECTIVES.get(arch, (f"{arch}'s objective", ""))[0]
        ax.set_title(f"{arch}: {objective}", fontsize=9)
        _token_axis(plt, ax)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle("training loss: each architecture's own objective, one panel each",
                 fontsize=10)
    fig.tight_layout()
    _save(fig, out_dir, "loss", series, "curve", manifest, colors,
          panels={arch: saes for arch, saes in groups.items()})
    plt.close(fig)


def plot_curves(plt, metrics, colors, out_dir, manifest):
    """fvu, l0, dead: training (solid) and held-out (dashed, diamonds) per SAE."""
    for name, key, eval_key, label, scale, log_y in CURVES:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        series, held = [], []
        for i, (sae, rows) in enumerate(metrics.items()):
            pts = _points(rows, key, scale)
            if pts:
                (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".",
                                  markersize=3, linewidth=1.3, label=sae, color=colors[sae])
                line.set_gid(f"series-{i}")
                series.append(sae)
            ev = _points(rows, eval_key, scale)  # eval_* only on the steps evaluated
            if ev:
                (line,) = ax.plot([p[0] for p in ev], [p[1] for p in ev], color=colors[sae],
                                  label=f"{sae} (held-out)", **HELD_OUT_STYLE)
                line.set_gid(f"held-out-{i}")
                held.append(sae)
        values = [v for line in ax.get_lines() for v in line.get_ydata()]
        if log_y and values and all(v > 0 for v in values):
            _log_y(plt, ax, label)
        else:
            ax.set_ylabel(label)
        if name == "dead":  # a percentage: from 0, and at least to 1% so that 0 reads as 0
            top = max(values) if values else 0.0
            ax.set_ylim(0, max(1.0, top * 1.1))
        _token_axis(plt, ax)
        title = f"{label.split(' (')[0]} per SAE: training batches"
        title += " (solid) and held-out rows (dashed)" if held else ""
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        styles = [("training batches", dict(linestyle="-", marker="."))]
        if held:
            styles.append(("held-out rows", HELD_OUT_STYLE))
        _legend_beside(plt, ax, series, colors, styles)
        fig.tight_layout()
        _save(fig, out_dir, name, series, "curve", manifest, colors, held_out=held)
        plt.close(fig)


def plot_lr(plt, metrics, info, colors, out_dir, manifest):
    """Every step's LR from the resolved schedule (solid where trained, dotted ahead), the
    logged values as dots on it."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series, source, ahead = [], {}, False
    tps = number((info or {}).get("tokens_per_step"))
    scheds = OrderedDict((sae, lr_schedule(info, sae) if info and tps else None)
                         for sae in metrics)
    # SAEs on one schedule draw one line in turns: dashes of each colour, offset, so that
    # every colour shows (drawn one over the other, only the last would).
    same = {sae: [o for o in scheds if scheds[o] is not None and scheds[o] == scheds[sae]]
            for sae in scheds}
    for i, (sae, rows) in enumerate(metrics.items()):
        sched = scheds[sae]
        logged = _points(rows, "lr")
        if sched:
            done = min(max((r["step"] for r in rows), default=0), len(sched))
            xs = [(s + 1) * tps for s in range(len(sched))]
            if len(sched) > MAX_LR_POINTS:  # far below a pixel apart: drawn at a stride
                keep = _stride_steps(len(sched), done)
                xs, sched = [xs[s] for s in keep], [sched[s] for s in keep]
                done = keep.index(done - 1) + 1 if done > 0 else 0
            group = same[sae]
            dash = "-" if len(group) == 1 else \
                (4.0 * group.index(sae), (4.0, 4.0 * (len(group) - 1)))
            (line,) = ax.plot(xs[:done], sched[:done], linewidth=1.6, color=colors[sae],
                              linestyle=dash, label=sae)
            if done < len(sched):  # dotted, the shared schedule's dots in turns
                ahead = True
                m, j = len(group), group.index(sae)
                ax.plot(xs[max(done - 1, 0):], sched[max(done - 1, 0):], linewidth=1.0,
                        linestyle=(2.0 * j, (1.0, 2.0 * m - 1.0)), color=colors[sae])
            source[sae] = "schedule"
        else:
            (line,) = ax.plot([p[0] for p in logged], [p[1] for p in logged], linewidth=1.3,
                              color=colors[sae], label=f"{sae} (logged)")
            source[sae] = "logged"
        line.set_gid(f"series-{i}")
        series.append(sae)
        if logged:  # hollow dots, at most about 40 per SAE so that the curve shows between
            stride = max(1, math.ceil(len(logged) / 40))
            ax.plot([p[0] for p in logged[::stride]], [p[1] for p in logged[::stride]],
                    linestyle="none", marker="o", markersize=3.5, markerfacecolor="white",
                    markeredgewidth=0.9, color=colors[sae])
    _token_axis(plt, ax)
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_ylabel("learning rate")
    _warmup_inset(plt, ax, metrics, info, scheds, colors, tps)
    shared = len(series) > 1 and all(len(same[s]) == len(series) for s in series)
    if all(v == "schedule" for v in source.values()):
        title = "learning rate of every step (the schedule in run.json)"
        ax.set_title(title + (f": the same for all {len(series)} SAEs" if shared else ""),
                     fontsize=10)
        styles = [("logged (metrics.jsonl)", dict(linestyle="none", marker="o",
                                                  markersize=3.5, markerfacecolor="white"))]
        if ahead:
            styles.append(("steps not trained yet", dict(linestyle=":")))
    else:
        ax.set_title("learning rate (logged values only: no run.json)", fontsize=10)
        styles = []
    ax.grid(True, alpha=0.3)
    _legend_beside(plt, ax, series, colors, styles)
    fig.tight_layout()
    _save(fig, out_dir, "lr", series, "curve", manifest, colors, source=source,
          steps={s: len(scheds[s]) for s in series if scheds[s]})
    plt.close(fig)


# Steps of the LR curve drawn in a plot: every step below this many, else a stride (the
# warm-up inset draws its steps one by one).
MAX_LR_POINTS = 20000


def _stride_steps(total, done):
    """Every (total / MAX_LR_POINTS)-th step, and the first, the last and the last trained."""
    stride = math.ceil(total / MAX_LR_POINTS)
    return sorted(set(range(0, total, stride)) | {total - 1} | ({done - 1} if done else set()))


def _warmup_inset(plt, ax, metrics, info, scheds, colors, tps):
    """A warm-up shorter than 5% of the run is a vertical line at this scale: its first steps
    magnified in an inset, every step a dot."""
    try:
        total = int(info["total_steps"])
        warmup = max(int(info["saes"][s]["lr"]["warmup_steps"]) for s in scheds if scheds[s])
    except (KeyError, TypeError, ValueError):
        return
    if warmup <= 0 or warmup >= 0.05 * total:
        return
    n = min(total, 2 * warmup + 2)
    inset = ax.inset_axes([0.12, 0.1, 0.36, 0.42])
    drawn = []
    for sae, sched in scheds.items():
        if sched:
            group = [o for o in drawn if scheds[o][:n] == sched[:n]] + [sae]
            m = max(len(group), 1)
            inset.plot([(s + 1) * tps for s in range(n)], sched[:n],
                       marker="." if n <= 80 else None, markersize=4, linewidth=1.2,
                       color=colors[sae],
                       linestyle="-" if m == 1 else (4.0 * (m - 1), (4.0, 4.0 * (m - 1))))
            drawn.append(sae)
    inset.set_title(f"warm-up: the first {n} steps", fontsize=7)
    inset.xaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(si))
    inset.yaxis.set_major_formatter(plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    inset.tick_params(labelsize=6)
    inset.set_ylim(bottom=0)
    inset.grid(True, alpha=0.3)


def frontier_points(metrics, summary, archs):
    """One (sae, arch, l0, fvu, held_out) per SAE: the summary's (held-out when present) or,
    for a run in progress, the last logged row's."""
    by_id = {r["sae"]: r for r in summary or []}
    pts = []
    for sae, rows in metrics.items():
        s = by_id.get(sae)
        src = s if s is not None else rows[-1]
        l0, fvu = number(src.get("eval_l0")), number(src.get("eval_fvu"))
        held_out = l0 is not None and fvu is not None
        if not held_out:
            l0, fvu = number(src.get("l0")), number(src.get("fvu"))
        if l0 is None or fvu is None:
            continue
        pts.append((sae, archs[sae], l0, fvu, held_out))
    return pts


def plot_frontier(plt, metrics, summary, archs, colors, out_dir, manifest):
    pts = frontier_points(metrics, summary, archs)
    index = {sae: i for i, sae in enumerate(metrics)}
    fig, ax = plt.subplots(figsize=(7, 4.8))
    series = []
    for sae, arch, l0, fvu, _ in pts:
        (pt,) = ax.plot([max(l0, 1e-3)], [fvu], linestyle="none",
                        marker=MARKERS.get(arch, "X"), markersize=9, color=colors[sae],
                        markeredgecolor="#333333", markeredgewidth=0.6)
        pt.set_gid(f"series-{index[sae]}")
        ax.annotate(sae, (max(l0, 1e-3), fvu), textcoords="offset points", xytext=(7, 4),
                    fontsize=7, color=colors[sae])
        series.append(sae)
    for arch in sorted({p[1] for p in pts}):  # one legend entry per architecture: the marker
        ax.plot([], [], linestyle="none", marker=MARKERS.get(arch, "X"), color="#bbbbbb",
                markeredgecolor="#333333", label=arch)
    ax.set_xscale("log")
    plain = plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="both", labelsize=7)
    held = bool(pts) and all(p[4] for p in pts)
    ax.set_xlabel("L0, active latents per token (log scale)" + (", held-out" if held else ""))
    ax.set_ylabel("FVU" + (" (held-out rows)" if held else " (last training interval)"))
    ax.set_title("sparsity / fidelity frontier (lower left is better; colour: SAE)",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if pts:
        ax.legend(title="architecture", fontsize=8)
        lo, hi = min(p[2] for p in pts), max(p[2] for p in pts)
        ax.set_xlim(max(lo, 1e-3) / 1.6, max(hi, 1e-3) * 2.5)  # room for the labels
        flo, fhi = min(p[3] for p in pts), max(p[3] for p in pts)
        pad = 0.12 * (fhi - flo) if fhi > flo else 0.1 * max(abs(fhi), 1e-3)
        ax.set_ylim(flo - pad, fhi + pad)
    fig.tight_layout()
    _save(fig, out_dir, "frontier", series, "frontier", manifest, colors)
    plt.close(fig)
    return pts


def plot_density(plt, run_dir, metrics, colors, out_dir, manifest):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series = []
    for i, sae in enumerate(metrics):
        h = read_density(run_dir, sae)
        if h is None:
            continue
        lo, counts, never = h
        # A step outline per SAE, so several overlap legibly.
        (line,) = ax.step(lo + [lo[-1] + 0.5], counts + counts[-1:], where="post",
                          linewidth=1.4, color=colors[sae],
                          label=f"{sae} (never fired: {never})")
        line.set_gid(f"series-{i}")
        series.append(sae)
    ax.set_xlabel("log10 feature density (fraction of tokens a latent fires on)")
    ax.set_ylabel("latents")
    ax.set_ylim(bottom=0)
    lows = [x for line in ax.get_lines() for x, y in zip(line.get_xdata(), line.get_ydata())
            if y > 0]
    if lows:  # the bins from the first one holding a latent (the histogram starts at 1e-8)
        ax.set_xlim(min(lows) - 0.5, 0.5)
    if series:
        ax.set_title("feature density (at the end of the run)", fontsize=10)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.set_title("feature density: not written yet (the run has not finished)",
                     fontsize=10)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    _save(fig, out_dir, "density", series, "density", manifest, colors)
    plt.close(fig)


# --- the page ----------------------------------------------------------------------------------

def table_html(header, rows, classes=None, swatches=None):
    """header: [(key, title)]; rows: [{key: text}]; classes: [{key: css class}] per row;
    swatches: {sae: colour} for a colour square before the first cell."""
    out = ['<div class="scroll"><table><thead><tr>']
    out += [f"<th>{html.escape(title)}</th>" for _, title in header]
    out.append("</tr></thead><tbody>")
    for i, r in enumerate(rows):
        out.append("<tr>")
        for j, (key, _) in enumerate(header):
            cls = (classes[i].get(key, "") if classes else "")
            cls = f' class="{cls}"' if cls else ""
            text = html.escape(str(r.get(key, "")))
            if j == 0 and swatches and r.get(key) in swatches:
                text = (f'<span class="sw" style="background:{swatches[r[key]]}"></span>'
                        + text)
            out.append(f"<td{cls}>{text}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def fmt(v, kind=""):
    """A cell: kind "%" (a fraction shown as a percentage), "rate" (37.8K), else 4 digits."""
    x = number(v)
    if x is None:
        return "" if v is None else str(v)
    if kind == "%":
        return f"{100 * x:.1f}"
    if kind == "rate":
        return si(x) if abs(x) >= 1e3 else f"{x:.0f}"
    if x == int(x) and abs(x) < 1e12:
        return str(int(x))
    return f"{x:.4g}"


# summary.csv's columns: (key, title, format). The config columns (arch, n_latents and the
# architecture's keys: the ones before "steps") go after the id; columns not named here keep
# their summary.csv name (the architectures' figures, e.g. Switch's expert loads).
TITLES = {"steps": ("steps", ""), "tokens": ("tokens", "rate"), "mse": ("train mse", ""),
          "fvu": ("train fvu", ""), "l0": ("train l0", ""),
          "dead_fraction": ("train dead %", "%"), "tokens_per_s": ("tok/s", "rate"),
          "wait_fraction": ("wait %", "%"), "tflops": ("TFLOP/s", ""), "mfu": ("MFU %", "%"),
          "gpu_mem_peak_GB": ("GPU mem GB", ""), "host_mem_peak_GB": ("host mem GB", ""),
          "feature_recovery": ("recovery", ""), "eval_rows": ("held-out rows", ""),
          "eval_fvu": ("held-out fvu", ""), "eval_l0": ("held-out l0", ""),
          "eval_dead_fraction": ("held-out dead %", "%"),
          "eval_dense_fraction": ("held-out dense %", "%")}
# The quality gates (quality.h): (key, title, format, passes, the console's failure text).
GATES = [("rel_recon_err", "rel_recon_err < 0.1", "", lambda x: x < 0.1,
          lambda x: f"rel_recon_err {x:.3g} >= 0.1"),
         ("zeros_frac", "zeros_frac > 0.85", "", lambda x: x > 0.85,
          lambda x: f"zeros_frac {x:.3g} <= 0.85"),
         ("decorr_rms", "decorr_rms < 0.3", "", lambda x: x < 0.3,
          lambda x: f"decorr_rms {x:.3g} >= 0.3"),
         ("gates_dead_fraction", "dead % < 10", "%", lambda x: x < 0.1,
          lambda x: f"dead {100 * x:.1f}% >= 10%"),
         ("gates_dense_fraction", "dense % < 10", "%", lambda x: x < 0.1,
          lambda x: f"dense {100 * x:.1f}% >= 10%")]
GATE_KEYS = {g[0] for g in GATES} | {"gates", "gates_on", "gates_failed"}


def gate_verdict(r):
    """The gates cell: "PASS", or "FAIL: " and the reasons the console printed (summary.csv's
    gates_failed; recomputed the console's way for a summary.csv without it)."""
    g = r.get("gates", "")
    if g != "FAIL":
        return g
    why = r.get("gates_failed")
    if not why:
        why = "; ".join(text(x) for k, _, _, ok, text in GATES
                        if (x := number(r.get(k))) is not None and not ok(x))
    return f"FAIL: {why}" if why else "FAIL"


def drop_empty(header, rows):
    """The columns some row has a value in."""
    return [(k, t) for k, t in header if any(str(r.get(k, "")).strip() for r in rows)]


def summary_tables(summary, colors):
    cols = list(summary[0])
    config = cols[1:cols.index("steps")] if "steps" in cols else []
    header = [("sae", "sae")] + [(c, c) for c in config]
    header += [(k, TITLES.get(k, (k, ""))[0]) for k in cols
               if k != "sae" and k not in config and k not in GATE_KEYS]
    kinds = {k: TITLES.get(k, ("", ""))[1] for k in cols}
    rows = [{k: fmt(r.get(k), kinds.get(k, "")) for k, _ in header} for r in summary]
    header = drop_empty(header, rows)
    main = table_html(header, rows, swatches=colors)
    gate_header = [("sae", "sae"), ("gates_on", "on")]
    gate_header += [(k, t) for k, t, _, _, _ in GATES if k in cols] + [("gates", "gates")]
    rows, classes = [], []
    for r in summary:
        verdict = gate_verdict(r)
        row = {"sae": r["sae"], "gates_on": r.get("gates_on", ""), "gates": verdict}
        cls = {"gates": "pass" if verdict == "PASS" else "fail" if verdict else ""}
        for k, _, kind, ok, _ in GATES:
            x = number(r.get(k))
            row[k] = fmt(r.get(k), kind)
            if x is not None:
                cls[k] = "" if ok(x) else "fail"
        rows.append(row)
        classes.append(cls)
    return main, table_html(gate_header, rows, classes, swatches=colors)


def held_out_text(config_text):
    """Where the held-out rows come from and when they are evaluated (data.eval_path,
    data.eval_rows, log.eval_every_steps)."""
    unset = (None, "", "0")
    path = yaml_value(config_text, "data", "eval_path")
    rows = yaml_value(config_text, "data", "eval_rows")
    every = yaml_value(config_text, "log", "eval_every_steps")
    if path:
        held = path + (f" (first {rows} rows)" if rows not in unset else "")
    elif rows not in unset:
        held = f"the last {rows} rows of data.path"
    else:
        return "none (data.eval_rows and data.eval_path unset)"
    if every not in unset:
        return held + f"; evaluated every {every} steps and at the end"
    return held + "; evaluated at the end only (log.eval_every_steps: 0)"


def facts_html(run_dir, info, config_text, metrics, state):
    data = yaml_value(config_text, "data", "path")
    held = held_out_text(config_text)
    info = info or {}
    last_steps = [rows[-1]["step"] for rows in metrics.values()]
    total = info.get("total_steps")
    steps = f"{max(last_steps)}" + (f" of {total}" if total else "")
    tokens = max(number(rows[-1].get("tokens")) or 0 for rows in metrics.values())
    ended = info.get("ended") or ("" if state in ("running",) else "not recorded")
    ranks = info.get("ranks")
    where = (f"{ranks} rank(s) on {info.get('hosts')} host(s), backend {info.get('backend')}"
             if ranks else "not recorded (no run.json)")
    resumed = info.get("resumed_from_step")
    facts = [
        ("out_dir", os.path.abspath(run_dir)),
        ("data.path", data or "(config.yaml not found)"),
        ("held-out rows", held),
        ("saetrain version", info.get("version") or "not recorded (no run.json)"),
        ("started (UTC)", (info.get("started") or "not recorded") +
         (f", resumed from step {resumed}" if resumed is not None else "")),
        ("ended (UTC)", ended or "still running"),
        ("ranks, hosts", where),
        ("steps logged", f"{steps} ({si(tokens)} tokens per SAE)"),
        ("SAEs", str(len(metrics))),
        ("report written (UTC)",
         datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")),
    ]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in facts)
    return f'<table class="facts">{rows}</table>'


PAGE_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1700px; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.4em; }
.state { padding: 8px 12px; border-radius: 4px; margin: 0.6em 0; font-weight: bold; }
.state-running { background: #dceefc; border: 1px solid #7ab3e0; }
.state-complete { background: #d9f2d9; border: 1px solid #7cc47c; }
.state-stopped, .state-unknown { background: #fdf1d0; border: 1px solid #e0b84f; }
.state-failed, .state-killed { background: #f8d7d7; border: 1px solid #d98080; }
.run { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.facts th { text-align: left; background: #f6f6f6; } .facts td { text-align: left; }
details { flex: 1; min-width: 420px; }
pre { background: #f6f6f6; border: 1px solid #ddd; padding: 8px; max-height: 28em;
      overflow: auto; font-size: 0.8em; margin: 0.3em 0; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; border: 1px solid #ddd; padding: 6px; background: #fff; }
figure img { width: 720px; } figure.wide img { width: 980px; }
figcaption { font-size: 0.85em; color: #555; max-width: 720px; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; white-space: normal; max-width: 6em; }
td:first-child { text-align: left; }
.facts th { max-width: none; white-space: nowrap; }
td.pass { background: #d9f2d9; } td.fail { background: #f8d7d7; text-align: left; }
.sw { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em;
      vertical-align: -0.05em; border: 1px solid #555; }
.meta { color: #555; font-size: 0.9em; }
"""

CAPTIONS = {
    "loss": "Training loss per token, one panel per architecture: each minimizes its own "
            "objective (the panel's title), so compare losses within a panel and fidelity "
            "across architectures with the FVU.",
    "fvu": "FVU of the training batches (solid) and of the held-out rows (dashed) when the "
           "run has them.",
    "l0": "Active latents per token, training (solid) and held-out (dashed).",
    "dead": "Latents that did not fire for train.dead_tokens tokens (training), and on none "
            "of the held-out rows (dashed).",
    "lr": "The learning rate of every step (a long run's at most 20,000 evenly spaced ones), "
          "computed from the schedule saetrain resolved (run.json) with its formula "
          "(src/core/schedule.cpp); dotted: steps not trained yet; circles: the values "
          "metrics.jsonl logged.",
    "frontier": "One point per SAE (colour as in every plot, marker per architecture).",
    "density": "How often each latent fires, at the end of the run.",
}


def write_index(run_dir, out_dir, metrics, summary, manifest, info, config_text, state,
                colors, archs):
    key, sentence = state
    if summary:
        main, gates = summary_tables(summary, colors)
        main += ('<p class="meta">All of summary.csv is in this table (columns empty for '
                 'every SAE left out); the file itself: '
                 '<a href="summary.csv">summary.csv</a>.</p>')
    else:
        cols = [("sae", "sae", ""), ("step", "step", ""), ("tokens", "tokens", "rate"),
                ("loss", "loss", ""), ("fvu", "train fvu", ""), ("l0", "train l0", ""),
                ("dead_fraction", "train dead %", "%"), ("lr", "lr", ""),
                ("tokens_per_s", "tok/s", "rate"), ("eval_fvu", "held-out fvu", ""),
                ("eval_l0", "held-out l0", ""), ("eval_step", "held-out at step", "")]
        rows = []
        for sae_rows in metrics.values():
            r = dict(sae_rows[-1])
            # The last held-out evaluation, which need not be on the last logged step.
            evals = [e for e in sae_rows if "eval_fvu" in e]
            if evals:
                r.update({k: evals[-1][k] for k in ("eval_fvu", "eval_l0") if k in evals[-1]})
                r["eval_step"] = evals[-1]["step"]
            rows.append({k: fmt(r.get(k), f) for k, _, f in cols})
        header = drop_empty([(k, t) for k, t, _ in cols], rows)
        main = ('<p class="meta">No summary.csv (written when the run completes): each SAE\'s '
                'last logged interval.</p>' + table_html(header, rows, swatches=colors))
        gates = '<p class="meta">The quality gates are measured at the end of the run.</p>'
    figs = []
    for name, m in manifest.items():
        wide = ' class="wide"' if name == "loss" and len(m.get("panels", {})) > 1 else ""
        figs.append(f'<figure{wide}><a href="{name}.svg"><img src="{name}.svg" alt="{name}">'
                    f"</a><figcaption>{html.escape(CAPTIONS.get(name, name))} &middot; "
                    f'<a href="{name}.png">PNG</a></figcaption></figure>')
    objectives = "".join(
        f"<li><b>{html.escape(a)}</b>: {html.escape(OBJECTIVES.get(a, ('', 'its own'))[1])}"
        "</li>" for a in sorted(set(archs.values())))
    config_block = (f"<details open><summary>The resolved config (<a href=\"config.yaml\">"
                    f"config.yaml</a>, every default written out)</summary>"
                    f"<pre>{html.escape(config_text)}</pre></details>"
                    if config_text else "<p>config.yaml not found in the run directory.</p>")
    title = os.path.basename(os.path.abspath(run_dir))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>saetrain report: {html.escape(title)}</title>
<style>{PAGE_STYLE}</style></head><body>
<h1>saetrain run: {html.escape(title)}</h1>
<div class="state state-{key}" id="state" data-state="{key}">{html.escape(sentence)}</div>
<div class="run">
{facts_html(run_dir, info, config_text, metrics, key)}
{config_block}
</div>
<h2>Summary</h2>
{main}
<h2>Quality gates</h2>
<p class="meta">On the held-out rows when the run has them, else the last 10% of training;
a red cell fails its gate and the gates column says why, as the console did
(docs/architectures.md).</p>
{gates}
<h2>Plots</h2>
<p class="meta">One colour per SAE on every plot. The losses are each architecture's own
objective:</p><ul class="meta">{objectives}</ul>
<div class="grid">
{"".join(figs)}
</div>
</body></html>
"""
    with out_dir.open("index.html", "w", encoding="utf-8") as f:
        f.write(page)


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
    write_index(run_dir, out_dir, metrics, summary, manifest, info, config_text, state,
                colors, archs)
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
