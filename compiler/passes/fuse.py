from __future__ import annotations

import attrs

from ..ir import Graph, Region
from .registry import PassContext, register_pass
from .rowforms import OWN, ROWFORMS, Fit


def fusible(n, types, group: set[str], rows: int, unheld: frozenset[str] = frozenset()) -> bool:
    """Whether ``n`` can join the row-parallel kernel over ``rows``: its op's row form says so, and it
    is static device work."""
    form = ROWFORMS.get(n.op)
    if form is None or n.type.placement.on_host or n.type.is_dynamic:
        return False
    return form.fusible(n, Fit(types, group, rows, unheld))


def row_space(n, types, rows_of: dict[str, int] | None = None) -> int | None:
    """The row count a node iterates over: its per-row operand's length (the row form names which),
    or for a node on batch-wide scalars only, the row space of the kernel that computed them."""
    if all(types[x].shape == () for x in n.inputs) and rows_of:
        return next((rows_of[x] for x in n.inputs if x in rows_of), None)
    form = ROWFORMS.get(n.op)
    if form is not None and form.rows_from == OWN:
        shape = n.type.shape
    elif form is not None and form.rows_from >= 0:
        shape = types[n.inputs[form.rows_from]].shape
    else:  # a 2-D value's rows are its first dimension
        shape = next((types[x].shape for x in n.inputs if len(types[x].shape) in (1, 2)), None)
    if not shape or not shape[0].is_Integer:
        return None
    return int(shape[0])


@register_pass("fuse")
def fuse(g: Graph, ctx: PassContext) -> Graph:
    """Requires a specialized, split-checked graph. Groups in_graph nodes into
    row-parallel Triton kernels, one per row space (the batch, or a TBO
    child's sub-range), as far as each op's row form (passes/rowforms.py)
    allows: elementwise chains, prefix sums, reductions over the rows, ragged
    gathers, page tables, repeats, and [rows, M] rows. A node joins a kernel
    only if every input is a per-row value, a scalar, or computed before that
    kernel runs: nothing outside a kernel that reads it may feed it, so the
    kernels and the remaining torch ops always order without a cycle. A node
    that must wait for a kernel (it gathers from a page table the kernel
    wrote) starts the row space's next kernel instead of running alone.
    Interpreter semantics are unchanged: this pass only records the grouping
    (``Graph.kernels``: node -> ``k<N>``)."""
    types = g.types()
    groups: dict[tuple[int, int], set[str]] = {}  # (row count, generation) -> members
    after: dict[tuple[int, int], set[str]] = {}  # group -> nodes outside it that read it
    rows_of: dict[str, int] = {}
    consts = set(g.constants())  # evaluated at bind, not per step
    unheld = frozenset(n.name for n in g.nodes if n.op in ROWFORMS and not ROWFORMS[n.op].held)
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
    kernels = tuple(sorted((m, f"k{k}") for k, (_, members) in enumerate(sorted(groups.items())) for m in members))
    return g if kernels == g.kernels else attrs.evolve(g, kernels=kernels)
