#!/usr/bin/env python3
"""features_bench.py: sae-features' rows/s beside the same SAE's training step, in one run.

    .venv/bin/python bench/features_bench.py [SAE_DIR] [--build build/cpu]

SAE_DIR defaults to runs/minilm/sae/topk-x16-k32 (bash tools/minilm-quickstart.sh trains it on
MiniLM's million tokens). Prints, at the SAE's shape and on its training data:
- the training step's tokens/s (bench_step, streamed, 4096-row batches, all cores), and the
  run's own figure from its summary.csv;
- sae-features on 1 rank x all cores, 1 rank x 1 thread and R ranks x 1 thread (R = cores), each
  as rows/s and as a multiple of the training step (target: 2x) or of 1 rank x 1 thread
  (target: R ranks >= 0.9 R x);
- the limit a forward pass has: the encoder GEMM and the top-k of bench_step's breakdown, the
  two passes training and sae-features share, as rows/s and as a multiple of the training step.
"""
import argparse
import csv
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        sys.exit(f"features_bench: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sae", nargs="?", default="runs/minilm/sae/topk-x16-k32")
    ap.add_argument("--build", default="build/cpu")
    a = ap.parse_args()
    apps, bench = os.path.join(a.build, "apps"), os.path.join(a.build, "bench")
    info = run([os.path.join(apps, "sae-inspect"), os.path.join(a.sae, "final.h5")])
    m = re.search(r"d_model (\d+)\s+n_latents (\d+)\s+k (\d+)", info)
    if not m:
        sys.exit(f"features_bench: {a.sae}: not a TopK SAE file (sae-inspect: {info.strip()})")
    d, n, k = m.groups()
    cores = os.cpu_count() or 1
    step = run([os.path.join(bench, "bench_step"), "--d-model", d, "--latents", n, "--k", k,
                "--batch", "4096", "--arch", "topk", "--reps", "5", "--breakdown"])
    streamed = float(re.search(r"streamed: [\d.]+ ms a step .* (\d+) tokens/s", step).group(1))
    gemm = float(re.search(rf"gemm 4096x{n}x{d}\s+([\d.]+) ms", step).group(1))
    topk = float(re.search(r"topk_forward\s+([\d.]+) ms", step).group(1))
    bound = 4096 / ((gemm + topk) / 1e3)
    summary = os.path.join(a.sae, "..", "..", "summary.csv")
    run_tok = None
    if os.path.exists(summary):
        with open(summary, newline="") as f:
            for row in csv.DictReader(f):
                run_tok = float(row.get("tokens_per_s") or row.get("tok_per_s") or 0) or None

    def features(ranks, threads):
        cmd = [os.path.join(apps, "sae-features"), a.sae, "--out", f"/tmp/features-bench-{ranks}",
               "--threads", str(threads)]
        if ranks > 1:
            cmd = ["mpirun", "--oversubscribe", "-np", str(ranks)] + cmd
        out = run(cmd)
        rows, secs = re.search(r"sae-features: (\d+) rows in ([\d.]+) s", out).groups()
        return int(rows) / float(secs)

    wide = features(1, cores)
    one = features(1, 1)
    many = features(cores, 1)
    print(f"features_bench | {a.sae} | d_model {d} n_latents {n} k {k} | {cores} cores")
    print(f"{'what':<40} {'rows/s':>9} {'x':>6}  against")
    print(f"{'training step (bench_step, streamed)':<40} {streamed:>9.0f} {1.0:>6.2f}  itself")
    if run_tok:
        print(f"{'training run (its summary.csv)':<40} {run_tok:>9.0f} {run_tok / streamed:>6.2f}"
              "  the training step")
    print(f"{f'sae-features 1 rank x {cores} threads':<40} {wide:>9.0f} {wide / streamed:>6.2f}"
          "  the training step (target 2.00)")
    print(f"{'forward limit (encoder GEMM + top-k)':<40} {bound:>9.0f} {bound / streamed:>6.2f}"
          f"  the training step ({gemm:.1f} + {topk:.1f} ms a 4096-row batch)")
    print(f"{'sae-features 1 rank x 1 thread':<40} {one:>9.0f} {1.0:>6.2f}  itself")
    print(f"{f'sae-features {cores} ranks x 1 thread':<40} {many:>9.0f} {many / one:>6.2f}"
          f"  1 rank x 1 thread (target {0.9 * cores:.2f})")


if __name__ == "__main__":
    main()
