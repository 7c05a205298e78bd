from __future__ import annotations

import attrs

from ..ir import Graph
from ..ir.ops import infer
from .registry import PassContext, register_pass


@register_pass("infer-shapes")
def infer_shapes(g: Graph, ctx: PassContext) -> Graph:
    """Requires a verified graph. Guarantees every node's type is the one its
    op rule derives from its inputs, in canonical (simplified) form, with
    data-dependent extents marked Dynamic."""
    types = {i.name: i.type for i in g.inputs}
    nodes = []
    for n in g.nodes:
        t = infer(n.op, [types[x] for x in n.inputs], n.a)
        types[n.name] = t
        nodes.append(n if t == n.type else attrs.evolve(n, type=t))
    return g if tuple(nodes) == g.nodes else attrs.evolve(g, nodes=tuple(nodes))
