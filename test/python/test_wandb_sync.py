"""tools/wandb_sync.py: a saetrain run mirrored into Weights & Biases, read back from the
offline run files wandb wrote.

wandb 0.31 has no Python reader of its run files (its internal writer is Go), so the records are
parsed with wandb's own protobuf classes (wandb.proto.wandb_internal_pb2.Record) out of the
file's framing, which is LevelDB's log format behind a 7-byte W&B header (read_records below).

- a 2-SAE sweep trained by saetrain under mpirun: each SAE is its own W&B run, both in one
  group; every number of every metrics.jsonl line is in its run's history at its step, with
  the value saetrain wrote; the config holds config.yaml and the SAE's id; the summary holds
  summary.csv's row (its gates) and the run's state;
- --follow beside a run that writes, is cut back by a resume and rewrites: each step once, in
  increasing order, and the tool ends when the run does;
- a directory that is not there is one line and status 1.

    SAETRAIN_BIN_DIR=build/cpu/apps .venv/bin/python -m pytest test/python/test_wandb_sync.py
"""
import csv
import glob
import json
import os
import struct
import subprocess
import sys
import time
import zlib

import pytest

from strict import need_module, skip_module  # noqa: E402

need_module("wandb")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "tools", "wandb_sync.py")
BIN = os.environ.get("SAETRAIN_BIN_DIR", "")
if not (BIN and os.path.exists(os.path.join(BIN, "saetrain"))):
    skip_module("SAETRAIN_BIN_DIR does not hold the built saetrain apps")

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
           OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", WANDB_SILENT="true")
ENV.pop("WANDB_API_KEY", None)


def _run(*cmd, ok=True, timeout=300):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV,
                       timeout=timeout)
    if ok:
        assert r.returncode == 0, " ".join(map(str, cmd)) + "\n" + r.stdout + r.stderr
    return r


