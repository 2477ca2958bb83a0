#!/usr/bin/env python3
"""The table of bench/clt_minilm.sh: each CLT run beside the per-layer transcoder sets, from what
the script left in OUT.

    clt_table.py OUT

Reads OUT/runs/<name>/summary.csv (saetrain's held-out figures on the last data.eval_rows rows
of every layer: eval_fvu_layer<l>, eval_l0_layer<l>, eval_dead_layer<l>; tokens_per_s,
host_mem_peak_GB), OUT/splice/<name>.json (tools/splice_eval.py) and OUT/torch.jsonl
(tools/bench_torch_clt.py). A per-layer set (runs tc-<act>-layer<l>) is one row: its total FVU
is the layers' squared errors summed over their variances summed, each layer's variance
computed here from the same held-out rows (the last eval_rows rows of the layer's target set),
which is the total a CLT's own eval_fvu is; its tokens/s is the tokens of one pass over the
rows divided by the six runs' summed training times, and its memory the largest of the six.
Parameters are compact counts (a CLT: L F d encoders + L (L + 1) / 2 F d decoders, the form
circuit-tracer holds; six transcoders: 12 F d), not what saetrain's dense CLT form allocates.
"""
import csv
import glob
import json
import math
import os
import sys

import h5py
import numpy as np

LAYERS = 6


def read_summary(run_dir):
    path = os.path.join(run_dir, "summary.csv")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        rows = list(csv.DictReader(fh))
    return rows[0] if rows else None


def f(row, key):
    try:
        return float(row[key])
    except (KeyError, TypeError, ValueError):
        return math.nan


def target_variance(run_dir, eval_rows):
    """Sum over the held-out rows of ||y - mean y||^2 of the run's target set (float64)."""
    cfg_path = os.path.join(run_dir, "config.yaml")
    import yaml
    with open(cfg_path) as fh:
        cfg = yaml.safe_load(fh)
    target = cfg["data"]["target_path"]
    target = target[0] if isinstance(target, list) else target
    blocks = []
    need = eval_rows
    for shard in sorted(glob.glob(os.path.join(target, "*.h5")), reverse=True):
        with h5py.File(shard, "r") as h:
            a = h["activations"]
            take = min(need, a.shape[0])
            blocks.insert(0, np.asarray(a[a.shape[0] - take:], dtype=np.float64))
            need -= take
        if need == 0:
            break
    if need > 0:
        sys.exit(f"clt_table: error: {target}: {eval_rows - need} of the {eval_rows} held-out rows "
                 "found (the extraction is gone or changed: rerun bench/clt_minilm.sh with "
                 "STEPS=\"extract train\")")
    y = np.concatenate(blocks)
    return float(((y - y.mean(axis=0)) ** 2).sum())


def splice_figures(out, name):
    path = os.path.join(out, "splice", f"{name}.json")
    if not os.path.exists(path):
        return None, None
    with open(path) as fh:
        rows = json.load(fh)
    rep = next((r for r in rows if r.get("splice") == "replacement"), None)
    layers = [r for r in rows if str(r.get("splice", "")).startswith("layer")]
    one = sum(r["fidelity"] for r in layers) / len(layers) if layers else None
    return (rep["fidelity"] if rep else None), one


def machine():
    """The CPU model and core count, as the table's header names the machine."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores"


def run_date(out):
    """The date of the newest summary.csv the table reads (when the runs were made)."""
    paths = glob.glob(os.path.join(out, "runs", "*", "summary.csv"))
    if not paths:
        return "no runs"
    import datetime
    t = max(os.path.getmtime(p) for p in paths)
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def cell(v, fmt="{:.4f}"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return fmt.format(v)


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip())
        return 1
    out = argv[0]
    rows = []
    for run_dir in sorted(glob.glob(os.path.join(out, "runs", "clt-*"))):
        s = read_summary(run_dir)
        if s is None:
            continue
        name = os.path.basename(run_dir)
        n = f(s, "n_latents")
        F = n / LAYERS
        d = 384
        rep, one = splice_figures(out, name)
        rows.append({
            "model": name, "params": LAYERS * F * d + LAYERS * (LAYERS + 1) / 2 * F * d,
            "fvu": f(s, "eval_fvu"), "layers": [f(s, f"eval_fvu_layer{l}") for l in range(LAYERS)],
            "l0": [f(s, f"eval_l0_layer{l}") for l in range(LAYERS)],
            "dead": [100 * f(s, f"eval_dead_layer{l}") for l in range(LAYERS)],
            "tok_s": f(s, "tokens_per_s"), "mem": f(s, "host_mem_peak_GB"),
            "rep": rep, "one": one})
    acts = sorted({os.path.basename(p).split("-")[1]
                   for p in glob.glob(os.path.join(out, "runs", "tc-*-layer0"))})
    for act in acts:
        per = [read_summary(os.path.join(out, "runs", f"tc-{act}-layer{l}")) for l in range(LAYERS)]
        if any(p is None for p in per):
            continue
        eval_rows = int(f(per[0], "eval_rows"))
        var = [target_variance(os.path.join(out, "runs", f"tc-{act}-layer{l}"), eval_rows)
               for l in range(LAYERS)]
        fvu = [f(p, "eval_fvu") for p in per]
        tokens = f(per[0], "tokens")
        seconds = sum(f(p, "tokens") / f(p, "tokens_per_s") for p in per)
        F = f(per[0], "n_latents")
        rep, one = splice_figures(out, f"tc-{act}")
        rows.append({
            "model": f"6 transcoders ({act})", "params": LAYERS * 2 * F * 384,
            "fvu": sum(a * v for a, v in zip(fvu, var)) / sum(var), "layers": fvu,
            "l0": [f(p, "eval_l0") for p in per],
            "dead": [100 * f(p, "eval_dead_fraction") for p in per],
            "tok_s": tokens / seconds, "mem": max(f(p, "host_mem_peak_GB") for p in per),
            "rep": rep, "one": one})
    print(f"clt_table: {out} | {machine()} | {run_date(out)}")
    print()
    head = (["model", "params (M)", "total FVU"] + [f"FVU {l}" for l in range(LAYERS)]
            + ["L0 a layer", "dead % by layer", "fidelity: replacement", "fidelity: one layer",
               "tok/s", "host mem GB"])
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        l0 = r["l0"]
        l0_cell = (f"{min(l0):.1f}–{max(l0):.1f}" if max(l0) - min(l0) > 0.05
                   else f"{l0[0]:.1f}")
        cells = ([r["model"], f"{r['params'] / 1e6:.1f}", cell(r["fvu"])]
                 + [cell(v) for v in r["layers"]]
                 + [l0_cell, " ".join(f"{v:.0f}" for v in r["dead"]), cell(r["rep"], "{:.3f}"),
                    cell(r["one"], "{:.3f}"), f"{r['tok_s'] / 1e3:.1f}K", f"{r['mem']:.2f}"])
        print("| " + " | ".join(cells) + " |")
    torch_path = os.path.join(out, "torch.jsonl")
    if os.path.exists(torch_path):
        print()
        print("plain PyTorch CLT step at the same shape (tools/bench_torch_clt.py):")
        with open(torch_path) as fh:
            for line in fh:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                j = json.loads(line)
                if "tokens_per_s" in j:
                    print(f"  {j.get('activation')} {j.get('variant')}: "
                          f"{j['tokens_per_s'] / 1e3:.2f}K tok/s, step "
                          f"{j.get('step_ms', math.nan):.0f} ms, peak "
                          f"{j.get('peak_mem_bytes', math.nan) / 2**30:.2f} GiB "
                          f"({j.get('peak_mem_kind', '')})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
