#!/usr/bin/env python3
"""sae-report: plots and one HTML page for a saetrain run directory (run.out_dir).

    sae-report RUN_DIR [--out DIR]        # writes RUN_DIR/report/ (or DIR)

Writes, as PNG and SVG:
  loss, fvu, l0, dead, lr   one curve per SAE against training tokens (metrics.jsonl)
  frontier                  the sweep's sparsity/fidelity frontier: L0 (log axis) against FVU,
                            one labelled point per SAE, one marker per architecture; held-out
                            figures when the run evaluated on held-out rows, else the last log
                            interval's training figures
  density                   log10 feature-density histograms, one per SAE
                            (sae/<id>/feature_density.csv, written at the end of a run)
and index.html showing them with the summary table and the quality gates. A run still in
progress (a partial metrics.jsonl, no summary.csv yet) and a resumed one (metrics.jsonl cut at
the checkpoint, then continued) both work: the table then holds the last logged row per SAE.
report/manifest.json lists every plot with its series, which the tests check against the SVGs
(each series is an SVG group with id "series-<n>").

Every bad input ends with one line on stderr and exit code 1.
"""
import argparse
import csv
import html
import json
import math
import os
import sys
from collections import OrderedDict

# The curves: (file name, metrics.jsonl key, axis label, scale factor, log y axis).
CURVES = [
    ("loss", "loss", "loss", 1.0, True),
    ("fvu", "fvu", "FVU (training batches)", 1.0, True),
    ("l0", "l0", "L0 (active latents per token)", 1.0, True),
    ("dead", "dead_fraction", "dead latents (%)", 100.0, False),
    ("lr", "lr", "learning rate", 1.0, False),
]
MARKERS = {"relu": "o", "topk": "s", "batchtopk": "D", "jumprelu": "^", "gated": "v",
           "switch": "P"}


class ReportError(Exception):
    pass


# --- reading the run ---------------------------------------------------------------------------

