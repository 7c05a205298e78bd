from __future__ import annotations

import attrs

from ..ir import Graph, Op, Region
from .registry import PassContext, register_pass

ROW_OPS = (Op.ewise, Op.ewise_const, Op.cast, Op.compare, Op.where, Op.copy, Op.lookup)
_FUSED_FNS = ("add", "sub", "mul", "min", "max", "lt", "le", "gt", "ge", "eq", "ne")  # outer fns with a Triton form
SINK_OPS = (Op.ragged_gather, Op.page_table, Op.repeat)


def fusible(n, types, group: set[str], bs: int, unheld: frozenset[str] = frozenset()) -> bool:
    """Whether ``n`` can join the row-parallel kernel: one program per request row. ``unheld``:
    members a program stores without holding their row as a value (page tables)."""

    def row_like(x: str) -> bool:  # a per-row value or a scalar the kernel can read or compute
        t = types[x]
        return not t.placement.on_host and t.shape in ((bs,), ())

    t, ins = n.type, n.inputs
    if t.placement.on_host or t.is_dynamic:
        return False
    if n.op is Op.ewise and n.a["fn"] in ("floordiv", "mod"):
        return False  # integer division rounding differs between Triton back ends; left to torch
    if n.op is Op.ewise_const and n.a["fn"] in ("floordiv", "ceildiv", "mod") and n.a["value"] <= 0:
        return False
    if (len(t.shape) == 2 and n.op is not Op.page_table) or n.op is Op.flatten:
        return _fusible_2d(n, types, group, unheld, bs, row_like)
    if n.op is Op.lookup:
        return ins[0] not in group and len(types[ins[0]].shape) == 1 and row_like(ins[1]) and t.shape == (bs,)
    if n.op in ROW_OPS:
        return t.shape in ((bs,), ()) and all(row_like(x) for x in ins)
    if n.op is Op.cumsum:
        return types[ins[0]].shape == (bs,) and row_like(ins[0])
    if n.op is Op.reduce:
        return types[ins[0]].shape == (bs,) and row_like(ins[0])
    if n.op is Op.ragged_gather:
        table, rows, lens, indptr, *jump = ins  # a fused indptr can only be a prefix sum: the one (bs+1) op
        return (table not in group and all(row_like(x) for x in (rows, lens, *jump))
                and types[indptr].shape == (bs + 1,))
    if n.op is Op.page_table:
        return ins[0] not in group and row_like(ins[1]) and row_like(ins[2])
    if n.op is Op.repeat:
        return types[ins[0]].shape == (bs,) and row_like(ins[0])
    return False


def _fusible_2d(n, types, group: set[str], unheld: frozenset[str], bs: int, row_like) -> bool:
    """A [bs, M] value as one row of M columns per program (M fixed, not the batch size): elementwise
    over rows of it, ``outer`` against a column argument, ``gather_rows`` from a table computed
    before the kernel, and ``flatten`` as a row-major store."""
    t, ins = n.type, n.inputs
    if n.op is Op.flatten:
        shape = types[ins[0]].shape
        return (len(shape) == 2 and shape[0] == bs and shape[1].is_Integer and int(shape[1]) > 1
                and ins[0] not in unheld)
    m = t.shape[1]
    if t.shape[0] != bs or not m.is_Integer:
        return False

    def row2d(x: str) -> bool:  # a [bs, M] value this program can hold its row of
        s = types[x]
        return not s.placement.on_host and s.shape == (bs, m) and x not in unheld

    if n.op is Op.outer:
        col = types[ins[1]]
        return (n.a["fn"] in _FUSED_FNS and row_like(ins[0]) and ins[1] not in group
                and col.shape == (m,) and not col.placement.on_host)
    if n.op is Op.gather_rows:
        return ins[0] not in group and row_like(ins[1]) and row2d(ins[2])
    if n.op is Op.lookup:
        return ins[0] not in group and len(types[ins[0]].shape) == 1 and row2d(ins[1])
    return n.op in ROW_OPS and all(row_like(x) or row2d(x) for x in ins)


def row_space(n, types, rows_of: dict[str, int] | None = None) -> int | None:
    """The row count a node iterates over: its per-row input's length, or for a node on
    batch-wide scalars only, the row space of the kernel that computed them."""
    if all(types[x].shape == () for x in n.inputs) and rows_of:
        return next((rows_of[x] for x in n.inputs if x in rows_of), None)
    if n.op in (Op.ragged_gather, Op.page_table, Op.lookup, Op.gather_rows):
        shape = types[n.inputs[1]].shape
    else:  # a 2-D value's rows are its first dimension
        shape = next((types[x].shape for x in n.inputs if len(types[x].shape) in (1, 2)), None)
    if not shape or not shape[0].is_Integer:
        return None
    return int(shape[0])


@register_pass("fuse")
def fuse(g: Graph, ctx: PassContext) -> Graph:
    """Requires a specialized, split-checked graph. Groups in_graph nodes into
    row-parallel Triton kernels, one per row space (the batch, or a TBO
    child's sub-range): elementwise chains, prefix sums, reductions over the
    rows, ragged gathers, page tables and repeats. A node joins a kernel only
    if every input is a per-row value, a scalar, or computed before that
    kernel runs: nothing outside a kernel that reads it may feed it, so the
    kernels and the remaining torch ops always order without a cycle. A node
    that must wait for a kernel (it gathers from a page table the kernel
    wrote) starts the row space's next kernel instead of running alone.
    Interpreter semantics are unchanged: this pass only annotates
    (``kernel=k<N>``)."""
    types = g.types()
    groups: dict[tuple[int, int], set[str]] = {}  # (row count, generation) -> members
    after: dict[tuple[int, int], set[str]] = {}  # group -> nodes outside it that read it
    kernel_of: dict[str, str] = {}
    rows_of: dict[str, int] = {}
    consts = set(g.constants())  # evaluated at bind, not per step
    unheld = frozenset(n.name for n in g.nodes if n.op is Op.page_table)
    for n in g.nodes:
        if n.region is not Region.in_graph or n.name in consts:
            continue
        rows = row_space(n, types, rows_of)
        joined = None
        for gen in range(sum(r == rows for r, _ in groups) + 1) if rows else ():  # the earliest that can take it
            key = (rows, gen)
            if not any(x in after.get(key, ()) for x in n.inputs) and fusible(
                    n, types, groups.get(key, set()), rows, unheld):
                groups.setdefault(key, set()).add(n.name)
                rows_of[n.name], joined = rows, key
                break
        for key, members in groups.items():
            if key != joined and any(x in members or x in after.get(key, ()) for x in n.inputs):
                after.setdefault(key, set()).add(n.name)
    for k, (_, members) in enumerate(sorted(groups.items())):
        kernel_of.update((m, f"k{k}") for m in members)
    if not kernel_of:
        return g
    nodes = tuple(attrs.evolve(n, kernel=kernel_of[n.name]) if n.name in kernel_of else n for n in g.nodes)
    return attrs.evolve(g, nodes=nodes)
