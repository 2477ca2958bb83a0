#!/usr/bin/env python3
"""serve_load.py — does watching a sweep slow it? sae-serve under N WebSocket clients.

    .venv/bin/python bench/serve_load.py --bin build/cpu/apps [--clients 50] [--reps 3]
        [--rows 1000000] [--d-model 64] [--log-every 5] [--ranks 4] [--out DIR] [--json]

Starts sae-serve on a fresh runs root, then trains the same 4-SAE sweep (k 8, 16, 32, 64; one
SAE per rank under mpirun, launched through the server) 2 x --reps times, alternating runs
without clients and runs with --clients WebSocket clients on /api/runs/ID/stream from the
launch to the end (the order flips every repetition, so a drift of the machine falls on both).
Prints, beside their limits:
  - each run's tokens/s (summary.csv, the SAEs' mean) and the medians with and without clients,
    against the run-to-run spread of the runs without clients (the noise the issue's target
    is measured against: "within the noise" when the medians differ by less than that spread);
  - every client's line count against metrics.jsonl's (each must have every line, once);
  - the fan-out: per step, the time between the first and the last client receiving it.
--json prints the same as one JSON object. The clients run in this process (one asyncio loop)
on the same machine, so they take CPU the run would otherwise have: an upper bound on the cost
of clients that would watch from laptops.
"""
import argparse
import asyncio
import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import requests
import websockets


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def start_server(bin_dir, root, ranks):
    env = dict(os.environ)
    if os.geteuid() == 0:  # Open MPI refuses root without these
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = open(root + ".log", "w")
    proc = subprocess.Popen([os.path.join(bin_dir, "sae-serve"), "--root", root, "--port", "0",
                             "--max-ranks", str(ranks)], stdout=out, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"serve_load: sae-serve exited: {open(root + '.log').read()}")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", open(root + ".log").read())
        if m:
            with open(os.path.join(root, ".sae-serve", "token")) as f:
                return proc, int(m.group(1)), f.read().strip()
        time.sleep(0.05)
    sys.exit("serve_load: sae-serve did not start in 60 s")


def sweep_config(data, log_every):
    return (f"data: {{path: {data}, batch_size: 1024}}\n"
            "sae: {arch: topk, expansion: 4, k: [8, 16, 32, 64]}\n"
            f"log: {{every_steps: {log_every}}}\n"
            "checkpoint: {every_steps: 100000}\nbackend: cpu\n")


async def client(url, headers, steps_seen):
    """One watcher: every metrics line of the run until its state is final."""
    lines = []
    async with websockets.connect(url, additional_headers=headers, max_size=None,
                                  max_queue=None, open_timeout=60) as ws:
        while True:
            m = json.loads(await ws.recv())
            if m["type"] == "metrics":
                now = time.monotonic()
                lines += [(x["step"], x["sae"]) for x in m["lines"]]
                first_last = steps_seen.setdefault(m["step"], [now, now])
                first_last[0], first_last[1] = min(first_last[0], now), max(first_last[1], now)
            elif m["type"] == "state" and m["state"] in ("complete", "stopped", "failed"):
                return lines, m["state"]


async def watch(port, token, run_id, n):
    headers = {"Authorization": f"Bearer {token}"}
    url = f"ws://127.0.0.1:{port}/api/runs/{run_id}/stream"
    steps_seen = {}
    results = await asyncio.gather(*[client(url, headers, steps_seen) for _ in range(n)])
    return results, steps_seen


