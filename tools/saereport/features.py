"""The feature pages: report/features/<id>/ for each RUN/features/<id>/features.h5 that
sae-features wrote (docs/features.md), and report/features/index.html listing them.

Each SAE's directory holds a static viewer (index.html) and its data as scripts, so the page
works from file:// as well as served (a browser fetches no local JSON from file://, but loads
scripts): summary.js (every latent's frequency, largest and mean activation, and the token ids
of its top rows, for sorting and searching) and detail-<c>.js, one per CHUNK latents (their
histograms, top rows with activations and token windows, neighbours), loaded when a latent of
that chunk is opened. Tokens are shown as text where the data's directory or its parent holds
vocab.json (tools/extract_activations.py writes it: entry i is token id i's string), else as
ids.
"""
import html
import json
import os

CHUNK = 256


def feature_sets(run_dir):
    """[(sae id, path of its features.h5)] in id order; [] when the run has none. Links are
    not followed (a run never writes one)."""
    root = os.path.join(run_dir, "features")
    if not os.path.isdir(root) or os.path.islink(root):
        return []
    out = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name, "features.h5")
        if os.path.islink(os.path.join(root, name)) or os.path.islink(path):
            continue
        if os.path.isfile(path):
            out.append((name, path))
    return out


def read_vocab(data):
    """The vocabulary beside a data set (its directory, glob's directory, or their parent),
    a list of strings, or None."""
    if data.startswith("s3://"):
        return None
    base = data if os.path.isdir(data) else os.path.dirname(data)
    for d in (base, os.path.dirname(os.path.normpath(base))):
        path = os.path.join(d, "vocab.json")
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, encoding="utf-8") as f:
                vocab = json.load(f)
            if isinstance(vocab, list) and all(isinstance(v, str) for v in vocab):
                return vocab
    return None


def _subdir(parent, name):
    """A ReportDir for parent/name, made if needed, never through a link."""
    from saereport.read import ReportDir
    try:
        os.mkdir(name, 0o755, dir_fd=parent.fd)
    except FileExistsError:
        pass
    return ReportDir(os.path.join(parent, name))


def _js(f, name, value):
    f.write(f"{name}(")
    json.dump(value, f, separators=(",", ":"), allow_nan=False)
    f.write(");\n")


def _rounded(values, digits=5):
    return [float(f"{v:.{digits}g}") for v in values.tolist()]


def _sample_of(i, rows, acts, ctx, cacts):
    """Latent i's sampled rows for its detail record (empty without a sample)."""
    if rows is None:
        return {"srows": []}
    k = int((rows[i] >= 0).sum())
    return {"srows": rows[i, :k].tolist(), "sacts": _rounded(acts[i, :k]),
            "sctx": ctx[i, :k].tolist() if ctx is not None else None,
            "scacts": [_rounded(w, 4) for w in cacts[i, :k]]}


def write_feature_set(h5py, sae_id, path, out):
    """Writes one SAE's viewer and data into `out` (a ReportDir). Returns its summary line.
    A file that is not sae-features' features.h5, or is damaged, is a ReportError naming it."""
    from saereport.read import ReportError
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != "saetrain-features 1":
                raise ReportError(f"{path}: not sae-features' features.h5 (format "
                                  f"{f.attrs.get('format', 'missing')!r})")
        return _write_feature_set(h5py, sae_id, path, out)
    except (OSError, KeyError, ValueError, IndexError) as e:
        raise ReportError(f"{path}: unreadable or damaged features file ({e})")


