"""sae-report's page, index.html: the run's state and facts, the resolved config, the summary
table (summary.csv, or each SAE's last logged interval while none is written), the quality gates
with each failure's reason (gate_verdict) and the plots with their captions."""
import datetime
import html
import os

from .plots import OBJECTIVES, si
from .read import number, yaml_value


def table_html(header, rows, classes=None, swatches=None):
    """header: [(key, title)]; rows: [{key: text}]; classes: [{key: css class}] per row;
    swatches: {sae: colour} for a colour square before the first cell."""
    out = ['<div class="scroll"><table><thead><tr>']
    out += [f"<th>{html.escape(title)}</th>" for _, title in header]
    out.append("</tr></thead><tbody>")
    for i, r in enumerate(rows):
        out.append("<tr>")
        for j, (key, _) in enumerate(header):
            cls = (classes[i].get(key, "") if classes else "")
            cls = f' class="{cls}"' if cls else ""
            text = html.escape(str(r.get(key, "")))
            if j == 0 and swatches and r.get(key) in swatches:
                text = (f'<span class="sw" style="background:{swatches[r[key]]}"></span>'
                        + text)
            out.append(f"<td{cls}>{text}</td>")
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def fmt(v, kind=""):
    """A cell: kind "%" (a fraction shown as a percentage), "rate" (37.8K), else 4 digits."""
    x = number(v)
    if x is None:
        return "" if v is None else str(v)
    if kind == "%":
        return f"{100 * x:.1f}"
    if kind == "rate":
        return si(x) if abs(x) >= 1e3 else f"{x:.0f}"
    if x == int(x) and abs(x) < 1e12:
        return str(int(x))
    return f"{x:.4g}"


# summary.csv's columns: (key, title, format). The config columns (arch, n_latents and the
# architecture's keys: the ones before "steps") go after the id; columns not named here keep
# their summary.csv name (the architectures' figures, e.g. Switch's expert loads).
TITLES = {"steps": ("steps", ""), "tokens": ("tokens", "rate"), "mse": ("train mse", ""),
          "fvu": ("train fvu", ""), "l0": ("train l0", ""),
          "dead_fraction": ("train dead %", "%"), "tokens_per_s": ("tok/s", "rate"),
          "wait_fraction": ("wait %", "%"), "tflops": ("TFLOP/s", ""), "mfu": ("MFU %", "%"),
          "gpu_mem_peak_GB": ("GPU mem GB", ""), "host_mem_peak_GB": ("host mem GB", ""),
          "feature_recovery": ("recovery", ""), "eval_rows": ("held-out rows", ""),
          "eval_fvu": ("held-out fvu", ""), "eval_l0": ("held-out l0", ""),
          "eval_dead_fraction": ("held-out dead %", "%"),
          "eval_dense_fraction": ("held-out dense %", "%")}
# The quality gates (quality.h): (key, title, format, passes, the console's failure text).
GATES = [("rel_recon_err", "rel_recon_err < 0.1", "", lambda x: x < 0.1,
          lambda x: f"rel_recon_err {x:.3g} >= 0.1"),
         ("zeros_frac", "zeros_frac > 0.85", "", lambda x: x > 0.85,
          lambda x: f"zeros_frac {x:.3g} <= 0.85"),
         ("decorr_rms", "decorr_rms < 0.3", "", lambda x: x < 0.3,
          lambda x: f"decorr_rms {x:.3g} >= 0.3"),
         ("gates_dead_fraction", "dead % < 10", "%", lambda x: x < 0.1,
          lambda x: f"dead {100 * x:.1f}% >= 10%"),
         ("gates_dense_fraction", "dense % < 10", "%", lambda x: x < 0.1,
          lambda x: f"dense {100 * x:.1f}% >= 10%")]
GATE_KEYS = {g[0] for g in GATES} | {"gates", "gates_on", "gates_failed"}


def gate_verdict(r):
    """The gates cell: "PASS", or "FAIL: " and the reasons the console printed (summary.csv's
    gates_failed; recomputed the console's way for a summary.csv without it)."""
    g = r.get("gates", "")
    if g != "FAIL":
        return g
    why = r.get("gates_failed")
    if not why:
        why = "; ".join(text(x) for k, _, _, ok, text in GATES
                        if (x := number(r.get(k))) is not None and not ok(x))
    return f"FAIL: {why}" if why else "FAIL"


def drop_empty(header, rows):
    """The columns some row has a value in."""
    return [(k, t) for k, t in header if any(str(r.get(k, "")).strip() for r in rows)]


