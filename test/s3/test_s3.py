"""Training from S3-compatible storage (issue 31), against a real S3 server on 127.0.0.1:
moto's server mode (tools/requirements.txt), started and stopped by these tests.

What is checked: listing across pages (SAETRAIN_S3_LIST_MAX_KEYS=2) and a glob; training from
s3:// bitwise equal to the same shards on disk (one rank, contiguous float32 and chunked
bfloat16; a 2-rank sweep and a 2-rank data-parallel job under mpirun); signed reads checked by a
server that verifies SigV4 and permissions, anonymous reads; each error's one line (no
credentials, access denied naming the credential source, no such bucket, an object changed or
deleted during a run, the endpoint unreachable after the retries); the server killed mid-run
and restarted within the retries (the run rides through, bitwise equal) or after them (the run
stops with exit 1 and a committed checkpoint, and the same command resumes to a bitwise-equal
result); keep-alive (a run's range GETs reuse a few connections of a store that keeps them).

Run by ctest as test_s3 (.venv/bin/python -m pytest test/s3); SAETRAIN_BIN_DIR names the built
programs."""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto")

BIN = Path(os.environ.get("SAETRAIN_BIN_DIR", Path(__file__).resolve().parents[2] / "build/cpu/apps"))
MPIEXEC = os.environ.get("SAETRAIN_MPIEXEC", "mpiexec")
BUCKET = "acts"
KEY_ID, SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
ODD = "odd key+=&ü"  # a prefix whose characters SigV4 must percent-encode in paths and queries


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Moto:
    """moto_server on 127.0.0.1:port; `auth` turns on its SigV4 and IAM checks after the first
    `free_calls` requests (those set up users and policies)."""

    def __init__(self, tmp, auth=False, free_calls=0, keep_alive=False):
        self.port = free_port()
        self.keep_alive = keep_alive
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tmp) / f"moto-{self.port}.log"
        self.env = dict(os.environ)
        if auth:
            self.env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(free_calls)
        self.proc = None
        self.start()

    def start(self):
        cmd = [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p",
               str(self.port)]
        if self.keep_alive:
            # moto_server's werkzeug closes every connection after its response; waitress
            # serving moto's same application keeps HTTP/1.1 connections open, as stores do.
            cmd = [sys.executable, "-c",
                   "import sys, waitress\n"
                   "from moto.server import DomainDispatcherApplication, create_backend_app\n"
                   "waitress.serve(DomainDispatcherApplication(create_backend_app),"
                   " host='127.0.0.1', port=int(sys.argv[1]), threads=8)", str(self.port)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd,
                                         stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto_server did not start: {self.log.read_text()}")

    def kill(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def client(self, key=KEY_ID, secret=SECRET):
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=key, aws_secret_access_key=secret)


class Proxy:
    """A TCP forwarder on 127.0.0.1:port to a store: stop() closes it and every connection
    through it (the store gone, as the client sees it), start(backend) listens again on the same
    port. Lets a test bring a restarted moto (which comes back empty) to the client only once it
    holds the objects again, as a real store that restarts does."""

    def __init__(self, backend_port):
        self.port = free_port()
        self.conns = []
        self.listener = None
        self.start(backend_port)

    def start(self, backend_port):
        import threading
        self.backend = backend_port
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(64)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener):
        import threading
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                backend = socket.create_connection(("127.0.0.1", self.backend))
            except OSError:
                client.close()
                continue
            self.conns += [client, backend]
            for a, b in ((client, backend), (backend, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(1 << 16):
                b.sendall(data)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def accepted(self):
        """Connections accepted so far."""
        return len(self.conns) // 2

    def stop(self):
        self.listener.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass
        self.conns = []


def upload(s3, data_dir, prefix, extra=True, public=False):
    """The shards of data_dir under prefix (and, with extra, objects the listing must skip);
    public: readable by anyone (ACL public-read)."""
    args = {"ACL": "public-read"} if public else None
    for f in sorted(Path(data_dir).iterdir()):
        s3.upload_file(str(f), BUCKET, prefix + f.name, ExtraArgs=args)
    if extra:
        s3.put_object(Bucket=BUCKET, Key=prefix + "README.txt", Body=b"not a shard")
        s3.put_object(Bucket=BUCKET, Key=prefix + "sub/deeper.h5", Body=b"not a direct child")


def fill(server, data):
    s3 = server.client()
    s3.create_bucket(Bucket=BUCKET)
    for name, d in data.items():
        upload(s3, d, name + "/")
    if "quick" in data:
        upload(s3, data["quick"], "public/", extra=False, public=True)


def run(cmd, env=None, timeout=300):
    e = dict(os.environ)
    e.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
              "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_SESSION_TOKEN"):
        e.pop(k, None)
    e.update(env or {})
    e = {k: v for k, v in e.items() if v is not None}
    return subprocess.run(cmd, shell=True, env=e, capture_output=True, text=True, timeout=timeout)


def error_lines(out):
    return [line for line in out.splitlines() if "error:" in line]


def config(tmp, name, path, extra="", data_extra="", epochs=2,
           sae="{arch: topk, expansion: 4, k: 6}"):
    p = Path(tmp) / f"{name}.yaml"
    p.write_text(
        f"run: {{out_dir: {Path(tmp) / name}, seed: 3}}\n"
        f"data: {{path: '{path}', batch_size: 64, epochs: {epochs}, shuffle_buffer_rows: 700"
        f"{data_extra}}}\n"
        f"sae: {sae}\n"
        "train: {lr: 0.003, warmup_steps: 10}\n"
        "log: {every_steps: 20}\n"
        "checkpoint: {every_steps: 10, keep: 2}\n" + extra)
    return str(p)


def s3_keys(server, retries=10, timeout=30):
    return (f", s3_endpoint: '{server.url}', s3_retries: {retries}, s3_timeout_s: {timeout},"
            " s3_request_bytes: 65536, s3_connections: 4")


def finals(run_dir):
    return sorted((Path(run_dir) / "sae").glob("*/final.h5"))


def assert_bitwise(run_a, run_b):
    a, b = finals(run_a), finals(run_b)
    assert a and [p.parent.name for p in a] == [p.parent.name for p in b], (a, b)
    for x, y in zip(a, b):
        r = run(f"{BIN}/sae-inspect {x} --compare {y}")
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("s3data")
    sets = {"quick": root / "quick", "chunked": root / "chunked"}
    r = run(f"{BIN}/sae-synth --out {sets['quick']} --d-model 32 --features 64 --rows 6000 "
            "--shards 5 --seed 5")
    assert r.returncode == 0, r.stderr
    r = run(f"{BIN}/sae-synth --out {sets['chunked']} --d-model 32 --features 64 --rows 3000 "
            "--shards 3 --seed 6 --chunked --chunk-rows 100 --dtype bf16")
    assert r.returncode == 0, r.stderr
    return sets


@pytest.fixture(scope="module")
def server(data, tmp_path_factory):
    m = Moto(tmp_path_factory.mktemp("moto"))
    fill(m, data)
    yield m
    m.kill()


# --- listing --------------------------------------------------------------------------------

def test_listing_across_pages_matches_the_directory(server, data):
    env = {"AWS_ENDPOINT_URL": server.url, "SAETRAIN_S3_LIST_MAX_KEYS": "2"}
    disk = run(f"{BIN}/sae-inspect {data['quick']}")
    obj = run(f"{BIN}/sae-inspect s3://{BUCKET}/quick/", env)
    assert disk.returncode == 0 and obj.returncode == 0, obj.stderr
    # Five shards (of eight objects: ground_truth.h5, README.txt and sub/ are skipped), the
    # same rows, in key order.
    rows = lambda out: [line.split()[1:] for line in out.splitlines() if "shard_" in line]
    assert len(rows(obj.stdout)) == 5 and rows(obj.stdout) == rows(disk.stdout), obj.stdout
    assert "s3://acts/quick/shard_00000.h5" in obj.stdout
    assert obj.stdout.splitlines()[-2] == disk.stdout.splitlines()[-2]  # total line
    glob = run(f"{BIN}/sae-inspect 's3://{BUCKET}/quick/shard_0000[13].h5'", env)
    assert glob.returncode == 0, glob.stderr
    assert [line.split()[0] for line in glob.stdout.splitlines() if "shard_" in line] == [
        "s3://acts/quick/shard_00001.h5", "s3://acts/quick/shard_00003.h5"]
    # A prefix without its trailing '/' is the directory, as a directory's path is.
    noslash = run(f"{BIN}/sae-inspect s3://{BUCKET}/quick", env)
    assert noslash.returncode == 0 and rows(noslash.stdout) == rows(disk.stdout), noslash.stderr
    one = run(f"{BIN}/sae-inspect s3://{BUCKET}/quick/shard_00002.h5", env)
    assert one.returncode == 0 and "total: 1 shards" in one.stdout, one.stdout + one.stderr
    nothing = run(f"{BIN}/sae-inspect 's3://{BUCKET}/quick/nothing_*.h5'", env)
    assert nothing.returncode == 1 and "no .h5 objects there" in nothing.stderr, nothing.stderr


@pytest.mark.parametrize("bad", ["not_hdf5", "truncated", "other_width"])
def test_a_bad_object_is_named_on_open(server, data, tmp_path, bad):
    s3 = server.client()
    prefix = f"bad-{bad}/"
    good = (Path(data["quick"]) / "shard_00000.h5").read_bytes()
    s3.put_object(Bucket=BUCKET, Key=prefix + "shard_00000.h5", Body=good)
    if bad == "not_hdf5":
        body = b"these bytes are not HDF5" * 100
    elif bad == "truncated":
        body = (Path(data["quick"]) / "shard_00001.h5").read_bytes()[:50000]
    else:
        r = run(f"{BIN}/sae-synth --out {tmp_path / 'wide'} --d-model 48 --rows 500 --shards 1")
        assert r.returncode == 0, r.stderr
        body = (tmp_path / "wide" / "shard_00000.h5").read_bytes()
    s3.put_object(Bucket=BUCKET, Key=prefix + "shard_00001.h5", Body=body)
    r = run(f"{BIN}/sae-inspect s3://{BUCKET}/{prefix}", {"AWS_ENDPOINT_URL": server.url})
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1, r.stdout + r.stderr
    assert f"s3://{BUCKET}/{prefix}shard_00001.h5" in lines[0], lines[0]
    want = {"not_hdf5": "cannot open as HDF5", "truncated": "truncated",
            "other_width": "d_model 48 differs from 32"}[bad]
    assert want in lines[0], lines[0]


# --- training -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["quick", "chunked"])
def test_one_rank_trains_bitwise_equal_to_disk(server, data, tmp_path, name):
    disk = config(tmp_path, "disk", data[name])
    obj = config(tmp_path, "obj", f"s3://{BUCKET}/{name}/", data_extra=s3_keys(server))
    r = run(f"{BIN}/saetrain {disk} --threads 1")
    assert r.returncode == 0, r.stderr
    r = run(f"{BIN}/saetrain {obj} --threads 1", {"SAETRAIN_S3_LIST_MAX_KEYS": "2"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"s3://{BUCKET}/{name}/" in r.stdout
    assert_bitwise(tmp_path / "disk", tmp_path / "obj")


def test_staged_and_held_out_from_s3(server, data, tmp_path):
    # data.stage_dir copies the rank's objects to local disk first; data.eval_path reads the
    # held-out rows from a bucket too. Same weights as from disk.
    disk = config(tmp_path, "disk", data["quick"],
                  data_extra=f", eval_path: '{data['chunked']}', eval_rows: 500")
    obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/",
                 data_extra=s3_keys(server) + f", stage_dir: '{tmp_path / 'stage'}'"
                 f", eval_path: 's3://{BUCKET}/chunked/', eval_rows: 500")
    r = run(f"{BIN}/saetrain {disk} --threads 1")
    assert r.returncode == 0, r.stderr
    r = run(f"{BIN}/saetrain {obj} --threads 1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (tmp_path / "stage" / "quick").iterdir()) == [
        f"shard_0000{i}.h5" for i in range(5)]
    assert_bitwise(tmp_path / "disk", tmp_path / "obj")


def test_run_started_on_disk_goes_on_from_the_bucket(server, data, tmp_path):
    # Stopped at step 21 (SIGTERM, exit 75) reading from disk, resumed reading the same shards
    # from the bucket: the same cursor into the same row space, so the weights end bitwise equal
    # to an uninterrupted run on disk.
    ref = config(tmp_path, "ref", data["quick"])
    assert run(f"{BIN}/saetrain {ref} --threads 1").returncode == 0
    disk = config(tmp_path, "moved", data["quick"])
    r = run(f"{BIN}/saetrain {disk} --threads 1", {"SAETRAIN_FAULT": "0:20:TERM"})
    assert r.returncode == 75, r.stdout + r.stderr
    obj = config(tmp_path, "moved", f"s3://{BUCKET}/quick/", data_extra=s3_keys(server))
    r = run(f"{BIN}/saetrain {obj} --threads 1 --allow-config-change")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resum" in r.stdout, r.stdout
    assert_bitwise(tmp_path / "ref", tmp_path / "moved")


def test_transcoder_input_and_target_from_s3(server, data, tmp_path):
    # data.path and data.target_path both in the bucket, read row for row (their pairing is
    # checked through the objects: rows, token ids), bitwise equal to the same sets on disk.
    d = tmp_path / "tc"
    r = run(f"{BIN}/sae-synth --out {d / 'in'} --target {d / 'out'} --d-model 32 --features 64 "
            "--rows 3000 --shards 3 --seed 8")
    assert r.returncode == 0, r.stderr
    s3 = server.client()
    upload(s3, d / "in", "tc-in/", extra=False)
    upload(s3, d / "out", "tc-out/", extra=False)
    sae = "{arch: transcoder, expansion: 4, k: 6}"
    disk = config(tmp_path, "disk", d / "in", data_extra=f", target_path: '{d / 'out'}'", sae=sae)
    obj = config(tmp_path, "obj", f"s3://{BUCKET}/tc-in/", sae=sae,
                 data_extra=s3_keys(server) + f", target_path: 's3://{BUCKET}/tc-out/'")
    r = run(f"{BIN}/saetrain {disk} --threads 1")
    assert r.returncode == 0, r.stderr
    r = run(f"{BIN}/saetrain {obj} --threads 1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert_bitwise(tmp_path / "disk", tmp_path / "obj")


def test_h5py_shards_plain_and_gzip_from_s3(server, tmp_path):
    # Shards as plain h5py writes them (contiguous float32) and gzip-compressed chunked float16
    # (read through HDF5's filter pipeline over the object driver, not raw): bitwise equal to
    # the same files on disk.
    h5py = pytest.importorskip("h5py")
    import numpy as np
    rng = np.random.default_rng(3)
    s3 = server.client()
    for name, kw, dt in (("h5py-plain", {}, np.float32),
                         ("h5py-gzip", {"chunks": (128, 24), "compression": "gzip"}, np.float16)):
        d = tmp_path / name
        d.mkdir()
        for i in range(3):
            with h5py.File(d / f"shard_{i}.h5", "w") as f:
                f.create_dataset("activations", data=rng.standard_normal((900, 24)).astype(dt),
                                 **kw)
        upload(s3, d, name + "/", extra=False)
        disk = config(tmp_path, f"disk-{name}", d)
        obj = config(tmp_path, f"obj-{name}", f"s3://{BUCKET}/{name}/", data_extra=s3_keys(server))
        r = run(f"{BIN}/saetrain {disk} --threads 1")
        assert r.returncode == 0, r.stderr
        r = run(f"{BIN}/saetrain {obj} --threads 1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert_bitwise(tmp_path / f"disk-{name}", tmp_path / f"obj-{name}")


@pytest.mark.parametrize("mode,extra", [
    ("sweep", "parallel: {mode: sweep}\n"),
    ("data_parallel", "parallel: {mode: data_parallel, replicas: 2}\n"),
])
def test_two_ranks_train_bitwise_equal_to_disk(server, data, tmp_path, mode, extra):
    sae = "{arch: topk, expansion: 4, k: " + ("[4, 6]}" if mode == "sweep" else "6}")
    disk = config(tmp_path, "disk", data["quick"], extra, sae=sae)
    obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/", extra, s3_keys(server), sae=sae)
    mpi = f"timeout 200 {MPIEXEC} --oversubscribe -np 2"
    r = run(f"{mpi} {BIN}/saetrain {disk} --threads 1")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(f"{mpi} {BIN}/saetrain {obj} --threads 1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(finals(tmp_path / "obj")) == (2 if mode == "sweep" else 1)
    assert_bitwise(tmp_path / "disk", tmp_path / "obj")


# --- signed and anonymous reads ---------------------------------------------------------------

@pytest.fixture(scope="module")
def auth_server(data, tmp_path_factory):
    """A server that checks every request's SigV4 signature and IAM permissions (after the 7
    unchecked IAM calls that make the users and a role): `reader` may read the bucket and
    assume the role `rd` (temporary credentials with a session token), `nobody` has no
    permission."""
    import json
    m = Moto(tmp_path_factory.mktemp("moto-auth"), auth=True, free_calls=7)
    iam = boto3.client("iam", endpoint_url=m.url, region_name="us-east-1",
                       aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET)
    keys = {}
    for user in ("reader", "nobody"):
        iam.create_user(UserName=user)
        k = iam.create_access_key(UserName=user)["AccessKey"]
        keys[user] = (k["AccessKeyId"], k["SecretAccessKey"])
    allow = lambda action: json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": action, "Resource": "*"}]})
    iam.put_user_policy(UserName="reader", PolicyName="read", PolicyDocument=allow("*"))
    role = iam.create_role(RoleName="rd", AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}))
    iam.put_role_policy(RoleName="rd", PolicyName="s3", PolicyDocument=allow("s3:*"))
    s3 = m.client(*keys["reader"])
    s3.create_bucket(Bucket=BUCKET)
    upload(s3, data["quick"], "quick/")
    upload(s3, data["quick"], ODD + "/", extra=False)
    sts = boto3.client("sts", endpoint_url=m.url, region_name="us-east-1",
                       aws_access_key_id=keys["reader"][0],
                       aws_secret_access_key=keys["reader"][1])
    t = sts.assume_role(RoleArn=role["Role"]["Arn"], RoleSessionName="test-s3")["Credentials"]
    keys["session"] = (t["AccessKeyId"], t["SecretAccessKey"], t["SessionToken"])
    m.keys = keys
    yield m
    m.kill()


def creds(key, secret, token=None):
    e = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}
    if token:
        e["AWS_SESSION_TOKEN"] = token
    return e


def test_signed_reads_train_bitwise(auth_server, data, tmp_path):
    disk = config(tmp_path, "disk", data["quick"])
    obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/", data_extra=s3_keys(auth_server))
    assert run(f"{BIN}/saetrain {disk} --threads 1").returncode == 0
    r = run(f"{BIN}/saetrain {obj} --threads 1", creds(*auth_server.keys["reader"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert_bitwise(tmp_path / "disk", tmp_path / "obj")


def test_signed_listing_and_reads_of_keys_that_need_encoding(auth_server, data):
    # The signature covers the encoded path and the listing's query: a mistake in either is a
    # SignatureDoesNotMatch from the checking server.
    env = {"AWS_ENDPOINT_URL": auth_server.url, **creds(*auth_server.keys["reader"])}
    r = run(f"{BIN}/sae-inspect 's3://{BUCKET}/{ODD}/'", env)
    assert r.returncode == 0 and "total: 5 shards" in r.stdout, r.stdout + r.stderr
    r = run(f"{BIN}/sae-inspect 's3://{BUCKET}/{ODD}/shard_0000[24].h5'", env)
    assert r.returncode == 0 and "total: 2 shards" in r.stdout, r.stdout + r.stderr


def test_session_token(auth_server):
    key, secret, token = auth_server.keys["session"]
    env = {"AWS_ENDPOINT_URL": auth_server.url}
    r = run(f"{BIN}/sae-inspect s3://{BUCKET}/quick/", {**env, **creds(key, secret, token)})
    assert r.returncode == 0 and "total: 5 shards" in r.stdout, r.stdout + r.stderr
    # The same temporary keys without their token are refused, by a line naming the source.
    r = run(f"{BIN}/sae-inspect s3://{BUCKET}/quick/", {**env, **creds(key, secret)})
    assert r.returncode == 1 and "InvalidAccessKeyId" in r.stderr, r.stderr
    assert "environment variables AWS_ACCESS_KEY_ID" in r.stderr, r.stderr


def test_profile_credentials(auth_server, tmp_path):
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    key, secret = auth_server.keys["reader"]
    (home / ".aws" / "credentials").write_text(
        "[default]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n\n"
        f"# the profile used\n[lab]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
    (home / ".aws" / "config").write_text(f"[profile lab]\nregion = us-east-1\n"
                                          f"endpoint_url = {auth_server.url}\n")
    env = {"HOME": str(home), "AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
           "AWS_PROFILE": "lab"}
    r = run(f"{BIN}/sae-inspect s3://{BUCKET}/quick/", env)
    assert r.returncode == 0 and "total: 5 shards" in r.stdout, r.stdout + r.stderr
    # The default profile's keys are refused by the server: the line names where they came from.
    env["AWS_PROFILE"] = None
    (home / ".aws" / "config").write_text(f"[default]\nendpoint_url = {auth_server.url}\n")
    r = run(f"{BIN}/sae-inspect s3://{BUCKET}/quick/", env)
    assert r.returncode == 1, r.stdout
    assert "profile 'default' in " + str(home / ".aws" / "credentials") in r.stderr, r.stderr


def test_anonymous_reads(server, data, tmp_path):
    # Unsigned requests, no credentials anywhere: objects uploaded public-read are read (moto
    # answers unsigned requests with HTTP 500 once its SigV4 checks are on, so this is the
    # server without them, which still applies the objects' ACLs); private ones are refused.
    disk = config(tmp_path, "disk", data["quick"])
    obj = config(tmp_path, "obj", f"s3://{BUCKET}/public/",
                 data_extra=s3_keys(server) + ", s3_anonymous: true")
    no_creds = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "HOME": str(tmp_path)}
    assert run(f"{BIN}/saetrain {disk} --threads 1").returncode == 0
    r = run(f"{BIN}/saetrain {obj} --threads 1", no_creds)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_bitwise(tmp_path / "disk", tmp_path / "obj")
    private = config(tmp_path, "private", f"s3://{BUCKET}/quick/",
                     data_extra=s3_keys(server) + ", s3_anonymous: true")
    line = one_error(run(f"{BIN}/saetrain {private} --threads 1", no_creds))
    assert f"s3://{BUCKET}/quick/shard_00000.h5" in line and "access denied" in line, line
    assert "anonymous (data.s3_anonymous)" in line and "not public" in line, line


# --- errors: one line naming the bucket and key ------------------------------------------------

def one_error(r):
    lines = error_lines(r.stderr)
    assert r.returncode == 1 and len(lines) == 1, r.stdout + r.stderr
    return lines[0]


def test_no_credentials(server, tmp_path):
    obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/", data_extra=s3_keys(server))
    r = run(f"{BIN}/saetrain {obj}", {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None,
                                      "HOME": str(tmp_path)})
    line = one_error(r)
    assert f"s3://{BUCKET}/quick/: no AWS credentials" in line and "s3_anonymous" in line, line


def test_access_denied_names_the_credential_source(auth_server, tmp_path):
    obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/", data_extra=s3_keys(auth_server))
    line = one_error(run(f"{BIN}/saetrain {obj}", creds(*auth_server.keys["nobody"])))
    assert f"s3://{BUCKET}/quick/" in line and "access denied" in line, line
    assert "environment variables AWS_ACCESS_KEY_ID" in line, line
    # A wrong secret: the signature does not match.
    line = one_error(run(f"{BIN}/saetrain {obj}", creds(auth_server.keys["reader"][0], "x" * 40)))
    assert "access denied" in line and "SignatureDoesNotMatch" in line, line


def test_no_such_bucket(server, tmp_path):
    obj = config(tmp_path, "obj", "s3://no-such-bucket/quick/", data_extra=s3_keys(server))
    line = one_error(run(f"{BIN}/saetrain {obj}"))
    assert "s3://no-such-bucket/quick/" in line and "no such bucket" in line, line


def test_endpoint_unreachable_after_retries(tmp_path):
    port = free_port()  # nothing listens there
    obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/",
                 data_extra=f", s3_endpoint: 'http://127.0.0.1:{port}', s3_retries: 3")
    t0 = time.time()
    line = one_error(run(f"{BIN}/saetrain {obj}"))
    assert f"s3://{BUCKET}/quick/" in line and f"http://127.0.0.1:{port} failed 3 attempts" in line
    assert "resume" in line, line
    assert time.time() - t0 < 60


def wait_for_commit(run_dir, proc, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if list((Path(run_dir) / "checkpoints").glob("*.commit")):
            return True
        time.sleep(0.05)
    return False


def start(cmd, env=None):
    e = dict(os.environ)
    e.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
              "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
              "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    e.update(env or {})
    return subprocess.Popen(cmd, shell=True, env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("change", ["replaced", "deleted"])
def test_object_changed_during_the_run(data, tmp_path, change):
    m = Moto(tmp_path)
    try:
        fill(m, {"quick": data["quick"]})
        obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/", data_extra=s3_keys(m),
                     epochs=200)
        p = start(f"timeout 120 {BIN}/saetrain {obj} --threads 1")
        assert wait_for_commit(tmp_path / "obj", p), p.communicate()
        key = "quick/shard_00002.h5"
        if change == "replaced":
            m.client().put_object(Bucket=BUCKET, Key=key, Body=b"other bytes")
        else:
            m.client().delete_object(Bucket=BUCKET, Key=key)
        out, err = p.communicate(timeout=120)
        lines = error_lines(err)
        assert p.returncode == 1 and len(lines) == 1, out + err
        assert f"s3://{BUCKET}/{key}" in lines[0], lines[0]
        want = "changed since the run started" if change == "replaced" else "no such key"
        assert want in lines[0] and "resume" in lines[0], lines[0]
    finally:
        m.kill()


# --- the store killed mid-run ---------------------------------------------------------------

def test_server_restarted_within_the_retries_rides_through(data, tmp_path):
    # The store is killed mid-run and a new one, holding the same objects, is back at the same
    # address 1-2 s later (a moto restarts empty: the client reaches it through a proxy only
    # once the objects are uploaded again, byte for byte, so their ETags are the same).
    m = Moto(tmp_path)
    proxy = Proxy(m.port)
    try:
        fill(m, {"quick": data["quick"]})
        disk = config(tmp_path, "disk", data["quick"], epochs=12)
        via = type("Endpoint", (), {"url": f"http://127.0.0.1:{proxy.port}"})
        obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/", data_extra=s3_keys(via, 12, 5),
                     epochs=12)
        assert run(f"{BIN}/saetrain {disk} --threads 1").returncode == 0
        p = start(f"timeout 200 {BIN}/saetrain {obj} --threads 1")
        assert wait_for_commit(tmp_path / "obj", p), p.communicate()
        m.kill()
        proxy.stop()
        assert p.poll() is None, "the run ended before the store was killed"
        time.sleep(1.0)
        m = Moto(tmp_path)
        fill(m, {"quick": data["quick"]})
        proxy.start(m.port)
        out, err = p.communicate(timeout=200)
        assert p.returncode == 0, out + err
        assert "saetrain: warning: s3://acts/quick/shard_" in err and "retrying" in err, err
        assert not error_lines(err), err
        assert_bitwise(tmp_path / "disk", tmp_path / "obj")
    finally:
        proxy.stop()
        m.kill()


@pytest.mark.parametrize("ranks", [1, 2])
def test_server_down_past_the_retries_stops_then_resumes_bitwise(data, tmp_path, ranks):
    # 2 ranks: data parallel, each rank reading its slice; the rank whose request fails first
    # ends the job (no rank left waiting), the other is stopped with it.
    extra = "parallel: {mode: data_parallel, replicas: 2}\n" if ranks == 2 else ""
    launch = f"{MPIEXEC} --oversubscribe -np 2 " if ranks == 2 else ""
    m = Moto(tmp_path)
    try:
        fill(m, {"quick": data["quick"]})
        disk = config(tmp_path, "disk", data["quick"], extra, epochs=12)
        obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/", extra, s3_keys(m, 3, 5),
                     epochs=12)
        assert run(f"{launch}{BIN}/saetrain {disk} --threads 1").returncode == 0
        cmd = f"timeout 200 {launch}{BIN}/saetrain {obj} --threads 1"
        p = start(cmd)
        assert wait_for_commit(tmp_path / "obj", p), p.communicate()
        m.kill()
        assert p.poll() is None, "the run ended before the store was killed"
        out, err = p.communicate(timeout=120)
        lines = error_lines(err)
        # One line per failing rank, each naming its object: two ranks whose requests fail in
        # the same moment may both print theirs before the job is aborted (seen here once in
        # three runs), so 2 ranks give one or two lines, from different ranks.
        assert p.returncode == 1 and 1 <= len(lines) <= ranks, out + err
        ranks_named = [re.search(r"error: (rank \d+:)?", ln).group(1) for ln in lines]
        assert len(set(ranks_named)) == len(lines), lines
        for ln in lines:
            assert f"s3://{BUCKET}/quick/shard_" in ln and "failed 3 attempts" in ln, lines
        assert list((tmp_path / "obj" / "checkpoints").glob("*.commit"))
        assert not (tmp_path / "obj" / "COMPLETE").exists()
        m.start()
        fill(m, {"quick": data["quick"]})
        r = run(cmd)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "resum" in r.stdout, r.stdout
        assert_bitwise(tmp_path / "disk", tmp_path / "obj")
    finally:
        m.kill()


def test_stalled_store_is_abandoned_not_waited_on(data, tmp_path):
    # The store stops answering (SIGSTOP: connections are accepted by the kernel, nothing is
    # sent): each request is abandoned after data.s3_timeout_s without progress and retried,
    # and the run ends with the line, in bounded time; then it resumes bitwise.
    m = Moto(tmp_path)
    try:
        fill(m, {"quick": data["quick"]})
        disk = config(tmp_path, "disk", data["quick"], epochs=12)
        obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/", data_extra=s3_keys(m, 3, 1),
                     epochs=12)
        assert run(f"{BIN}/saetrain {disk} --threads 1").returncode == 0
        cmd = f"timeout 200 {BIN}/saetrain {obj} --threads 1"
        p = start(cmd)
        assert wait_for_commit(tmp_path / "obj", p), p.communicate()
        os.killpg(m.proc.pid, signal.SIGSTOP)
        t0 = time.time()
        assert p.poll() is None, "the run ended before the store stalled"
        out, err = p.communicate(timeout=120)
        lines = error_lines(err)
        assert p.returncode == 1 and len(lines) == 1, out + err
        assert "failed 3 attempts" in lines[0] and "too slow" in lines[0].lower(), lines[0]
        assert time.time() - t0 < 30
        os.killpg(m.proc.pid, signal.SIGCONT)
        r = run(cmd)
        assert r.returncode == 0, r.stdout + r.stderr
        assert_bitwise(tmp_path / "disk", tmp_path / "obj")
    finally:
        os.killpg(m.proc.pid, signal.SIGCONT)
        m.kill()


def test_connections_are_kept_alive(data, tmp_path):
    # A store that keeps connections open (waitress serving moto) behind a proxy that counts
    # them: the run's few hundred range GETs of 4 KiB (listing, HDF5 metadata, rows; 4
    # connections at once) reuse a handful of connections, and train bitwise as from disk.
    m = Moto(tmp_path, keep_alive=True)
    proxy = Proxy(m.port)
    try:
        fill(m, {"quick": data["quick"]})
        via = type("Endpoint", (), {"url": f"http://127.0.0.1:{proxy.port}"})
        keys = s3_keys(via).replace("s3_request_bytes: 65536", "s3_request_bytes: 4096")
        disk = config(tmp_path, "disk", data["quick"])
        obj = config(tmp_path, "obj", f"s3://{BUCKET}/quick/", data_extra=keys)
        assert run(f"{BIN}/saetrain {disk} --threads 1").returncode == 0
        r = run(f"{BIN}/saetrain {obj} --threads 1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert_bitwise(tmp_path / "disk", tmp_path / "obj")
        # 6000 rows of 32 float32 values, two epochs: at least 2 x 750 KB / 4 KiB requests
        # (here 4 connections carried them; moto's own server, which closes each, took 397).
        requests = 2 * 6000 * 32 * 4 // 4096
        assert proxy.accepted() <= 8, f"{proxy.accepted()} connections for >= {requests} GETs"
    finally:
        proxy.stop()
        m.kill()


def test_iobench_reports_both_rates(server):
    r = run(f"{BIN}/sae-iobench s3://{BUCKET}/quick/ --passes 1 --json",
            {"AWS_ENDPOINT_URL": server.url})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "range GET" in r.stdout and "reader" in r.stdout, r.stdout
