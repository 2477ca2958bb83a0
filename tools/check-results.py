#!/usr/bin/env python3
"""check-results.py — the outputs the docs show are what their commands print.

    tools/check-results.py --build BUILD_DIR --root DIR [--only NAME] [--keep] [FILE.md ...]
    tools/check-results.py --self-test

A shown output is marked by the line `<!-- check-output: NAME -->` directly before its fenced
block; its command is the last command line of the fenced block before the marker, or, in a
block whose command follows a `$ ` prompt, that command (the other lines are its output). The
command's set-up steps (`bash tools/install-deps.sh`, `bash tools/setup-venv.sh` and `cmake`:
the build is already there) are dropped and the rest runs as written, with bash, in a scratch
directory of its own where `build/cpu` (and `build/<BUILD_DIR's name>`) is BUILD_DIR and
configs/, tools/, slurm/ and bench/ are the repository's (so the docs' relative paths resolve and nothing is written into
the source tree). Every marked command of one check runs in that one directory, in the order
of the files given and of the markers in each, as a reader runs them: the README's quickstart
writes data/quickstart, which the docs' examples then train on (so give README.md first). As
root, the two variables the docs tell root to export for mpirun are set. Then every line of the
shown block must be printed:

- a line whose first word is a figure's owner (an SAE id, a table's row) is matched to the
  printed line that starts with the same word; each figure in it is compared with the printed
  one in the same column within the tolerance below, and the words between the figures must be
  the same (so "PASS" against "FAIL: rel_recon_err 0.181 >= 0.1" fails);
- the columns that measure the machine rather than the result (wait %, tok/s, TFLOP/s, host
  mem GB, ETA, s) are not compared: they are named by the table's header line, whose labels
  end where their right-aligned figures end;
- any other line must be printed as shown, up to runs of spaces; a line `...` stands for
  lines left out.

In a `$ ` block the commands run one after another whatever each exits with (such a block may
show an error on purpose: its line is then among those that must be printed); elsewhere the
command must exit 0.

Tolerance: a figure may differ from the shown one by 2% of it or by five units of its last
shown digit, whichever is larger (the same run on another machine differs in the last digits:
its BLAS kernels, its compiler's target (-march=native) and thread count sum in another order;
a regression such as FVU 0.1188 -> 0.2194 or recovery 0.996 -> 0.849 is far outside it). A
dead % may differ by 2.5 points: it counts latents, and in a small SAE whose latents are still
dying at the last steps the count moves by several latents with the last bits. docs/config.md's
sweep4 BatchTopK (512 latents, 0.2 points each) ended at 6.4% dead on an AMD EPYC with AVX2
only, 7.6% on an Intel Xeon with AVX-512 and 8.0% on an AMD EPYC with AVX-512 (Zen 5), the same
commit on each; a regression such as 7.6 -> 30 is outside it. Prints one line per difference
(FILE:LINE: ...) and exits 1 when there is one.
"""
import argparse
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = re.compile(r"^<!--\s*check-output:\s*([\w.-]+)\s*-->\s*$")
SETUP = (("bash", "tools/install-deps.sh"), ("bash", "tools/setup-venv.sh"), ("cmake",))
LINKED = ("configs", "tools", "slurm", "bench")
# Columns that measure the machine, not the result: never compared.
MACHINE_COLUMNS = {"wait %", "tok/s", "TFLOP/s", "host mem GB", "ETA", "s", "MFU %"}
NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?(%|[KMG])?$")
REL_TOL, DIGIT_UNITS = 0.02, 5
# Columns whose figures count latents: the points they may move by across machines (docstring).
COUNT_POINTS = {"dead %": 2.5}


