"""tools/scaling_table.py on a fake scaling study: summary.csv files written here as saetrain
writes them (the columns of src/core/report.cpp), in the directories slurm/scaling-study.sbatch
names.

- the GPU-count runs (gpus-<N>) keep their table: per-rank figures and the efficiency against
  the smallest run;
- the latent-sharding grid (n<nodes>-s<shards>-r<replicas>-b<batch>) is read back point by
  point: GPUs = SAEs x replicas x shards, tokens/s and TFLOP/s per GPU, MFU, memory per GPU;
  directories that are not runs are ignored;
- --predict runs the given sae-perfmodel command with the point's grid appended (checked with
  a stand-in that echoes its arguments, and with the real binary where it is built);
- a directory with no runs is one clear line and exit status 1.

    .venv/bin/python -m pytest test/python/test_scaling_table.py
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "scaling_table.py"
sys.path.insert(0, str(ROOT / "tools"))
import scaling_table  # noqa: E402

COLUMNS = ["sae", "steps", "tokens", "mse", "fvu", "l0", "dead_fraction", "tokens_per_s",
           "wait_fraction", "tflops", "mfu", "gpu_mem_peak_GB", "host_mem_peak_GB", "gates"]


def write_run(directory: pathlib.Path, rows: list) -> None:
    """summary.csv with one line per SAE: (tokens_per_s, tflops, mfu, gpu_mem_peak_GB)."""
    directory.mkdir(parents=True)
    lines = [",".join(COLUMNS)]
    for i, (tps, tflops, mfu, mem) in enumerate(rows):
        lines.append(f"topk-x32-k64-{i},100,409600,0.1,0.2,64,0,{tps},0.01,{tflops},{mfu},"
                     f"{mem},3.5,PASS")
    (directory / "summary.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture()
def study(tmp_path):
    write_run(tmp_path / "gpus-1", [(100000, 10, 0.5, 20.0)])
    write_run(tmp_path / "gpus-2", [(180000, 18, 0.45, 20.5)])
    # One SAE, 2 nodes, 4 replicas x 2 shards = 8 GPUs.
    write_run(tmp_path / "n2-s2-r4-b8192", [(400000, 80, 0.25, 11.5)])
    # One SAE, 1 node, 8 replicas x 1 shard.
    write_run(tmp_path / "n1-s1-r8-b4096", [(640000, 64, 0.2, 21.25)])
    # Two SAEs (a hybrid sweep), 1 node, each 2 replicas x 2 shards: 8 GPUs; the MFU of all is
    # (30 + 10) / (30 / 0.3 + 10 / 0.1) = 0.2, the memory the larger.
    write_run(tmp_path / "n1-s2-r2-b4096", [(300000, 30, 0.3, 9.0), (100000, 10, 0.1, 9.5)])
    # Not runs: a name the grid does not write, a run that died before its summary.
    write_run(tmp_path / "n1-s2-r2-bx", [(1, 1, 1, 1)])
    (tmp_path / "n4-s8-r1-b4096").mkdir()
    return tmp_path


def run_tool(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def table_rows(stdout: str, first_head: str) -> list:
    """The cells of the table whose header starts with first_head, under its units row."""
    lines = stdout.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.split()[:1] == [first_head])
    rows = []
    for ln in lines[start + 2:]:
        if not ln.strip():
            break
        rows.append(ln.split())
    return rows


def test_gpu_count_table_is_kept(study):
    r = run_tool(study)
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout, "ranks")
    # ranks, tokens/s, per rank, efficiency vs 1 rank, TFLOP/s per rank, MFU %, memory.
    assert rows == [["1", "100000", "100000", "100.0", "10", "50.0", "20.00"],
                    ["2", "180000", "90000", "90.0", "9", "45.0", "20.50"]]


def test_grid_table_per_point(study):
    r = run_tool(study)
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout, "nodes")
    # nodes, GPUs, shards, replicas, batch, tokens/s, /GPU, TFLOP/s, /GPU, MFU %, memory/GPU;
    # in (nodes, shards, replicas, batch) order, the non-runs left out.
    assert rows == [
        ["1", "8", "1", "8", "4096", "640000", "80000", "64", "8", "20.0", "21.25"],
        ["1", "8", "2", "2", "4096", "400000", "50000", "40", "5", "20.0", "9.50"],
        ["2", "8", "2", "4", "8192", "400000", "50000", "80", "10", "25.0", "11.50"],
    ]
    assert "GPU mem/GPU" in r.stdout


def test_grid_names_parse():
    assert scaling_table.GRID_DIR.fullmatch("n12-s4-r3-b16384").groups() == (
        "12", "4", "3", "16384")
    for other in ("gpus-8", "n1-s2-r2-bx", "n1-s2-b4096", "n1-s2-r2-b4096-old"):
        assert scaling_table.GRID_DIR.fullmatch(other) is None, other


def test_host_memory_when_no_gpu_column(tmp_path):
    d = tmp_path / "n1-s2-r1-b64"
    d.mkdir()
    (d / "summary.csv").write_text(
        "sae,steps,tokens,tokens_per_s,wait_fraction,tflops,host_mem_peak_GB\n"
        "relu-x4,10,640,5000,0,0.002,0.75\n")
    r = run_tool(tmp_path)
    assert r.returncode == 0, r.stderr
    assert "host mem/GPU" in r.stdout
    assert table_rows(r.stdout, "nodes") == [
        ["1", "2", "2", "1", "64", "5000", "2500", "0.002", "0.001", "-", "0.75"]]


FAKE_MODEL = """import json, sys
a = sys.argv[1:]
arg = lambda name: int(a[a.index(name) + 1])
assert a[:2] == ["--gpu", "H100"] and a[-1] == "--json", a
print(json.dumps({"predicted_tokens_per_s_per_gpu": 1000 * arg("--latent-shards")
                  + 100 * arg("--replicas") + 10 * arg("--nodes") + arg("--batch") // 4096,
                  "predicted_memory_per_gpu_GB": 40.0 / arg("--latent-shards")}))
