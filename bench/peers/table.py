#!/usr/bin/env python3
"""Prints the peer benchmark's results as one Markdown table.

    python bench/peers/table.py RESULTS_DIR [--all-columns] [--reference saelens|sparsify]

Reads every *.json under RESULTS_DIR that train_peer.py or eval_export.py wrote (one SAE
each) and prints: tool, arch, setting, tokens, tok/s, speed vs SAELens, eval FVU, eval L0,
dead %, dense %, and, when some row has saetrain's own C++ evaluation, that FVU / L0 beside
(the cross-check of the shared Python evaluator). Every eval column comes from the one
evaluator (bench/peers/sae_eval.py) on the same held-out rows.

speed vs SAELens: the row's tok/s over SAELens's tok/s for the same arch (the SAELens row
with the same setting when there is one, else the median over SAELens's rows of that arch at
its defaults (no setting_extra such as autocast or a warm-up override; all of them when none
is; of sparsify's, those with Adam, saetrain's optimizer), e.g. over an l1 sweep, whose cost
does not depend on the coefficient). --reference sparsify makes sparsify the tool compared
against ("speed vs sparsify"; the transcoder benchmark, bench/peers/transcoder.sh, where
SAELens has no TopK transcoder).

--l0-range LO,HI (default 20,100): after the table, one line per tool with ReLU rows saying
whether its sweep's eval L0s bracket the range (some L0 <= LO and some >= HI), and which end
of the l1 list to extend when they do not.
"""
import argparse
import glob
import json
import os
import statistics

TOOL_ORDER = {"saetrain": 0, "saelens": 1, "sparsify": 2}
TOOL_NAMES = {"saelens": "SAELens", "sparsify": "sparsify", "saetrain": "saetrain"}
ARCH_ORDER = {"topk": 0, "transcoder": 1, "skip_transcoder": 2, "relu": 3}


def setting(r):
    if r.get("arch") != "relu":
        s = f"k={r.get('k')}"
    else:
        s = f"l1={r.get('l1_coeff'):g}" if r.get("l1_coeff") is not None else "l1=?"
    if r.get("expansion"):
        s += f", x{r['expansion']}"
    if r.get("optimizer"):
        s += f", {r['optimizer']}"
    if isinstance(r.get("lr"), (int, float)):
        s += f", lr {r['lr']:.2g}"
    if r.get("setting_extra"):
        s += f", {r['setting_extra']}"
    return s


def fmt_rate(v):
    if v is None:
        return "-"
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}K" if v >= 1e3 else f"{v:.0f}"


def fmt(v, spec, scale=1.0):
    return "-" if v is None else format(v * scale, spec)


def load(results_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(results_dir, "**", "*.json"), recursive=True)):
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(r, dict) and "tool" in r and "eval_fvu" in r:
            r["_file"] = os.path.relpath(path, results_dir)
            rows.append(r)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results_dir")
    ap.add_argument("--all-columns", action="store_true", help="add steps, seconds, file")
    ap.add_argument("--l0-range", default="20,100", help="ReLU sweep target L0 range LO,HI")
    ap.add_argument("--reference", default="saelens", choices=["saelens", "sparsify"],
                    help="the tool the speed column compares against")
    a = ap.parse_args()
    lo_l0, hi_l0 = (float(v) for v in a.l0_range.split(","))
    rows = load(a.results_dir)
    if not rows:
        raise SystemExit(f"table: no result JSON under {a.results_dir}")

    def ref_rate(r):
        peers = [p for p in rows if p["tool"] == a.reference and p["arch"] == r["arch"]
                 and p.get("tokens_per_s")]
        same = [p for p in peers if setting(p) == setting(r)]
        default = [p for p in peers if not p.get("setting_extra")]
        adam = [p for p in default if p.get("optimizer") == "adam"]  # saetrain's optimizer
        use = same or adam or default or peers
        return statistics.median(p["tokens_per_s"] for p in use) if use else None

    rows.sort(key=lambda r: (ARCH_ORDER.get(r["arch"], 9), TOOL_ORDER.get(r["tool"], 9),
                             r["tool"], r.get("optimizer") or "", r.get("eval_l0") or 0))
    cross = any(r.get("cpp_eval_fvu") is not None for r in rows)
    head = ["tool", "arch", "setting", "tokens", "tok/s", f"speed vs {TOOL_NAMES[a.reference]}",
            "eval FVU", "eval L0", "dead %", "dense %"]
    if cross:
        head += ["saetrain's own eval FVU / L0"]
    if a.all_columns:
        head += ["steps", "seconds", "train FVU (last batch)", "file"]
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join("---" if i < 3 else "---:" for i in range(len(head))) + "|")
    for r in rows:
        rate = r.get("tokens_per_s")
        ref = ref_rate(r)
        speed = f"{rate / ref:.2f}x" if rate and ref else "-"
        cells = [r["tool"], r["arch"], setting(r),
                 f"{r['tokens']:,}" if r.get("tokens") is not None else "-",
                 fmt_rate(rate), speed, fmt(r.get("eval_fvu"), ".4f"),
                 fmt(r.get("eval_l0"), ".1f"), fmt(r.get("eval_dead_fraction"), ".1f", 100),
                 fmt(r.get("eval_dense_fraction"), ".1f", 100)]
        if cross:
            c = r.get("cpp_eval_fvu")
            cells.append("-" if c is None else
                         f"{c:.4f} / {fmt(r.get('cpp_eval_l0'), '.1f')}")
        if a.all_columns:
            cells += [str(r.get("steps", "-")), fmt(r.get("seconds"), ".3g"),
                      fmt(r.get("train_fvu_last"), ".4f"), r["_file"]]
        print("| " + " | ".join(cells) + " |")

    relu_tools = sorted({r["tool"] for r in rows if r["arch"] == "relu"},
                        key=lambda t: TOOL_ORDER.get(t, 9))
    if relu_tools:
        print()
    for tool in relu_tools:
        pts = sorted((r.get("eval_l0"), r.get("l1_coeff")) for r in rows
                     if r["tool"] == tool and r["arch"] == "relu" and r.get("eval_l0") is not None)
        if not pts:
            continue
        l0s = [p[0] for p in pts]
        span = f"{tool} ReLU-L1: eval L0 {min(l0s):.1f} to {max(l0s):.1f} over l1 " + \
            ", ".join(f"{p[1]:g}" for p in sorted(pts, key=lambda p: p[1] or 0))
        need = []
        if min(l0s) > lo_l0:
            need.append(f"no L0 <= {lo_l0:g}: add a larger l1 coefficient")
        if max(l0s) < hi_l0:
            need.append(f"no L0 >= {hi_l0:g}: add a smaller l1 coefficient")
        print(f"- {span}: " + ("; ".join(need) if need else
                                f"brackets {lo_l0:g}-{hi_l0:g}"))


if __name__ == "__main__":
    main()
