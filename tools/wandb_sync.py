#!/usr/bin/env python3
"""Mirrors a saetrain run into Weights & Biases: every SAE of the run as its own W&B run, all in
one group, with its metrics, its config and, at the end, its summary and quality gates.

    tools/wandb_sync.py RUN_DIR [--follow] [--project saetrain] [--group NAME] [--online]
        [--wandb-dir DIR] [--poll SECONDS]

    .venv/bin/python tools/wandb_sync.py runs/minilm             # after the run, offline
    .venv/bin/python tools/wandb_sync.py runs/sweep --follow &   # beside a running job

Offline by default: nothing leaves the machine, and wandb writes the runs under DIR/wandb
(DIR: --wandb-dir, default the directory holding RUN_DIR: runs/wandb for runs/minilm; never
inside RUN_DIR, which holds saetrain's files only), for `wandb sync DIR/wandb/offline-run-*`
to upload later. `--online` logs
straight to the W&B server the environment names (WANDB_API_KEY, WANDB_BASE_URL, as wandb
reads them).

What is mirrored, from the files saetrain writes in RUN_DIR:
  config    config.yaml (the resolved config) under "saetrain", and the SAE's own settings
            from run.json ("arch", the learning-rate schedule) under "sae"
  history   every line of metrics.jsonl for that SAE, at its "step": each number it carries
            (loss, fvu, l0, dead_fraction, tokens_per_s, eval_* ...); null values (undefined,
            for example an FVU over constant data) are left out of that step
  summary   the SAE's row of summary.csv (numbers as numbers; "gates" PASS/FAIL and
            "gates_failed" as text) and run.json's state, when the run has ended
A resumed run rewrites the metrics after its checkpoint; steps that W&B has already been given
are not sent again (W&B needs increasing steps), so each step is mirrored once.

--follow keeps reading metrics.jsonl as the run writes it (every --poll seconds, default 2) and
finishes when the run has ended (COMPLETE, or run.json's state other than "running") and every
line is read. Without it the tool mirrors what is there and finishes.

The group defaults to the run directory's name and its start time from run.json
("minilm-2026-12-03T01-47-54Z"); a W&B run is named by its SAE id.

Errors print one line `wandb_sync: error: ...` and exit with status 1.
"""
import argparse
import csv
import json
import math
import os
import re
import sys
import time


class SyncError(Exception):
    pass


