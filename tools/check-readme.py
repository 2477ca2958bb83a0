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
exist, and so must every `cmake --preset`/`ctest --preset` preset.

In the prose (everything outside fenced blocks):
- every repository path in a code span (`tools/...`, `configs/...`, `slurm/...`, `bench/...`,
  `apps/...`, `docs/...`, `test/...`, `src/...`, `include/...`) must exist; globs and
  placeholders (`*`, `?`, `<name>`, `{x}`, `...`, an all-capitals component such as NAME) are
  skipped, and so are paths a run creates (runs/, data/, build/, exports/: not checked);
- every `sae-...` word in a code span must be one of our programs, and a code span that starts
  with one of them (`sae-inspect A --compare B`) may name only options of its --help;
- every markdown link to a file ([text](docs/x.md), ![plot](../bench/...png)) must point at a
  file or directory that exists, relative to the page, and an anchor (#section) into a markdown
  page must be one of that page's headings (GitHub's anchors).

Prints one line per problem (FILE:LINE: ...) and exits 1 when there is one.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

OURS = {"saetrain", "sae-synth", "sae-inspect", "sae-export", "sae-features", "sae-iobench",
        "sae-perfmodel", "sae-report", "sae-serve"}
LAUNCHERS = {"mpirun", "mpiexec", "srun"}
SHELL = {"bash", "cmake", "ctest", "xdg-open", "python3", "sbatch", "export", "cd", "ls", "rm",
         "setsid", "kill", "timeout", "cp", "scancel", "git", "curl", "ssh", "echo"} | LAUNCHERS
OTHER_LANGUAGES = {"yaml", "yml", "json", "python", "py", "cpp", "c++", "c", "text", "toml",
                   "ini", "cmake", "diff"}
REPO_DIRS = ("tools/", "configs/", "slurm/", "bench/", "apps/", "docs/", "test/", "src/",
             "include/")
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


def mask_fences(text):
    """The text with every fenced block's lines (fences included) blanked: the prose, with its
    line numbers kept."""
    out, inside = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            inside = not inside
            out.append("")
            continue
        out.append("" if inside else line)
    return "\n".join(out)


CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


# Files whose names are in capitals: not placeholders.
REAL_CAPITALS = {"README", "LICENSE", "DEVELOPERS", "CHANGELOG", "CONTRIBUTING", "NOTICE",
                 "AUTHORS", "COMPLETE"}


def is_placeholder(path):
    """A glob or a placeholder, not a file's name: `slurm/*.sbatch`, `arch/<name>.h`, `x/NAME`."""
    if any(c in path for c in "*?<>{}[]|$") or "..." in path:
        return True
    return any(re.fullmatch(r"[A-Z][A-Z0-9_]*", part.split(".")[0])
               and part.split(".")[0] not in REAL_CAPITALS for part in path.split("/"))


