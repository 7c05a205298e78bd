"""Graphviz DOT text for a graph: inputs as boxes, in_graph nodes green,
out_graph nodes orange, so the split is visible at a glance."""

from __future__ import annotations

import json

from .graph import Graph, Role
from .types import Region

_COLOR = {Region.in_graph: "palegreen", Region.out_graph: "orange"}


def to_dot(g: Graph) -> str:
    q = json.dumps
    lines = [f"digraph {q(g.name)} {{", "  rankdir=TB; node [fontname=monospace, fontsize=10];"]
    for i in g.inputs:
        shape = "cylinder" if i.role is Role.pool else "box"
        lines.append(f"  {q(i.name)} [shape={shape}, label={q(f'{i.name}: {i.type}')}];")
    for n in g.nodes:
        label = f"{n.name} = {n.op.value}\\n{n.type}"
        style = ", peripheries=2" if n.movable else ""
        lines.append(f"  {q(n.name)} [style=filled, fillcolor={_COLOR[n.region]}{style}, label={q(label)}];")
        lines += [f"  {q(x)} -> {q(n.name)};" for x in n.inputs]
    for o in g.outputs:
        lines.append(f"  {q('out:' + o.field)} [shape=note, label={q(o.field)}];")
        lines.append(f"  {q(o.value)} -> {q('out:' + o.field)};")
    lines.append("}")
    return "\n".join(lines).replace('\\\\n', '\\n') + "\n"
