"""Graphviz DOT text for a graph: the out_graph and in_graph regions as clusters (orange, green),
each fused kernel a cluster inside in_graph, inputs as boxes (pools as cylinders), and every
node's op, attributes, type and spec line in its label and tooltip."""

from __future__ import annotations

import json

from .graph import Graph, Role
from .printer import fmt_attr
from .types import Region

# one palette for the DOT text and the report's own drawing: light green in_graph, light orange out_graph
REGION_COLOR = {Region.in_graph: "#c8f0c8", Region.out_graph: "#ffd9a0"}


WRAP = 48  # characters per label line: a node with many attributes (the guard's ingest) grows down, not across


def node_label(n) -> str:
    lines, line = [], ""
    for part in (f"{k}={fmt_attr(v)}" for k, v in n.attrs):
        if line and len(line) + len(part) + 2 > WRAP:
            lines.append(line + ",")
            line = ""
        line = f"{line}, {part}" if line else part
    attrs = "\\n".join([*lines, line]) if n.attrs else ""
    return f"%{n.name} = {n.op.value}" + (f"\\n{{{attrs}}}" if attrs else "") + f"\\n{n.type}"


def to_dot(g: Graph, marked: frozenset[str] = frozenset()) -> str:
    """The DOT text of ``g``; ``marked`` nodes or inputs (a failed check's violations) drawn with a thick red
    border."""
    q = json.dumps
    mark = lambda v: ", color=red, penwidth=3" if v in marked else ""  # noqa: E731
    kernel_of = g.kernel_of()
    lines = [f"digraph {q(g.name)} {{", "  rankdir=TB; compound=true; node [fontname=monospace, fontsize=9];"]
    for i in g.inputs:
        shape = "cylinder" if i.role is Role.pool else "box"
        lines.append(f"  {q(i.name)} [shape={shape}, label={q(f'{i.name}: {i.type}')}, tooltip={q(i.origin)}"
                     f"{mark(i.name)}];")
    for region in (Region.out_graph, Region.in_graph):
        nodes = [n for n in g.nodes if n.region is region]
        if not nodes:
            continue
        lines.append(f"  subgraph {q('cluster_' + region.value)} {{ label={q(region.value)}; style=dashed;")
        kernels: dict[str, list] = {}
        for n in nodes:
            kernels.setdefault(kernel_of.get(n.name, ""), []).append(n)
        for k, members in kernels.items():
            if k:
                lines.append(f"    subgraph {q('cluster_' + k)} {{ label={q('fused kernel ' + k)}; style=filled; "
                             "fillcolor=honeydew;")
            for n in members:
                style = ", peripheries=2" if n.movable else ""
                fill = q(REGION_COLOR[n.region])
                lines.append(f"      {q(n.name)} [shape=box, style=filled, fillcolor={fill}{style}, "
                             f"label={q(node_label(n))}, tooltip={q(n.origin)}{mark(n.name)}];")
            if k:
                lines.append("    }")
        lines.append("  }")
    for n in g.nodes:
        lines += [f"  {q(x)} -> {q(n.name)};" for x in n.inputs]
    for o in g.outputs:
        lines.append(f"  {q('out:' + o.field)} [shape=note, label={q(o.field)}];")
        lines.append(f"  {q(o.value)} -> {q('out:' + o.field)};")
    lines.append("}")
    return "\n".join(lines).replace("\\\\n", "\\n") + "\n"
