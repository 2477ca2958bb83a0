#!/usr/bin/env python3
"""check-rooms.py — the layers, the file sizes and the Words table hold in the code.

    tools/check-rooms.py               (exit 1, one line per breach: FILE:LINE and the rule)
    tools/check-rooms.py --self-test   (finds the planted breaches, and only them)

Layers (docs/architecture.md, "Layers"): each library under src/ includes only the headers of
its own layer and the layers below it, followed through the headers it includes (a core source
that includes a core header that includes an io header is a breach). A header's layer is the
directory of the source that defines it (include/saetrain/X.h beside src/io/X.cpp is io's),
or LAYER_OF where the names differ; a header with no source is an interface of core. System
headers of the libraries a layer does not link (MPI, HDF5, CUDA, NCCL, libcurl, Boost) count
as those layers' headers.

Sizes: no source outside test/ (apps, bench, include, src, tools) over MAX_LINES lines, except
the files in CEILING, which may not grow past their figure (each is to be split).

Words (docs/architecture.md, "Words"): a rank's place in the job is its coordinates, never a
layout; the tensors a checkpoint sends to the first latent shard are gathered, not streamed
(stream means the rows an SAE trains on, or a CUDA stream); in the model's layers (core, cpu,
cuda, comm) a latent shard is never shortened to "shard" in code (comments and strings may say
"latent shard"; elsewhere a shard is an HDF5 file of activations); the optimizer's two buffers
are opt_m and opt_v whichever optimizer runs (files keep the names adam_m and adam_v).
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 800
CEILING = {}
# Layers below each one (itself included): what its sources may include.
ALLOWED = {
    "core": {"core"},
    "cpu": {"core", "cpu"},
    "comm": {"core", "comm"},
    "io": {"core", "io"},
    "cuda": {"core", "comm", "cuda"},
    "backends": {"core", "cpu", "cuda", "backends"},
    "run": {"core", "cpu", "comm", "io", "cuda", "backends", "run"},
    "serve": {"core", "serve"},
}
# Headers whose defining source has another name.
LAYER_OF = {
    "arch.h": "core",  # src/core/arch/registry.cpp
    "arch_ops.h": "core",  # the op sets' interface; src/cuda/arch_ops.cpp fills the CUDA one
    "backend_registry.h": "core",  # the interface each backend's BackendKind implements
    "mpi_world.h": "comm",  # src/comm/mpi_comm.cpp
    "s3.h": "io",  # src/io/s3_client.cpp
    "cuda_collective_delay.h": "cuda",
    "cuda_device.h": "cuda",
    "cuda_pinned.h": "cuda",
    "cuda_staged_comm.h": "cuda",
    "serve/page.h": "serve",  # generated from src/serve/page.html
}
SYSTEM = [
    (re.compile(r"^mpi\.h$"), "comm"),
    (re.compile(r"^(hdf5|H5[A-Za-z]*)\.h$"), "io"),
    (re.compile(r"^curl/"), "io"),
    (re.compile(r"^(cuda|cuda_runtime|cuda_fp16|cuda_bf16|cublasLt|cublas_v2)[A-Za-z_]*\.h$"), "cuda"),
    (re.compile(r"^nccl\.h$"), "cuda"),
    (re.compile(r"^boost/"), "serve"),
]
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)
WORDS = [
    (re.compile(r"\bRankCoords\s*&?\s*\w*layout\w*"),
     "a RankCoords is a rank's coordinates, not a layout (Words)"),
    (re.compile(r"\bstream_\w+\s*\("),
     "a function named stream_*: tensors sent to the first latent shard are gathered (Words)"),
    (re.compile(r"\badam_(m|v)\b"),
     "the optimizer's buffers are opt_m and opt_v, whichever optimizer (Words; files keep "
     "\"adam_m\" and \"adam_v\")"),
]
# In the model's layers a shard is a latent shard, and it is never shortened (in io, src/run
# and the data headers a shard is an HDF5 file of activations).
LATENT_WORDS = (
    re.compile(r"\b(shard|shards|shard_|shards_|first_shard|over_shards)\b"),
    "a latent shard is never shortened to shard in the model's layers (Words)",
)
LATENT_DIRS = ("src/core/", "src/cpu/", "src/cuda/", "src/comm/")
WORD_DIRS = ("apps", "include", "src")
WORD_SKIP = ("src/cuda/",)  # CUDA streams are streams
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".py", ".sh")


def layer_of_source(rel):
    """The layer of a file under src/ (None for apps, tests, tools)."""
    parts = rel.split("/")
    if parts[0] != "src" or len(parts) < 2:
        return None
    if len(parts) == 2:  # src/backend_registry.cpp
        return "backends"
    return parts[1]


def header_layers(root):
    """include/saetrain/... header (relative to include/saetrain) -> its layer."""
    # A name defined in several layers (src/core/arch/switch.cpp, src/cuda/switch.cu) is the
    # lowest layer's header.
    order = ["core", "comm", "cpu", "io", "cuda", "backends", "run", "serve"]
    defined = {}
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            if f.endswith((".cpp", ".cu")):
                layer = layer_of_source(os.path.relpath(os.path.join(dirpath, f), root))
                base = os.path.splitext(f)[0]
                if base not in defined or order.index(layer) < order.index(defined[base]):
                    defined[base] = layer
    layers = {}
    inc = os.path.join(root, "include", "saetrain")
    for dirpath, _, files in os.walk(inc):
        for f in files:
            if not f.endswith(".h"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), inc)
            base = os.path.splitext(f)[0]
            if rel in LAYER_OF:
                layers[rel] = LAYER_OF[rel]
            elif rel.startswith("serve/"):
                layers[rel] = "serve"
            else:
                layers[rel] = defined.get(base, "core")
    return layers


def includes(path):
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    for m in INCLUDE_RE.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)


def resolve(root, src_path, quote, name):
    """The file an include names: ('saetrain', rel) for a project header, ('local', path) for one
    beside the source, ('system', name) otherwise."""
    if name.startswith("saetrain/"):
        return "saetrain", name[len("saetrain/"):]
    if quote == '"':
        local = os.path.join(os.path.dirname(src_path), name)
        if os.path.exists(local):
            return "local", os.path.normpath(local)
    return "system", name


def check_layers(root):
    layers = header_layers(root)
    found = []
    cache = {}

    def reach(path):
        """Every (layer, what) a file reaches through its includes, with the first line."""
        if path in cache:
            return cache[path]
        cache[path] = []
        out = []
        for line, quote, name in includes(path):
            kind, what = resolve(root, path, quote, name)
            if kind == "saetrain":
                layer = layers.get(what)
                if layer is None:
                    continue  # generated (build_config.h) or missing: the compiler says so
                out.append((line, layer, "saetrain/" + what))
                for _, l2, w2 in reach(os.path.join(root, "include", "saetrain", what)):
                    out.append((line, l2, f"saetrain/{what} -> {w2}"))
            elif kind == "local":
                for l1, l2, w2 in reach(what):
                    out.append((line, l2, f"{name} -> {w2}"))
            else:
                for rx, layer in SYSTEM:
                    if rx.search(what):
                        out.append((line, layer, f"<{what}>"))
        cache[path] = out
        return out

    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for f in sorted(files):
            if not f.endswith((".cpp", ".cu", ".h", ".cuh")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            layer = layer_of_source(rel)
            seen = set()  # one breach per include line
            for line, l2, what in reach(path):
                if l2 not in ALLOWED[layer] and line not in seen:
                    seen.add(line)
                    found.append(f"{rel}:{line}: {layer} includes {what}, a header of {l2} "
                                 f"(a layer {layer} may not use)")
    inc = os.path.join(root, "include", "saetrain")
    for rel, layer in sorted(layers.items()):
        path = os.path.join(inc, rel)
        seen = set()
        for line, l2, what in reach(path):
            if l2 not in ALLOWED[layer] and line not in seen:
                seen.add(line)
                found.append(f"include/saetrain/{rel}:{line}: a {layer} header includes {what}, "
                             f"a header of {l2}")
    return found


def tracked_sources(root):
    for top in ("apps", "bench", "include", "src", "tools"):
        for dirpath, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d not in ("__pycache__",)]
            for f in sorted(files):
                if f.endswith(SOURCE_EXT):
                    yield os.path.relpath(os.path.join(dirpath, f), root)


def check_sizes(root):
    found = []
    for rel in tracked_sources(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            n = sum(1 for _ in fh)
        limit = CEILING.get(rel, MAX_LINES)
        if n > limit:
            why = ("its ceiling until it is split" if rel in CEILING
                   else "split it into files of one concern each")
            found.append(f"{rel}: {n} lines, over {limit} ({why})")
    return found


def check_words(root):
    found = []
    for rel in tracked_sources(root):
        if not rel.startswith(WORD_DIRS) or rel.startswith(WORD_SKIP):
            continue
        if not rel.endswith((".h", ".cpp", ".cu", ".cuh")):
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            for i, text in enumerate(fh, 1):
                code = code_of(text)
                for rx, why in WORDS:
                    if rx.search(code):
                        found.append(f"{rel}:{i}: {why}")
    for rel in tracked_sources(root):
        if not rel.startswith(LATENT_DIRS) or not rel.endswith((".h", ".cpp", ".cu", ".cuh")):
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            for i, text in enumerate(fh, 1):
                if LATENT_WORDS[0].search(code_of(text)):
                    found.append(f"{rel}:{i}: {LATENT_WORDS[1]}")
    return found


def code_of(line):
    """A C++ line without its // comment and with its string and character literals emptied."""
    out, i, n = [], 0, len(line)
    while i < n:
        c = line[i]
        if c in "\"'":
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        elif line.startswith("//", i):
            break
        else:
            out.append(c)
            i += 1
    return "".join(out)