def _check_readme():
    spec = importlib.util.spec_from_file_location("check_readme",
                                                  os.path.join(HERE, "check-readme.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CR = _check_readme()


def marked_outputs(text):
    """(name, marker line, command, shown lines, shown block's first line) for each marker."""
    lines = text.splitlines()
    fenced = CR.blocks(text)  # (first content line, lang, lines)
    out = []
    for no, line in enumerate(lines, 1):
        m = MARKER.match(line)
        if not m:
            continue
        after = [b for b in fenced if b[0] == no + 2]
        before = [b for b in fenced if b[0] + len(b[2]) <= no]
        if after and any(l.startswith("$ ") for l in after[0][2]):
            # One block with its command after a '$ ' prompt and the output below it.
            lines_ = after[0][2]
            commands = [l[2:] for l in lines_ if l.startswith("$ ")]
            shown = [l for l in lines_ if not l.startswith("$ ")]
            # Each prompted command runs whatever the one before it did (the block may show an
            # error on purpose); the shown lines say what must come out.
            out.append((m.group(1), no, "; ".join(commands), shown,
                        after[0][0] + (len(lines_) - len(shown)), True))
            continue
        if not after or not before:
            raise ValueError(f"line {no}: check-output marker without a command block before it "
                             "and an output block right after it")
        cmd_block = before[-1]
        commands = [t for _, t in CR.logical_lines(cmd_block[0], cmd_block[2])
                    if t.strip() and not t.lstrip().startswith("#")]
        if not commands:
            raise ValueError(f"line {no}: the block before the check-output marker has no command")
        out.append((m.group(1), no, commands[-1], after[0][2], after[0][0], False))
    return out


def runnable(command):
    """The command without its set-up steps, as one bash line ('' when nothing is left)."""
    keep = []
    for part in command.split("&&"):
        words = shlex.split(part)
        if any(tuple(words[:len(s)]) == s for s in SETUP):
            continue
        keep.append(part.strip())
    return " && ".join(keep)


def scratch_dir(build, root):
    """A directory where build/<preset> is BUILD and the repository's folders are linked."""
    work = tempfile.mkdtemp(prefix="check-results.")
    os.makedirs(os.path.join(work, "build"))
    # The docs name build/cpu; a build of another preset (build/asan) stands in for it.
    for preset in {"cpu", os.path.basename(os.path.normpath(build))}:
        os.symlink(os.path.abspath(build), os.path.join(work, "build", preset))
    for name in LINKED:
        os.symlink(os.path.join(os.path.abspath(root), name), os.path.join(work, name))
    return work


def tokens_with_ends(line):
    return [(m.group(0), m.end()) for m in re.finditer(r"\S+", line)]


def column_labels(header, row):
    """For each word of a right-aligned row, the header's text above it (labels end where
    their figures end)."""
    labels, start = [], 0
    for _, end in tokens_with_ends(row):
        labels.append(" ".join(header[start:end].split()))
        start = end
    return labels


def is_number(word):
    return NUMBER.match(word) is not None


def value(word):
    m = NUMBER.match(word)
    scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(m.group(3), 1.0)
    return float(m.group(1) + (m.group(2) or "")) * scale


def tolerance(shown, label=""):
    m = NUMBER.match(shown)
    digits = len(m.group(1).split(".")[1]) if "." in m.group(1) else 0
    return max(REL_TOL * abs(value(shown)), DIGIT_UNITS * 10.0**-digits,
               COUNT_POINTS.get(label, 0.0))


def compare(shown_lines, printed):
    """Differences between the shown block and the printed text: a list of (index, message)."""
    printed_lines = printed.splitlines()
    problems, header = [], None
    norm = lambda s: " ".join(s.split())
    for i, line in enumerate(shown_lines):
        if not line.strip():
            header = None
            continue
        if line.strip() == "...":  # lines left out of the shown block
            continue
        words = line.split()
        if not any(is_number(w) for w in words[1:]):
            # A header or a plain line: printed as shown.
            if norm(line) not in {norm(p) for p in printed_lines}:
                problems.append((i, f"not printed: {line.strip()!r}"))
            header = line
            continue
        key = words[0]
        candidates = [p for p in printed_lines if p.split()[:1] == [key]]
        if not candidates:
            problems.append((i, f"no printed line starts with {key!r}"))
            continue
        # The printed line of the same table: the first after the same header, else the one
        # with the same words around its figures, else the last.
        same_words = [p for p in candidates
                      if [w for w in p.split() if not is_number(w)] ==
                      [w for w in words if not is_number(w)]]
        got = same_words[0] if same_words else candidates[-1]
        if header is not None:
            for j, p in enumerate(printed_lines):
                if norm(p) == norm(header):
                    after = [q for q in printed_lines[j + 1:] if q.split()[:1] == [key]]
                    if after:
                        got = after[0]
                    break
        labels = column_labels(header, line) if header is not None else [""] * len(words)
        got_words = got.split()
        shown_text = [w for w in words if not is_number(w)]
        got_text = [w for w in got_words if not is_number(w)]
        if shown_text != got_text or len(got_words) != len(words):
            problems.append((i, f"{key}: shown {norm(line)!r}, printed {norm(got)!r}"))
            continue
        for w, g, label in zip(words, got_words, labels):
            if not is_number(w) or label in MACHINE_COLUMNS:
                continue
            if abs(value(g) - value(w)) > tolerance(w, label):
                problems.append((i, f"{key} {label or 'figure'}: shown {w}, printed {g} "
                                    f"(tolerance {tolerance(w, label):.3g})"))
    return problems


def run_file(path, only, work):
    text = open(path, encoding="utf-8").read()
    problems = 0
    try:
        outputs = marked_outputs(text)
    except ValueError as e:
        print(f"{path}:{e}")
        return 1
    for name, no, command, shown, first, prompted in outputs:
        if only and name not in only:
            continue
        cmd = command if prompted else runnable(command)
        env = dict(os.environ)
        if os.geteuid() == 0:  # what the docs tell root to export before mpirun
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        proc = subprocess.run(["bash", "-c", cmd], cwd=work, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env)
        log = os.path.join(work, f"{name}.log")
        with open(log, "w", encoding="utf-8") as f:
            f.write(proc.stdout)
        found = compare(shown, proc.stdout)
        if proc.returncode != 0 and not prompted:
            print(f"{path}:{no}: {name}: the command exited {proc.returncode} ({cmd}); "
                  f"its output: {log}")
            problems += 1
        for i, msg in found:
            print(f"{path}:{first + i}: {name}: {msg}")
        problems += len(found)
        if found or (proc.returncode != 0 and not prompted):
            print(f"check-results: {name}: ran in {work}")
        else:
            print(f"check-results: {name}: {len(shown)} shown line(s) match ({cmd})")
    return 1 if problems else 0


# --- self-test: planted differences must be found, a faithful run must pass ------------------

SHOWN = """sae (sorted by l0)              steps  train fvu       l0   dead %  wait %      tok/s   TFLOP/s host mem GB   recovery
topk-x4-k8                        293     0.1188      7.5      0.0     0.0     584.5K    0.0215        0.10      0.996

quality gates                       on  rel_recon_err  zeros_frac  decorr_rms  dead %  dense %  gates
topk-x4-k8                    training         0.0988      0.9706       0.038     0.0      0.0  PASS""".splitlines()


def self_test():
    printed = "\n".join(["some progress line"] + SHOWN)
    failures = []

    def expect(desc, text, n):
        got = compare(SHOWN, text)
        if (len(got) > 0) != (n > 0):
            failures.append(f"{desc}: expected {'a difference' if n else 'none'}, got {got}")

    expect("identical", printed, 0)
    # Speed and memory differ on every machine: not compared.
    expect("machine columns", printed.replace("584.5K", "13.4K").replace("0.0215", "0.000493")
           .replace("0.10      0.996", "0.12      0.996"), 0)
    expect("last digits", printed.replace("0.1188", "0.1191").replace("0.9706", "0.9702"), 0)
    expect("fvu regression", printed.replace("0.1188", "0.2194"), 1)
    # A dead % counts latents: another machine's few latents more pass, a regression does not.
    dead = printed.replace("7.5      0.0     0.0", "7.5      2.4     0.0")
    expect("dead % on another machine", dead, 0)
    expect("dead % regression", printed.replace("7.5      0.0     0.0", "7.5     12.0     0.0"), 1)
    expect("dead % in the gates", printed.replace("0.038     0.0", "0.038     2.6"), 1)
    expect("recovery regression", printed.replace("0.996", "0.849"), 1)
    expect("steps", printed.replace("  293  ", "  300  "), 1)
    expect("gate failed", printed.replace("0.0      0.0  PASS",
                                          "0.0      0.0  FAIL: rel_recon_err 0.181 >= 0.1"), 1)
    expect("header changed", printed.replace("zeros_frac", "zero_frac "), 1)
    expect("row missing", "\n".join(SHOWN[:1] + SHOWN[2:]), 1)
    if compare(["wrote a", "...", "wrote c"], "wrote a\nwrote b\nwrote c") or \
            not compare(["wrote a", "...", "wrote d"], "wrote a\nwrote b\nwrote c"):
        failures.append("'...' stands for left-out lines, and only for them")
    if runnable("bash tools/install-deps.sh && cmake --preset cpu && cmake --build --preset cpu "
                "-j2 && ./build/cpu/apps/sae-synth --out d && ./x y") != \
            "./build/cpu/apps/sae-synth --out d && ./x y":
        failures.append("runnable() kept a set-up step or dropped a command")
    doc = ("```\nbash tools/install-deps.sh && ./build/cpu/apps/saetrain c.yaml\n```\n\n"
           "<!-- check-output: demo -->\n```\nout\n```\n")
    prompted = ("<!-- check-output: dry -->\n```\n$ ./build/cpu/apps/saetrain c.yaml --dry-run\n"
                "saetrain: ok: 2 SAEs\n```\n")
    got = marked_outputs(prompted)
    if [(n, c, s, p) for n, _, c, s, _, p in got] != [
            ("dry", "./build/cpu/apps/saetrain c.yaml --dry-run", ["saetrain: ok: 2 SAEs"], True)]:
        failures.append(f"marked_outputs of a '$ ' block: {got}")
    two = "saetrain: config OK: 2 SAEs: a, b\nsaetrain: sweep mode on 2 rank(s)"
    if compare(["saetrain: config OK: 2 SAEs: a, b"], two) or \
            not compare(["saetrain: config OK: 2 SAEs: a, c"], two):
        failures.append("lines that share their first word are told apart by their words")
    got = marked_outputs(doc)
    if [(n, c, s, p) for n, _, c, s, _, p in got] != [
            ("demo", "bash tools/install-deps.sh && ./build/cpu/apps/saetrain c.yaml", ["out"],
             False)]:
        failures.append(f"marked_outputs: {got}")
    for f in failures:
        print(f"check-results self-test: FAIL: {f}")
    print(f"check-results self-test: {'FAIL' if failures else 'ok'}")
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--build", help="the build directory (build/cpu)")
    ap.add_argument("--root", default=".", help="the repository")
    ap.add_argument("--only", action="append", help="check only this marked output")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()
    if a.self_test:
        return self_test()
    if not a.build:
        ap.error("--build is required")
    files = a.files or [os.path.join(a.root, "README.md")]
    work = scratch_dir(a.build, a.root)
    rc = max(run_file(f, a.only, work) for f in files)
    if rc == 0 and not a.keep:
        shutil.rmtree(work)
    return rc


if __name__ == "__main__":
    sys.exit(main())