def read_records(path):
    """Every record of a .wandb file, as wandb_internal_pb2.Record, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", path
    block, pos, payload, out = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        assert len(chunk) == length, f"{path}: a record torn at byte {pos}"
        assert zlib.crc32(bytes([kind]) + chunk) & 0xFFFFFFFF == crc, f"{path}: crc at {pos}"
        pos += 7 + length
        payload = chunk if kind in (1, 2) else payload + chunk
        if kind in (1, 4):  # full, or the last piece
            rec = pb.Record()
            rec.ParseFromString(payload)
            out.append(rec)
            payload = b""
    return out


def _value(text):
    v = json.loads(text)
    # wandb keeps config values as {"value": ...} (with a "desc"); unwrap them
    if isinstance(v, dict) and "value" in v and set(v) <= {"value", "desc"}:
        return v["value"]
    return v


def _key(item):
    return item.key or "/".join(item.nested_key)


def read_run(path):
    """One offline run: its id, name, group, config, history {step: {key: value}}, summary."""
    run = {"history": {}, "summary": {}, "config": {}, "steps": []}
    for rec in read_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            run.update(id=rec.run.run_id, name=rec.run.display_name, group=rec.run.run_group)
            for item in rec.run.config.update:
                run["config"][_key(item)] = _value(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                run["config"][_key(item)] = _value(item.value_json)
        elif kind == "history":
            step = rec.history.step.num
            values = {_key(i): json.loads(i.value_json) for i in rec.history.item
                      if not _key(i).startswith("_")}
            run["steps"].append(step)
            run["history"].setdefault(step, {}).update(values)
        elif kind == "summary":
            for item in rec.summary.update:
                run["summary"][_key(item)] = json.loads(item.value_json)
    return run


def runs_under(d):
    files = sorted(glob.glob(os.path.join(d, "wandb", "offline-run-*", "run-*.wandb")))
    return {r["name"]: r for r in map(read_run, files)}


def test_a_sweep_is_one_group_of_runs_holding_every_logged_value(tmp_path):
    data, out = tmp_path / "data", tmp_path / "run"
    _run(os.path.join(BIN, "sae-synth"), "--out", data, "--d-model", "16", "--features", "32",
         "--rows", "4000", "--shards", "2", "--seed", "7")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"run: {{out_dir: {out}}}\n"
                   f"data: {{path: {data}, batch_size: 256, eval_rows: 500}}\n"
                   "sae: {arch: [topk, batchtopk], expansion: 2, k: 4}\n"
                   "log: {every_steps: 3, eval_every_steps: 6}\n")
    _run("mpirun", "--oversubscribe", "-np", "2", os.path.join(BIN, "saetrain"), cfg,
         "--threads", "1")
    r = _run(sys.executable, TOOL, out)
    assert "2 SAE(s) of" in r.stdout and "offline" in r.stdout, r.stdout

    runs = runs_under(tmp_path)
    assert not (out / "wandb").exists(), "wandb wrote inside the run directory"
    ids = sorted(runs)
    assert ids == ["batchtopk-x2-k4", "topk-x2-k4"], ids
    groups = {r["group"] for r in runs.values()}
    assert len(groups) == 1 and groups.pop().startswith("run-"), groups
    assert len({r["id"] for r in runs.values()}) == 2

    lines = [json.loads(x) for x in open(out / "metrics.jsonl") if x.strip()]
    summary = {row["sae"]: row for row in csv.DictReader(open(out / "summary.csv"))}
    for sae, run in runs.items():
        mine = [x for x in lines if x["sae"] == sae]
        assert len(mine) >= 3, sae
        assert run["steps"] == sorted(set(run["steps"])), "each step once, increasing"
        for line in mine:
            got = run["history"][line["step"]]
            for key, value in line.items():
                if key in ("sae", "step") or isinstance(value, bool) or value is None:
                    continue
                if isinstance(value, (int, float)):
                    assert got[key] == value, (sae, line["step"], key, got.get(key), value)
        assert "eval_fvu" in run["history"][mine[-1]["step"]], "held-out figures mirrored"
        assert run["config"]["sae_id"] == sae
        assert run["config"]["saetrain"]["data"]["batch_size"] == 256
        assert run["config"]["sae"]["arch"] == sae.split("-")[0]
        assert run["summary"]["run_state"] == "complete"
        assert run["summary"]["gates"] == summary[sae]["gates"]
        # the last held-out FVU: summary.csv's, printed to 6 digits, and the history's own
        assert run["summary"]["eval_fvu"] == pytest.approx(float(summary[sae]["eval_fvu"]),
                                                           rel=1e-5)
        assert run["summary"].get("gates_failed", "") == summary[sae]["gates_failed"]


def test_follow_mirrors_each_step_once_across_a_resume_and_ends_with_the_run(tmp_path):
    run_dir = tmp_path / "live"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps(
        {"state": "running", "started": "2026-12-03T08:00:00Z", "saes": {"a": {"arch": "topk"}}}))
    metrics = run_dir / "metrics.jsonl"

    def line(step, fvu):
        return json.dumps({"sae": "a", "step": step, "fvu": fvu, "l0": 4.0}) + "\n"

    metrics.write_text(line(10, 0.9) + line(20, 0.8))
    p = subprocess.Popen([sys.executable, TOOL, str(run_dir), "--follow", "--poll", "0.2"],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        with open(metrics, "a") as f:
            f.write(line(30, 0.7) + '{"sae": "a", "st')  # a line still being written
        time.sleep(1)
        # A resume from the checkpoint at step 20 cuts the file there and writes on.
        metrics.write_text(line(10, 0.9) + line(20, 0.8))
        time.sleep(1)
        with open(metrics, "a") as f:
            f.write(line(30, 0.65) + line(40, 0.6))
        time.sleep(1)
        assert p.poll() is None, "--follow ended while the run was running"
        (run_dir / "run.json").write_text(json.dumps({"state": "complete", "saes": {}}))
        so, se = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, se
    run = runs_under(tmp_path)["a"]
    assert run["steps"] == [10, 20, 30, 40], run["steps"]
    assert run["history"][40]["fvu"] == 0.6
    assert run["summary"]["run_state"] == "complete"
    assert run["group"] == "live-2026-12-03T08-00-00Z"


def test_a_missing_directory_is_one_line(tmp_path):
    r = _run(sys.executable, TOOL, tmp_path / "nope", ok=False)
    assert r.returncode == 1
    assert r.stderr.strip() == f"wandb_sync: error: {tmp_path / 'nope'}: no such run directory"
