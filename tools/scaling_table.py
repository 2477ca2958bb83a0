#!/usr/bin/env python3
"""Scaling table from a scaling study's runs: OUT/gpus-<N>/summary.csv for N = 1, 2, 4, ...

Prints, per run: ranks, tokens/s, tokens/s per rank, efficiency (tokens/s per rank relative to
the 1-rank run), model TFLOP/s per rank, MFU (when the run knew its devices' peak: the table by
GPU name, or log.peak_tflops) and the memory high-water mark per rank (the GPU's on GPU runs,
else the process's resident set on the host, labelled so). Every figure is what the runs
measured and wrote to summary.csv (saetrain's metrics); a column the runs did not write shows
"-". Usage: tools/scaling_table.py runs/scaling-<jobid>
"""
import csv
import pathlib
import re
import sys


def number(row: dict, key: str):
    """The cell as a float, or None when the column is absent or empty."""
    value = row.get(key, "")
    try:
        return float(value) if value != "" else None
    except ValueError:
        return None


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = pathlib.Path(sys.argv[1])
    rows = []
    for d in root.glob("gpus-*"):
        m = re.fullmatch(r"gpus-(\d+)", d.name)
        summary = d / "summary.csv"
        if not m or not summary.is_file():
            continue
        with summary.open() as f:
            first = next(csv.DictReader(f), None)
        if first is None or number(first, "tokens_per_s") is None:
            continue
        rows.append((int(m.group(1)), first))
    if not rows:
        print(f"scaling_table: no gpus-*/summary.csv under {root}", file=sys.stderr)
        return 1
    rows.sort(key=lambda r: r[0])
    base = number(rows[0][1], "tokens_per_s") / rows[0][0]
    # Memory: the device's where the runs were on GPUs, else the host's (CPU backend).
    on_gpu = any(number(r, "gpu_mem_peak_GB") is not None for _, r in rows)
    mem_key = "gpu_mem_peak_GB" if on_gpu else "host_mem_peak_GB"
    mem_name = "GPU mem/rank" if on_gpu else "host mem/rank"

    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)

    head = ("ranks", "tokens/s", "tokens/s/rank", "efficiency", "TFLOP/s/rank", "MFU", mem_name)
    units = ("", "tok/s", "tok/s", "%", "TFLOP/s", "%", "GB")
    line = "{:>6} {:>14} {:>14} {:>11} {:>13} {:>7} {:>14}"
    print(line.format(*head))
    print(line.format(*units))
    for n, r in rows:
        tps = number(r, "tokens_per_s")
        tflops = number(r, "tflops")  # the SAE over all its replicas
        mfu = number(r, "mfu")
        print(line.format(
            n, f"{tps:.0f}", f"{tps / n:.0f}", f"{100 * tps / n / base:.1f}",
            cell(None if tflops is None else tflops / n, ".4g"),
            cell(None if mfu is None else 100 * mfu, ".1f"),
            cell(number(r, mem_key), ".2f")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
