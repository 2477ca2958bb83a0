"""sae-serve end to end: a real server on a runs root, real saetrain runs (1 rank alone, 2 ranks
under mpirun) on synthetic shards, and real clients (requests, websockets, headless Chromium).

The server is started with SAETRAIN_FAULT=0:30:STOP in its environment, which every run it
launches inherits: each run's rank 0 stops itself (SIGSTOP) at iteration 30, having logged its
first steps, and waits there until the test sends SIGCONT. "Mid-run" is thus a place in the run
by construction, not a race with the clock: the test disconnects, stops, kills the server there.

    SAETRAIN_BIN_DIR=build/cpu/apps OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \\
        .venv/bin/python -m pytest -q test/serve
"""
import asyncio
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))
from strict import need_module, skip_module  # noqa: E402
from chromium import Chromium  # noqa: E402  (headless Chromium over DevTools)

requests = need_module("requests")
websockets = need_module("websockets")
from serve_helpers import (BIN, TIMEOUT, Server, file_lines, lines_of, proc_state,  # noqa: E402
                           run_pid, stream, thaw, wait_for, wait_frozen)

FREEZE_AT = 30  # SAETRAIN_FAULT's iteration
LOG_EVERY = 5


def config(data, k="4", **extra):
    """A small run: 22,000 training rows of d_model 32 at 128 a step (171 steps), logged every
    5 steps, held-out rows evaluated every 20; k a list makes a sweep."""
    text = (f"data: {{path: {data}, batch_size: 128, eval_rows: 2000, shuffle_buffer_rows: 4096}}\n"
            f"sae: {{arch: topk, expansion: 4, k: {k}}}\n"
            f"log: {{every_steps: {LOG_EVERY}, eval_every_steps: 20}}\n"
            "checkpoint: {every_steps: 20}\nbackend: cpu\n")
    for key, value in extra.items():
        text += f"{key}: {value}\n"
    return text


@pytest.fixture(scope="module")
def tmp():
    d = tempfile.mkdtemp(prefix="sae_serve_e2e_")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def data(tmp):
    out = os.path.join(tmp, "data")
    subprocess.run([os.path.join(BIN, "sae-synth"), "--out", out, "--d-model", "32",
                    "--features", "64", "--rows", "24000", "--shards", "2"],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def server(tmp):
    s = Server(os.path.join(tmp, "runs"), args=["--max-ranks", "2", "--max-body", "65536"],
               env={"SAETRAIN_FAULT": f"0:{FREEZE_AT}:STOP"})
    yield s
    if s.proc.poll() is None:
        s.kill(signal.SIGTERM)
    # The runs launched are detached from the server: end any a failed test left behind.
    for run_id in os.listdir(s.root):
        pid = run_pid(s.root, run_id)
        if pid and proc_state(pid) not in (None, "Z"):
            os.kill(pid, signal.SIGKILL)


def assert_every_line_once(received, root, run_id):
    """The stream's lines are metrics.jsonl's, each once, in the file's order."""
    expected = file_lines(root, run_id)
    keys = [(line["step"], line["sae"]) for line in received]
    assert len(keys) == len(set(keys)), "a line was received twice"
    assert received == expected, (f"received {len(received)} lines, metrics.jsonl has "
                                  f"{len(expected)}")


# ---- the token ---------------------------------------------------------------------------------

def test_every_request_needs_the_token(server):
    token_file = os.path.join(server.root, ".sae-serve", "token")
    assert os.stat(token_file).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(token_file)).st_mode & 0o777 == 0o700
    assert len(server.token) == 64

    for path in ("/", "/api/runs", "/api/runs/x", "/api/runs/x/metrics", "/runs/x/report/"):
        r = requests.get(server.url + path, timeout=60)
        assert r.status_code == 401, (path, r.status_code)
        assert "no token" in r.json()["error"] and token_file in r.json()["error"]
    for headers in ({"Authorization": "Bearer " + "0" * 64},
                    {"Authorization": "Bearer " + server.token[:-1]},
                    {"Authorization": "Basic " + server.token}):
        r = requests.get(server.url + "/api/runs", headers=headers, timeout=60)
        assert r.status_code == 401 and "wrong token" in r.json()["error"]
    r = requests.get(server.url + "/api/runs?token=" + "0" * 64, timeout=60)
    assert r.status_code == 401
    r = requests.post(server.url + "/api/runs", data=b"x", timeout=60)
    assert r.status_code == 401
    assert server.get("/api/runs").status_code == 200

    # The page's first visit: the token becomes an HttpOnly, SameSite=Strict cookie.
    s = requests.Session()
    r = s.get(server.url + "/?token=" + server.token, allow_redirects=False, timeout=60)
    assert r.status_code == 303 and r.headers["Location"] == "/"
    cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and server.token in cookie
    page = s.get(server.url + "/", timeout=60)
    assert page.status_code == 200 and "<title>sae-serve</title>" in page.text
    assert "http://" not in page.text.replace("http://www.w3.org/2000/svg", ""), \
        "the page loads nothing from elsewhere"
    assert s.get(server.url + "/api/runs", timeout=60).status_code == 200
    r = s.post(server.url + "/api/runs", data=b"x", timeout=60)
    assert r.status_code == 401 and "Authorization" in r.json()["error"], \
        "a cookie alone must not launch runs"
    r = s.get(server.url + "/api/runs", headers={"Origin": "http://evil.example"}, timeout=60)
    assert r.status_code == 403

    async def ws_status(headers):
        try:
            async with websockets.connect(f"{server.ws_url}/api/runs/none/stream",
                                          additional_headers=headers, open_timeout=60):
                return 101
        except websockets.exceptions.InvalidStatus as e:
            return e.response.status_code
    assert asyncio.run(ws_status({})) == 401
    assert asyncio.run(ws_status({"Authorization": "Bearer nope"})) == 401
    assert asyncio.run(ws_status(server.auth)) == 404  # the token is right; the run is missing