def check(root):
    return check_layers(root) + check_sizes(root) + check_words(root)


def self_test():
    """Plants one breach of each rule in a copy of a small tree; each must be found, and the clean
    tree must pass."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        def write(rel, text):
            p = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as fh:
                fh.write(text)

        write("include/saetrain/trainer.h", '#include "saetrain/comm.h"\n')
        write("include/saetrain/comm.h", "struct Communicator;\n")
        write("include/saetrain/checkpoint.h", '#include "saetrain/trainer.h"\n')
        write("src/core/trainer.cpp", '#include "saetrain/trainer.h"\n#include "local.h"\n')
        write("src/core/local.h", "#include <vector>\n")
        write("src/io/checkpoint.cpp", '#include "saetrain/checkpoint.h"\n#include <hdf5.h>\n')
        write("src/core/report.cpp", 'RankCoords coords_;  // shard\nauto s = "shards";\n')
        clean = check(tmp)
        if clean:
            print("check-rooms self-test: the clean tree has breaches:\n" + "\n".join(clean))
            return 1
        # A core header that reaches io through another header, MPI in core through a local
        # header, a long file, and both words.
        write("include/saetrain/trainer.h",
              '#include "saetrain/comm.h"\n#include "saetrain/checkpoint_view.h"\n')
        write("include/saetrain/checkpoint_view.h", '#include "saetrain/checkpoint.h"\n')
        write("src/io/checkpoint_view.cpp", "\n")
        write("src/core/local.h", "#include <mpi.h>\n")
        write("src/core/long.cpp", "x\n" * (MAX_LINES + 1))
        write("src/core/report.cpp", "RankCoords layout_;\nvoid stream_latents(int);\n"
              'int shards_ = 1;  // "shard" in a comment or a "shard" string is fine\n'
              'float* adam_m = nullptr;  // "adam_m", the file\'s name, is fine\n')
        found = check(tmp)
        want = [
            "src/core/trainer.cpp:1: core includes saetrain/trainer.h -> saetrain/checkpoint_view.h",
            "src/core/trainer.cpp:2: core includes local.h -> <mpi.h>, a header of comm",
            "src/core/local.h:1: core includes <mpi.h>, a header of comm",
            "include/saetrain/trainer.h:2: a core header includes saetrain/checkpoint_view.h",
            f"src/core/long.cpp: {MAX_LINES + 1} lines, over {MAX_LINES}",
            "src/core/report.cpp:1: a RankCoords is a rank's coordinates",
            "src/core/report.cpp:2: a function named stream_*",
            "src/core/report.cpp:3: a latent shard is never shortened",
            "src/core/report.cpp:4: the optimizer's buffers are opt_m and opt_v",
        ]
        missing = [w for w in want if not any(f.startswith(w) for f in found)]
        extra = [f for f in found if not any(f.startswith(w) for w in want)]
        if missing or extra:
            print("check-rooms self-test: FAILED")
            for m in missing:
                print("  not found:", m)
            for e in extra:
                print("  unexpected:", e)
            return 1
        print(f"check-rooms self-test: {len(found)} planted breach(es) found, none else")
        return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    found = check(ROOT)
    for f in found:
        print(f)
    if found:
        print(f"check-rooms: {len(found)} breach(es)", file=sys.stderr)
        return 1
    print(f"check-rooms: layers, sizes (<= {MAX_LINES} lines) and words hold")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