def _write_feature_set(h5py, sae_id, path, out):
    with h5py.File(path, "r") as f:
        a = dict(f.attrs)
        n, top = int(a["n_latents"]), int(a["top"])
        freq, mx, mean = f["frequency"][()], f["max_act"][()], f["mean_act"][()]
        fires = f["fire_count"][()]
        rows, acts = f["top_rows"][()], f["top_acts"][()]
        hist, edges = f["hist"][()], f["hist_edges"][()]
        ctx = f["top_context_tokens"][()] if "top_context_tokens" in f else None
        cacts = f["top_context_acts"][()] if "top_context_acts" in f else None
        srows = f["sample_rows"][()] if "sample_rows" in f else None
        sacts = f["sample_acts"][()] if srows is not None else None
        sctx = f["sample_context_tokens"][()] if "sample_context_tokens" in f else None
        scacts = f["sample_context_acts"][()] if srows is not None else None
        nb = f["neighbours"][()] if "neighbours" in f else None
        nbc = f["neighbour_cosine"][()] if "neighbour_cosine" in f else None
        logits = {k: f[k][()] for k in ("logit_pos_ids", "logit_pos_values", "logit_neg_ids",
                                        "logit_neg_values")} if "logit_pos_ids" in f else None
    context = int(a["context"])
    summary = {
        "id": sae_id, "arch": str(a["arch"]), "rows": int(a["rows"]), "n": n, "top": top,
        "context": context, "contexts": str(a["contexts"]), "data": str(a["data"]),
        "chunk": CHUNK, "freq": _rounded(freq), "max": _rounded(mx), "mean": _rounded(mean),
        "fires": fires.tolist(), "edges": _rounded(edges, 4),
        # The token of each top row (the row itself, the window's middle), for search by token.
        "top_token": ctx[:, :, context].tolist() if ctx is not None else None,
        "vocab": read_vocab(str(a["data"])) if ctx is not None or logits else None,
        "logits": str(a.get("logits", "none: computed before sae-features kept logit tables")),
    }
    with out.open("summary.js", "w", encoding="utf-8") as f:
        _js(f, "saeFeaturesSummary", summary)
    for c0 in range(0, n, CHUNK):
        latents = []
        for i in range(c0, min(n, c0 + CHUNK)):
            k = int((rows[i] >= 0).sum())
            latents.append({
                "hist": hist[i].tolist(),
                "rows": rows[i, :k].tolist(), "acts": _rounded(acts[i, :k]),
                "ctx": ctx[i, :k].tolist() if ctx is not None else None,
                "cacts": [_rounded(w, 4) for w in cacts[i, :k]] if cacts is not None else None,
                **_sample_of(i, srows, sacts, sctx, scacts),
                "nb": nb[i].tolist() if nb is not None else [],
                "nbc": _rounded(nbc[i], 4) if nbc is not None else [],
                **({"lpos": logits["logit_pos_ids"][i].tolist(),
                    "lposv": _rounded(logits["logit_pos_values"][i], 4),
                    "lneg": logits["logit_neg_ids"][i].tolist(),
                    "lnegv": _rounded(logits["logit_neg_values"][i], 4)} if logits else {})})
        with out.open(f"detail-{c0 // CHUNK:05d}.js", "w", encoding="utf-8") as f:
            _js(f, "saeFeaturesChunk", {"chunk": c0 // CHUNK, "latents": latents})
    with out.open("index.html", "w", encoding="utf-8") as f:
        f.write(VIEWER.replace("__TITLE__", html.escape(sae_id)))
    dead = int((fires == 0).sum())
    dense = int((fires > 0.1 * int(a["rows"])).sum())
    return (sae_id, n, int(a["rows"]), dead, dense)


def write_features(run_dir, out_dir):
    """report/features/ for every feature set of the run; returns [(id, n, rows, dead, dense)]
    (empty, and nothing written, when the run has none)."""
    sets = feature_sets(run_dir)
    if not sets:
        return []
    try:
        import h5py
    except ImportError:
        from saereport.read import ReportError
        raise ReportError("the run has features (features/*/features.h5) but h5py is not "
                          "installed for this Python; run bash tools/setup-venv.sh")
    root = _subdir(out_dir, "features")
    lines = [write_feature_set(h5py, sae_id, path, _subdir(root, sae_id))
             for sae_id, path in sets]
    items = "".join(
        f'<tr><td><a href="{html.escape(i)}/index.html">{html.escape(i)}</a></td><td>{n}</td>'
        f"<td>{rows}</td><td>{dead}</td><td>{dense}</td></tr>" for i, n, rows, dead, dense in lines)
    with root.open("index.html", "w", encoding="utf-8") as f:
        f.write(f"""<!doctype html>
<html><head><meta charset="utf-8"><title>saetrain features</title>
<style>body{{font:14px sans-serif;margin:1.5em}}td,th{{padding:2px 10px;text-align:right}}
td:first-child,th:first-child{{text-align:left}}</style></head><body>
<h1>Features</h1><p><a href="../index.html">the run's report</a></p>
<table id="sets"><thead><tr><th>sae</th><th>latents</th><th>rows read</th><th>dead</th>
<th>dense (&gt; 10%)</th></tr></thead><tbody>{items}</tbody></table></body></html>
""")
    return lines


# The viewer: one page per SAE, reading summary.js at once and detail-<c>.js on demand.
# URL hash: #latent=ID opens a latent; #q=TEXT searches (an id, or token:ID).
VIEWER = r"""<!doctype html>
<html><head><meta charset="utf-8"><title>features: __TITLE__</title>
<style>
body{font:14px sans-serif;margin:1.2em;color:#222}
.meta{color:#555}
#layout{display:flex;gap:1.5em;align-items:flex-start}
#list{min-width:26em}
table{border-collapse:collapse}
td,th{padding:1px 8px;text-align:right}
#latents tbody tr{cursor:pointer}
#latents tbody tr:hover{background:#eef}
#detail{flex:1}
.ctx{font-family:monospace;white-space:nowrap}
.tok{padding:0 2px;margin:0 1px;border-radius:2px}
.tok.here{font-weight:bold;outline:1px solid #c60}
.gone{color:#bbb}
.logit .tok{font-family:monospace}
.logit.pos .tok{background:#dfe9f7}
.logit.neg .tok{background:#f7dfdf}
a.lat{color:#036;cursor:pointer;margin-right:.6em}
</style></head><body>
<h1>Features: <span id="sae"></span></h1>
<p class="meta" id="facts"></p>
<div id="layout">
<div id="list">
<p><input id="search" placeholder="latent id, or token:ID or token:TEXT" size="26">
sort by <select id="sort"><option value="freq">frequency</option>
<option value="max">max activation</option><option value="id">latent id</option></select></p>
<p class="meta" id="count"></p>
<table id="latents"><thead><tr><th>latent</th><th>frequency</th><th>max act</th>
<th>mean act</th></tr></thead><tbody></tbody></table>
<p><button id="prev">previous</button> <span id="page"></span> <button id="next">next</button></p>
<h3>Dead latents (<span id="dead-count"></span>)</h3><div id="dead" class="meta"></div>
<h3>Dense latents, on more than 10% of rows (<span id="dense-count"></span>)</h3>
<div id="dense" class="meta"></div>
</div>
<div id="detail"><p class="meta">Click a latent to see its top rows.</p></div>
</div>
<script>
"use strict";
const t0 = performance.now();
const PER_PAGE = 100;
let S = null, order = [], shown = [], page = 0;
const chunks = {}, waiting = {};
function saeFeaturesSummary(s) { S = s; }
function saeFeaturesChunk(c) {
  chunks[c.chunk] = c.latents;
  for (const f of waiting[c.chunk] || []) f();
  delete waiting[c.chunk];
}
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}
function tokText(t) { return S.vocab && t < S.vocab.length ? S.vocab[t] : String(t); }
function pct(v) { return (100 * v).toPrecision(3) + "%"; }
function num(v) { return Number(v).toPrecision(4); }
function latentLink(i) {
  const a = el("a", {class: "lat", "data-latent": i}, String(i));
  a.onclick = () => { location.hash = "latent=" + i; };
  return a;
}
function sortBy(key) {
  order = [...Array(S.n).keys()];
  if (key === "freq") order.sort((a, b) => S.freq[b] - S.freq[a] || a - b);
  if (key === "max") order.sort((a, b) => S.max[b] - S.max[a] || a - b);
}
function filter(q) {
  q = q.trim();
  if (!q) return order;
  const tok = q.match(/^token:\s*(.+)$/);
  if (tok) {
    if (!S.top_token) return [];
    const want = tok[1].trim();
    const t = /^\d+$/.test(want) ? Number(want) : (S.vocab ? S.vocab.indexOf(want) : -1);
    return t < 0 ? [] : order.filter((i) => S.top_token[i].includes(t));
  }
  const id = Number(q);
  return Number.isInteger(id) && id >= 0 && id < S.n ? [id] : [];
}
function drawList() {
  const body = document.querySelector("#latents tbody");
  body.textContent = "";
  const pages = Math.max(1, Math.ceil(shown.length / PER_PAGE));
  page = Math.min(page, pages - 1);
  for (const i of shown.slice(page * PER_PAGE, (page + 1) * PER_PAGE)) {
    const tr = el("tr", {"data-latent": i});
    tr.append(el("td", {}, String(i)), el("td", {}, pct(S.freq[i])),
              el("td", {}, num(S.max[i])), el("td", {}, num(S.mean[i])));
    tr.onclick = () => { location.hash = "latent=" + i; };
    body.append(tr);
  }
  document.getElementById("count").textContent = shown.length + " of " + S.n + " latents";
  document.getElementById("page").textContent = "page " + (page + 1) + " of " + pages;
}
function refresh() {
  sortBy(document.getElementById("sort").value);
  shown = filter(document.getElementById("search").value);
  drawList();
}
function withChunk(c, f) {
  if (chunks[c]) return f();
  if (waiting[c]) { waiting[c].push(f); return; }
  waiting[c] = [f];
  document.head.append(el("script", {src: "detail-" + String(c).padStart(5, "0") + ".js"}));
}
function histogram(h) {
  const ns = "http://www.w3.org/2000/svg", w = 480, hgt = 110;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", hgt + 18); svg.id = "hist";
  const top = Math.max(1, ...h.map((v) => Math.log10(1 + v)));
  h.forEach((v, b) => {
    const r = document.createElementNS(ns, "rect"), bh = hgt * Math.log10(1 + v) / top;
    r.setAttribute("x", b * w / h.length); r.setAttribute("width", w / h.length - 0.5);
    r.setAttribute("y", hgt - bh); r.setAttribute("height", bh); r.setAttribute("fill", "#369");
    r.setAttribute("data-count", v);
    const tip = document.createElementNS(ns, "title");
    tip.textContent = num(S.edges[b]) + " .. " + num(S.edges[b + 1]) + ": " + v;
    r.append(tip); svg.append(r);
  });
  const used = h.map((v, b) => v ? b : -1).filter((b) => b >= 0);
  if (used.length) {
    const lab = document.createElementNS(ns, "text");
    lab.setAttribute("x", 0); lab.setAttribute("y", hgt + 14); lab.setAttribute("font-size", 11);
    lab.textContent = "activation, log bins: " + num(S.edges[used[0]]) + " .. " +
      num(S.edges[used[used.length - 1] + 1]) + " (bar heights log counts)";
    svg.append(lab);
  }
  return svg;
}
function drawDetail(i) {
  const d = document.getElementById("detail");
  d.textContent = "";
  d.dataset.latent = i;
  d.append(el("h2", {}, "Latent " + i));
  d.append(el("p", {class: "meta"}, "fires on " + S.fires[i] + " of " + S.rows + " rows (" +
    pct(S.freq[i]) + "); max activation " + num(S.max[i]) + ", mean " + num(S.mean[i])));
  withChunk(Math.floor(i / S.chunk), () => {
    if (d.dataset.latent !== String(i)) return;
    const L = chunks[Math.floor(i / S.chunk)][i % S.chunk];
    d.append(el("h3", {}, "Activations"), histogram(L.hist));
    const nb = el("p", {id: "neighbours"});
    nb.append(el("b", {}, "Nearest by decoder cosine: "));
    L.nb.forEach((j, k) => { if (j >= 0) { nb.append(latentLink(j), el("span", {class: "meta"},
      "(" + L.nbc[k].toFixed(3) + ") ")); } });
    d.append(nb);
    if (L.lpos) {
      const lg = el("div", {id: "logits"});
      for (const [label, ids, vals, cls] of [["Promotes", L.lpos, L.lposv, "pos"],
                                             ["Suppresses", L.lneg, L.lnegv, "neg"]]) {
        const p = el("p", {class: "logit " + cls});
        p.append(el("b", {}, label + ": "));
        ids.forEach((t, k) => p.append(el("span", {class: "tok", "data-token": t,
          title: "logit " + (vals[k] >= 0 ? "+" : "") + num(vals[k])}, tokText(t)), " "));
        lg.append(p);
      }
      d.append(el("h3", {}, "Logits"), el("p", {class: "meta"}, "The tokens whose unembedding " +
        "rows its decoder row raises and lowers most (" + S.logits + "; hover for the value)."),
        lg);
    } else {
      d.append(el("p", {class: "meta", id: "no-logits"}, "No logit tables: " +
        S.logits.replace(/^none: /, "") + "."));
    }
    d.append(el("h3", {}, "Top rows"));
    if (!L.ctx) d.append(el("p", {class: "meta", id: "no-text"}, "No token windows: " +
      S.contexts.replace(/^none: /, "") + "."));
    else d.append(el("p", {class: "meta"}, (S.vocab ? "Tokens" : "Token ids (no vocab.json " +
      "beside the data)") + ", each shaded by the latent's activation on it over its largest; " +
      "the top row's own token outlined."));
    d.append(rowsTable("top", i, L.rows, L.acts, L.ctx, L.cacts));
    if (L.srows && L.srows.length) {
      d.append(el("h3", {}, "A uniform sample of its firings"),
               el("p", {class: "meta"}, L.srows.length + " of its " + S.fires[i] +
                  " firings drawn at random, largest first: what it does below its top rows."));
      d.append(rowsTable("sample", i, L.srows, L.sacts, L.sctx, L.scacts));
    }
    d.dataset.ready = "1";
  });
}
function rowsTable(id, i, rows, acts, ctx, cacts) {
  const t = el("table", {id: id});
  t.append(el("tr", {}, ""));
  t.firstChild.append(el("th", {}, "row"), el("th", {}, "activation"),
                      el("th", {}, ctx ? "tokens" : ""));
  rows.forEach((r, k) => {
    const tr = el("tr", {"data-row": r});
    tr.append(el("td", {}, String(r)), el("td", {}, num(acts[k])));
    const cell = el("td", {class: "ctx"});
    if (ctx) ctx[k].forEach((tok, o) => {
      const here = o === S.context;
      const v = cacts ? cacts[k][o] : (here ? acts[k] : 0);
      const s = el("span", {class: "tok" + (here ? " here" : "") + (tok < 0 ? " gone" : ""),
                            "data-token": tok, "data-act": v, title: "activation " + num(v)},
                   tok < 0 ? "\u00b7" : tokText(tok));
      if (tok >= 0 && v > 0)
        s.style.background = "rgba(255,140,0," + Math.min(1, v / S.max[i]).toFixed(3) + ")";
      cell.append(s);
    });
    tr.append(cell); t.append(tr);
  });
  return t;
}
function route() {
  const m = location.hash.match(/latent=(\d+)/);
  if (m && Number(m[1]) < S.n) drawDetail(Number(m[1]));
  const q = location.hash.match(/q=([^&]*)/);
  if (q) { document.getElementById("search").value = decodeURIComponent(q[1]); refresh(); }
}
function listIds(id, ids) {
  const box = document.getElementById(id);
  document.getElementById(id + "-count").textContent = ids.length;
  for (const i of ids.slice(0, 500)) box.append(latentLink(i));
  if (ids.length > 500) box.append(el("span", {}, "... and " + (ids.length - 500) + " more"));
}
function start() {
  document.getElementById("sae").textContent = S.id;
  document.getElementById("facts").textContent = S.arch + ", " + S.n + " latents over " +
    S.rows + " rows of " + S.data + "; top " + S.top + " rows a latent, " +
    (S.top_token ? "token windows of " + S.context + " rows each side" : S.contexts);
  const ids = [...Array(S.n).keys()];
  listIds("dead", ids.filter((i) => S.fires[i] === 0));
  listIds("dense", ids.filter((i) => S.fires[i] > 0.1 * S.rows));
  document.getElementById("search").oninput = () => { page = 0; refresh(); };
  document.getElementById("sort").onchange = () => { page = 0; refresh(); };
  document.getElementById("prev").onclick = () => { page = Math.max(0, page - 1); drawList(); };
  document.getElementById("next").onclick = () => { page += 1; drawList(); };
  window.onhashchange = route;
  refresh();
  route();
  document.body.dataset.loadMs = (performance.now() - t0).toFixed(1);
  document.body.dataset.ready = "1";
}
</script>
<script src="summary.js"></script>
<script>start();</script>
</body></html>
"""