def run_once(port, token, root, data, args, run_id, clients):
    auth = {"Authorization": f"Bearer {token}"}
    r = requests.post(f"http://127.0.0.1:{port}/api/runs?id={run_id}&ranks={args.ranks}",
                      data=sweep_config(data, args.log_every).encode(), headers=auth, timeout=60)
    if r.status_code != 201:
        sys.exit(f"serve_load: POST /api/runs: {r.status_code} {r.text}")
    fanout = []
    if clients:
        # Connected right after the launch, while saetrain starts: they see every line live.
        results, steps_seen = asyncio.run(watch(port, token, run_id, clients))
        fanout = [last - first for first, last in steps_seen.values()]
    while True:
        state = requests.get(f"http://127.0.0.1:{port}/api/runs/{run_id}", headers=auth,
                             timeout=60).json()
        if state["state"] not in ("queued", "running", "stopping"):
            break
        time.sleep(0.2)
    if state["state"] != "complete":
        sys.exit(f"serve_load: run {run_id} ended {state['state']}: {state['exit_line']}")
    with open(os.path.join(root, run_id, "summary.csv")) as f:
        rates = [float(row["tokens_per_s"]) for row in csv.DictReader(f)]
    with open(os.path.join(root, run_id, "metrics.jsonl")) as f:
        expected = [(json.loads(x)["step"], json.loads(x)["sae"]) for x in f if x.strip()]
    counts = []
    if clients:
        for lines, final in results:
            counts.append(len(lines) if lines == expected and final == "complete" else
                          -len(lines))  # negative: lines missing, repeated or out of order
    return {"run": run_id, "clients": clients, "tokens_per_s": statistics.mean(rates),
            "lines": len(expected), "client_lines": counts,
            "fanout_max_s": max(fanout) if fanout else None,
            "fanout_median_s": statistics.median(fanout) if fanout else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/cpu/apps", help="the build's apps directory")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3, help="pairs of runs (without, with clients)")
    ap.add_argument("--rows", type=int, default=1000000, help="synthetic training rows")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=5, help="log.every_steps (lines per step)")
    ap.add_argument("--ranks", type=int, default=4, help="one SAE per rank: 4")
    ap.add_argument("--out", help="work directory (default: a temporary one, removed)")
    ap.add_argument("--json", action="store_true", help="print the JSON twin instead")
    a = ap.parse_args()
    if a.ranks != 4:
        sys.exit("serve_load: the sweep has 4 SAEs: --ranks 4")
    work = a.out or tempfile.mkdtemp(prefix="serve_load_")
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "data")
    if not os.path.isdir(data):
        log(f"serve_load: writing {a.rows} synthetic rows of d_model {a.d_model} to {data}")
        subprocess.run([os.path.join(a.bin, "sae-synth"), "--out", data, "--d-model",
                        str(a.d_model), "--rows", str(a.rows), "--shards", "4"], check=True,
                       capture_output=True)
    root = os.path.join(work, f"runs-{int(time.time())}")
    proc, port, token = start_server(a.bin, root, a.ranks)
    runs = []
    try:
        for rep in range(a.reps):
            order = [0, a.clients] if rep % 2 == 0 else [a.clients, 0]
            for n in order:
                run_id = f"rep{rep}-{'clients' if n else 'alone'}"
                log(f"serve_load: {run_id} ({n} clients)")
                runs.append(run_once(port, token, root, data, a, run_id, n))
    finally:
        proc.terminate()
        proc.wait()
        if not a.out:
            shutil.rmtree(work, ignore_errors=True)

    alone = [r["tokens_per_s"] for r in runs if not r["clients"]]
    loaded = [r["tokens_per_s"] for r in runs if r["clients"]]
    med_alone, med_loaded = statistics.median(alone), statistics.median(loaded)
    # The noise needs two runs at least; with one, no verdict.
    spread = (max(alone) - min(alone)) / med_alone if len(alone) > 1 else None
    delta = (med_loaded - med_alone) / med_alone
    within = None if spread is None else abs(delta) <= spread
    every = all(c == r["lines"] for r in runs if r["clients"] for c in r["client_lines"])
    summary = {"clients": a.clients, "reps": a.reps, "rows": a.rows, "d_model": a.d_model,
               "log_every": a.log_every, "runs": runs,
               "median_tokens_per_s_alone": med_alone, "median_tokens_per_s_clients": med_loaded,
               "delta": delta, "noise_alone": spread, "within_noise": within,
               "every_client_every_line": every}
    if a.json:
        print(json.dumps(summary, indent=1))
        return 0 if every else 1
    print(f"sae-serve load: 4-SAE sweep (k 8/16/32/64, {a.ranks} ranks), {a.rows} rows, "
          f"log every {a.log_every} steps, {a.clients} WebSocket clients, {a.reps} pairs")
    print(f"{'run':<16} {'clients':>7} {'tokens/s':>11} {'lines':>7} {'clients w/ every line':>22}"
          f" {'fan-out max s':>14}")
    print(f"{'':<16} {'':>7} {'tok/s':>11} {'file':>7} {'(limit: all)':>22} {'':>14}")
    for r in runs:
        ok = sum(1 for c in r["client_lines"] if c == r["lines"])
        fan = f"{r['fanout_max_s']:.3f}" if r["fanout_max_s"] is not None else "-"
        cl = f"{ok} / {r['clients']}" if r["clients"] else "-"
        print(f"{r['run']:<16} {r['clients']:>7} {r['tokens_per_s']:>11.1f} {r['lines']:>7} "
              f"{cl:>22} {fan:>14}")
    verdict = ("no verdict: one run without clients has no spread (--reps 2 or more)"
               if within is None else
               f"{100 * spread:.1f}% -> {'within' if within else 'OUTSIDE'} the noise")
    print(f"median tokens/s without clients {med_alone:.1f}, with {a.clients}: {med_loaded:.1f} "
          f"({100 * delta:+.1f}%); limit: the spread of the runs without clients, {verdict}")
    print(f"every client received every line once, in order: {'yes' if every else 'NO'}")
    return 0 if every else 1


if __name__ == "__main__":
    sys.exit(main())