def summary_tables(summary, colors):
    cols = list(summary[0])
    config = cols[1:cols.index("steps")] if "steps" in cols else []
    header = [("sae", "sae")] + [(c, c) for c in config]
    header += [(k, TITLES.get(k, (k, ""))[0]) for k in cols
               if k != "sae" and k not in config and k not in GATE_KEYS]
    kinds = {k: TITLES.get(k, ("", ""))[1] for k in cols}
    rows = [{k: fmt(r.get(k), kinds.get(k, "")) for k, _ in header} for r in summary]
    header = drop_empty(header, rows)
    main = table_html(header, rows, swatches=colors)
    gate_header = [("sae", "sae"), ("gates_on", "on")]
    gate_header += [(k, t) for k, t, _, _, _ in GATES if k in cols] + [("gates", "gates")]
    rows, classes = [], []
    for r in summary:
        verdict = gate_verdict(r)
        row = {"sae": r["sae"], "gates_on": r.get("gates_on", ""), "gates": verdict}
        cls = {"gates": "pass" if verdict == "PASS" else "fail" if verdict else ""}
        for k, _, kind, ok, _ in GATES:
            x = number(r.get(k))
            row[k] = fmt(r.get(k), kind)
            if x is not None:
                cls[k] = "" if ok(x) else "fail"
        rows.append(row)
        classes.append(cls)
    return main, table_html(gate_header, rows, classes, swatches=colors)


def held_out_text(config_text):
    """Where the held-out rows come from and when they are evaluated (data.eval_path,
    data.eval_rows, log.eval_every_steps)."""
    unset = (None, "", "0")
    path = yaml_value(config_text, "data", "eval_path")
    rows = yaml_value(config_text, "data", "eval_rows")
    every = yaml_value(config_text, "log", "eval_every_steps")
    if path:
        held = path + (f" (first {rows} rows)" if rows not in unset else "")
    elif rows not in unset:
        held = f"the last {rows} rows of data.path"
    else:
        return "none (data.eval_rows and data.eval_path unset)"
    if every not in unset:
        return held + f"; evaluated every {every} steps and at the end"
    return held + "; evaluated at the end only (log.eval_every_steps: 0)"


def facts_html(run_dir, info, config_text, metrics, state):
    data = yaml_value(config_text, "data", "path")
    held = held_out_text(config_text)
    info = info or {}
    last_steps = [rows[-1]["step"] for rows in metrics.values()]
    total = info.get("total_steps")
    steps = f"{max(last_steps)}" + (f" of {total}" if total else "")
    tokens = max(number(rows[-1].get("tokens")) or 0 for rows in metrics.values())
    ended = info.get("ended") or ("" if state in ("running",) else "not recorded")
    ranks = info.get("ranks")
    where = (f"{ranks} rank(s) on {info.get('hosts')} host(s), backend {info.get('backend')}"
             if ranks else "not recorded (no run.json)")
    resumed = info.get("resumed_from_step")
    facts = [
        ("out_dir", os.path.abspath(run_dir)),
        ("data.path", data or "(config.yaml not found)"),
        ("held-out rows", held),
        ("saetrain version", info.get("version") or "not recorded (no run.json)"),
        ("started (UTC)", (info.get("started") or "not recorded") +
         (f", resumed from step {resumed}" if resumed is not None else "")),
        ("ended (UTC)", ended or "still running"),
        ("ranks, hosts", where),
        ("steps logged", f"{steps} ({si(tokens)} tokens per SAE)"),
        ("SAEs", str(len(metrics))),
        ("report written (UTC)",
         datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")),
    ]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>"
                   for k, v in facts)
    return f'<table class="facts">{rows}</table>'


