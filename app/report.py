"""The HTML report of one compile (``attnmeta inspect DIR --html``, ``attnmeta compile --report``):
one self-contained page (no script, no external file) with the pass table, the IR after each
pass with what it changed, the final graph of each dumped size drawn with its regions and fused
kernels, and the generated code, whose annotated kernel variables link to the IR values (and
name the spec lines) they come from."""

from __future__ import annotations

import difflib
import html
import os
import re

from attnmeta.compiler.ir import parse

from . import inspect as dumps
from .draw import BIG, has_dot, layered, svg

CSS = """body{font-family:sans-serif;margin:24px;max-width:1400px}table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#eee}td.num{text-align:right}
pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px;line-height:1.35}
details{margin:4px 0}summary{cursor:pointer;font-family:monospace}.add{background:#dfd}.del{background:#fdd}
.changed{font-weight:bold}.graph{overflow-x:auto;border:1px solid #ddd;padding:4px}a.v{color:#06c}
h2{border-bottom:1px solid #ccc}.fit:checked~.graph svg,.fit:checked~details .graph svg{max-width:100%;height:auto}
label{font-size:13px;color:#444}tr.failed td{background:#fdd;font-weight:bold}"""


def _pass_table(rows: list[dict]) -> str:
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in ("pass", "mode", "bs", "changed", "nodes", "ms", "kernels"))
    body = []
    for r in rows:
        if r.get("failed"):  # the pass that failed: no result to count
            body.append(f"<tr class='failed'><td>{r['pass']}</td><td>{r['mode']}</td><td class=num>"
                        f"{'' if r['bs'] is None else r['bs']}</td><td colspan=4>failed: {html.escape(r['error'])}"
                        "</td></tr>")
            continue
        nodes = f"{r['nodes_before']} &rarr; {r['nodes_after']}" if r["nodes_before"] is not None else r["nodes_after"]
        cls = ' class="changed"' if r["changed"] else ""
        bs = "" if r["bs"] is None else r["bs"]
        body.append(f"<tr{cls}><td>{r['pass']}</td><td>{r['mode']}</td><td class=num>{bs}"
                    f"</td><td>{'yes' if r['changed'] else 'no'}</td><td class=num>{nodes}</td><td class=num>"
                    f"{r['seconds'] * 1000:.2f}</td><td class=num>{r['kernels'] or ''}</td></tr>")
    return f'<table id="passes">{head}</tr>{"".join(body)}</table>'


def _diff(a: list[str], b: list[str]) -> str:
    out = []
    for line in difflib.unified_diff(a, b, n=0, lineterm=""):
        if line.startswith(("+++", "---", "@@")):
            continue
        cls = "add" if line.startswith("+") else "del"
        out.append(f'<span class="{cls}">{html.escape(line)}</span>')
    return "\n".join(out) or "(no change)"


def _ir_lines(text: str, anchor: str | None) -> str:
    """The IR, each input and node line an anchor (``anchor-<value>``) the generated code can link to."""
    out = []
    for line in text.splitlines():
        m = re.match(r"\s+(?:input )?%(\w+)[ :]", line)
        esc = html.escape(line)
        out.append(f'<span id="{anchor}-{m.group(1)}">{esc}</span>' if anchor and m else esc)
    return "\n".join(out)


def _linked_code(text: str, anchor: str) -> str:
    """Generated code with each ``# %value (spec:line)`` annotation linked to the value's IR line."""
    esc = html.escape(text)
    return re.sub(r"# %(\w+)", lambda m: f'# <a class="v" href="#{anchor}-{m.group(1)}">%{m.group(1)}</a>', esc)


def _section(run: str, mode: str, bs: int | None) -> str:
    files = dumps.stages(run, mode, bs)
    if bs is not None:
        files = [f for f in files if os.path.dirname(f[1]).endswith(f"bs{bs}")]
    anchor = f"{mode}-{bs}" if bs is not None else None
    parts, prev = [], None
    for k, (name, path) in enumerate(files):
        with open(path) as f:
            text = f.read()
        body = text.splitlines()[1:]
        last = anchor is not None and k == len(files) - 1
        diff = "" if prev is None else f"<details><summary>what it changed</summary><pre>{_diff(prev, body)}</pre>" \
                                         "</details>"
        parts.append(f"<details{' open' if last else ''}><summary>{html.escape(name)}</summary>{diff}"
                     f"<pre>{_ir_lines(chr(10).join(body), anchor if last else None)}</pre></details>")
        prev = body
    if bs is None:
        return "".join(parts)
    g = parse(open(files[-1][1]).read())
    lowered = sorted(f for f in os.listdir(os.path.join(run, mode, f"bs{bs}")) if f.endswith("-lowered.py"))
    code = ""
    if lowered:
        with open(os.path.join(run, mode, f"bs{bs}", lowered[-1])) as f:
            text = _linked_code(f.read(), anchor)
        code = f"<details open><summary>{lowered[-1]}</summary><pre>{text}</pre></details>"
    # a checkbox, not a script, switches the graph between fitted to the page and full size
    fit = (f'<input type="checkbox" class="fit" id="fit-{anchor}" checked><label for="fit-{anchor}">fit to '
           f'the page (untick for full size; hover a node for its attributes and spec line)</label>')
    if len(g.nodes) > BIG:  # a large graph opens collapsed to its fused kernels; the full one on demand
        drawn = (f'<p>{len(g.nodes)} nodes: shown with each fused kernel as one box (hover it for its ops); '
                 f'the full graph below.</p><div class="graph">{layered(g, collapsed=True)}</div>'
                 f'<details><summary>the full graph ({len(g.nodes)} nodes)</summary><div class="graph">{svg(g)}'
                 "</div></details>")
    else:
        drawn = f'<div class="graph">{svg(g)}</div>'
    code = f"<h4>generated code</h4>{code}" if code else ""  # a failed compile lowered nothing: no empty heading
    return f'<h3>{mode}, bs {bs}</h3>{fit}{drawn}{"".join(parts)}{code}'