# ---- bad input ---------------------------------------------------------------------------------

def test_a_bad_config_is_a_400_with_saetrains_own_line(server, data, tmp):
    for body in (config(data).replace("expansion", "expnasion"),
                 config(data) + "train: {lr: -1}\n",
                 "sae: {arch: topk\n",
                 config(data, k="[4, 8]").replace("every_steps: 5,", "every_steps: 0,")):
        r = server.post("/api/runs?id=bad", data=body.encode())
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        # Exactly what `saetrain CONFIG --dry-run` prints for the same text, the file named
        # "request body".
        path = os.path.join(tmp, "bad.yaml")
        with open(path, "w") as f:
            f.write(body)
        dry = subprocess.run([os.path.join(BIN, "saetrain"), path, "--dry-run"],
                             capture_output=True, text=True)
        assert dry.returncode == 1
        assert error == dry.stderr.strip().replace(path, "request body"), (error, dry.stderr)
    assert "did you mean sae.expansion" in server.post(
        "/api/runs?id=bad", data=config(data).replace("expansion", "expnasion").encode()
    ).json()["error"]
    # Job sizes: over --max-ranks, and one the sweep does not fit (saetrain's line).
    r = server.post("/api/runs?id=bad&ranks=3", data=config(data, k="[4, 8]").encode())
    assert r.status_code == 400 and "--max-ranks 2" in r.json()["error"]
    r = server.post("/api/runs?id=bad", data=config(data, k="[4, 8, 16]").encode())
    assert r.status_code == 400 and "--max-ranks 2" in r.json()["error"]
    r = server.post("/api/runs?id=bad&ranks=1", data=config(data, k="[4, 8]").encode())
    assert r.status_code == 400
    assert r.json()["error"].startswith("saetrain: error: ") and "run with 2 rank(s)" in \
        r.json()["error"]
    # Bytes that are not UTF-8 in the config: saetrain's line, with U+FFFD for them.
    r = server.post("/api/runs?id=bad", data=b"data: {path: x}\nsae: {\xff\xfe: 4}\n")
    assert r.status_code == 400
    assert r.json()["error"].startswith("saetrain: error: request body:2: unknown key 'sae.")
    assert "\ufffd" in r.json()["error"]
    for query in ("ranks=0", "ranks=two", "since=1", "id=a&bogus=1"):
        r = server.post("/api/runs?" + query, data=config(data).encode())
        assert r.status_code == 400, (query, r.text)
    assert not os.path.exists(os.path.join(server.root, "bad"))
    assert server.get("/api/runs/none/metrics?since=x").status_code in (400, 404)


