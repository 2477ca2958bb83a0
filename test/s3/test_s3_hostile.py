"""The S3 client checks each response against its request instead of trusting the store's
framing (issue 58), against a store of the tests' own that misbehaves one way at a time
(misbehaving_store.py), serving two shards made by sae-synth.

What is checked: the store itself works (a run against its good mode trains, exit 0); a 206 of
other bytes (a truthful Content-Range of another offset, or one that starts where asked but ends
elsewhere), a 200 of the object's first bytes for a range at a non-zero offset, a Content-Range
whose total is not the listed size, and answers without an ETag to a request with If-Match are
each refused with one line naming the object and the endpoint (exit 1, nothing trained); a 206
cut short is retried and the run trains; a listing that repeats its continuation token or goes
backwards is one line; an ETag with CR/LF is refused at the listing naming its key, and no
object is requested; keys holding "../" are requested byte for byte; SIGTERM or SIGINT during a
listing that never ends stops the process within a second or so (exit 75, one line); an
endpoint with credentials in it is refused and the secret is printed nowhere.

Run by ctest as part of test_s3 (pytest test/s3)."""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from misbehaving_store import Store
from test_s3 import BIN, BUCKET, KEY_ID, SECRET, config, error_lines, run, s3_keys

STOPPED = ("saetrain: stopped by a signal before the first step; nothing to save. Run the same "
           "command to start (exit code 75).")


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    # Two shards of 3000 rows of 32 float32 (384 KB each): more than the VFD's 256 KiB block,
    # so opening one reads a block at a non-zero offset, and rows span several 64 KiB requests.
    d = tmp_path_factory.mktemp("hostile") / "shards"
    r = run(f"{BIN}/sae-synth --out {d} --d-model 32 --features 64 --rows 6000 --shards 2 "
            "--seed 7")
    assert r.returncode == 0, r.stderr
    return d


@pytest.fixture
def store(request, shards):
    s = Store(shards, request.param)
    yield s
    s.close()


def train(store, tmp_path, prefix="p/", env=None):
    cfg = config(tmp_path, "obj", f"s3://{BUCKET}/{prefix}", epochs=1,
                 data_extra=s3_keys(store, retries=2, timeout=5))
    return run(f"timeout 120 {BIN}/saetrain {cfg} --threads 1", env)


def one_error(r):
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1, r.stdout + r.stderr
    return lines[0]


def trained(tmp_path):
    return list((tmp_path / "obj" / "sae").glob("*/final.h5"))


