from __future__ import annotations

import attrs
import sympy

from ..ir import Graph
from ..ir.ops import norm_attr
from ..ir.types import bind
from .registry import PassContext, register_pass


def _subs(v, env):
    if isinstance(v, sympy.Expr):
        return norm_attr(bind(v, env))
    if isinstance(v, tuple):
        return tuple(bind(d, env) for d in v)
    return v


@register_pass("specialize-batch")
def specialize_batch(g: Graph, ctx: PassContext) -> Graph:
    """Requires ctx.bs. Guarantees one graph for (mode, bs): ``bs`` and every
    config symbol (max_bs, L, P, W, D, K, S) substituted in types and
    attributes, so every static extent is an int; the bindings are recorded
    in ``graph.symbols`` and the name gets ``.bs<N>``."""
    if ctx.bs is None:
        raise ValueError("specialize-batch needs a batch size in the pass context")
    env = {**ctx.options.symbols(), "bs": ctx.bs}
    types, values = {}, {}  # most nodes share a handful of types and attribute values: substitute each once

    def typ(t):
        if t not in types:
            types[t] = t.subs(env)
        return types[t]

    def val(v):
        key = (type(v), v)
        if key not in values:
            values[key] = _subs(v, env)
        return values[key]

    inputs = tuple(attrs.evolve(i, type=typ(i.type)) for i in g.inputs)
    nodes = tuple(attrs.evolve(n, type=typ(n.type), attrs=tuple((k, val(v)) for k, v in n.attrs)) for n in g.nodes)
    return attrs.evolve(g, name=f"{g.name}.bs{ctx.bs}", inputs=inputs, nodes=nodes, symbols=env)
