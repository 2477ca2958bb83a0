"""What sae-report reads: a run directory's files, each opened without following a link at
its name (open_run_file, refuse_links), and the run's state (run_state: running, complete,
stopped, failed, killed) from run.json, COMPLETE, the checkpoints and the lock file; and the
report directory it writes, held open so that every report file is created from its descriptor
(ReportDir)."""
import csv
import datetime
import json
import math
import os
import socket
from collections import OrderedDict


class ReportError(Exception):
    pass


# --- a run's files, never through a link, and the report directory -----------------------------

def _no_follow(path, flags):
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC)


def open_run_file(path, mode="r", **kw):
    """A run's file, opened for reading without following a link at its name."""
    return open(path, mode, opener=_no_follow, **kw)


# What sae-report reads in a run directory, and the report directory it writes; every one must be
# the run's own file or directory, not a symlink (a run never writes one: a link was planted).
RUN_FILES = ("metrics.jsonl", "summary.csv", "run.json", "config.yaml", "COMPLETE",
             ".saetrain.lock", "checkpoints", "sae")


def refuse_links(run_dir, out_dir):
    """ReportError naming the first symlink among what sae-report would read or write."""
    def check(path):
        if os.path.islink(path):
            raise ReportError(f"{path} is a symlink: sae-report reads and writes only a run's own "
                              "files, and a run never writes a link; remove it")
    for name in RUN_FILES:
        check(os.path.join(run_dir, name))
    sae = os.path.join(run_dir, "sae")
    if os.path.isdir(sae):
        for name in sorted(os.listdir(sae)):
            check(os.path.join(sae, name))
            check(os.path.join(sae, name, "feature_density.csv"))
    check(out_dir)
    if os.path.isdir(out_dir):
        for name in sorted(os.listdir(out_dir)):
            check(os.path.join(out_dir, name))


class ReportDir(str):
    """The report directory (its path, as a str), held open: every file is created in it by
    name from its descriptor, never through a link planted at the name."""

    def __new__(cls, path):
        self = super().__new__(cls, path)
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        return self

    def open(self, name, mode="w", **kw):
        def opener(path, flags):
            return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=self.fd)
        return open(name, mode, opener=opener, **kw)


# --- reading the run ---------------------------------------------------------------------------

