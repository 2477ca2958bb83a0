#!/usr/bin/env python3
"""check-fmt-args.py — every fmt call's arguments match its format string's {} fields.

    tools/check-fmt-args.py [FILE_OR_DIR ...]      (default: apps bench include src test)
    tools/check-fmt-args.py --self-test            (finds the planted mismatches, and only them)

fmt 9 under C++17 checks format strings at run time only: a missing argument throws when the
line is printed (often on an error path no test reaches), and an extra argument is dropped
silently (issue 34's "run with 2 rank(s) (one SAE per rank2: mpirun -np  / srun -n 2)" had nine
arguments for eight fields). This reads every call of fmt::format, fmt::print, fmt::format_to
and SAE_ENFORCE whose format string is a literal (adjacent literals concatenated), counts the
replacement fields (nested {} in a spec, as in {:<{}}, count too; {{ and }} do not) and the
arguments after it, and prints FILE:LINE for each mismatch. Exit 1 when there is one.
"""
import os
import re
import sys

CALLS = {
    # name: index of the format string among the call's arguments (-1: the first literal)
    "fmt::format": 0,
    "fmt::print": -1,  # fmt::print(stderr, "...", ...) or fmt::print("...", ...)
    "fmt::format_to": 1,
    "SAE_ENFORCE": 1,
}
CALL_RE = re.compile(r"(?<![\w:])(" + "|".join(re.escape(c) for c in CALLS) + r")\s*\(")


def strip_comments(src):
    """Blanks out comments (keeping newlines and offsets) so commented code is not checked."""
    out = list(src)
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c in "\"'":
            i = skip_literal(src, i)
            continue
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
            continue
        i += 1
    return "".join(out)


def skip_literal(src, i):
    """Index just past the string or char literal starting at i (raw strings included)."""
    if src[i] == '"' and i > 0 and src[i - 1] == "R":
        m = re.match(r'R"([^(]*)\(', src[i - 1:])
        if m:
            end = src.find(")" + m.group(1) + '"', i)
            return len(src) if end < 0 else end + len(m.group(1)) + 2
    q = src[i]
    j = i + 1
    while j < len(src) and src[j] != q:
        j += 2 if src[j] == "\\" else 1
    return j + 1


def call_args(src, open_paren):
    """The top-level arguments of the call whose '(' is at open_paren, and the end offset."""
    args, depth, start, i = [], 0, open_paren + 1, open_paren + 1
    while i < len(src):
        c = src[i]
        if c in "\"'":
            i = skip_literal(src, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                args.append(src[start:i])
                return args, i
            depth -= 1
        elif c == "," and depth == 0:
            args.append(src[start:i])
            start = i + 1
        i += 1
    return None, len(src)


LITERAL_RE = re.compile(r'\s*(?:u8|u|U|L)?"((?:[^"\\]|\\.)*)"\s*', re.S)


def literal_text(arg):
    """The text of an argument made only of adjacent string literals, else None."""
    pos, text = 0, []
    while pos < len(arg):
        m = LITERAL_RE.match(arg, pos)
        if not m or m.end() == pos:
            break
        text.append(m.group(1))
        pos = m.end()
    if not text or arg[pos:].strip():
        return None
    return "".join(text)


def fields(fmt_text):
    """(automatic fields, highest explicit index + 1) of a format string, or None if malformed."""
    auto, explicit, i, n = 0, 0, 0, len(fmt_text)
    while i < n:
        c = fmt_text[i]
        if c == "}":
            if i + 1 < n and fmt_text[i + 1] == "}":
                i += 2
                continue
            return None  # a lone '}'
        if c != "{":
            i += 1
            continue
        if i + 1 < n and fmt_text[i + 1] == "{":
            i += 2
            continue
        # A replacement field: {[arg_id][:spec]}, the spec may hold nested {} (width, precision).
        j, depth = i + 1, 1
        body = []
        while j < n and depth > 0:
            if fmt_text[j] == "{":
                depth += 1
            elif fmt_text[j] == "}":
                depth -= 1
            if depth > 0:
                body.append(fmt_text[j])
            j += 1
        if depth:
            return None
        body = "".join(body)
        arg_id, _, spec = body.partition(":")
        for part in [arg_id] + re.findall(r"\{([^{}]*)\}", spec):
            part = part.strip()
            if part == "":
                auto += 1
            elif part.isdigit():
                explicit = max(explicit, int(part) + 1)
            # a named argument (fmt::arg) is not counted
        i = j
    return auto, explicit


def check_file(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        src = strip_comments(f.read())
    problems, checked = [], 0
    for m in CALL_RE.finditer(src):
        name = m.group(1)
        if name == "SAE_ENFORCE" and src[: m.start()].rstrip().endswith("#define"):
            continue  # the macro's own definition
        args, _ = call_args(src, m.end() - 1)
        if args is None:
            continue
        at = CALLS[name]
        if at < 0:
            at = next((k for k, a in enumerate(args) if literal_text(a) is not None), None)
            if at is None:
                continue
        if at >= len(args):
            continue
        text = literal_text(args[at])
        if text is None:
            continue  # a runtime format string: not checkable here
        line = src.count("\n", 0, m.start()) + 1
        checked += 1
        counted = fields(text)
        given = len(args) - at - 1
        if counted is None:
            problems.append(f"{path}:{line}: {name}: malformed format string \"{text[:60]}\"")
            continue
        auto, explicit = counted
        if auto and explicit:
            problems.append(f"{path}:{line}: {name}: mixes automatic and explicit field numbers")
        wanted = auto if auto else explicit
        if wanted != given:
            problems.append(
                f"{path}:{line}: {name}: {wanted} field(s) in \"{text[:70]}\" but {given} "
                f"argument(s)")
    return problems, checked


def sources(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, _, files in os.walk(p):
                for f in sorted(files):
                    if f.endswith((".cpp", ".h", ".cu", ".cuh")):
                        yield os.path.join(root, f)
        else:
            yield p


def self_test(root):
    """The checker finds exactly the mismatches planted in test/data/fmt_args_mismatches.txt."""
    path = os.path.join(root, "test", "data", "fmt_args_mismatches.txt")
    found, checked = check_file(path)
    lines = [int(p.split(":")[1]) for p in found]
    if lines != [4, 6, 8, 11] or checked != 7:
        print(f"check-fmt-args: self-test FAILED: reported lines {lines} of {checked} calls, "
              "expected [4, 6, 8, 11] of 7", file=sys.stderr)
        return 1
    print("check-fmt-args: self-test passed (4 planted mismatches found among 7 calls)")
    return 0


def main(argv):
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    if argv[1:] == ["--self-test"]:
        return self_test(root)
    paths = argv[1:] or [os.path.relpath(os.path.join(root, d)) for d in
                         ("apps", "bench", "include", "src", "test")]
    problems, files, calls = [], 0, 0
    for path in sources(paths):
        found, checked = check_file(path)
        files, calls, problems = files + 1, calls + checked, problems + found
    for p in problems:
        print(p)
    sys.stdout.flush()
    if problems:
        print(f"check-fmt-args: {len(problems)} mismatch(es) among {calls} calls in {files} files",
              file=sys.stderr)
        return 1
    print(f"check-fmt-args: {calls} calls in {files} files, each with as many arguments as its "
          "format string has fields")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