def parse_args(argv):
    p = argparse.ArgumentParser(prog="wandb_sync.py", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", metavar="RUN_DIR", help="a saetrain run directory (run.out_dir)")
    p.add_argument("--follow", action="store_true", help="mirror a running job until it ends")
    p.add_argument("--project", default="saetrain", help="W&B project (default saetrain)")
    p.add_argument("--group", help="W&B group (default: the run directory's name and start)")
    p.add_argument("--online", action="store_true", help="log to the W&B server (default offline)")
    p.add_argument("--wandb-dir", help="wandb writes under DIR/wandb (default DIR: RUN_DIR's "
                   "parent directory)")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between reads with --follow")
    return p.parse_args(argv)


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise SyncError(f"{path}: not readable as JSON ({e})") from e


def read_config(run_dir):
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.exists(path):
        return {}
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise SyncError(f"{path}: not readable as YAML ({e})") from e
    return cfg if isinstance(cfg, dict) else {}


def read_summary(run_dir):
    """summary.csv's rows by SAE id, numbers converted."""
    path = os.path.join(run_dir, "summary.csv")
    rows = {}
    if not os.path.exists(path):
        return rows
    with open(path, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            sae = row.get("sae")
            if not sae:
                continue
            out = {}
            for key, text in row.items():
                if key is None or key == "sae" or text in (None, ""):
                    continue
                try:
                    value = float(text)
                    out[key] = value if math.isfinite(value) else text
                except ValueError:
                    out[key] = text
            rows[sae] = out
    return rows


def default_group(run_dir, run_json):
    name = os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
    started = (run_json or {}).get("started")
    if isinstance(started, str) and started:
        name += "-" + started.replace(":", "-")
    return name


def run_id(group, sae):
    """A W&B run id (letters, digits, - and _) that names the group and the SAE."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{group}-{sae}")[:128]


class MetricsTail:
    """Complete lines of metrics.jsonl as the run appends them. A file that shrinks (a resumed
    run cut it at its checkpoint) is read again from the start."""

    def __init__(self, path):
        self.path = path
        self.offset = 0
        self.partial = b""

    def read(self):
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            return []
        if size < self.offset:
            self.offset, self.partial = 0, b""
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()  # an incomplete last line waits for the rest
        out = []
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                print(f"wandb_sync: warning: {self.path}: a line that is not JSON is skipped",
                      file=sys.stderr)
                continue
            if isinstance(rec, dict) and isinstance(rec.get("sae"), str):
                out.append(rec)
        return out


def numbers(rec):
    """The numbers of one metrics line, without its sae and step."""
    out = {}
    for key, value in rec.items():
        if key in ("sae", "step") or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = value
    return out


class Mirror:
    def __init__(self, args):
        self.args = args
        self.run_dir = args.run_dir
        self.runs = {}       # SAE id -> wandb run
        self.last_step = {}  # SAE id -> the last step sent
        import wandb

        self.wandb = wandb
        self.run_json = read_json(os.path.join(self.run_dir, "run.json")) or {}
        self.group = args.group or default_group(self.run_dir, self.run_json)
        self.config = read_config(self.run_dir)
        # Beside the run, not in it: saetrain refuses a run directory holding links it did
        # not write, which wandb's own files include.
        self.dir = args.wandb_dir or os.path.dirname(os.path.abspath(self.run_dir))
        os.makedirs(self.dir, exist_ok=True)

    def run_for(self, sae):
        run = self.runs.get(sae)
        if run is None:
            saes = self.run_json.get("saes") if isinstance(self.run_json.get("saes"), dict) else {}
            run = self.wandb.init(
                project=self.args.project, group=self.group, name=sae,
                id=run_id(self.group, sae), job_type="train", dir=self.dir,
                mode="online" if self.args.online else "offline", reinit="create_new",
                config={"saetrain": self.config, "sae": saes.get(sae, {}), "sae_id": sae},
                settings=self.wandb.Settings(console="off", silent=True))
            self.runs[sae] = run
            self.last_step[sae] = -1
        return run

    def log(self, records):
        for rec in records:
            step = rec.get("step")
            if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                continue
            sae = rec["sae"]
            run = self.run_for(sae)
            if step <= self.last_step[sae]:
                continue  # sent before a resume cut the file at its checkpoint
            values = numbers(rec)
            if values:
                run.log(values, step=step)
            self.last_step[sae] = step

    def finish(self):
        self.run_json = read_json(os.path.join(self.run_dir, "run.json")) or self.run_json
        summary = read_summary(self.run_dir)
        for sae in summary:
            self.run_for(sae)  # an SAE that logged no line still gets its run and summary
        for sae, run in self.runs.items():
            run.summary.update(summary.get(sae, {}))
            run.summary["run_state"] = self.run_json.get("state", "unknown")
            run.finish()
        return len(self.runs)


def ended(run_dir):
    if os.path.exists(os.path.join(run_dir, "COMPLETE")):
        return True
    state = (read_json(os.path.join(run_dir, "run.json")) or {}).get("state")
    return state is not None and state != "running"


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if not os.path.isdir(args.run_dir):
            raise SyncError(f"{args.run_dir}: no such run directory")
        metrics = os.path.join(args.run_dir, "metrics.jsonl")
        if not args.follow and not os.path.exists(metrics):
            raise SyncError(f"{metrics}: missing (is {args.run_dir} a saetrain run directory?)")
        mirror = Mirror(args)
        tail = MetricsTail(metrics)
        while True:
            done = ended(args.run_dir)  # before the read, so that no line written after is lost
            mirror.log(tail.read())
            if not args.follow or done:
                break
            time.sleep(args.poll)
        n = mirror.finish()
    except SyncError as e:
        print(f"wandb_sync: error: {e}", file=sys.stderr)
        return 1
    mode = "online" if args.online else f"offline, under {os.path.join(mirror.dir, 'wandb')}"
    print(f"wandb_sync: {n} SAE(s) of {args.run_dir} mirrored to project {args.project}, "
          f"group {mirror.group} ({mode})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
