#!/usr/bin/env python3
"""Scaling tables from a scaling study's runs (slurm/scaling-study.sbatch), one per kind of run
directory found under OUT:

- OUT/gpus-<N>/summary.csv for N = 1, 2, 4, ... (the GPU-count study): ranks, tokens/s,
  tokens/s per rank, efficiency (tokens/s per rank relative to the smallest run), model
  TFLOP/s per rank, MFU and the memory high-water mark per rank.
- OUT/n<nodes>-s<shards>-r<replicas>-b<batch>/summary.csv (the latent-sharding grid): nodes,
  GPUs (SAEs x replicas x shards), latent shards, replicas, batch (rows per replica per step),
  tokens/s in all and per GPU, TFLOP/s in all and per GPU, MFU and memory per GPU. With
  --predict CMD, where CMD is an sae-perfmodel command line for the study's SAE and GPU,
  the model's tokens/s and memory per GPU stand beside each single-SAE point (CMD is run with
  --nodes, --replicas, --latent-shards, --batch and --json appended).

Every measured figure is what the runs wrote to summary.csv (saetrain's metrics): an SAE's
tokens_per_s and tflops over all its replicas, mfu against its GPUs' summed peak, and the
largest memory high-water mark of its ranks (the GPU's on GPU runs, else the process's resident
set on the host, labelled so). A column the runs did not write shows "-".

Usage: tools/scaling_table.py [--predict "sae-perfmodel --gpu H100 --d-model 4096 ..."] OUT
"""
import argparse
import csv
import json
import pathlib
import re
import shlex
import subprocess
import sys
from typing import NamedTuple

GRID_DIR = re.compile(r"n(\d+)-s(\d+)-r(\d+)-b(\d+)")


class Point(NamedTuple):
    """One run of the latent-sharding grid, as its directory names it."""
    nodes: int
    shards: int
    replicas: int
    batch: int


def number(row: dict, key: str):
    """The cell as a float, or None when the column is absent or empty."""
    value = row.get(key, "")
    try:
        return float(value) if value != "" else None
    except ValueError:
        return None


def cell(value, fmt):
    return "-" if value is None else format(value, fmt)


def summary_rows(run_dir: pathlib.Path) -> list:
    """The SAEs' rows of a run's summary.csv; [] when it is missing or holds no tokens/s."""
    summary = run_dir / "summary.csv"
    if not summary.is_file():
        return []
    with summary.open() as f:
        rows = list(csv.DictReader(f))
    return rows if rows and all(number(r, "tokens_per_s") is not None for r in rows) else []


def gpu_count_runs(root: pathlib.Path) -> list:
    """[(N, first SAE row)] of OUT/gpus-<N>, by N."""
    runs = []
    for d in root.glob("gpus-*"):
        m = re.fullmatch(r"gpus-(\d+)", d.name)
        rows = summary_rows(d) if m else []
        if rows:
            runs.append((int(m.group(1)), rows[0]))
    return sorted(runs, key=lambda r: r[0])


def grid_runs(root: pathlib.Path) -> list:
    """[(Point, SAE rows)] of OUT/n<nodes>-s<shards>-r<replicas>-b<batch>, in grid order."""
    runs = []
    for d in root.glob("n*-s*-r*-b*"):
        m = GRID_DIR.fullmatch(d.name)
        rows = summary_rows(d) if m else []
        if rows:
            runs.append((Point(*(int(g) for g in m.groups())), rows))
    return sorted(runs, key=lambda r: r[0])


def memory_key(rows) -> tuple:
    """The device's memory where the runs were on GPUs, else the host's (CPU backend)."""
    if any(number(r, "gpu_mem_peak_GB") is not None for r in rows):
        return "gpu_mem_peak_GB", "GPU"
    return "host_mem_peak_GB", "host"


def print_gpu_count_table(runs) -> None:
    base = number(runs[0][1], "tokens_per_s") / runs[0][0]
    mem_key, where = memory_key([r for _, r in runs])
    head = ("ranks", "tokens/s", "tokens/s/rank", "efficiency", "TFLOP/s/rank", "MFU",
            f"{where} mem/rank")
    units = ("", "tok/s", "tok/s", "%", "TFLOP/s", "%", "GB")
    line = "{:>6} {:>14} {:>14} {:>11} {:>13} {:>7} {:>14}"
    print(line.format(*head))
    print(line.format(*units))
    for n, r in runs:
        tps = number(r, "tokens_per_s")
        tflops = number(r, "tflops")  # the SAE over all its replicas
        mfu = number(r, "mfu")
        print(line.format(
            n, f"{tps:.0f}", f"{tps / n:.0f}", f"{100 * tps / n / base:.1f}",
            cell(None if tflops is None else tflops / n, ".4g"),
            cell(None if mfu is None else 100 * mfu, ".1f"),
            cell(number(r, mem_key), ".2f")))