def test_paths_cannot_leave_the_runs_root(server, data, tmp):
    outside = os.path.join(tmp, "outside")
    os.makedirs(os.path.join(outside, "report"), exist_ok=True)
    with open(os.path.join(outside, "run.json"), "w") as f:
        json.dump({"state": "complete", "exit_code": 0, "saes": {}}, f)
    with open(os.path.join(outside, "report", "index.html"), "w") as f:
        f.write("outside the root")
    os.symlink(outside, os.path.join(server.root, "escape"))
    for out_dir in ("/etc/evil", "../evil", "a/b", outside, os.path.join(server.root, "..", "x"),
                    os.path.join(server.root, ".sae-serve")):
        body = config(data) + f"run: {{out_dir: '{out_dir}'}}\n"
        r = server.post("/api/runs?ranks=1", data=body.encode())
        assert r.status_code == 400, (out_dir, r.text)
        assert "run.out_dir" in r.json()["error"], r.text
    for run_id in ("..", ".sae-serve", "a%2Fb", "..%2F..%2Fetc"):
        r = server.post(f"/api/runs?id={run_id}", data=config(data).encode())
        assert r.status_code == 400, (run_id, r.text)
        assert "run id" in r.json()["error"]
    r = server.post("/api/runs?id=escape", data=config(data).encode())
    assert r.status_code == 400 and "symlink" in r.json()["error"]
    # data.stage_dir: resolved, not compared as text ('$TMPDIR/..' started with '$TMPDIR').
    for stage in ("/etc/saetrain-stage", "$TMPDIR/../etc/saetrain-stage", "$TMPDIRx/y"):
        r = server.post("/api/runs?id=stage", data=(config(data) + "").replace(
            "shuffle_buffer_rows: 4096", f"shuffle_buffer_rows: 4096, stage_dir: '{stage}'")
            .encode())
        assert r.status_code == 400 and "data.stage_dir" in r.json()["error"], (stage, r.text)
    assert not os.path.exists("/etc/saetrain-stage")
    # Links planted where sae-report reads or writes: refused by the server before it runs it.
    secret = os.path.join(tmp, "secret.txt")
    with open(secret, "w") as f:
        f.write("an unrelated file")
    os.chmod(secret, 0o600)
    for name, target in (("config.yaml", secret), ("report", os.path.join(outside, "report"))):
        run = os.path.join(server.root, "linked-" + name.replace(".", "-"))
        os.makedirs(run)
        with open(os.path.join(run, "metrics.jsonl"), "w") as f:
            f.write('{"sae":"a","step":10,"tokens":640,"fvu":0.5,"l0":4}\n')
        os.symlink(target, os.path.join(run, name))
        r = server.get(f"/runs/{os.path.basename(run)}/report/")
        assert r.status_code == 403, (name, r.status_code, r.text)
        assert f"{name} is a symlink" in r.json()["error"], r.text
        assert "an unrelated file" not in r.text
        assert not os.path.exists(os.path.join(run, "report", "config.yaml"))
    for path in ("/api/runs/%2e%2e", "/api/runs/..%2F..%2Fetc", "/api/runs/.sae-serve",
                 "/api/runs/%2e%2e/metrics", "/runs/%2e%2e/report/"):
        r = server.get(path)
        assert r.status_code == 400, (path, r.status_code)
        assert "run id" in r.json()["error"]
    r = server.get("/api/runs/escape")
    assert r.status_code == 404 and "symlink" in r.json()["error"]
    assert server.get("/runs/escape/report/").status_code == 404
    assert server.get("/runs/escape/report/index.html").status_code == 404
    assert "escape" not in [x["id"] for x in server.get("/api/runs").json()["runs"]]
    # Inside a run: a report file name with a path in it, and a link planted in report/.
    planted = os.path.join(server.root, "planted", "report")
    os.makedirs(planted)
    os.symlink(os.path.join(server.root, ".sae-serve", "token"), os.path.join(planted, "t.txt"))
    r = server.get("/runs/planted/report/t.txt")
    assert r.status_code == 404 and "symlink" in r.json()["error"]
    assert server.token not in r.text
    r = server.get("/runs/planted/report/..%2F..%2F.sae-serve%2Ftoken")
    assert r.status_code == 400 and server.token not in r.text
    # The feature pages' directories below report/: a link planted as one is not followed,
    # and no other directory is served.
    os.symlink(os.path.join(server.root, ".sae-serve"), os.path.join(planted, "features"))
    for path in ("features/token", "features/x/token", "features/"):
        r = server.get(f"/runs/planted/report/{path}")
        assert r.status_code == 404 and server.token not in r.text, path
    r = server.get("/runs/planted/report/plots/a.svg")
    assert r.status_code == 404 and "no such directory" in r.json()["error"]
    assert server.get("/runs/planted/report/features/a/b/c").status_code == 404
    assert sorted(os.listdir(outside)) == ["report", "run.json"], "nothing written outside"
    assert os.listdir(os.path.join(outside, "report")) == ["index.html"]


