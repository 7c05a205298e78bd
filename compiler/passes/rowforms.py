"""Each op's row form in a fused, row-parallel kernel, as ``fuse`` sees it: may the node join a
kernel (``fusible``), does a program hold its row as a value (``held``), which operand gives its row
count. How each form is written in Triton is the lowering's table (``lowering/rowemit.py``), with a
totality check against this one.

One program per row ``i``. A per-row value has a value at row ``i`` and, when a prefix sum or a
reduction needs the whole batch, one over all rows. A ``[rows, M]`` value (M fixed) is, in
program ``i``, its row: a vector over the columns.

Adding an op to fused kernels: a ``RowForm`` here and its emitter in ``lowering/rowemit.py`` (the
totality checks name the ops that have neither: they never fuse).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..ir import Node, Op

# the functions an ``outer`` of two operands may apply (binary arithmetic and comparisons)
OUTER_FNS = frozenset({"add", "sub", "mul", "min", "max", "lt", "le", "gt", "ge", "eq", "ne"})


@attrs.frozen
class Fit:
    """What fusibility looks at: value types, the kernel's members so far, its row count, and the
    members a program stores without holding their row as a value (page tables)."""

    types: dict
    group: set
    rows: int
    unheld: frozenset

    def row_like(self, x: str) -> bool:  # a per-row value or a scalar the kernel can read or compute
        t = self.types[x]
        return not t.placement.on_host and t.shape in ((self.rows,), ())

    def row2d(self, x: str, m) -> bool:  # a [rows, M] value this program can hold its row of
        s = self.types[x]
        return not s.placement.on_host and s.shape == (self.rows, m) and x not in self.unheld

    def fixed_width(self, n: Node):
        """M of a [rows, M] result with M fixed, else None."""
        t = n.type
        return t.shape[1] if len(t.shape) == 2 and t.shape[0] == self.rows and t.shape[1].is_Integer else None


OWN = -2  # RowForm.rows_from: the node's own row count


@attrs.frozen
class RowForm:
    fusible: Callable[[Node, Fit], bool]
    held: bool = True  # a program holds its row as a value (a page table is only stored)
    rows_from: int = -1  # the operand whose leading extent is the node's row count (-1: the first per-row one;
    #                      OWN: the node's own leading extent)


# --- fusibility ---
def _elementwise(n: Node, fit: Fit) -> bool:
    m = fit.fixed_width(n)
    if len(n.type.shape) == 2:
        return m is not None and all(fit.row_like(x) or fit.row2d(x, m) for x in n.inputs)
    return n.type.shape in ((fit.rows,), ()) and all(fit.row_like(x) for x in n.inputs)


def _ewise_ok(n: Node, fit: Fit) -> bool:
    # integer division rounds differently between Triton back ends: tensor-by-tensor is left to torch
    return n.a["fn"] not in ("floordiv", "mod") and _elementwise(n, fit)


def _ewise_const_ok(n: Node, fit: Fit) -> bool:
    return not (n.a["fn"] in ("floordiv", "ceildiv", "mod") and n.a["value"] <= 0) and _elementwise(n, fit)


def _lookup_ok(n: Node, fit: Fit) -> bool:
    table, idx = n.inputs
    if table in fit.group or len(fit.types[table].shape) != 1:
        return False
    m = fit.fixed_width(n)
    return fit.row2d(idx, m) if m is not None else fit.row_like(idx) and n.type.shape == (fit.rows,)


def _rows_of(x: str, fit: Fit) -> bool:
    return fit.types[x].shape == (fit.rows,) and fit.row_like(x)


def _flatten_ok(n: Node, fit: Fit) -> bool:
    s = fit.types[n.inputs[0]].shape
    return (len(s) == 2 and s[0] == fit.rows and s[1].is_Integer and int(s[1]) > 1
            and n.inputs[0] not in fit.unheld)


def _outer_ok(n: Node, fit: Fit) -> bool:
    m, col = fit.fixed_width(n), fit.types[n.inputs[1]]
    return (m is not None and n.a["fn"] in OUTER_FNS and fit.row_like(n.inputs[0])
            and n.inputs[1] not in fit.group and col.shape == (m,) and not col.placement.on_host)


def _gather_rows_ok(n: Node, fit: Fit) -> bool:
    m = fit.fixed_width(n)
    return m is not None and n.inputs[0] not in fit.group and fit.row_like(n.inputs[1]) and fit.row2d(n.inputs[2], m)


def _ragged_gather_ok(n: Node, fit: Fit) -> bool:
    table, rows, lens, indptr, *jump = n.inputs  # a fused indptr can only be a prefix sum: the one (rows+1) op
    return (table not in fit.group and all(fit.row_like(x) for x in (rows, lens, *jump))
            and fit.types[indptr].shape == (fit.rows + 1,))


def _page_table_ok(n: Node, fit: Fit) -> bool:
    return n.inputs[0] not in fit.group and fit.row_like(n.inputs[1]) and fit.row_like(n.inputs[2])


def _ingest_ok(n: Node, fit: Fit) -> bool:
    staged, feed, engine, word, gen, _record, *rest = n.inputs
    whole = rest.pop() if n.a["sized"] else None  # the whole input, read for its length only
    idx = rest.pop() if n.a["index"] else None
    tables = (staged, feed, engine) if idx is not None else ()  # a lookup reads the input as a table
    rows = (idx,) if idx is not None else (staged, feed, engine)
    # the word (a scalar) and the generation (two words) are device values every program reads whole
    return (n.type.shape == (fit.rows,) and all(fit.row_like(x) for x in (*rows, word))
            and not fit.types[gen].placement.on_host
            and not any(x in fit.group for x in (gen, *tables, *rest, *((whole,) if whole else ()))))


def _per_row_input(n: Node, fit: Fit) -> bool:
    return _rows_of(n.inputs[0], fit)


ROWFORMS: dict[Op, RowForm] = {
    Op.ewise: RowForm(_ewise_ok),
    Op.ewise_const: RowForm(_ewise_const_ok),
    Op.cast: RowForm(_elementwise),
    Op.clamp: RowForm(_elementwise),
    Op.log2_scale: RowForm(_elementwise),
    Op.compare: RowForm(_elementwise),
    Op.where: RowForm(_elementwise),
    Op.copy: RowForm(_elementwise),
    Op.lookup: RowForm(_lookup_ok, rows_from=1),
    Op.outer: RowForm(_outer_ok),
    Op.gather_rows: RowForm(_gather_rows_ok, rows_from=1),
    Op.flatten: RowForm(_flatten_ok),
    Op.reduce: RowForm(_per_row_input),
    Op.cumsum: RowForm(_per_row_input),
    Op.ragged_gather: RowForm(_ragged_gather_ok, held=False, rows_from=1),
    Op.page_table: RowForm(_page_table_ok, held=False, rows_from=1),
    Op.repeat: RowForm(_per_row_input, held=False),
    Op.ingest: RowForm(_ingest_ok, rows_from=OWN),
}
# ops that never join a fused kernel: host work, syncs, data-dependent shapes, constants (made at bind),
# views (slices), and whole-row reorders no program can do on its own row alone
NOT_FUSED = {Op.item, Op.to_host, Op.to_device, Op.nonzero, Op.host_call, Op.split_at, Op.slice, Op.full, Op.arange,
             Op.sort_rows, Op.reduce_rows}
assert set(ROWFORMS) | NOT_FUSED == set(Op) and not set(ROWFORMS) & NOT_FUSED, \
    f"every op needs a row form or a place in NOT_FUSED: {sorted(o.value for o in set(Op) - set(ROWFORMS) - NOT_FUSED)}"
