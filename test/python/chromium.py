"""Headless Chromium for the page tests (test/serve's live page, test/python's feature pages):
Debian's chromium driven over the DevTools protocol, its WebSocket spoken with websockets."""
import asyncio
import json
import os
import shutil
import subprocess
import time

from strict import need_module, skip_module

requests = need_module("requests")
websockets = need_module("websockets")


def wait_for(cond, what, timeout=120):
    """cond()'s first true value, polled every 50 ms; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Chromium:
    """Headless Chromium driven over the DevTools protocol (its WebSocket, with websockets)."""

    def __init__(self, profile):
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if exe is None:
            skip_module("no chromium (tools/install-deps.sh installs Debian's)")
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-dev-shm-usage", "--remote-debugging-port=0", f"--user-data-dir={profile}",
             "--window-size=1400,1100", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = os.path.join(profile, "DevToolsActivePort")
        wait_for(lambda: os.path.exists(port_file) and open(port_file).read().count("\n") >= 1,
                 "Chromium's DevTools port")
        port = int(open(port_file).read().split()[0])
        targets = requests.get(f"http://127.0.0.1:{port}/json/list", timeout=60).json()
        self.ws_url = [t for t in targets if t["type"] == "page"][0]["webSocketDebuggerUrl"]
        self.next_id = 0

    def call(self, method, **params):
        async def go():
            async with websockets.connect(self.ws_url, max_size=None, open_timeout=60) as ws:
                self.next_id += 1
                await ws.send(json.dumps({"id": self.next_id, "method": method,
                                          "params": params}))
                while True:
                    m = json.loads(await asyncio.wait_for(ws.recv(), 120))
                    if m.get("id") == self.next_id:
                        return m
        return asyncio.run(go())

    def eval(self, expression):
        m = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return m["result"]["result"].get("value")

    def close(self):
        self.proc.kill()
        self.proc.wait()