def read_metrics(run_dir):
    """Rows of metrics.jsonl by SAE, in step order. A torn last line (a run writing it right
    now) is skipped; a step logged twice keeps its last row."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise ReportError(f"{path}: no such file; give a saetrain run directory (its "
                          "run.out_dir) that has logged at least one interval")
    by_sae = OrderedDict()
    with open_run_file(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(row, dict) or not isinstance(row.get("sae"), str) \
                    or not isinstance(row.get("step"), int):
                continue
            by_sae.setdefault(row["sae"], {})[row["step"]] = row
    if not by_sae:
        raise ReportError(f"{path}: no metrics rows yet (the first is written after "
                          "log.every_steps steps)")
    return OrderedDict((sae, [steps[s] for s in sorted(steps)]) for sae, steps in by_sae.items())


def read_summary(run_dir):
    path = os.path.join(run_dir, "summary.csv")
    if not os.path.isfile(path):
        return None
    with open_run_file(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def read_run_json(run_dir):
    """run.json (saetrain writes it when training starts and when it ends), or None: a run of
    an earlier saetrain, or one that never started training."""
    path = os.path.join(run_dir, "run.json")
    if not os.path.isfile(path):
        return None
    try:
        with open_run_file(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def read_text(path):
    try:
        with open_run_file(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def yaml_value(text, section, key):
    """`section.key` of config.yaml as saetrain writes it (a block map of block maps, yaml-cpp's
    emitter): enough to show data.path without a YAML library."""
    current = None
    for line in (text or "").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            current = line.split(":", 1)[0].strip()
            continue
        if current == section and ":" in line:
            k, v = line.strip().split(":", 1)
            if k.strip() == key:
                v = v.strip()
                if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
                    v = v[1:-1]
                return v
    return None


def read_density(run_dir, sae):
    """(bin lower edges, counts, latents that never fired) or None."""
    path = os.path.join(run_dir, "sae", sae, "feature_density.csv")
    if not os.path.isfile(path):
        return None
    lo, counts, never = [], [], 0
    try:
        with open_run_file(path, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                if r["log10_density_lo"] == "-inf":
                    never = int(r["latents"])
                else:
                    lo.append(float(r["log10_density_lo"]))
                    counts.append(int(r["latents"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ReportError(f"{path}: not a feature-density histogram as saetrain writes it "
                          f"(log10_density_lo,log10_density_hi,latents): {e}")
    return (lo, counts, never) if lo else None


def committed_steps(run_dir):
    """The steps of checkpoints/step-<N>.commit: the checkpoints a rerun resumes from."""
    steps = []
    try:
        names = os.listdir(os.path.join(run_dir, "checkpoints"))
    except OSError:
        return steps
    for name in names:
        if name.startswith("step-") and name.endswith(".commit"):
            try:
                steps.append(int(name[5:-7]))
            except ValueError:
                pass
    return sorted(steps)


def arch_of(sae, summary_row=None, info=None):
    if summary_row and summary_row.get("arch"):
        return summary_row["arch"]
    arch = (((info or {}).get("saes") or {}).get(sae) or {}).get("arch")
    if isinstance(arch, str) and arch:
        return arch
    return sae.split("-x")[0].split("-")[0]  # ids are "<arch>-x<expansion>-..."


def number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


# --- the run's state ---------------------------------------------------------------------------

def pid_alive(pid, host):
    """True/False for a saetrain process `pid` on this host; None when `host` is another one
    (nothing can be checked from here)."""
    if host != socket.gethostname():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, someone else's
    except (OSError, TypeError, ValueError):
        return False
    try:  # a reused pid: alive, but not saetrain
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0]
        return os.path.basename(argv0) == b"saetrain"
    except OSError:
        return True


def lock_holder(run_dir):
    """(pid, host) from .saetrain.lock ("pid N on HOST"), as an earlier saetrain leaves it."""
    text = read_text(os.path.join(run_dir, ".saetrain.lock")) or ""
    parts = text.split()
    if len(parts) >= 4 and parts[0] == "pid" and parts[2] == "on":
        try:
            return int(parts[1]), parts[3]
        except ValueError:
            pass
    return None


def age_text(seconds):
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def run_state(run_dir, info, last_step):
    """(key, sentence): key is one of running, complete, stopped, failed, killed, unknown."""
    commits = committed_steps(run_dir)
    resumable = (f"a rerun of the same command resumes from the checkpoint at step {commits[-1]}"
                 if commits else "no checkpoint was committed: a rerun starts over")
    complete = os.path.exists(os.path.join(run_dir, "COMPLETE"))
    metrics = os.path.join(run_dir, "metrics.jsonl")
    idle = age_text(datetime.datetime.now().timestamp() - os.path.getmtime(metrics)) \
        if os.path.exists(metrics) else "?"
    if info and isinstance(info.get("state"), str):
        st, code = info["state"], info.get("exit_code")
        pid, host = info.get("pid"), info.get("host", "?")
        if st == "complete":
            return "complete", f"complete (exit 0) after {last_step} steps"
        if st == "stopped":
            return "stopped", (f"stopped by a signal (exit {code}) after step {last_step}; "
                               f"{resumable}")
        if st == "failed":
            msg = info.get("message") or "see the console output"
            return "failed", f"failed (exit {code}): saetrain: error: {msg}; {resumable}"
        if st == "running":
            alive = pid_alive(pid, host)
            if alive:
                return "running", (f"running (pid {pid} on {host}; last metrics line "
                                   f"{idle} ago)")
            if alive is False:
                return "killed", ("ended without recording an exit (saetrain's pid {} on {} "
                                  "has ended): "
                                  "killed (SIGKILL, out of memory, node loss) or aborted for "
                                  "another rank's failure; {}".format(pid, host, resumable))
            return "running", (f"running on {host} (pid {pid}) as far as run.json says: "
                               f"this host cannot check; last metrics line {idle} ago")
    # A run of an earlier saetrain (no run.json): COMPLETE, then the lock file's holder.
    if complete:
        return "complete", f"complete (COMPLETE marker) after {last_step} steps"
    holder = lock_holder(run_dir)
    alive = pid_alive(*holder) if holder else None
    if alive:
        return "running", f"running (pid {holder[0]}; last metrics line {idle} ago)"
    return "unknown", (f"not complete and not running here (no run.json: stopped, failed or "
                       f"killed); {resumable}")
