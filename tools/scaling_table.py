#!/usr/bin/env python3
"""Scaling table from a scaling study's runs: OUT/gpus-<N>/summary.csv for N = 1, 2, 4, ...

Prints ranks, tokens/s, tokens/s per rank and efficiency (tokens/s per rank relative to the
1-rank run). Usage: tools/scaling_table.py runs/scaling-<jobid>
"""
import csv
import pathlib
import re
import sys


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
        if first is None:
            continue
        rows.append((int(m.group(1)), float(first["tokens_per_s"])))
    if not rows:
        print(f"scaling_table: no gpus-*/summary.csv under {root}", file=sys.stderr)
        return 1
    rows.sort()
    base = rows[0][1] / rows[0][0]
    print(f"{'ranks':>6} {'tokens/s':>14} {'tokens/s/rank':>14} {'efficiency':>11}")
    for n, tps in rows:
        print(f"{n:>6} {tps:>14.0f} {tps / n:>14.0f} {100 * tps / n / base:>10.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
