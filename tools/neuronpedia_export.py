#!/usr/bin/env python3
"""neuronpedia_export.py: sae-features' features.h5 as the batch files Neuronpedia imports.

    .venv/bin/python tools/neuronpedia_export.py FEATURES_H5 --out DIR [--model-id ID]
        [--layer N] [--sae-set NAME] [--features-per-batch 128] [--vocab VOCAB_JSON]
        [--intervals 10]

Writes DIR/batch-0.json, batch-1.json, ...: SAEDashboard 0.8's NeuronpediaDashboardBatch
layout (model_id, layer, sae_set, sae_id_suffix, features), which its neuronpedia runner writes
and Neuronpedia's upload reads, each file --features-per-batch latents in order. Per latent (a
NeuronpediaDashboardFeature):
  feature_index                the latent
  frac_nonzero                 its frequency (rows it fired on / rows read)
  freq_hist_data_bar_values    the centres of its histogram's log-spaced bins that hold a count,
  freq_hist_data_bar_heights   and those counts
  correlated_features_indices  its nearest latents by decoder cosine, correlated_features_l1
                               their cosines (where SAEDashboard puts its cosines)
  activations                  its top rows, largest first, each as SAEDashboard's "top
                               activations" group (bin_min -1, bin_max the latent's largest
                               activation, bin_contains -1): the window's tokens as text and the
                               latent's activation on each (rows of other contexts left out);
                               then its sampled firings (sae-features --samples) as
                               SAEDashboard's interval groups: --intervals equal intervals of
                               [0, its largest activation], highest first, each row in the one
                               its activation falls in, bin_contains the share of all rows in
                               it (the lowest counting the rows it did not fire on, as
                               SAEDashboard's does), estimated from the sample's share
  pos_str, pos_values          the tokens its decoder row promotes most through the unembedding,
  neg_str, neg_values          and suppresses most (sae-features' logit tables; empty without
                               an unembedding.h5)
  n_prompts_total              rows read; n_tokens_in_prompt: the window's length (2 W + 1)
  dataset                      the data set features.h5 was computed on
The fields sae-features has no data for are empty: the logits histogram, neuron alignment and
correlations, decoder weight distribution. Tokens are text from vocab.json (tools/extract_activations.py writes it beside
the sets; --vocab another); shards without token ids, or no vocabulary, are one line and status
1, as are a file that is not features.h5 and an --out that holds batch files already.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


class Fail(Exception):
    pass


def token_text(vocab, t):
    return vocab[t] if 0 <= t < len(vocab) else str(t)


def logit_fields(i, f, vocab):
    """SAEDashboard's logit tables of latent i (pos_*: the tokens it promotes, largest first;
    neg_*: those it suppresses, most negative first), empty without sae-features' tables."""
    if "logit_pos_ids" not in f:
        return {"neg_str": [], "neg_values": [], "pos_str": [], "pos_values": []}
    return {
        "neg_str": [token_text(vocab, int(t)) for t in f["logit_neg_ids"][i]],
        "neg_values": [round(float(v), 3) for v in f["logit_neg_values"][i]],
        "pos_str": [token_text(vocab, int(t)) for t in f["logit_pos_ids"][i]],
        "pos_values": [round(float(v), 3) for v in f["logit_pos_values"][i]],
    }


def window(toks, vals, w, vocab):
    """A row's window: its tokens as text and activations, rows of other contexts left out."""
    keep = [o for o in range(2 * w + 1) if toks[o] >= 0]
    return {"tokens": [vocab[int(toks[o])] for o in keep],
            "values": [round(float(vals[o]), 3) for o in keep],
            "qualifying_token_index": keep.index(w)}


def interval_groups(i, f, w, vocab, intervals):
    """Latent i's sampled firings as SAEDashboard's interval groups, highest interval first."""
    mx = float(f["max_act"][i])
    if intervals <= 0 or "sample_rows" not in f or "sample_context_tokens" not in f or mx <= 0:
        return []
    rows, acts = f["sample_rows"][i], f["sample_acts"][i]
    kept = [j for j in range(len(rows)) if rows[j] >= 0]
    if not kept:
        return []
    which = {j: min(intervals - 1, int(float(acts[j]) / mx * intervals)) for j in kept}
    freq = float(f["frequency"][i])
    out = []
    for q in range(intervals - 1, -1, -1):
        members = [j for j in kept if which[j] == q]
        share = freq * len(members) / len(kept) + (1 - freq if q == 0 else 0)
        for j in members:
            out.append({"bin_min": round(mx * q / intervals, 3),
                        "bin_max": round(mx * (q + 1) / intervals, 3),
                        "bin_contains": round(share, 6),
                        **window(f["sample_context_tokens"][i, j], f["sample_context_acts"][i, j],
                                 w, vocab)})
    return out


