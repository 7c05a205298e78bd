from __future__ import annotations

import attrs
import sympy

from ..ir import Graph, Op
from ..ir.errors import ShapeError
from ..ir.ops import infer, norm_attr
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
    out = attrs.evolve(g, name=f"{g.name}.bs{ctx.bs}", inputs=inputs, nodes=nodes, symbols=env)
    _extents_hold(out, ctx.bs)
    return out


def _extents_hold(g: Graph, bs: int) -> None:
    """A spec's symbolic row ranges (``slice``) and extents, bound to this size, must be ranges: a slice
    to ``bs - 3`` holds at bs 8 and not at bs 1. Checked here, for every size compiled, as a spec error
    naming the size (the verifier would only find a malformed graph)."""
    types = {i.name: i.type for i in g.inputs} | {n.name: n.type for n in g.nodes}
    for n in g.nodes:
        bad = [d for d in n.type.shape if getattr(d, "is_number", False) and d < 0]
        try:
            if n.op is Op.slice:
                infer(n.op, [types[x] for x in n.inputs], n.a)
            if bad:
                raise ShapeError(f"extent {bad[0]} < 0 in {n.type}")
        except ShapeError as e:
            where = f" ({n.origin})" if n.origin else ""
            raise ShapeError(f"%{n.name} = {n.op.value}{where} does not hold at batch size {bs}: {e}; make the "
                             "range valid at every captured size, or drop that size") from None
