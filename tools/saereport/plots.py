"""sae-report's plots, each as PNG and SVG with one colour per SAE (sae_colors): the loss per
architecture titled with its objective (OBJECTIVES), fvu, l0 and dead latents, the learning rate
of every step (lr_at, a copy of src/core/schedule.cpp), the sparsity/fidelity frontier and the
feature densities. _save writes each from the report directory's descriptor and records it in
the manifest. matplotlib comes in as `plt` from build_report, so this module imports without
it."""
import math
from collections import OrderedDict

from .read import number, read_density

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