def test_a_forged_run_json_cannot_direct_a_stop_at_another_process(server, tmp):
    """run.json's pid is a run's only when that process holds the run's lock: a run.json naming
    some other process called saetrain is never sent the stop signal."""
    decoy = os.path.join(tmp, "saetrain")
    shutil.copy("/bin/sleep", decoy)
    proc = subprocess.Popen([decoy, "120"])
    try:
        run = os.path.join(server.root, "forged")
        os.makedirs(run)
        with open(os.path.join(run, "run.json"), "w") as f:
            json.dump({"state": "running", "pid": proc.pid, "host": socket.gethostname(),
                       "saes": {}}, f)
        with open(os.path.join(run, ".saetrain.lock"), "w") as f:
            f.write(f"pid {proc.pid} on {socket.gethostname()}\n")
        r = server.post("/api/runs/forged/stop")
        assert r.status_code == 409, r.text
        assert "holds its lock" in r.json()["error"], r.text
        time.sleep(0.5)
        assert proc.poll() is None, "the decoy was signalled"
    finally:
        proc.kill()
        proc.wait()


def test_idle_connections_without_the_token_cannot_keep_clients_out(tmp):
    """Every slot (--max-clients 4) held by connections that never send a request: a client with
    the token still gets in (the oldest idle one is closed for it), and an idle one is closed
    within its first header's 10 s anyway."""
    s = Server(os.path.join(tmp, "slots"), args=["--max-clients", "4"])
    idle = []
    try:
        for _ in range(8):
            idle.append(socket.create_connection(("127.0.0.1", s.port)))
        r = s.get("/api/runs")
        assert r.status_code == 200, r.text
        # The connections pushed out were closed by the server (a read sees the end).
        closed = 0
        for c in idle:
            c.settimeout(15)
            try:
                closed += c.recv(1) == b""
            except (ConnectionResetError, socket.timeout):
                closed += 1
        assert closed == len(idle), closed
    finally:
        for c in idle:
            c.close()
        s.kill(signal.SIGTERM)


def test_damaged_run_files_do_not_end_the_server(server):
    """Run directories the server only reads, with what a damaged or hand-made run could hold:
    each is shown as well as its files allow; the server stays up."""
    odd = os.path.join(server.root, "odd")
    os.makedirs(odd)
    with open(os.path.join(odd, "run.json"), "w") as f:
        json.dump({"state": 3, "pid": "x", "host": None, "ranks": -5, "total_steps": "many",
                   "saes": ["a"], "exit_code": 1e300}, f)
    with open(os.path.join(odd, "metrics.jsonl"), "w") as f:
        f.write('garbage\n{"sae": "a", "step": 5, "eval_rows": "x", "tokens_per_s": "fast"}\n'
                '{"sae": 1, "step": 5}\n\x00\xff\n')
    with open(os.path.join(odd, "summary.csv"), "w") as f:
        f.write('sae,gates\n"unterminated,\n')
    fifo = os.path.join(server.root, "fifo")
    os.makedirs(fifo)
    os.mkfifo(os.path.join(fifo, "metrics.jsonl"))  # opening it must not block the server
    os.mkfifo(os.path.join(fifo, "run.json"))
    for run_id in ("odd", "fifo"):
        d = wait_for(lambda: server.get(f"/api/runs/{run_id}").status_code == 200 and
                     server.run(run_id), f"GET /api/runs/{run_id}")
        assert d["id"] == run_id
        r = server.get(f"/api/runs/{run_id}/metrics?since=0")
        assert r.status_code == 200
    assert server.get("/api/runs").status_code == 200
    assert server.proc.poll() is None
    with open(server.log) as f:
        assert "terminate" not in f.read()


