#!/usr/bin/env python3
"""The sparsity/quality frontier: held-out FVU against held-out L0, every SAE of run.sh's
frontier step (saetrain's architectures at their defaults over sae.k / sae.target_l0, and the
peers' SAEs), as one CSV and one plot.

    python bench/peers/frontier.py --saetrain-runs OUT/saetrain --results OUT/results \\
        --csv OUT/frontier.csv --png OUT/frontier.png [--title TEXT]

saetrain's points: every summary.csv under OUT/saetrain/frontier-*/ (one row per SAE; its own
held-out evaluation, data.eval_path: the same rows and the same FVU definition as the shared
evaluator, which checks it for TopK and ReLU in run.sh's table). The peers' points: every
OUT/results/frontier-*.json that train_peer.py wrote (the shared evaluator). With --previous
CSV, the points of an earlier frontier CSV (the same rows and evaluator, e.g. docs/results.md's)
join them, except where a run here gives the same tool, arch and setting: a partial rerun
(some architectures, a changed default) updates a frontier without rerunning the rest. Prints
the CSV's rows as a Markdown table, sorted by tool, arch and L0.
"""
import argparse
import csv
import glob
import json
import os
import sys

COLUMNS = ["tool", "arch", "setting", "target", "eval_l0", "eval_fvu", "eval_dead_pct",
           "train_l0", "tokens", "tokens_per_s"]


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None  # NaN: absent


def saetrain_points(runs_dir):
    """One point per summary.csv row of runs_dir/frontier-*/summary.csv."""
    points = []
    for path in sorted(glob.glob(os.path.join(runs_dir, "frontier-*", "summary.csv"))):
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if _num(r.get("eval_fvu")) is None:
                    why = ("'s held-out rows have no variance, so its FVU is undefined"
                           if _num(r.get("eval_rows")) else
                           " has no held-out evaluation (eval_fvu); the run needs data.eval_path")
                    raise SystemExit(f"frontier: {path}: SAE {r.get('sae')}{why}")
                k, target = _num(r.get("k")), _num(r.get("target_l0"))
                if r["arch"] in ("relu", "gated", "jumprelu") and target:
                    setting, aim = f"target_l0={target:g}", target
                elif k:
                    setting, aim = f"k={k:g}", k
                else:
                    setting, aim = "defaults", None
                # frontier-ARCH-TAG (run.sh's FRONTIER_TAG): a variant of ARCH, its own series
                tag = os.path.basename(os.path.dirname(path))[len("frontier-" + r["arch"]):]
                if tag.startswith("-"):
                    setting += f", {tag[1:]}"
                points.append({
                    "tool": "saetrain", "arch": r["arch"], "setting": setting, "target": aim,
                    "eval_l0": _num(r["eval_l0"]), "eval_fvu": _num(r["eval_fvu"]),
                    "eval_dead_pct": 100 * (_num(r.get("eval_dead_fraction")) or 0.0),
                    "train_l0": _num(r.get("l0")), "tokens": _num(r.get("tokens")),
                    "tokens_per_s": _num(r.get("tokens_per_s"))})
    return points


def peer_points(results_dir):
    """One point per results_dir/frontier-*.json (train_peer.py's output)."""
    points = []
    for path in sorted(glob.glob(os.path.join(results_dir, "frontier-*.json"))):
        with open(path) as f:
            r = json.load(f)
        if r.get("arch") == "relu":
            setting, aim = f"l1={r.get('l1_coeff'):g}", None
        else:
            setting, aim = f"k={r.get('k')}", _num(r.get("k"))
        if r.get("optimizer"):
            setting += f", {r['optimizer']}"
        points.append({
            "tool": r["tool"], "arch": r["arch"], "setting": setting, "target": aim,
            "eval_l0": _num(r.get("eval_l0")), "eval_fvu": _num(r.get("eval_fvu")),
            "eval_dead_pct": 100 * (_num(r.get("eval_dead_fraction")) or 0.0),
            "train_l0": None, "tokens": _num(r.get("tokens")),
            "tokens_per_s": _num(r.get("tokens_per_s"))})
    return points


