from __future__ import annotations

import attrs
import networkx as nx

from ..ir import Graph, Op
from .registry import PassContext, register_pass

EFFECTFUL = (Op.host_call,)  # planners write workspaces the kernels read: never dead


@register_pass("dce")
def dce(g: Graph, ctx: PassContext) -> Graph:
    """Requires a verified graph. Removes nodes no output and no effectful
    node (planner) depends on. Inputs are kept: they are the batch contract."""
    dag = g.to_nx()
    roots = [o.value for o in g.outputs] + [n.name for n in g.nodes if n.op in EFFECTFUL]
    live = set(roots)
    for r in roots:
        live |= nx.ancestors(dag, r)
    nodes = tuple(n for n in g.nodes if n.name in live)
    return g if len(nodes) == len(g.nodes) else attrs.evolve(g, nodes=nodes)