def feature_dict(i, f, a, vocab, edges, intervals):
    """Latent i's NeuronpediaDashboardFeature fields from features.h5's arrays `f`."""
    w = int(a["context"])
    hist = f["hist"][i]
    bins = [b for b in range(len(hist)) if hist[b] > 0]
    rows = f["top_rows"][i]
    acts = []
    for j in range(len(rows)):
        if rows[j] < 0:
            break
        acts.append({"bin_min": -1, "bin_max": round(float(f["max_act"][i]), 3),
                     "bin_contains": -1,
                     **window(f["top_context_tokens"][i, j], f["top_context_acts"][i, j], w,
                              vocab)})
    acts += interval_groups(i, f, w, vocab, intervals)
    nb = [int(x) for x in f["neighbours"][i]] if "neighbours" in f else []
    nbc = [round(float(x), 3) for x in f["neighbour_cosine"][i]] if "neighbours" in f else []
    keep_nb = [k for k, x in enumerate(nb) if x >= 0]
    return {
        "feature_index": int(i),
        "neuron_alignment_indices": [], "neuron_alignment_values": [], "neuron_alignment_l1": [],
        "correlated_neurons_indices": [], "correlated_neurons_l1": [],
        "correlated_neurons_pearson": [],
        "correlated_features_indices": [nb[k] for k in keep_nb],
        "correlated_features_l1": [nbc[k] for k in keep_nb], "correlated_features_pearson": [],
        **logit_fields(i, f, vocab),
        "frac_nonzero": float(f["frequency"][i]),
        "freq_hist_data_bar_values": [round(float((edges[b] * edges[b + 1]) ** 0.5), 6)
                                      for b in bins],
        "freq_hist_data_bar_heights": [float(hist[b]) for b in bins],
        "logits_hist_data_bar_heights": [], "logits_hist_data_bar_values": [],
        "n_prompts_total": int(a["rows"]), "n_tokens_in_prompt": 2 * w + 1,
        "dataset": str(a["data"]),
        "activations": acts,
        "decoder_weights_dist": [],
        "vector": [],
    }


def export(path, out, model_id, layer, sae_set, per_batch, vocab_path, intervals=10):
    import h5py
    from saereport.features import read_vocab

    try:
        h = h5py.File(path, "r")
    except OSError as e:
        raise Fail(f"{path}: not readable HDF5 ({e})")
    with h:
        a = dict(h.attrs)
        if a.get("format") != "saetrain-features 1":
            raise Fail(f"{path}: not sae-features' features.h5 (format "
                       f"{a.get('format', 'missing')!r})")
        if "top_context_tokens" not in h or "top_context_acts" not in h:
            raise Fail(f"{path}: no token windows ({a.get('contexts', '')}); Neuronpedia shows "
                       "each top row as text: run sae-features on shards with token_ids")
        if vocab_path:
            with open(vocab_path, encoding="utf-8") as v:
                vocab = json.load(v)
        else:
            vocab = read_vocab(str(a["data"]))
        if not vocab:
            raise Fail(f"{path}: no vocab.json beside {a['data']} (tools/extract_activations.py "
                       "writes it); give --vocab")
        most = max(int(h[k][()].max()) for k in ("top_context_tokens", "sample_context_tokens")
                   if k in h)
        if most >= len(vocab):
            raise Fail(f"{vocab_path or 'vocab.json'}: {len(vocab)} tokens, but the windows "
                       f"hold token id {most}: not this data set's vocabulary")
        f = {k: h[k][()] for k in h}
    if os.path.isdir(out) and any(n.startswith("batch-") for n in os.listdir(out)):
        raise Fail(f"--out {out}: holds batch files already; choose an empty directory")
    os.makedirs(out, exist_ok=True)
    n = int(a["n_latents"])
    edges = f["hist_edges"]
    written = []
    for b, i0 in enumerate(range(0, n, per_batch)):
        batch = {"model_id": model_id, "layer": layer, "sae_set": sae_set,
                 "sae_id_suffix": None, "features": [feature_dict(i, f, a, vocab, edges, intervals)
                              for i in range(i0, min(n, i0 + per_batch))]}
        name = os.path.join(out, f"batch-{b}.json")
        with open(name + ".tmp", "w", encoding="utf-8") as g:
            json.dump(batch, g, ensure_ascii=False, allow_nan=False)
        os.replace(name + ".tmp", name)
        written.append(name)
    return n, written


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("features", help="features.h5 written by sae-features")
    ap.add_argument("--out", required=True, help="directory for batch-<i>.json")
    ap.add_argument("--model-id", default="", help="Neuronpedia's model id (e.g. gpt2-small)")
    ap.add_argument("--layer", type=int, default=0, help="the SAE's layer")
    ap.add_argument("--sae-set", default="", help="Neuronpedia's SAE set name")
    ap.add_argument("--features-per-batch", type=int, default=128)
    ap.add_argument("--vocab", help="a vocab.json (default: the one beside the data)")
    ap.add_argument("--intervals", type=int, default=10,
                    help="interval groups of the sampled firings (0: none; default 10)")
    a = ap.parse_args(argv)
    if os.environ.get("SAETRAIN_PARSE_ONLY") == "1":
        return 0
    if a.features_per_batch < 1:
        ap.error("--features-per-batch must be >= 1")
    if a.intervals < 0:
        ap.error("--intervals must be >= 0")
    try:
        n, written = export(a.features, a.out, a.model_id, a.layer, a.sae_set,
                            a.features_per_batch, a.vocab, a.intervals)
    except Fail as e:
        print(f"neuronpedia_export: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"neuronpedia_export: error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"neuronpedia_export: {n} latents in {len(written)} batch file(s) in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
