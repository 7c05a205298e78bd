from __future__ import annotations

import attrs

from ..ir import Graph, Op, Region
from ..lowering.fx import CONST_OPS
from .registry import PassContext, register_pass

ROW_OPS = (Op.ewise, Op.ewise_const, Op.cast, Op.compare, Op.where, Op.copy, Op.lookup)
SINK_OPS = (Op.ragged_gather, Op.page_table, Op.repeat)
KERNEL = "k0"


def fusible(n, types, group: set[str], bs: int) -> bool:
    """Whether ``n`` can join the row-parallel kernel: one program per request row."""

    def row_like(x: str) -> bool:  # a per-row value or a scalar the kernel can read or compute
        t = types[x]
        return not t.placement.on_host and t.shape in ((bs,), ())

    t, ins = n.type, n.inputs
    if t.placement.on_host or t.is_dynamic:
        return False
    if n.op is Op.ewise and n.a["fn"] == "floordiv":
        return False  # integer division rounding differs between Triton back ends; left to torch
    if n.op is Op.ewise_const and n.a["fn"] == "floordiv" and n.a["value"] <= 0:
        return False
    if n.op is Op.lookup:
        return ins[0] not in group and len(types[ins[0]].shape) == 1 and row_like(ins[1]) and t.shape == (bs,)
    if n.op in ROW_OPS:
        return t.shape == (bs,) and all(row_like(x) for x in ins)
    if n.op is Op.cumsum:
        return types[ins[0]].shape == (bs,) and row_like(ins[0])
    if n.op is Op.reduce:
        return types[ins[0]].shape == (bs,) and row_like(ins[0])
    if n.op is Op.ragged_gather:
        table, rows, lens, indptr = ins  # a fused indptr can only be a prefix sum: the one (bs+1) op
        return table not in group and row_like(rows) and row_like(lens) and types[indptr].shape == (bs + 1,)
    if n.op is Op.page_table:
        return ins[0] not in group and row_like(ins[1]) and row_like(ins[2])
    if n.op is Op.repeat:
        return types[ins[0]].shape == (bs,) and row_like(ins[0])
    return False


@register_pass("fuse")
def fuse(g: Graph, ctx: PassContext) -> Graph:
    """Requires a specialized, split-checked graph. Groups in_graph nodes into
    one row-parallel Triton kernel (``kernel=k0``): elementwise chains, prefix
    sums, reductions over the batch, ragged gathers, page tables and repeats.
    A node joins only if every input is a per-row value, a scalar, or
    something computed before the kernel runs; nodes after an unfused step
    that reads the kernel's results stay out, so there is never a cycle
    between the kernel and torch ops. Interpreter semantics are unchanged:
    this pass only annotates."""
    bs = g.env.get("bs")
    if not bs:
        return g  # bs 0 (an IDLE eager batch) has no rows to give programs to
    types, group, after = g.types(), set(), set()
    for n in g.nodes:
        if n.region is not Region.in_graph or n.op in CONST_OPS:
            continue
        depends_after = any(x in after for x in n.inputs)
        if not depends_after and fusible(n, types, group, bs):
            group.add(n.name)
            continue
        if depends_after or any(x in group for x in n.inputs):
            after.add(n.name)
    if not group:
        return g
    nodes = tuple(attrs.evolve(n, kernel=KERNEL) if n.name in group else n for n in g.nodes)
    return attrs.evolve(g, nodes=nodes)
