"""tools/bench_torch_clt.py at tiny shapes, one thread (the whole file in well under 20 s):

- --check passes: dense and sparse agree, and every activation's loss and gradients equal the
  plain loops';
- --check fails, in one line and with exit status 1, when the sparse decoder is planted wrong
  (a layer's picks written one layer too far) or JumpReLU's threshold gradient is;
- a timing run with --json prints a header and one row per (activation, variant), JumpReLU dense
  only, with tokens/s = batch / step and the compact parameter count;
- bf16 on the CPU is refused in one line.

    .venv/bin/python -m pytest test/python/test_bench_torch_clt.py
"""
import json
import pathlib
import subprocess
import sys

import pytest

from strict import need_module

torch = need_module("torch")

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "bench_torch_clt.py"
sys.path.insert(0, str(ROOT / "tools"))
import bench_torch_clt  # noqa: E402


def test_check_passes():
    # The one run as a program: --check as the engineer types it.
    r = subprocess.run([sys.executable, str(TOOL), "--threads", "1", "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "bench_torch_clt --check: passed"
    for act in bench_torch_clt.ACTIVATIONS:
        assert f"--check: {act} " in r.stdout


def run_main(monkeypatch, capsys, *args):
    """main() in this process (torch's start-up is paid once): (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["bench_torch_clt.py", "--threads", "1", *args])
    code = 0
    try:
        bench_torch_clt.main()
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def planted_check(monkeypatch, capsys, name, replacement):
    monkeypatch.setattr(bench_torch_clt, name, replacement)
    code, _, err = run_main(monkeypatch, capsys, "--check")
    assert code == 1
    err = err.splitlines()
    assert len(err) == 1 and err[0].startswith("bench_torch_clt: error: "), err
    return err[0]


def test_check_fails_on_a_wrong_sparse_decoder(monkeypatch, capsys):
    right = bench_torch_clt.decode_sparse

    def shifted(flat, vals, B, L, n_feat, w_dec, b_dec):
        # Layer 0's picks decoded with layer 1's picks: another feature's rows at its place.
        return right((flat + n_feat) % (B * L * n_feat), vals, B, L, n_feat, w_dec, b_dec)

    line = planted_check(monkeypatch, capsys, "decode_sparse", shifted)
    assert "topk sparse" in line


def test_check_fails_on_a_wrong_threshold_gradient(monkeypatch, capsys):
    right = bench_torch_clt.JumpReLU

    class NoKernel(right):
        @staticmethod
        def backward(ctx, dz):
            dv, _, _ = right.backward(ctx, dz)
            return dv, None, None  # the threshold learns only from the L0 term

    line = planted_check(monkeypatch, capsys, "JumpReLU", NoKernel)
    assert "jumprelu" in line and "log_threshold" in line


def test_timing_rows_in_json(monkeypatch, capsys):
    L, d, n_feat, k, batch = 2, 16, 64, 2, 32
    code, out, err = run_main(monkeypatch, capsys, "--layers", str(L), "--d-model", str(d),
                              "--features", str(n_feat), "--k", str(k), "--batch", str(batch),
                              "--reps", "2", "--warmup", "1", "--activation",
                              "topk,batchtopk,jumprelu", "--variants", "dense,sparse", "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines[0]["kind"] == "header" and lines[0]["threads"] == 1
    assert lines[0]["adam"] in ("fused", "foreach")
    rows = lines[1:]
    assert [(row["activation"], row["variant"]) for row in rows] == [
        ("topk", "dense"), ("topk", "sparse"), ("batchtopk", "dense"), ("batchtopk", "sparse"),
        ("jumprelu", "dense")]
    compact = L * n_feat * d + L * (L + 1) // 2 * n_feat * d + L * n_feat + L * d
    for row in rows:
        assert row["step_ms"] > 0 and row["peak_mem_bytes"] > 0
        assert row["tokens_per_s"] == pytest.approx(batch / (row["step_ms"] / 1e3))
        thresholds = L * n_feat if row["activation"] == "jumprelu" else 0
        assert row["params"] == compact + thresholds


def test_bf16_on_the_cpu_is_refused(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "--dtype", "bf16", "--device", "cpu")
    assert code == 2
    assert err.splitlines()[-1].startswith("bench_torch_clt: error: --dtype bf16")
