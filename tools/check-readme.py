#!/usr/bin/env python3
"""check-readme.py — the README's commands still parse against the programs they name.

    tools/check-readme.py --bin BUILD/apps [--root DIR] [FILE.md ...]   (default: README.md)
    tools/check-readme.py --self-test --bin BUILD/apps

Reads every fenced code block that is not marked as another language (```yaml and the like
are skipped), joins backslash-continued lines and splits commands at '&&'. In a block with
'$ ' prompts only the prompted lines are commands (the others are their output); otherwise a
line is a command when its first word is a program of ours, a launcher (mpirun, srun) or a
shell tool. For each command of one of our programs (saetrain, sae-synth, sae-inspect,
sae-export, sae-iobench, sae-perfmodel, sae-report, sae-serve):

- a synopsis (placeholders such as CONFIG.yaml, DIR or [--opt ...]): every --option it names
  must be in the program's --help;
- a real command: it is run in parse-only form from --root, with no data touched: saetrain with
  --dry-run --ranks N (N: the launcher's -np / -n, else 1), which reads the config, applies
  every --set and checks the job size as a run does; the others with SAETRAIN_PARSE_ONLY=1,
  under which they parse their command line and exit. It must exit 0, unless the block shows
  the error it prints ("PROG: error: ..." on the lines after it): then either it parses (the
  error comes later, from data this check does not have) or what it prints on stderr is
  exactly the lines shown.

Paths into the repository a command names (tools/..., configs/..., slurm/..., bench/...) must
exist, and so must every `cmake --preset`/`ctest --preset` preset. Prints one line per problem
(FILE:LINE: ...) and exits 1 when there is one.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

OURS = {"saetrain", "sae-synth", "sae-inspect", "sae-export", "sae-iobench", "sae-perfmodel",
        "sae-report", "sae-serve"}
LAUNCHERS = {"mpirun", "mpiexec", "srun"}
SHELL = {"bash", "cmake", "ctest", "xdg-open", "python3", "sbatch", "export", "cd", "ls", "rm",
         "setsid", "kill", "timeout", "cp", "scancel", "git", "curl", "ssh", "echo"} | LAUNCHERS
OTHER_LANGUAGES = {"yaml", "yml", "json", "python", "py", "cpp", "c++", "c", "text", "toml",
                   "ini", "cmake", "diff"}
REPO_DIRS = ("tools/", "configs/", "slurm/", "bench/", "apps/", "docs/", "test/")
# Launcher options that take a value (everything else starting with '-' takes none).
LAUNCHER_VALUED = {"-np", "-n", "--np", "-N", "--ntasks", "--bind-to", "--map-by", "--mca",
                   "-x", "--host", "-H", "--nodes", "--gpus-per-task", "--cpus-per-task",
                   "--hostfile", "-c"}


def blocks(text):
    """(first line number, language, [lines]) of every fenced block."""
    out, cur, lang, start = [], None, "", 0
    for no, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if cur is None:
                cur, lang, start = [], line[3:].strip().lower(), no + 1
            else:
                out.append((start, lang, cur))
                cur = None
            continue
        if cur is not None:
            cur.append(line)
    return out


def logical_lines(start, lines):
    """Joins continuation lines: (line number, text)."""
    out, buf, first = [], "", None
    for i, line in enumerate(lines):
        if first is None:
            first = start + i
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append((first, buf + line))
        buf, first = "", None
    if buf:
        out.append((first, buf))
    return out


def words(cmd):
    try:
        return shlex.split(cmd, comments=True)
    except ValueError:
        return None


def program_of(tokens):
    """(program, its arguments, ranks) of a command, or (None, ...) when it is not ours."""
    env_free = list(tokens)
    while env_free and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", env_free[0]):
        env_free.pop(0)
    if not env_free:
        return None, [], 1
    ranks, i = 1, 0
    if os.path.basename(env_free[0]) in LAUNCHERS:
        i = 1
        while i < len(env_free) and env_free[i].startswith("-"):
            opt = env_free[i]
            if opt in LAUNCHER_VALUED:
                if opt in ("-np", "-n", "--np", "--ntasks") and i + 1 < len(env_free):
                    try:
                        ranks = int(env_free[i + 1])
                    except ValueError:
                        pass
                i += 2
            else:
                m = re.match(r"^--ntasks=(\d+)$", opt)
                if m:
                    ranks = int(m.group(1))
                i += 1
    if i >= len(env_free):
        return None, [], ranks
    prog = os.path.basename(env_free[i])
    if prog not in OURS:
        return None, env_free[i:], ranks
    return prog, env_free[i + 1:], ranks


def is_synopsis(args):
    for a in args:
        if a.startswith("[") or (a.endswith("]") and "[" not in a) or "..." in a:
            return True
        if re.fullmatch(r"[A-Z][A-Z_0-9]*(\.[a-z0-9]+)?", a):  # CONFIG.yaml, DIR, SAE
            return True
        if "|" in a and not a.startswith("-"):
            return True
    return False


class Checker:
    def __init__(self, bindir, root):
        self.bindir, self.root = bindir, root
        self.problems = []
        self.helps = {}
        self.checked = 0
        try:
            with open(os.path.join(root, "CMakePresets.json")) as f:
                p = json.load(f)
            self.presets = {x["name"] for k in ("configurePresets", "buildPresets", "testPresets")
                            for x in p.get(k, [])}
        except (OSError, ValueError):
            self.presets = None

    def problem(self, where, what):
        self.problems.append(f"{where}: {what}")

    def exe(self, prog):
        return os.path.join(self.bindir, prog)

    def help_of(self, prog):
        if prog not in self.helps:
            r = subprocess.run([self.exe(prog), "--help"], capture_output=True, text=True,
                               cwd=self.root)
            self.helps[prog] = r.stdout + r.stderr
        return self.helps[prog]

    def check_paths(self, where, tokens):
        for t in tokens:
            for piece in t.split("="):
                if piece.startswith(REPO_DIRS) and not any(c in piece for c in "*?<>"):
                    if not os.path.exists(os.path.join(self.root, piece)):
                        self.problem(where, f"{piece}: no such file in the repository")
        for i, t in enumerate(tokens[:-1]):
            if t == "--preset" and self.presets is not None and tokens[i + 1] not in self.presets:
                self.problem(where, f"--preset {tokens[i + 1]}: no such preset in "
                             "CMakePresets.json")

    def check_command(self, where, cmd, shown_error):
        tokens = words(cmd)
        if tokens is None:
            self.problem(where, f"cannot split into words: {cmd}")
            return
        if not tokens:
            return
        self.check_paths(where, tokens)
        prog, args, ranks = program_of(tokens)
        if prog is None:
            return
        self.checked += 1
        if is_synopsis(args):
            text = self.help_of(prog)
            for a in args:
                for opt in re.findall(r"--[a-z][a-z0-9-]*", a):
                    if not re.search(r"(^|[\s,])" + re.escape(opt) + r"\b", text, re.M):
                        self.problem(where, f"{prog}: {opt} is not an option of {prog} "
                                     "(its --help)")
            return
        env = dict(os.environ)
        argv = [self.exe(prog)] + args
        if prog == "saetrain" and "--dry-run" not in args:
            argv += ["--dry-run", "--ranks", str(ranks)]
        else:
            env["SAETRAIN_PARSE_ONLY"] = "1"
        r = subprocess.run(argv, capture_output=True, text=True, cwd=self.root, env=env)
        if r.returncode == 0:
            return
        got = r.stderr.rstrip("\n").splitlines() or [""]
        if shown_error is not None and got == shown_error:
            return
        if shown_error is not None:
            self.problem(where, f"{prog} prints '{' / '.join(got)}' (exit {r.returncode}), the "
                         f"README shows '{' / '.join(shown_error)}'")
        else:
            self.problem(where, f"{prog} does not accept this (exit {r.returncode}): {got[0]}")

    def check_file(self, path):
        with open(path) as f:
            text = f.read()
        for start, lang, lines in blocks(text):
            if lang in OTHER_LANGUAGES:
                continue
            logical = logical_lines(start, lines)
            prompted = any(t.startswith("$ ") for _, t in logical)
            for idx, (no, t) in enumerate(logical):
                if prompted:
                    if not t.startswith("$ "):
                        continue
                    t = t[2:]
                else:
                    first = (words(t) or [""])
                    head = next((w for w in first if not re.match(r"^[A-Za-z_]\w*=", w)), "")
                    if os.path.basename(head) not in OURS | SHELL:
                        continue
                # The error the block shows for this command: the next line, when it is one.
                shown = None
                if idx + 1 < len(logical) and re.match(r"^[a-z-]+: error: ", logical[idx + 1][1]):
                    shown = []
                    for _, out in logical[idx + 1:]:
                        if out.startswith("$ "):
                            break
                        shown.append(out)
                for part in t.split("&&"):
                    self.check_command(f"{path}:{no}", part.strip(), shown)


SELF_TEST = """\
```
./build/cpu/apps/saetrain configs/quickstart.yaml --set sae.expnasion=4
mpirun -np 3 ./build/cpu/apps/saetrain configs/quickstart.yaml --set 'sae.k=[4,8]'
sae-synth --out DIR [--d-model 64 --bogus-option 3]
./build/cpu/apps/sae-synth --out x --bogus
bash tools/no-such-script.sh && cmake --preset no-such-preset
```