def read_metrics(run_dir):
    """Rows of metrics.jsonl by SAE, in step order. A torn last line (a run writing it right
    now) is skipped; a step logged twice keeps its last row."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ReportError(f"{path}: no such file; give a saetrain run directory (its "
                          "run.out_dir) that has logged at least one interval")
    by_sae = OrderedDict()
    with open(path, encoding="utf-8") as f:
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
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_density(run_dir, sae):
    """(bin lower edges, counts, latents that never fired) or None."""
    path = os.path.join(run_dir, "sae", sae, "feature_density.csv")
    if not os.path.isfile(path):
        return None
    lo, counts, never = [], [], 0
    try:
        with open(path, newline="", encoding="utf-8") as f:
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


def arch_of(sae, summary_row):
    if summary_row and summary_row.get("arch"):
        return summary_row["arch"]
    return sae.split("-x")[0].split("-")[0]  # ids are "<arch>-x<expansion>-..."


def number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# --- plots -------------------------------------------------------------------------------------

def _save(fig, out_dir, name, series, kind, manifest):
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out_dir, f"{name}.{ext}"), dpi=110 if ext == "png" else None)
    manifest[name] = {"kind": kind, "series": series,
                      "files": [f"{name}.png", f"{name}.svg"]}


def plot_curves(plt, metrics, out_dir, manifest):
    for name, key, label, scale, log_y in CURVES:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        series = []
        for i, (sae, rows) in enumerate(metrics.items()):
            pts = [(number(r.get("tokens")), number(r.get(key))) for r in rows]
            pts = [(t, v * scale) for t, v in pts if t is not None and v is not None]
            if not pts:
                continue
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".",
                              markersize=3, linewidth=1.3, label=sae)
            line.set_gid(f"series-{i}")
            series.append(sae)
        if log_y and all(v > 0 for line in ax.get_lines() for v in line.get_ydata()) \
                and ax.get_lines():
            ax.set_yscale("log")
            plain = plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
            ax.tick_params(axis="y", which="minor", labelsize=7)
        ax.set_xlabel("training tokens")
        ax.set_ylabel(label)
        ax.set_title(f"{label} per SAE")
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        _save(fig, out_dir, name, series, "curve", manifest)
        plt.close(fig)


def frontier_points(metrics, summary):
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
        pts.append((sae, arch_of(sae, s), l0, fvu, held_out))
    return pts


def plot_frontier(plt, metrics, summary, out_dir, manifest):
    pts = frontier_points(metrics, summary)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    archs = sorted({p[1] for p in pts})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    series = []
    for i, (sae, arch, l0, fvu, _) in enumerate(pts):
        c = colors[archs.index(arch) % len(colors)]
        (pt,) = ax.plot([max(l0, 1e-3)], [fvu], linestyle="none",
                        marker=MARKERS.get(arch, "X"), markersize=8, color=c)
        pt.set_gid(f"series-{i}")
        ax.annotate(sae, (max(l0, 1e-3), fvu), textcoords="offset points", xytext=(6, 4),
                    fontsize=7)
        series.append(sae)
    for arch in archs:  # one legend entry per architecture
        ax.plot([], [], linestyle="none", marker=MARKERS.get(arch, "X"),
                color=colors[archs.index(arch) % len(colors)], label=arch)
    ax.set_xscale("log")
    plain = plt.matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_formatter(plain)
    ax.xaxis.set_minor_formatter(plain)
    ax.tick_params(axis="x", which="minor", labelsize=7)
    held = pts and all(p[4] for p in pts)
    ax.set_xlabel("L0 (active latents per token, log scale)" + (", held-out" if held else ""))
    ax.set_ylabel("FVU" + (" (held-out rows)" if held else " (last training interval)"))
    ax.set_title("sparsity / fidelity frontier (lower left is better)")
    ax.grid(True, which="both", alpha=0.3)
    if archs:
        ax.legend(title="architecture", fontsize=8)
    if pts:  # room for the labels
        lo, hi = min(p[2] for p in pts), max(p[2] for p in pts)
        ax.set_xlim(max(lo, 1e-3) / 1.6, max(hi, 1e-3) * 2.5)
        flo, fhi = min(p[3] for p in pts), max(p[3] for p in pts)
        pad = 0.12 * (fhi - flo) if fhi > flo else 0.1 * max(abs(fhi), 1e-3)
        ax.set_ylim(flo - pad, fhi + pad)
    fig.tight_layout()
    _save(fig, out_dir, "frontier", series, "frontier", manifest)
    plt.close(fig)
    return pts


def plot_density(plt, run_dir, metrics, out_dir, manifest):
    hists = [(sae, read_density(run_dir, sae)) for sae in metrics]
    hists = [(sae, h) for sae, h in hists if h is not None]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series = []
    for i, (sae, (lo, counts, never)) in enumerate(hists):
        edges = lo + [lo[-1] + 0.5] if lo else []
        # A step outline per SAE, so several overlap legibly.
        (line,) = ax.step(edges, counts + counts[-1:], where="post", linewidth=1.4,
                          label=f"{sae} (never fired: {never})")
        line.set_gid(f"series-{i}")
        series.append(sae)
    ax.set_xlabel("log10 feature density (fraction of tokens a latent fires on)")
    ax.set_ylabel("latents")
    if series:
        ax.set_title("feature density (at the end of the run)")
        ax.legend(fontsize=7)
    else:
        ax.set_title("feature density: not written yet (the run has not finished)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    _save(fig, out_dir, "density", series, "density", manifest)
    plt.close(fig)


# --- the page ----------------------------------------------------------------------------------

def table_html(header, rows, classes=None):
    """header: [(key, title)]; rows: [{key: text}]; classes: [{key: css class}] per row."""
    out = ['<div class="scroll"><table><thead><tr>']
    out += [f"<th>{html.escape(title)}</th>" for _, title in header]
    out.append("</tr></thead><tbody>")
    for i, r in enumerate(rows):
        out.append("<tr>")
        for key, _ in header:
            cls = (classes[i].get(key, "") if classes else "")
            cls = f' class="{cls}"' if cls else ""
            out.append(f"<td{cls}>{html.escape(str(r.get(key, '')))}</td>")
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
        for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
            if abs(x) >= div:
                return f"{x / div:.1f}{suffix}"
        return f"{x:.0f}"
    if x == int(x) and abs(x) < 1e12:
        return str(int(x))
    return f"{x:.4g}"


# The summary's main columns: (key, title, format); the config columns (arch, n_latents and
# the architecture's keys: the ones before "steps" in summary.csv) go after the id.
MAIN_COLUMNS = [("steps", "steps", ""), ("tokens", "tokens", "rate"),
                ("fvu", "train fvu", ""), ("l0", "train l0", ""),
                ("dead_fraction", "train dead %", "%"),
                ("eval_fvu", "held-out fvu", ""), ("eval_l0", "held-out l0", ""),
                ("eval_dead_fraction", "held-out dead %", "%"),
                ("eval_dense_fraction", "held-out dense %", "%"),
                ("feature_recovery", "recovery", ""), ("tokens_per_s", "tok/s", "rate"),
                ("tflops", "TFLOP/s", ""), ("mfu", "MFU %", "%"),
                ("gpu_mem_peak_GB", "GPU mem GB", ""), ("host_mem_peak_GB", "host mem GB", "")]
# The quality gates (quality.h): (key, title, format, passes).
GATES = [("rel_recon_err", "rel_recon_err < 0.1", "", lambda x: x < 0.1),
         ("zeros_frac", "zeros_frac > 0.85", "", lambda x: x > 0.85),
         ("decorr_rms", "decorr_rms < 0.3", "", lambda x: x < 0.3),
         ("gates_dead_fraction", "dead % < 10", "%", lambda x: x < 0.1),
         ("gates_dense_fraction", "dense % < 10", "%", lambda x: x < 0.1)]


def summary_tables(summary):
    cols = list(summary[0])
    config = cols[1:cols.index("steps")] if "steps" in cols else []
    header = [("sae", "sae")] + [(c, c) for c in config]
    header += [(k, t) for k, t, _ in MAIN_COLUMNS if k in cols]
    kinds = {k: f for k, _, f in MAIN_COLUMNS}
    main = table_html(header, [{k: fmt(r.get(k), kinds.get(k, "")) for k, _ in header}
                               for r in summary])
    gate_header = [("sae", "sae"), ("gates_on", "on")]
    gate_header += [(k, t) for k, t, _, _ in GATES if k in cols] + [("gates", "gates")]
    rows, classes = [], []
    for r in summary:
        row = {"sae": r["sae"], "gates_on": r.get("gates_on", ""), "gates": r.get("gates", "")}
        cls = {"gates": {"PASS": "pass", "FAIL": "fail"}.get(r.get("gates", ""), "")}
        for k, _, kind, ok in GATES:
            x = number(r.get(k))
            row[k] = fmt(r.get(k), kind)
            if x is not None:
                cls[k] = "" if ok(x) else "fail"
        rows.append(row)
        classes.append(cls)
    return main, table_html(gate_header, rows, classes)


def write_index(run_dir, out_dir, metrics, summary, manifest, complete):
    if summary:
        status = "finished" if complete else "finished (no COMPLETE marker)"
        main, gates = summary_tables(summary)
        main += '<p class="meta">Every column: <a href="../summary.csv">summary.csv</a>.</p>'
    else:
        status = "in progress (no summary.csv yet): the last logged interval of each SAE"
        cols = [("sae", "sae", ""), ("step", "step", ""), ("tokens", "tokens", "rate"),
                ("loss", "loss", ""), ("fvu", "train fvu", ""), ("l0", "train l0", ""),
                ("dead_fraction", "train dead %", "%"), ("lr", "lr", ""),
                ("tokens_per_s", "tok/s", "rate"), ("eval_fvu", "held-out fvu", ""),
                ("eval_l0", "held-out l0", "")]
        last = [rows[-1] for rows in metrics.values()]
        cols = [c for c in cols if any(c[0] in r for r in last)]
        main = table_html([(k, t) for k, t, _ in cols],
                          [{k: fmt(r.get(k), f) for k, _, f in cols} for r in last])
        gates = "<p>The quality gates are measured at the end of the run.</p>"
    steps = ", ".join(f"{s}: step {rows[-1]['step']}" for s, rows in metrics.items())
    figs = []
    for name, m in manifest.items():
        figs.append(f'<figure><a href="{name}.svg"><img src="{name}.svg" alt="{name}"></a>'
                    f"<figcaption>{name} ({len(m['series'])} series) &middot; "
                    f'<a href="{name}.png">PNG</a></figcaption></figure>')
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>saetrain report: {html.escape(run_dir)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; color: #222; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.15em; margin-top: 1.4em; }}
.grid {{ display: flex; flex-wrap: wrap; gap: 12px; }}
figure {{ margin: 0; border: 1px solid #ddd; padding: 6px; background: #fff; }}
figure img {{ width: 640px; }}
figcaption {{ font-size: 0.85em; color: #555; }}
.scroll {{ overflow-x: auto; max-width: 100%; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 7px; text-align: right; white-space: nowrap; }}
th {{ background: #f0f0f0; }} td:first-child {{ text-align: left; }}
td.pass {{ background: #d9f2d9; }} td.fail {{ background: #f8d7d7; }}
.meta {{ color: #555; font-size: 0.9em; }}
</style></head><body>
<h1>saetrain run: {html.escape(os.path.abspath(run_dir))}</h1>
<p class="meta">Status: {html.escape(status)}. {len(metrics)} SAE(s); {html.escape(steps)}.</p>
<h2>Summary</h2>
{main}
<h2>Quality gates</h2>
<p class="meta">On the held-out rows when the run has them, else the last 10% of training;
a red cell fails its gate (docs/architectures.md).</p>
{gates}
<h2>Plots</h2>
<div class="grid">
{"".join(figs)}
</div>
</body></html>
"""
    with open(os.path.join(out_dir, "index.html"), "w", encoding="utf-8") as f:
        f.write(page)