PAGE_STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 1700px; }
h1 { font-size: 1.4em; margin-bottom: 0.2em; } h2 { font-size: 1.15em; margin-top: 1.4em; }
.state { padding: 8px 12px; border-radius: 4px; margin: 0.6em 0; font-weight: bold; }
.state-running { background: #dceefc; border: 1px solid #7ab3e0; }
.state-complete { background: #d9f2d9; border: 1px solid #7cc47c; }
.state-stopped, .state-unknown { background: #fdf1d0; border: 1px solid #e0b84f; }
.state-failed, .state-killed { background: #f8d7d7; border: 1px solid #d98080; }
.run { display: flex; flex-wrap: wrap; gap: 16px; align-items: flex-start; }
.facts th { text-align: left; background: #f6f6f6; } .facts td { text-align: left; }
details { flex: 1; min-width: 420px; }
pre { background: #f6f6f6; border: 1px solid #ddd; padding: 8px; max-height: 28em;
      overflow: auto; font-size: 0.8em; margin: 0.3em 0; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; }
figure { margin: 0; border: 1px solid #ddd; padding: 6px; background: #fff; }
figure img { width: 720px; } figure.wide img { width: 980px; }
figcaption { font-size: 0.85em; color: #555; max-width: 720px; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; white-space: normal; max-width: 6em; }
td:first-child { text-align: left; }
.facts th { max-width: none; white-space: nowrap; }
td.pass { background: #d9f2d9; } td.fail { background: #f8d7d7; text-align: left; }
.sw { display: inline-block; width: 0.8em; height: 0.8em; margin-right: 0.4em;
      vertical-align: -0.05em; border: 1px solid #555; }
.meta { color: #555; font-size: 0.9em; }
"""

CAPTIONS = {
    "loss": "Training loss per token, one panel per architecture: each minimizes its own "
            "objective (the panel's title), so compare losses within a panel and fidelity "
            "across architectures with the FVU.",
    "fvu": "FVU of the training batches (solid) and of the held-out rows (dashed) when the "
           "run has them.",
    "l0": "Active latents per token, training (solid) and held-out (dashed).",
    "dead": "Latents that did not fire for train.dead_tokens tokens (training), and on none "
            "of the held-out rows (dashed).",
    "lr": "The learning rate of every step (a long run's at most 20,000 evenly spaced ones), "
          "computed from the schedule saetrain resolved (run.json) with its formula "
          "(src/core/schedule.cpp); dotted: steps not trained yet; circles: the values "
          "metrics.jsonl logged.",
    "frontier": "One point per SAE (colour as in every plot, marker per architecture).",
    "density": "How often each latent fires, at the end of the run.",
}


def features_html(features):
    """The Features section: a link to each SAE's feature page (saereport/features.py)."""
    if not features:
        return ""
    items = "".join(
        f'<li><a href="features/{html.escape(i)}/index.html">{html.escape(i)}</a>: {n} latents '
        f"over {rows} rows, {dead} dead, {dense} dense</li>" for i, n, rows, dead, dense in features)
    return (f'<h2>Features</h2><p class="meta">What each latent responds to, from '
            f'sae-features (<a href="features/index.html">all</a>):</p>'
            f'<ul id="features">{items}</ul>')


def write_index(run_dir, out_dir, metrics, summary, manifest, info, config_text, state,
                colors, archs, features=None):
    key, sentence = state
    if summary:
        main, gates = summary_tables(summary, colors)
        main += ('<p class="meta">All of summary.csv is in this table (columns empty for '
                 'every SAE left out); the file itself: '
                 '<a href="summary.csv">summary.csv</a>.</p>')
    else:
        cols = [("sae", "sae", ""), ("step", "step", ""), ("tokens", "tokens", "rate"),
                ("loss", "loss", ""), ("fvu", "train fvu", ""), ("l0", "train l0", ""),
                ("dead_fraction", "train dead %", "%"), ("lr", "lr", ""),
                ("tokens_per_s", "tok/s", "rate"), ("eval_fvu", "held-out fvu", ""),
                ("eval_l0", "held-out l0", ""), ("eval_step", "held-out at step", "")]
        rows = []
        for sae_rows in metrics.values():
            r = dict(sae_rows[-1])
            # The last held-out evaluation, which need not be on the last logged step.
            evals = [e for e in sae_rows if "eval_fvu" in e]
            if evals:
                r.update({k: evals[-1][k] for k in ("eval_fvu", "eval_l0") if k in evals[-1]})
                r["eval_step"] = evals[-1]["step"]
            rows.append({k: fmt(r.get(k), f) for k, _, f in cols})
        header = drop_empty([(k, t) for k, t, _ in cols], rows)
        main = ('<p class="meta">No summary.csv (written when the run completes): each SAE\'s '
                'last logged interval.</p>' + table_html(header, rows, swatches=colors))
        gates = '<p class="meta">The quality gates are measured at the end of the run.</p>'
    figs = []
    for name, m in manifest.items():
        wide = ' class="wide"' if name == "loss" and len(m.get("panels", {})) > 1 else ""
        figs.append(f'<figure{wide}><a href="{name}.svg"><img src="{name}.svg" alt="{name}">'
                    f"</a><figcaption>{html.escape(CAPTIONS.get(name, name))} &middot; "
                    f'<a href="{name}.png">PNG</a></figcaption></figure>')
    objectives = "".join(
        f"<li><b>{html.escape(a)}</b>: {html.escape(OBJECTIVES.get(a, ('', 'its own'))[1])}"
        "</li>" for a in sorted(set(archs.values())))
    config_block = (f"<details open><summary>The resolved config (<a href=\"config.yaml\">"
                    f"config.yaml</a>, every default written out)</summary>"
                    f"<pre>{html.escape(config_text)}</pre></details>"
                    if config_text else "<p>config.yaml not found in the run directory.</p>")
    title = os.path.basename(os.path.abspath(run_dir))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>saetrain report: {html.escape(title)}</title>
<style>{PAGE_STYLE}</style></head><body>
<h1>saetrain run: {html.escape(title)}</h1>
<div class="state state-{key}" id="state" data-state="{key}">{html.escape(sentence)}</div>
<div class="run">
{facts_html(run_dir, info, config_text, metrics, key)}
{config_block}
</div>
<h2>Summary</h2>
{main}
<h2>Quality gates</h2>
<p class="meta">On the held-out rows when the run has them, else the last 10% of training;
a red cell fails its gate and the gates column says why, as the console did
(docs/architectures.md).</p>
{gates}
{features_html(features)}
<h2>Plots</h2>
<p class="meta">One colour per SAE on every plot. The losses are each architecture's own
objective:</p><ul class="meta">{objectives}</ul>
<div class="grid">
{"".join(figs)}
</div>
</body></html>
"""
    with out_dir.open("index.html", "w", encoding="utf-8") as f:
        f.write(page)
