#!/usr/bin/env python3
"""ncu_step_table.py — the kernels of one training step from an Nsight Compute CSV.

    ncu --csv --metrics gpu__time_duration.sum bench_step --backend cuda --arch topk --reps 1 \\
        > ncu.csv
    python3 tools/ncu_step_table.py ncu.csv [--first-kernel sub_rows_kernel]

Takes the kernels from the last launch of --first-kernel (the first kernel of every step: the
encoder input x - b_dec) to the end of the file, and prints each kernel's duration (summed over
its launches in that step, in launch order of first appearance) and the step's total. Kernel
durations under ncu are serialized and cache-flushed, so the total exceeds the step's real time;
the split is what this is for.
"""
import argparse
import csv
import re
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--first-kernel", default="sub_rows_kernel")
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own messages start with ==
    rows = [r for r in csv.DictReader(lines) if r.get("Metric Name") == "gpu__time_duration.sum"]
    if not rows:
        sys.exit(f"{a.csv}: no gpu__time_duration.sum rows")
    starts = [i for i, r in enumerate(rows) if a.first_kernel in r["Kernel Name"]]
    step = rows[starts[-1]:] if starts else rows
    unit = step[0]["Metric Unit"]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[unit]
    totals, order = {}, []
    for r in step:
        name = re.sub(r"\(.*", "", r["Kernel Name"]).replace("void ", "")
        name = re.sub(r"saetrain::cuda::(\(anonymous namespace\)::)?", "", name)[:70]
        if name not in totals:
            order.append(name)
            totals[name] = [0.0, 0]
        totals[name][0] += float(r["Metric Value"].replace(",", "")) * scale
        totals[name][1] += 1
    total = sum(t for t, _ in totals.values())
    print(f"{'kernel':<70} {'launches':>8} {'us':>9}")
    for name in order:
        t, c = totals[name]
        print(f"{name:<70} {c:>8} {t:>9.1f}")
    print(f"{'one step, kernels serialized':<70} {len(step):>8} {total:>9.1f}")


if __name__ == "__main__":
    main()
