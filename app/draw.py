"""A graph as SVG for the report: Graphviz's ``dot`` when it is installed (the DOT text of
``compiler/ir/dot.py``), else a layered layout of our own (networkx's topological generations),
so the report shows the graph on any machine. Either way: regions by colour, fused kernels
framed, every node's attributes and spec line in its tooltip."""

from __future__ import annotations

import html
import shutil
import subprocess

import networkx as nx

from attnmeta.compiler.ir import Graph
from attnmeta.compiler.ir.dot import REGION_COLOR, to_dot

KERNEL = ["#2a7", "#27a", "#a52", "#72a", "#aa2", "#2aa"]
W, H, GX, GY = 230, 46, 26, 38


def has_dot() -> bool:
    """Whether Graphviz's ``dot`` is on the PATH."""
    return shutil.which("dot") is not None


def svg(g: Graph, use_dot: bool = True, marked: frozenset[str] = frozenset()) -> str:
    """``g`` drawn by Graphviz where it is installed, else by ``layered``; ``marked`` nodes outlined in red."""
    if use_dot and has_dot():
        r = subprocess.run(["dot", "-Tsvg"], input=to_dot(g, marked), capture_output=True, text=True, timeout=60)
        if r.returncode == 0 and "<svg" in r.stdout:
            return r.stdout[r.stdout.index("<svg"):]
    return layered(g, marked=marked)


BIG = 60  # nodes past which the report shows the graph collapsed to its kernels first


def _rows(dag: nx.DiGraph) -> list[list[str]]:
    """Rows by dependency depth; within a row, nodes ordered by the mean position of their predecessors
    (the barycentre heuristic), which untangles most crossings of a layered drawing."""
    rows, at = [], {}
    for layer in nx.topological_generations(dag):
        key = {v: (sum(at[p] for p in dag.predecessors(v)) / max(1, dag.in_degree(v)), v) for v in layer}
        row = sorted(layer, key=key.__getitem__)
        at.update((v, k) for k, v in enumerate(row))
        rows.append(row)
    return rows


def collapse(g: Graph) -> nx.DiGraph:
    """The graph with each fused kernel's nodes merged into one (``kernel:K``), inputs and outputs kept, but the
    device guard's own inputs (feeds, the engine's buffers, the word, the generation, the record: guard-inputs),
    which every check reads and the full graph shows."""
    kernel_of = g.kernel_of()
    plumbing = {i.name for i in g.inputs if i.role.guard}
    name = {v: f"kernel:{kernel_of[v]}" if v in kernel_of else v for v in g.to_nx().nodes if v not in plumbing}
    dag = nx.DiGraph()
    dag.add_nodes_from(set(name.values()))
    dag.add_edges_from((name[a], name[b]) for a, b in g.to_nx().edges if a in name and b in name and name[a] != name[b])
    for o in g.outputs:
        dag.add_edge(name[o.value], f"out:{o.field}")
    return dag


def layered(g: Graph, collapsed: bool = False, marked: frozenset[str] = frozenset()) -> str:
    """Nodes in rows by dependency depth (inputs on top, outputs at the bottom), edges as arrows from a
    node's bottom to its consumer's top; ``collapsed``: one box per fused kernel (``collapse``)."""
    if collapsed:
        dag = collapse(g)
    else:
        dag = g.to_nx()
        for o in g.outputs:
            dag.add_edge(o.value, f"out:{o.field}")
    rows = _rows(dag)
    pos = {v: (GX + k * (W + GX), GY + r * (H + GY)) for r, layer in enumerate(rows) for k, v in enumerate(layer)}
    width = GX + max(len(layer) for layer in rows) * (W + GX)
    height = GY + len(rows) * (H + GY)
    kinds = {n.name: n for n in g.nodes}
    inputs = {i.name: i for i in g.inputs}
    kernel_of = g.kernel_of()
    color = {k: KERNEL[i % len(KERNEL)] for i, k in enumerate(sorted(set(kernel_of.values())))}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="monospace" font-size="10">'
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#888"/></marker></defs>']
    for a, b in dag.edges:  # curves from the producer's bottom to the consumer's top, drawn under the boxes
        (x1, y1), (x2, y2) = pos[a], pos[b]
        sx, sy, tx, ty = x1 + W / 2, y1 + H, x2 + W / 2, y2
        out.append(f'<path d="M {sx} {sy} C {sx} {sy + GY}, {tx} {ty - GY}, {tx} {ty}" fill="none" '
                   'stroke="#999" marker-end="url(#arrow)"/>')
    for kernel, c in ({} if collapsed else color).items():  # a frame around each fused kernel's nodes
        xs = [pos[n] for n, k in kernel_of.items() if k == kernel and n in pos]
        if xs:
            x0, y0 = min(p[0] for p in xs) - 6, min(p[1] for p in xs) - 14
            x1, y1 = max(p[0] for p in xs) + W + 6, max(p[1] for p in xs) + H + 6
            out.append(f'<rect x="{x0}" y="{y0}" width="{x1 - x0}" height="{y1 - y0}" fill="none" stroke="{c}" '
                       f'stroke-width="2" stroke-dasharray="6 3" rx="8"/><text x="{x0 + 4}" y="{y0 + 10}" '
                       f'fill="{c}">fused kernel {kernel}</text>')
    for v, (x, y) in pos.items():
        if v.startswith("kernel:"):
            k = v.removeprefix("kernel:")
            members = [n for n, kk in kernel_of.items() if kk == k]
            fill, label, sub = "#c8f0c8", f"fused kernel {k}", f"{len(members)} ops"
            tip = "\n".join(f"%{n} = {kinds[n].op.value}  {kinds[n].origin}" for n in members if n in kinds)
        elif v in kinds:
            n = kinds[v]
            fill, label = REGION_COLOR[n.region], f"%{n.name} = {n.op.value}"
            tip = f"{n.op.value} {dict(n.attrs)} : {n.type} {n.region.value}\n{n.origin}"
            sub = str(n.type)
        elif v in inputs:
            fill, label, sub = "#e8e8ff", f"{v} ({inputs[v].role.value})", str(inputs[v].type)
            tip = inputs[v].origin
        else:
            fill, label, sub, tip = "#ffffff", v.removeprefix("out:"), "metadata field", ""
        stroke = color.get(kernel_of.get(v, v.removeprefix("kernel:")), "#555")
        stroke, wide = ("red", ' stroke-width="3" class="violation"') if v in marked else (stroke, "")
        out.append(f'<g><title>{html.escape(tip)}</title><rect x="{x}" y="{y}" width="{W}" height="{H}" '
                   f'fill="{fill}" stroke="{stroke}"{wide} rx="4"/><text x="{x + 6}" y="{y + 18}">'
                   f'{html.escape(label[:36])}</text><text x="{x + 6}" y="{y + 34}" fill="#444">'
                   f'{html.escape(sub[:36])}</text></g>')
    out.append("</svg>")
    return "\n".join(out)