def test_an_oversized_request_is_413_and_the_server_goes_on(server):
    big = b"# padding\n" * 10000  # 100 KB against --max-body 65536
    r = server.post("/api/runs?id=big", data=big)
    assert r.status_code == 413, r.text
    assert "65536" in r.json()["error"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(100):
            yield b"#" * 1024 + b"\n"
    r = server.post("/api/runs?id=big", data=chunks())
    assert r.status_code == 413, r.text
    r = requests.get(server.url + "/api/runs", headers={**server.auth, "X-Big": "x" * 20000},
                     timeout=60)
    assert r.status_code == 431
    # Expect: 100-continue (curl's, for a body over 1 KiB): "100 Continue" before the body is
    # sent, or at once the final answer when the body would be too large.
    body = b"sae: {expnasion: 4}\n" + b"#" * 2000 + b"\n"
    head = (f"POST /api/runs?id=x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}"
            f"\r\nExpect: 100-continue\r\nContent-Length: {{}}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head.format(len(body)).encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 100 Continue")
        s.sendall(body)
        answer = b""
        while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < int(
                re.search(rb"Content-Length: (\d+)", answer, re.I).group(1)
                if re.search(rb"Content-Length: (\d+)", answer, re.I) else 1):
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 400") and b"expnasion" in answer, answer
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(head.format(10 ** 6).encode())
        assert s.recv(4096).startswith(b"HTTP/1.1 413")
    # A garbled request and a client that hangs up mid-header end only their connection.
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        assert b"400" in s.recv(4096).split(b"\r\n")[0]
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        s.sendall(b"GET /api/runs HTTP/1.1\r\nHost: x\r\n")
    assert server.get("/api/runs").status_code == 200
    assert server.proc.poll() is None
    assert not os.path.exists(os.path.join(server.root, "big"))


# ---- runs --------------------------------------------------------------------------------------

def test_submit_stream_every_line_and_complete(server, data):
    """A 2-SAE sweep on 2 ranks under mpirun: the stream carries every line of metrics.jsonl
    once, in order, then the state complete; the REST views agree."""
    j = server.submit(config(data, k="[4, 8]"), "sweep", ranks=2)
    assert j["command"][:4] == ["mpirun", "--oversubscribe", "-np", "2"]
    assert j["state"] in ("queued", "running")
    pid = wait_frozen(server.root, "sweep")
    received = []
    states = []

    def on_message(m):
        if m["type"] == "state":
            states.append(m["state"])
            if m["state"] == "running" and proc_state(pid) == "T":
                thaw(pid)
    msgs = stream(server, "sweep", until=("complete", "failed"), on_message=on_message)
    received = lines_of(msgs)
    assert "running" in states and states[-1] == "complete", states
    assert msgs[-1]["exit_code"] == 0
    assert_every_line_once(received, server.root, "sweep")
    assert {line["sae"] for line in received} == {"topk-x4-k4", "topk-x4-k8"}
    steps = [m["step"] for m in msgs if m["type"] == "metrics"]
    assert steps == sorted(set(steps)) and all(
        len(m["lines"]) == 2 for m in msgs if m["type"] == "metrics"), "a step came in part"

    d = server.run("sweep")
    assert d["state"] == "complete" and d["exit_code"] == 0 and d["launched"]
    assert d["step"] == steps[-1] == d["total_steps"] and d["eta_s"] is None
    assert "run:" in d["config"] and os.path.join(server.root, "sweep") in d["config"]
    for sae in ("topk-x4-k4", "topk-x4-k8"):
        e = d["sae"][sae]
        assert e["latest"]["step"] == steps[-1]
        assert e["held_out"]["eval_rows"] == 2000
        assert e["gates"]["gates"] in ("PASS", "FAIL") and e["gates"]["gates_on"] == "held-out"
    listed = {x["id"]: x for x in server.get("/api/runs").json()["runs"]}
    assert listed["sweep"]["state"] == "complete"

    # metrics?since=S: the lines of the steps after S, and where to continue from.
    lines = file_lines(server.root, "sweep")
    for since in (None, 0, LOG_EVERY, steps[len(steps) // 2], steps[-1]):
        r = server.get("/api/runs/sweep/metrics" + ("" if since is None else f"?since={since}"))
        assert r.status_code == 200
        got = [json.loads(x) for x in r.text.splitlines()]
        assert got == [x for x in lines if since is None or x["step"] > since]
        assert int(r.headers["X-Last-Step"]) == steps[-1]
    # A finished run's stream from a step: the rest, then its state.
    msgs = stream(server, "sweep", since=steps[-3])
    assert [m["type"] for m in msgs] == ["metrics", "metrics", "state"]
    assert lines_of(msgs) == [x for x in lines if x["step"] > steps[-3]]
    r = server.post("/api/runs/sweep/stop")
    assert r.status_code == 409 and "complete" in r.json()["error"]
    r = server.post("/api/runs/sweep/resume")
    assert r.status_code == 409 and "nothing to resume" in r.json()["error"]
    r = server.post("/api/runs?id=sweep&ranks=2", data=config(data, k="[4, 8]").encode())
    assert r.status_code == 409 and "resume" in r.json()["error"]


def test_stop_exits_75_and_resume_completes(server, data):
    """One rank, saetrain alone: stopped mid-run (exit 75, a checkpoint), resumed, complete; a
    client connected all along receives every line once."""
    server.submit(config(data), "stopme", ranks=1)
    pid = wait_frozen(server.root, "stopme")
    server.wait_state("stopme", "running")
    r = server.post("/api/runs/stopme/resume")
    assert r.status_code == 409
    for query in ("", "&overwrite=1"):  # a running run is never launched over
        r = server.post("/api/runs?id=stopme" + query, data=config(data).encode())
        assert r.status_code == 409 and "stop it first" in r.json()["error"], r.text
    states, received = [], []
    thawed = {}

    def on_message(m):
        if m["type"] == "state":
            states.append(m["state"])
            if m["state"] == "running" and not thawed:
                r = server.post("/api/runs/stopme/stop")
                assert r.status_code == 202, r.text
                assert r.json()["signal"] == "SIGUSR1"
            if m["state"] == "stopping":
                thawed["stop"] = True
                thaw(pid)  # it takes the stop request at its next step
            if m["state"] == "stopped":
                thawed["resume"] = True
                r = server.post("/api/runs/stopme/resume")
                assert r.status_code == 202, r.text
        if m["type"] == "rewind":
            raise AssertionError(f"a stop and resume rewound the metrics: {m}")
    msgs = stream(server, "stopme", until=("complete", "failed"), on_message=on_message)
    received = lines_of(msgs)
    assert "stopping" in states and "stopped" in states, states
    # (The resumed run's queued and running may each fall between two polls: not asserted.)
    assert states.index("stopped") < len(states) - 1 and states[-1] == "complete", states
    stopped_msg = [m for m in msgs if m["type"] == "state" and m["state"] == "stopped"][0]
    assert stopped_msg["exit_code"] == 75
    assert "stopped by a signal" in stopped_msg["exit_line"]
    assert_every_line_once(received, server.root, "stopme")
    with open(os.path.join(server.root, "stopme", "run.json")) as f:
        run = json.load(f)
    assert run["state"] == "complete" and run["resumed_from_step"] is not None
    assert run["resumed_from_step"] > FREEZE_AT - 1


def test_a_client_reconnecting_with_since_loses_and_repeats_nothing(server, data):
    server.submit(config(data, k="[4, 8]"), "hops", ranks=2)
    pid = wait_frozen(server.root, "hops")
    # Frozen mid-run: read two steps, hang up, come back after the last one read.
    first = stream(server, "hops", max_metrics=2)
    last = [m for m in first if m["type"] == "metrics"][-1]["step"]
    logged = [x["step"] for x in file_lines(server.root, "hops")]
    assert max(logged) > last, "the run is not past the steps read"
    wait_for(lambda: server.run("hops")["step"] == max(logged), "the server to read every step")
    again = stream(server, "hops", since=last, until=("running",))
    assert lines_of(first) + lines_of(again) == file_lines(server.root, "hops")
    # A client asking for the steps after one the run has not reached: it gets those only,
    # live (it connects before the run goes on: its first message is the state).
    ahead = max(logged) + 3 * LOG_EVERY
    connected, result = threading.Event(), {}

    def watch_ahead():
        result["msgs"] = stream(server, "hops", since=ahead, until=("complete", "failed"),
                                on_message=lambda m: connected.set())
    t = threading.Thread(target=watch_ahead)
    t.start()
    assert connected.wait(TIMEOUT)
    # Then live: a client that hangs up after every step and reconnects from the last one it
    # has, while the run goes on to its end.
    thaw(pid)
    received, since, done = [], None, False
    while not done:
        msgs = stream(server, "hops", since=since, max_metrics=1,
                      until=("complete", "failed"))
        for m in msgs:
            if m["type"] == "metrics":
                received += m["lines"]
                since = m["step"]
            if m["type"] == "state" and m["state"] in ("complete", "failed"):
                done = True
    assert_every_line_once(received, server.root, "hops")
    assert server.run("hops")["state"] == "complete"
    t.join(TIMEOUT)
    assert lines_of(result["msgs"]) == [x for x in file_lines(server.root, "hops")
                                        if x["step"] > ahead]


def test_a_killed_server_leaves_runs_going_and_a_new_one_picks_them_up(server, data):
    server.submit(config(data, k="[4, 8]"), "survivor", ranks=2)
    server.submit(config(data), "ends-alone", ranks=1)
    server.submit(config(data), "killed-alone", ranks=1)
    pids = {r: wait_frozen(server.root, r) for r in ("survivor", "ends-alone", "killed-alone")}
    last = file_lines(server.root, "survivor")[-1]["step"]
    before = wait_for(lambda: (lambda j: j if j["step"] == last else None)(server.run("survivor")),
                      "the server to read every step logged")
    server.kill(signal.SIGKILL)
    for r, pid in pids.items():
        assert proc_state(pid) == "T", f"{r}'s rank 0 did not outlive the server"
    # While no server is up: one run ends, one is killed outright.
    thaw(pids["ends-alone"])
    os.kill(pids["killed-alone"], signal.SIGKILL)  # ends a stopped process too
    state_dir = os.path.join(server.root, ".sae-serve", "runs")
    for r in ("ends-alone", "killed-alone"):
        wait_for(lambda: os.path.exists(os.path.join(state_dir, r, "exit")),
                 f"{r}'s wrapper to record its exit")
    server.restart()
    after = server.run("survivor")
    assert after["state"] == "running" and after["step"] == before["step"], (before, after)
    d = server.wait_state("ends-alone", ("complete", "failed"))
    assert d["state"] == "complete" and d["exit_code"] == 0 and d["launched"]
    d = server.wait_state("killed-alone", ("complete", "failed"))
    assert d["state"] == "failed" and d["exit_code"] == 128 + 9 and "SIGKILL" in d["exit_line"]
    assert server.post("/api/runs/killed-alone/resume").status_code == 202
    # It resumes from its checkpoint before the freeze, so it stops itself there once more.
    resumed = wait_frozen(server.root, "killed-alone")
    assert resumed != pids["killed-alone"]
    thaw(resumed)
    # The survivor streams from its start through the restart to its end.
    thaw(pids["survivor"])
    msgs = stream(server, "survivor", until=("complete", "failed"))
    assert msgs[-1]["state"] == "complete"
    assert_every_line_once(lines_of(msgs), server.root, "survivor")
    d = server.wait_state("killed-alone", ("complete", "failed"))
    assert d["state"] == "complete", d


# ---- the page ----------------------------------------------------------------------------------

PAGE_STATE = """(() => {
  const q = (s) => [...document.querySelectorAll(s)];
  const charts = {};
  for (const svg of q('#charts svg')) charts[svg.id] = {
    series: Object.fromEntries(q('#' + svg.id + ' polyline.series').map(
      (p) => [p.dataset.sae, Number(p.dataset.points)])),
    held_out: Object.fromEntries(q('#' + svg.id + ' g.held-out').map(
      (g) => [g.dataset.sae, g.querySelectorAll('circle').length])),
    title: svg.querySelector('text.title')?.textContent};
  return {
    runs: q('#runs tbody tr').map((tr) => [...tr.cells].map((c) => c.textContent)),
    run: document.getElementById('run').dataset.run,
    state: document.getElementById('run-state').textContent,
    step: document.getElementById('run-step').textContent,
    total: document.getElementById('run-total').textContent,
    exit_line: document.getElementById('exit-line').textContent,
    last_step: Number(document.getElementById('run').dataset.lastStep),
    drawn_step: Number(document.getElementById('run').dataset.drawnStep),
    charts,
    legend: document.getElementById('legend').textContent,
    gates: q('#gates tbody tr').map((tr) => [...tr.cells].map((c) => c.textContent)),
    latest: q('#latest tbody tr').map((tr) => [...tr.cells].map((c) => c.textContent)),
    report: document.getElementById('report-link').getAttribute('href'),
  };
})()"""


def save(browser, dom, suffix):
    """With SAE_SERVE_PAGE_OUT=PATH: the page as rendered (PATH{suffix}.png) and what the test
    read of its DOM (PATH{suffix}.json), for a person to look at."""
    out = os.environ.get("SAE_SERVE_PAGE_OUT")
    if not out:
        return
    shot = browser.call("Page.captureScreenshot", format="png")["result"]["data"]
    with open(out + suffix + ".png", "wb") as f:
        f.write(base64.b64decode(shot))
    with open(out + suffix + ".json", "w") as f:
        json.dump(dom, f, indent=1)


def test_the_live_page_draws_the_curves_in_chromium(server, data, tmp):
    server.submit(config(data, k="[4, 8]"), "page", ranks=2)
    pid = wait_frozen(server.root, "page")
    browser = Chromium(os.path.join(tmp, "chromium"))
    try:
        browser.call("Page.navigate", url=f"{server.url}/?token={server.token}#run=page")
        logged = sorted({x["step"] for x in file_lines(server.root, "page")})

        def drawn(steps):
            def check():
                p = browser.eval(PAGE_STATE)
                if not p or p["drawn_step"] != steps[-1]:
                    return None
                fvu = p["charts"].get("chart-fvu", {}).get("series", {})
                ok = fvu == {"topk-x4-k4": len(steps), "topk-x4-k8": len(steps)}
                return p if ok else None
            return check
        def listed_running():
            p = drawn(logged)()
            return p if p and ["page", "running"] in [r[:2] for r in p["runs"]] else None
        mid = wait_for(listed_running, "the page to draw the steps logged before the freeze "
                       "and list the run as running")
        save(browser, mid, "-mid")
        assert mid["state"] == "running" and mid["run"] == "page"
        thaw(pid)
        wait_for(lambda: server.run("page")["state"] == "complete", "the run to complete")
        steps = sorted({x["step"] for x in file_lines(server.root, "page")})

        def finished():
            p = drawn(steps)()
            return p if p and p["state"] == "complete" and len(p["gates"]) == 2 else None
        page = wait_for(finished, "the page to show the whole run and its gates")
        evals = sorted({x["step"] for x in file_lines(server.root, "page")
                        if x.get("eval_rows", 0) > 0})
        for chart in ("chart-fvu", "chart-l0", "chart-dead"):
            assert page["charts"][chart]["held_out"] == {"topk-x4-k4": len(evals),
                                                         "topk-x4-k8": len(evals)}, chart
        for chart in ("chart-tokens_per_s", "chart-lr"):
            assert set(page["charts"][chart]["series"]) == {"topk-x4-k4", "topk-x4-k8"}
        assert page["step"] == str(steps[-1]) and page["total"] == str(steps[-1])
        assert [g[0] for g in page["gates"]] == ["topk-x4-k4", "topk-x4-k8"]
        assert all(g[-1].startswith(("PASS", "FAIL")) for g in page["gates"])
        assert page["report"] == "/runs/page/report/"
        save(browser, page, "")
    finally:
        browser.close()
    # The page's report link: sae-report's page, made on the first visit.
    r = server.get("/runs/page/report/")
    assert r.status_code == 200, r.text
    assert "page" in r.text and "<html" in r.text.lower()
    assert server.get("/runs/page/report/fvu.svg").status_code == 200
    # With sae-features' output in the run, the report made again links the feature pages,
    # which the server serves from report/features/<sae>/.
    run_dir = os.path.join(server.root, "page")
    subprocess.run([os.path.join(BIN, "sae-features"), os.path.join(run_dir, "sae", "topk-x4-k4")],
                   check=True, capture_output=True, cwd=run_dir)
    r = server.get("/runs/page/report/?refresh=1")
    assert r.status_code == 200 and 'href="features/topk-x4-k4/index.html"' in r.text, r.text
    r = server.get("/runs/page/report/features/topk-x4-k4/index.html")
    assert r.status_code == 200 and "saeFeaturesSummary" in r.text
    assert r.headers["content-type"].startswith("text/html")
    r = server.get("/runs/page/report/features/topk-x4-k4/summary.js")
    assert r.status_code == 200 and r.text.startswith("saeFeaturesSummary(")
    assert r.headers["content-type"].startswith("text/javascript")
    assert server.get("/runs/page/report/features/topk-x4-k4/").text == \
        server.get("/runs/page/report/features/topk-x4-k4/index.html").text
    assert "topk-x4-k4" in server.get("/runs/page/report/features/index.html").text