@pytest.mark.parametrize("store", ["good"], indirect=True)
def test_the_store_itself_serves_a_run(store, tmp_path):
    r = train(store, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert trained(tmp_path) and not error_lines(r.stderr), r.stderr
    gets = store.object_gets()
    assert gets and all("Range" in h and "If-Match" in h for _, _, h in gets), gets[:3]


@pytest.mark.parametrize("store", ["cut-once"], indirect=True)
def test_a_206_cut_short_is_retried(store, tmp_path):
    r = train(store, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "retrying" in r.stderr and trained(tmp_path), r.stderr


@pytest.mark.parametrize("store,want", [
    ("other-offset", "with Content-Range 'bytes 4096-"),
    ("lying-end", "with Content-Range 'bytes 0-"),
    ("first-bytes-200", "with 200 OK (the object from its first byte), not 206 Partial Content"),
    ("total-mismatch", "an object of "),
    ("no-etag", "without an ETag, so it does not support If-Match/ETags"),
], indirect=["store"])
def test_a_response_that_is_not_the_range_asked_for_is_refused(store, tmp_path, want):
    line = one_error(train(store, tmp_path))
    assert f"s3://{BUCKET}/p/shard_0000" in line and f"(endpoint {store.url})" in line, line
    assert want in line, line
    if store.mode in ("other-offset", "lying-end"):
        assert "other bytes than were asked for" in line, line
    if store.mode == "total-mismatch":
        assert "but it was listed with" in line, line
    assert not trained(tmp_path)


@pytest.mark.parametrize("store,want", [
    ("repeat-token", "repeats the continuation token 'same-token' (page 2)"),
    ("backwards", f"went backwards: page 2 has the key 'p/ground_truth.h5', not after "
                  "'p/shard_00001.h5'"),
], indirect=["store"])
def test_a_listing_that_makes_no_progress_is_refused(store, tmp_path, want):
    line = one_error(train(store, tmp_path))
    assert f"s3://{BUCKET}/p/: the store's listing" in line and store.url in line, line
    assert want in line, line
    assert len(store.list_requests()) == 2 and not store.object_gets()


@pytest.mark.parametrize("store", ["etag-crlf"], indirect=True)
def test_an_etag_with_crlf_is_refused_at_the_listing(store, tmp_path):
    line = one_error(train(store, tmp_path))
    assert f"s3://{BUCKET}/p/shard_00001.h5: the store's listing gives it the ETag" in line, line
    assert "control character" in line and "\\x0d\\x0aX-Injected" in line, line
    assert not store.object_gets()  # nothing requested, so no header was injected


@pytest.mark.parametrize("store", ["dotdot"], indirect=True)
def test_keys_with_dot_segments_are_sent_byte_for_byte(store, tmp_path):
    r = train(store, tmp_path, prefix="p/sub/../")
    assert r.returncode == 0, r.stdout + r.stderr
    paths = {p for _, p, _ in store.object_gets()}
    assert paths == {f"/{BUCKET}/p/sub/../shard_0000{i}.h5" for i in range(2)}, paths


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("store", ["endless", "stall"], indirect=True)
def test_a_signal_ends_a_wait_for_the_store(store, tmp_path, sig):
    # endless: a listing of ever new pages (each wait is short; the flag is read before each);
    # stall: the first range GETs are never answered (one long wait, polled every 100 ms).
    cfg = config(tmp_path, "obj", f"s3://{BUCKET}/p/", epochs=1,
                 data_extra=s3_keys(store, retries=2, timeout=5))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               AWS_ACCESS_KEY_ID=KEY_ID, AWS_SECRET_ACCESS_KEY=SECRET,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    # Not through a shell: the signal goes to saetrain itself, as Slurm's and a terminal's do.
    p = subprocess.Popen([f"{BIN}/saetrain", cfg, "--threads", "1"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        waiting = (lambda: len(store.list_requests()) >= 20) if store.mode == "endless" else (
            lambda: len(store.object_gets()) >= 1)
        while not waiting() and time.time() < deadline and p.poll() is None:
            time.sleep(0.05)
        time.sleep(0.2)
        assert p.poll() is None and waiting(), p.communicate()
        t0 = time.time()
        p.send_signal(sig)
        out, err = p.communicate(timeout=30)
        took = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 75, out + err
    assert STOPPED in err.splitlines() and not error_lines(err), err
    assert took < 5, took  # a wait polls the stop flag every 100 ms


@pytest.mark.parametrize("where", ["config", "environment"])
@pytest.mark.parametrize("store", ["good"], indirect=True)
def test_credentials_in_the_endpoint_are_never_printed(store, tmp_path, where):
    secret = "Sup3rSecretPassw0rd"
    endpoint = store.url.replace("http://", f"http://AKIDUSERNAME:{secret}@")
    keys = s3_keys(store, retries=2, timeout=5)
    if where == "config":
        keys = keys.replace(store.url, endpoint)
        env = None
    else:
        keys = keys.replace(f"s3_endpoint: '{store.url}', ", "")
        env = {"AWS_ENDPOINT_URL": endpoint}
    cfg = config(tmp_path, "obj", f"s3://{BUCKET}/p/", epochs=1, data_extra=keys)
    r = run(f"{BIN}/saetrain {cfg} --threads 1", env)
    line = one_error(r)
    assert secret not in r.stdout + r.stderr and "AKIDUSERNAME" not in r.stdout + r.stderr
    assert "has credentials in it" in line and "http://***@127.0.0.1:" in line, line
    assert ("data.s3_endpoint" if where == "config" else "AWS_ENDPOINT_URL") in line, line
    assert not store.requests
    for f in (Path(tmp_path) / "obj").rglob("*"):  # the run directory, if one was made
        assert not f.is_file() or secret.encode() not in f.read_bytes(), f