class GridRow(NamedTuple):
    """One grid point's measured figures: its SAEs summed (memory: the largest)."""
    gpus: int
    tokens_per_s: float
    tflops: float  # None when a row lacks it
    mfu: float  # None unless every SAE knew its peak
    memory_gb: float  # per GPU, None when not written


def grid_figures(point: Point, rows: list, mem_key: str) -> GridRow:
    tps = sum(number(r, "tokens_per_s") for r in rows)
    tflops = [number(r, "tflops") for r in rows]
    mfus = [number(r, "mfu") for r in rows]
    total_tflops = None if None in tflops else sum(tflops)
    mfu = None
    if total_tflops and None not in mfus and all(m > 0 for m in mfus):
        # Each SAE's MFU is its TFLOP/s over its GPUs' peak: the grid's is all over all.
        mfu = total_tflops / sum(t / m for t, m in zip(tflops, mfus))
    mems = [number(r, mem_key) for r in rows]
    mem = None if None in mems else max(mems)
    return GridRow(len(rows) * point.replicas * point.shards, tps, total_tflops, mfu, mem)


def predict(command: str, point: Point) -> tuple:
    """(tokens/s per GPU, memory per GPU in GB) from sae-perfmodel for one grid point."""
    argv = shlex.split(command) + [
        "--nodes", str(point.nodes), "--replicas", str(point.replicas),
        "--latent-shards", str(point.shards), "--batch", str(point.batch), "--json"]
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"--predict: {' '.join(argv)} exited {r.returncode}: "
                           f"{r.stderr.strip()}")
    out = json.loads(r.stdout)
    return out["predicted_tokens_per_s_per_gpu"], out["predicted_memory_per_gpu_GB"]


def print_grid_table(runs, predict_cmd) -> None:
    mem_key, where = memory_key([r for _, rows in runs for r in rows])
    head = ["nodes", "GPUs", "shards", "replicas", "batch", "tokens/s", "tokens/s/GPU",
            "TFLOP/s", "TFLOP/s/GPU", "MFU", f"{where} mem/GPU"]
    units = ["", "", "", "", "rows", "tok/s", "tok/s", "TFLOP/s", "TFLOP/s", "%", "GB"]
    line = "{:>5} {:>5} {:>6} {:>8} {:>7} {:>13} {:>13} {:>9} {:>11} {:>6} {:>13}"
    if predict_cmd:  # the model's figures, labelled as such
        head += ["pred tok/s/GPU", "pred mem/GPU"]
        units += ["tok/s", "GB"]
        line += " {:>14} {:>12}"
    print(line.format(*head))
    print(line.format(*units))
    for point, rows in runs:
        g = grid_figures(point, rows, mem_key)
        per_gpu_tflops = None if g.tflops is None else g.tflops / g.gpus
        cells = [point.nodes, g.gpus, point.shards, point.replicas, point.batch,
                 f"{g.tokens_per_s:.0f}", f"{g.tokens_per_s / g.gpus:.0f}",
                 cell(g.tflops, ".4g"), cell(per_gpu_tflops, ".4g"),
                 cell(None if g.mfu is None else 100 * g.mfu, ".1f"), cell(g.memory_gb, ".2f")]
        if predict_cmd:
            # The model describes one SAE; a sweep's point has no single prediction.
            tps, mem = predict(predict_cmd, point) if len(rows) == 1 else (None, None)
            cells += [cell(tps, ".0f"), cell(mem, ".2f")]
        print(line.format(*cells))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=pathlib.Path,
                        help="the study's directory (runs/scaling-<jobid>)")
    parser.add_argument("--predict", metavar="CMD",
                        help="sae-perfmodel command line for the study's SAE and GPU")
    args = parser.parse_args(argv)
    counts, grid = gpu_count_runs(args.out), grid_runs(args.out)
    if not counts and not grid:
        print(f"scaling_table: no gpus-*/summary.csv or n*-s*-r*-b*/summary.csv under "
              f"{args.out}", file=sys.stderr)
        return 1
    if counts:
        print_gpu_count_table(counts)
    if grid:
        if counts:
            print()
        try:
            print_grid_table(grid, args.predict)
        except (RuntimeError, OSError, ValueError, KeyError) as e:
            print(f"scaling_table: {e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