def previous_points(path, fresh):
    """The rows of an earlier frontier CSV that no point of `fresh` replaces."""
    seen = {(p["tool"], p["arch"], p["setting"]) for p in fresh}
    points = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise SystemExit(f"frontier: {path} is not a frontier CSV (no column "
                             f"{', '.join(missing)})")
        for r in reader:
            if (r["tool"], r["arch"], r["setting"]) in seen:
                continue
            p = {c: r[c] for c in ("tool", "arch", "setting")}
            p.update({c: _num(r[c]) for c in COLUMNS if c not in p})
            points.append(p)
    return points


def series_name(p):
    opt = p["setting"].split(", ")[1] if ", " in p["setting"] else ""
    return f"{p['tool']} {p['arch']}" + (f" ({opt})" if opt else "")


def plot(points, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0), dpi=150)
    series = {}
    for p in points:
        if p["eval_l0"] and p["eval_fvu"] is not None:
            series.setdefault(series_name(p), []).append(p)
    styles = {"saetrain": ("o", "-"), "saelens": ("s", "--"), "sparsify": ("^", ":")}
    # One colour per tool and architecture (tab10's ten suffice for saetrain's seven and the
    # two peers); a series with an optimizer in its name (an earlier default) is drawn thin
    # and dashed, with hollow markers, in its architecture's colour.
    kinds = sorted({(pts[0]["tool"], pts[0]["arch"]) for pts in series.values()})
    colours = plt.get_cmap("tab10" if len(kinds) <= 10 else "tab20")
    colour = {k: colours(i % colours.N) for i, k in enumerate(kinds)}
    for name, pts in sorted(series.items()):
        pts.sort(key=lambda p: p["eval_l0"])
        marker, line = styles.get(pts[0]["tool"], ("x", "-."))
        c = colour[(pts[0]["tool"], pts[0]["arch"])]
        variant = name.endswith(")") and pts[0]["tool"] == "saetrain"
        ax.plot([p["eval_l0"] for p in pts], [p["eval_fvu"] for p in pts], marker=marker,
                linestyle="--" if variant else line, linewidth=0.8 if variant else 1.5,
                markerfacecolor="none" if variant else c, color=c, alpha=0.7 if variant else 1.0,
                label=name)
    ax.set_xscale("log")
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    l0s = [p["eval_l0"] for pts in series.values() for p in pts]
    if l0s:  # plain ticks at powers of two over the points' range
        ticks = [2 ** i for i in range(0, 17) if min(l0s) / 1.5 <= 2 ** i <= max(l0s) * 1.5]
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("held-out L0 (latents per token)")
    ax.set_ylabel("held-out FVU (lower is better)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--saetrain-runs", required=True, help="OUT/saetrain of run.sh")
    ap.add_argument("--results", required=True, help="OUT/results of run.sh (the peers' JSON)")
    ap.add_argument("--csv", required=True)
    ap.add_argument("--png", default=None, help="the plot (needs matplotlib)")
    ap.add_argument("--title", default="held-out FVU against L0")
    ap.add_argument("--previous", default=None,
                    help="an earlier frontier CSV whose points join these (a run here replaces "
                         "the point of the same tool, arch and setting)")
    a = ap.parse_args()
    points = saetrain_points(a.saetrain_runs) + peer_points(a.results)
    if a.previous:
        points += previous_points(a.previous, points)
    if not points:
        raise SystemExit(f"frontier: no frontier-* runs under {a.saetrain_runs} or "
                         f"{a.results}")
    order = {"saetrain": 0, "saelens": 1, "sparsify": 2}
    points.sort(key=lambda p: (order.get(p["tool"], 9), p["arch"], series_name(p),
                               p["eval_l0"] or 0))
    os.makedirs(os.path.dirname(os.path.abspath(a.csv)), exist_ok=True)
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for p in points:
            w.writerow({c: ("" if p[c] is None else p[c]) for c in COLUMNS})
    if a.png:
        plot(points, a.png, a.title)
    print("| tool | arch | setting | eval L0 | eval FVU | dead % | train L0 |")
    print("|---|---|---|---:|---:|---:|---:|")
    for p in points:
        print(f"| {p['tool']} | {p['arch']} | {p['setting']} | {fmt(p['eval_l0'], '.1f')} | "
              f"{fmt(p['eval_fvu'], '.4f')} | {fmt(p['eval_dead_pct'], '.1f')} | "
              f"{fmt(p['train_l0'], '.1f')} |")
    print(f"frontier: {len(points)} SAEs -> {a.csv}" + (f", {a.png}" if a.png else ""),
          file=sys.stderr)


if __name__ == "__main__":
    main()
