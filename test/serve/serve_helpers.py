"""What test_serve_e2e.py drives sae-serve with: the server as a process, its token, HTTP and
WebSocket clients, and the runs' processes (found by run.json's pid).

Every wait polls a condition with a deadline and fails naming what it waited for; no test
asserts on how long anything took.
"""
import asyncio
import json
import os
import re
import signal
import subprocess
import time

import requests
import websockets

BIN = os.environ.get("SAETRAIN_BIN_DIR", "build/cpu/apps")
TIMEOUT = 180  # seconds any one wait may take on a loaded 2-core machine


def wait_for(cond, what, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def proc_state(pid):
    """The state letter of /proc/PID/stat (R, S, T: stopped, Z), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class Server:
    """sae-serve on a runs root, its output in ROOT.log beside the root."""

    def __init__(self, root, args=(), env=None, port=0):
        self.root, self.args, self.env = str(root), list(args), env
        self.port = port
        self.proc = None
        self.start()

    def start(self):
        self.starts = getattr(self, "starts", 0) + 1
        self.log = f"{self.root}.{self.starts}.log"
        env = dict(os.environ)
        env.update(self.env or {})
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [os.path.join(BIN, "sae-serve"), "--root", self.root, "--port", str(self.port)]
                + self.args, stdout=out, stderr=subprocess.STDOUT, env=env,
                start_new_session=True)

        def listening():
            with open(self.log) as f:
                text = f.read()
            if self.proc.poll() is not None:
                raise AssertionError(f"sae-serve exited {self.proc.returncode}: {text}")
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", text)
            return m and int(m.group(1))
        self.port = wait_for(listening, "sae-serve to listen")
        with open(os.path.join(self.root, ".sae-serve", "token")) as f:
            self.token = f.read().strip()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        self.proc.wait(timeout=60)

    def restart(self):
        self.start()

    @property
    def auth(self):
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, path, **kw):
        kw.setdefault("headers", self.auth)
        return requests.get(self.url + path, timeout=60, **kw)

    def post(self, path, data=b"", **kw):
        kw.setdefault("headers", self.auth)
        return requests.post(self.url + path, data=data, timeout=60, **kw)

    def run(self, run_id):
        r = self.get(f"/api/runs/{run_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def submit(self, yaml_text, run_id, ranks=1, expect=201):
        r = self.post(f"/api/runs?id={run_id}&ranks={ranks}", data=yaml_text.encode())
        assert r.status_code == expect, r.text
        return r.json()

    def wait_state(self, run_id, states, timeout=TIMEOUT):
        states = (states,) if isinstance(states, str) else states
        return wait_for(lambda: (lambda j: j if j["state"] in states else None)(self.run(run_id)),
                        f"run {run_id} to be {'/'.join(states)}", timeout)


def run_pid(root, run_id):
    """Rank 0's pid from run.json (None until training starts)."""
    path = os.path.join(root, run_id, "run.json")
    if not os.path.isfile(path):  # a FIFO planted by a test would block open()
        return None
    try:
        with open(path) as f:
            return json.load(f)["pid"]
    except (OSError, ValueError, KeyError):
        return None


def wait_frozen(root, run_id):
    """The pid of a run's rank 0 once SAETRAIN_FAULT=0:N:STOP has stopped it (SIGSTOP)."""
    def frozen():
        pid = run_pid(root, run_id)
        return pid if pid and proc_state(pid) == "T" else None
    return wait_for(frozen, f"run {run_id}'s rank 0 to stop itself (SAETRAIN_FAULT)")


def thaw(pid):
    os.kill(pid, signal.SIGCONT)


def file_lines(root, run_id):
    """metrics.jsonl, parsed, in file order."""
    with open(os.path.join(root, run_id, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def stream(server, run_id, since=None, until=("complete", "stopped", "failed"), max_metrics=None,
           headers=None, on_message=None):
    """Messages of /api/runs/ID/stream until a state in `until` (the server sends the steps it
    has, then the state) or `max_metrics` metrics messages. Returns the messages."""
    url = f"{server.ws_url}/api/runs/{run_id}/stream" + (f"?since={since}" if since is not None
                                                          else "")

    async def go():
        got, metrics = [], 0
        async with websockets.connect(url, additional_headers=headers or server.auth,
                                      max_size=None, max_queue=None, open_timeout=60) as ws:
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
                got.append(m)
                if on_message:
                    on_message(m)
                if m["type"] == "metrics":
                    metrics += 1
                    if max_metrics is not None and metrics >= max_metrics:
                        return got
                if m["type"] == "state" and m["state"] in until:
                    return got
    return asyncio.run(go())


def lines_of(messages):
    """The metrics lines of stream messages, in order."""
    return [line for m in messages if m["type"] == "metrics" for line in m["lines"]]