"""


def test_predict_appends_the_grid(study, tmp_path_factory):
    fake = tmp_path_factory.mktemp("model") / "fake_model.py"
    fake.write_text(FAKE_MODEL)
    r = run_tool("--predict", f"{sys.executable} {fake} --gpu H100", study)
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout, "nodes")
    # shards x 1000 + replicas x 100 + nodes x 10 + batch / 4096; memory 40 GB / shards. The
    # two-SAE point has no single prediction.
    assert [row[-2:] for row in rows] == [["1811", "40.00"], ["-", "-"], ["2422", "20.00"]]
    assert "pred tok/s/GPU" in r.stdout


def test_predict_failure_is_one_line(study):
    r = run_tool("--predict", f"{sys.executable} -c 'import sys; sys.exit(3)'", study)
    assert r.returncode == 1
    assert r.stderr.startswith("scaling_table: --predict:") and "exited 3" in r.stderr


def test_predict_with_sae_perfmodel(study):
    binary = pathlib.Path(os.environ.get("SAETRAIN_BIN_DIR", ROOT / "build" / "cpu" / "apps"))
    binary = binary / "sae-perfmodel"
    if not binary.exists():
        pytest.skip(f"{binary} is not built")
    model = [str(binary), "--gpu", "H100", "--d-model", "4096", "--n-latents", "131072",
             "--k", "64", "--disk-gbps", "7"]
    r = run_tool("--predict", " ".join(model), study)
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout, "nodes")
    # The single-SAE points (rows 0 and 2) carry what sae-perfmodel says for their grid.
    for row, (nodes, shards, replicas, batch) in [(rows[0], (1, 1, 8, 4096)),
                                                  (rows[2], (2, 2, 4, 8192))]:
        direct = subprocess.run(
            model + ["--nodes", str(nodes), "--replicas", str(replicas), "--latent-shards",
                     str(shards), "--batch", str(batch), "--json"],
            capture_output=True, text=True, check=True)
        expected = json.loads(direct.stdout)
        assert row[-2] == f"{expected['predicted_tokens_per_s_per_gpu']:.0f}"
        assert row[-1] == f"{expected['predicted_memory_per_gpu_GB']:.2f}"
    assert rows[1][-2:] == ["-", "-"]


def test_no_runs_is_one_clear_line(tmp_path):
    r = run_tool(tmp_path)
    assert r.returncode == 1
    assert r.stdout == ""
    assert r.stderr.strip().count("\n") == 0 and "no gpus-*/summary.csv" in r.stderr