def build_report(run_dir, out_dir=None):
    """Writes the report; returns the manifest {plot: {kind, series, files}}."""
    if not os.path.isdir(run_dir):
        raise ReportError(f"{run_dir}: no such directory")
    metrics = read_metrics(run_dir)
    summary = read_summary(run_dir)
    out_dir = out_dir or os.path.join(run_dir, "report")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ReportError(f"{out_dir}: cannot create the report directory: {e.strerror}")
    try:
        import matplotlib
    except ImportError:
        raise ReportError(f"matplotlib is not installed for {sys.executable}; run bash "
                          "tools/setup-venv.sh (sae-report uses .venv)")
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "saetrain"  # stable SVG ids from run to run
    import matplotlib.pyplot as plt

    manifest = OrderedDict()
    plot_curves(plt, metrics, out_dir, manifest)
    plot_frontier(plt, metrics, summary, out_dir, manifest)
    plot_density(plt, run_dir, metrics, out_dir, manifest)
    complete = os.path.exists(os.path.join(run_dir, "COMPLETE"))
    write_index(run_dir, out_dir, metrics, summary, manifest, complete)
    with open(os.path.join(out_dir, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump({"run_dir": os.path.abspath(run_dir), "complete": complete,
                   "plots": manifest}, f, indent=1)
    return manifest


def main(argv=None):
    ap = argparse.ArgumentParser(prog="sae-report", description=__doc__.split("\n")[0])
    ap.add_argument("run_dir", help="a saetrain run directory (run.out_dir)")
    ap.add_argument("--out", help="report directory (default RUN_DIR/report)")
    args = ap.parse_args(argv)
    try:
        manifest = build_report(args.run_dir, args.out)
    except ReportError as e:
        print(f"sae-report: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # an unreadable run file, a report directory we cannot write
        print(f"sae-report: error: {e.filename or args.run_dir}: {e.strerror}", file=sys.stderr)
        return 1
    out = args.out or os.path.join(args.run_dir, "report")
    n = len(next(iter(manifest.values()))["series"]) if manifest else 0
    print(f"sae-report: wrote {os.path.join(out, 'index.html')} ({len(manifest)} plots, "
          f"{n} SAE(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