def github_anchor(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    h = re.sub(r"<[^>]*>", "", heading).strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors_of(text):
    """Every heading's anchor in a markdown text (repeated ones get -1, -2, ... as on GitHub)."""
    seen, out = {}, set()
    for line in mask_fences(text).split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        a = github_anchor(m.group(1))
        n = seen.get(a, 0)
        seen[a] = n + 1
        out.add(a if n == 0 else f"{a}-{n}")
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
        self.anchors = {}
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
        if prog not in self.helps and not os.path.exists(self.exe(prog)):
            self.problem(self.bindir, f"{prog} is not built: its --help cannot be read")
            self.helps[prog] = ""
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
        if not os.path.exists(self.exe(prog)):
            self.problem(where, f"{prog} is not built in {self.bindir}")
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

    def anchors_in(self, path):
        if path not in self.anchors:
            try:
                with open(path) as f:
                    self.anchors[path] = anchors_of(f.read())
            except OSError:
                self.anchors[path] = set()
        return self.anchors[path]

    def check_prose(self, path, text, page):
        """The prose's code spans (repository paths, program names) and links. `page`: where the
        file is, for its relative links."""
        prose = mask_fences(text)
        spans = []
        for m in CODE_SPAN.finditer(prose):
            spans.append((m.start(), m.end()))
            first = (m.group(2).split() or [""])[0]
            prog = os.path.basename(first)
            if prog in OURS:
                where = f"{path}:{prose.count(chr(10), 0, m.start()) + 1}"
                text_help = self.help_of(prog)
                for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", m.group(2)):
                    if not re.search(r"(^|[\s,])" + re.escape(opt) + r"\b", text_help, re.M):
                        self.problem(where, f"{prog}: {opt} is not an option of {prog} "
                                     "(its --help)")
            for wm in re.finditer(r"\S+", m.group(2)):
                w = wm.group(0)
                where = f"{path}:{prose.count(chr(10), 0, m.start(2) + wm.start()) + 1}"
                for piece in w.split("="):
                    piece = piece.lstrip("(\"'").rstrip(".,;:)\"'")
                    if piece.startswith(REPO_DIRS) and not is_placeholder(piece):
                        if not os.path.exists(os.path.join(self.root, piece)):
                            self.problem(where, f"{piece}: no such file in the repository")
                word = w.strip("(),.;:\"'")
                if re.fullmatch(r"sae-[a-z0-9_-]+", word) and word not in OURS:
                    self.problem(where, f"{word}: not one of our programs "
                                 f"({', '.join(sorted(OURS))})")
        # Links, outside code spans (a span's text is not a link).
        plain = list(prose)
        for a, b in spans:
            for i in range(a, b):
                if plain[i] != "\n":
                    plain[i] = " "
        plain = "".join(plain)
        for m in LINK.finditer(plain):
            target = m.group(1)
            where = f"{path}:{plain.count(chr(10), 0, m.start()) + 1}"
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            if file_part:
                dest = os.path.normpath(os.path.join(os.path.dirname(page), file_part))
                if not os.path.exists(dest):
                    self.problem(where, f"link to {file_part}: no such file")
                    continue
            else:
                dest = page
            if anchor and dest.endswith(".md"):
                known = self.anchors_in(dest) if file_part else anchors_of(text)
                if anchor not in known:
                    self.problem(where, f"link to {target}: no heading with anchor #{anchor} "
                                 f"in {os.path.relpath(dest, self.root)}")

    def check_file(self, path, page=None):
        """Checks one markdown file; `page`: where it stands in the repository (its path when
        it is there), for its relative links."""
        with open(path) as f:
            text = f.read()
        self.check_prose(path, text, os.path.abspath(page or path))
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

## Planted prose

`tools/no-such-tool.py` is missing; `tools/check-readme.py` and `docs/` exist.
So must `src/core/no_such_file.cpp` be; `slurm/*.sbatch`, `include/saetrain/arch/<name>.h`,
`runs/NAME/x`, `data/quickstart`, `build/cpu/apps/saetrain` and `test/NAME.cpp` are not checked.
Run `sae-bogus --help`, not `sae-export` or `saetrain`; `tools/check-readme.py --self-test`
takes a path `SAETRAIN_X=tools/also-missing.sh`. A span over
two lines: `tools/check-readme.py
tools/missing-on-the-next-line.py`.
[a page](docs/no-such-page.md), [this page's heading](#planted-prose),
[no heading](#no-such-heading), [a file](tools/check-readme.py), [a site](https://example.org/x),
[`tools/check-readme.py`, a span in a link's text](tools/check-readme.py).
`sae-synth --out x --bogus-prose-option 3`; `saetrain CONFIG.yaml --dry-run --ranks 2`.

```text
`tools/in-a-fenced-block.sh` and [a link](no-such-file-in-a-block.md) are not prose.
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
    ":20: tools/no-such-tool.py: no such file",
    ":21: src/core/no_such_file.cpp: no such file",
    ":23: sae-bogus: not one of our programs",
    ":24: tools/also-missing.sh: no such file",
    ":26: tools/missing-on-the-next-line.py: no such file",
    ":27: link to docs/no-such-page.md: no such file",
    ":28: link to #no-such-heading: no heading with anchor #no-such-heading",
    ":30: sae-synth: --bogus-prose-option is not an option of sae-synth",
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
            c.check_file(f.name, page=os.path.join(root, "README.md"))
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
