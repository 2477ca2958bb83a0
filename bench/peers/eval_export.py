#!/usr/bin/env python3
"""Evaluates an SAE in SAELens's format (cfg.json + sae_weights.safetensors, as
`sae-export SAE --format saelens --out DIR` writes for saetrain) or in sparsify's
(cfg.json + sae.safetensors, `--format sparsify`; saetrain's TopK transcoders export only so)
on held-out rows with the same evaluator as the peers (bench/peers/sae_eval.py), and writes
one JSON object.

    python bench/peers/eval_export.py SAE_EXPORT_DIR --eval DIR --json OUT \\
        [--tool saetrain] [--summary out_dir/summary.csv --sae-id ID] [--threads 2]
    python bench/peers/eval_export.py SPARSIFY_DIR --eval X_DIR --eval-target Y_DIR ...

A transcoder (a sparsify directory with transcode: true) is judged against --eval-target,
the held-out target rows (an MLP's output), row for row with --eval (its input); its arch is
transcoder, or skip_transcoder when it has a skip connection.

With --summary, the SAE's row of saetrain's summary.csv (matched by --sae-id, or the only
row) supplies tokens, tokens_per_s, steps and saetrain's own C++ evaluation (eval_fvu, eval_l0,
eval_dead_fraction, eval_dense_fraction, when the columns are there), stored as cpp_eval_*
beside this evaluator's numbers for the cross-check.
"""
import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sae_eval import evaluate_saelens_dir, evaluate_sparsify_dir, read_rows  # noqa: E402


def _num(v):
    try:
        return float(v) if v not in (None, "") else None
    except ValueError:
        return None


def summary_row(path, sae_id=None):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if sae_id is not None:
        rows = [r for r in rows if r.get("sae") == sae_id]
    if len(rows) != 1:
        raise SystemExit(f"{path}: {len(rows)} rows match sae {sae_id!r}; pass --sae-id")
    return rows[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export_dir")
    ap.add_argument("--eval", required=True)
    ap.add_argument("--eval-target", help="a transcoder's held-out target rows, row for row "
                    "with --eval")
    ap.add_argument("--json", required=True)
    ap.add_argument("--tool", default="saetrain")
    ap.add_argument("--summary", help="saetrain's out_dir/summary.csv")
    ap.add_argument("--sae-id", help="the row of --summary (its 'sae' column)")
    ap.add_argument("--eval-max-rows", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="where the evaluator runs (cpu, cuda)")
    a = ap.parse_args()

    import torch

    torch.set_num_threads(a.threads)
    ev = read_rows(a.eval, a.eval_max_rows)
    if os.path.exists(os.path.join(a.export_dir, "sae.safetensors")):  # sparsify's layout
        ev_y = read_rows(a.eval_target, a.eval_max_rows) if a.eval_target else None
        m, cfg = evaluate_sparsify_dir(a.export_dir, ev, target=ev_y, batch_size=a.batch_size,
                                       device=a.device)
        arch = ("skip_transcoder" if cfg.get("skip_connection") else "transcoder") \
            if cfg.get("transcode") else "topk"
        d_in = cfg.get("d_in")
        d_sae = cfg.get("num_latents") or (d_in or 0) * cfg.get("expansion_factor", 0)
    else:
        if a.eval_target:
            raise SystemExit(f"{a.export_dir}: a SAELens-format SAE, but --eval-target given")
        m, cfg = evaluate_saelens_dir(a.export_dir, ev, batch_size=a.batch_size,
                                      device=a.device)
        arch = "topk" if cfg.get("architecture") == "topk" else "relu"
        d_in, d_sae = cfg.get("d_in"), cfg.get("d_sae")
    out = {"tool": a.tool, "arch": arch}
    if arch != "relu":
        out["k"] = cfg.get("k")
    out["expansion"] = d_sae // d_in if d_in and d_sae and d_sae % d_in == 0 else None
    out["n_latents"] = d_sae
    md = cfg.get("metadata") or {}
    if md.get("saetrain_tokens") is not None:
        out["tokens"] = int(md["saetrain_tokens"])
    if md.get("saetrain_step") is not None:
        out["steps"] = int(md["saetrain_step"])
    if a.summary:
        r = summary_row(a.summary, a.sae_id)
        out["sae_id"] = r.get("sae")
        if arch == "relu" and _num(r.get("l1_coeff")) is not None:
            out["l1_coeff"] = _num(r["l1_coeff"])
        for key in ("lr", "tokens_per_s", "tflops", "host_mem_peak_GB"):
            if _num(r.get(key)) is not None:
                out[key] = _num(r[key])
        for key in ("tokens", "steps"):
            if _num(r.get(key)) is not None:
                out[key] = int(_num(r[key]))
        if out.get("tokens") and out.get("tokens_per_s"):
            out["seconds"] = out["tokens"] / out["tokens_per_s"]
        out["train_fvu_last"] = _num(r.get("fvu"))
        out["train_l0_last"] = _num(r.get("l0"))
        for key in ("eval_fvu", "eval_l0", "eval_dead_fraction", "eval_dense_fraction"):
            if _num(r.get(key)) is not None:
                out["cpp_" + key] = _num(r[key])
    out.update(m)
    out["export_dir"] = os.path.abspath(a.export_dir)
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    cross = ""
    if "cpp_eval_fvu" in out:
        cross = (f" (saetrain's own: fvu {out['cpp_eval_fvu']:.4f} l0 "
                 f"{out.get('cpp_eval_l0', float('nan')):.1f})")
    print(f"eval_export: {a.export_dir}: {arch}, eval fvu {m['eval_fvu']:.4f} l0 "
          f"{m['eval_l0']:.1f} dead {100 * m['eval_dead_fraction']:.1f}% dense "
          f"{100 * m['eval_dense_fraction']:.1f}%{cross} -> {a.json}")


if __name__ == "__main__":
    main()