def _with_failure(data: dict) -> list[dict]:
    """The pass rows, then the pass that failed (the table shows where the compile stopped)."""
    f = data.get("failure")
    rows = list(data["passes"])
    if f:
        rows.append({"pass": f["pass"], "mode": f["mode"], "bs": f["bs"], "failed": True, "error": f["error"]})
    return rows


def _failure(run: str, f: dict | None) -> str:
    """A failed compile opens on its failure: every violation (rule, node, spec line, message, fix), then
    the IR the failing pass was given, each offending node's line marked."""
    if not f:
        return ""
    if f.get("ir") is None:  # stopped before any pass: the spec's builder raised
        return (f"<h2 id='failure'>failed building the spec: {html.escape(f['error'])}</h2>"
                f"<p>{html.escape(f['message'])}</p>")
    where = f["mode"] + ("" if f["bs"] is None else f", bs {f['bs']}")
    rows = "".join(f"<tr><td>{html.escape(v['rule'])}</td><td><a href='#v-{html.escape(v['node'])}'>"
                   f"%{html.escape(v['node'])}</a></td><td><code>{html.escape(v['origin'] or '?')}</code></td>"
                   f"<td>{html.escape(v['message'])}</td><td>{html.escape(v['fix'])}</td></tr>"
                   for v in f["violations"])
    table = (f"<table id='violations'><tr><th>rule</th><th>node</th><th>spec line</th><th>what</th><th>fix</th>"
             f"</tr>{rows}</table>") if rows else f"<p>{html.escape(f['message'])}</p>"
    try:
        with open(os.path.join(run, f["ir"])) as fh:
            text = fh.read()
    except OSError:
        text = ""
    marked = {v["node"] for v in f["violations"]}
    lines = []
    for line in text.splitlines():
        node = next((n for n in marked if re.match(rf"\s*(input )?%{re.escape(n)}\b", line)), None)
        esc = html.escape(line)
        lines.append(f"<span id='v-{html.escape(node)}' class='del'>{esc}</span>" if node else esc)
    drawn = ""
    try:
        g = parse(text)
        drawn = f"<div class='graph'>{svg(g, marked=frozenset(marked))}</div>"  # the violations outlined in red
    except Exception:  # noqa: BLE001 - an IR the parser refuses is still shown as text below
        pass
    return (f"<h2 id='failure'>failed in pass {html.escape(f['pass'])} ({html.escape(where)}): "
            f"{html.escape(f['error'])}</h2>{table}<h3>the IR {html.escape(f['pass'])} was given</h3>{drawn}"
            f"<pre>{chr(10).join(lines)}</pre>")


def _graphviz_hint() -> str:
    """One line when Graphviz is missing: the graphs below use attnmeta's own layered drawing, and how to get
    dot's (which routes edges around nodes: easier to follow on graphs of more than a few dozen nodes)."""
    if has_dot():
        return ""
    return ("<p class='hint'>Graphs drawn with attnmeta's own layout: Graphviz's <code>dot</code> is not installed. "
            "For its layout, install Graphviz (<code>apt install graphviz</code>, <code>brew install graphviz</code> "
            "or <code>conda install graphviz</code>) and write the report again.</p>")


def render(run: str) -> str:
    data = dumps.load(run)
    title = f"attnmeta compile of {data.get('backend', os.path.basename(os.path.dirname(run)))}"
    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>"
           f"<p>run <code>{html.escape(run)}</code>; options: <code>{html.escape(str(data.get('options', '')))}"
           "</code></p>", _graphviz_hint(), _failure(run, data.get("failure")), "<h2>passes</h2>",
           _pass_table(_with_failure(data))]
    for mode in dumps.modes(run):
        out.append(f"<h2>{mode}</h2><h3>mode-generic passes</h3>{_section(run, mode, None)}")
        for bs in dumps.sizes(run, mode):
            out.append(_section(run, mode, bs))
    out.append("</body></html>")
    return "\n".join(out)


def write(run: str, path: str | None = None) -> str:
    """Write the report of ``run`` (to ``run/report.html`` by default); returns its path."""
    path = path or os.path.join(run, "report.html")
    with open(path, "w") as f:
        f.write(render(run))
    return path
