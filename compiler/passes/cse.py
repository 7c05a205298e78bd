from __future__ import annotations

import attrs

from ..ir import Graph, Op
from .dce import EFFECTFUL
from .registry import PassContext, register_pass


@register_pass("cse")
def cse(g: Graph, ctx: PassContext) -> Graph:
    """Requires a verified graph. Merges nodes computing the same op on the
    same inputs with the same attributes in the same region; uses and
    outputs are redirected to the first. Planners are never merged, nor the values they bind (a
    planner may write them), so their binds never need redirecting."""
    seen: dict[tuple, str] = {}
    rename: dict[str, str] = {}
    nodes = []
    # a value a planner binds may be one it writes (FlashMLA's schedule into a constant's buffer): two
    # such values are two buffers however alike the graph computes them
    bound = {v for n in g.nodes if n.op is Op.host_call for v in n.a["binds"].values()}
    for n in g.nodes:
        ins = tuple(rename.get(x, x) for x in n.inputs)
        n2 = n if ins == n.inputs else attrs.evolve(n, inputs=ins)
        key = (n2.op, ins, n2.attrs, n2.region, n2.type)
        if n2.op not in EFFECTFUL and n2.name not in bound and key in seen:
            rename[n2.name] = seen[key]
            continue
        seen.setdefault(key, n2.name)
        nodes.append(n2)
    if not rename:
        return g
    outputs = tuple(attrs.evolve(o, value=rename.get(o.value, o.value)) for o in g.outputs)
    return attrs.evolve(g, nodes=tuple(nodes), outputs=outputs)