```
$ saetrain
saetrain: error: this is not what it prints
```

```yaml
this: {is: not checked}
```
"""
SELF_TEST_EXPECTED = [
    ":2: saetrain does not accept this (exit 1): saetrain: error: configs/quickstart.yaml: "
    "--set sae.expnasion=4: unknown key 'sae.expnasion' (did you mean sae.expansion?)",
    ":3: saetrain does not accept this (exit 1)",
    ":4: sae-synth: --bogus-option is not an option of sae-synth",
    ":5: sae-synth does not accept this (exit 2)",
    ":6: tools/no-such-script.sh: no such file",
    ":6: --preset no-such-preset: no such preset",
    ":10: saetrain prints 'saetrain: error: CONFIG is required / usage: saetrain CONFIG.yaml",
]


def main():
    ap = argparse.ArgumentParser(prog="check-readme.py", description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="markdown files (default: README.md)")
    ap.add_argument("--bin", required=True, help="the build's apps directory")
    ap.add_argument("--root", default=".", help="the repository (commands run from here)")
    ap.add_argument("--self-test", action="store_true",
                    help="check planted mistakes are found, and only them")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    c = Checker(os.path.abspath(a.bin), root)
    if a.self_test:
        with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as f:
            f.write(SELF_TEST)
        try:
            c.check_file(f.name)
        finally:
            os.unlink(f.name)
        missing = [e for e in SELF_TEST_EXPECTED if not any(e in p for p in c.problems)]
        extra = [p for p in c.problems if not any(e in p for e in SELF_TEST_EXPECTED)]
        for e in missing:
            print(f"check-readme self-test: not found: {e}")
        for p in extra:
            print(f"check-readme self-test: unexpected: {p}")
        if missing or extra:
            return 1
        print(f"check-readme self-test: the {len(SELF_TEST_EXPECTED)} planted mistakes found, "
              "nothing else")
        return 0
    for path in a.files or [os.path.join(root, "README.md")]:
        c.check_file(path)
    for p in c.problems:
        print(p)
    if c.problems:
        return 1
    print(f"check-readme: {c.checked} command(s) of our programs parse as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
