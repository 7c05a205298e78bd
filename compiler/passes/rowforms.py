"""Each op's row form in a fused, row-parallel kernel: one table that ``fuse`` (may the node join a
kernel?) and the Triton emitter (its value at row ``i``, how it is stored) both dispatch through.

One program per row ``i``. A per-row value has a scalar form ``s`` (its value at row ``i``) and,
when a prefix sum or a reduction needs the whole batch, a vector form ``v`` over
``offs = arange(BLOCK)``. A ``[rows, M]`` value (M fixed) is, in program ``i``, its row: a vector
over the columns ``c<M>``. The emitter ``e`` (lowering/fusion.py) offers: ``val(x, f)``, ``emit``,
``name``, ``arg``, ``table``, ``row``, ``columns``, ``column``, ``width``, ``meta``, ``lines``.

Adding an op to fused kernels: a ``RowForm`` here (the totality check below names the ops that
have none: they never fuse).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..ir import Node, Op

BIN = {"add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "min": "tl.minimum({a}, {b})",
       "max": "tl.maximum({a}, {b})"}
CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
TL = {"i32": "tl.int32", "i64": "tl.int64", "f32": "tl.float32", "bool": "tl.int1", "u8": "tl.uint8"}
IDENT = {"sum": "0", "max": "-2147483648", "min": "2147483647"}
GATHER_BLOCK, PAGE_BLOCK = 128, 64


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


@attrs.frozen
class RowForm:
    fusible: Callable[[Node, Fit], bool]
    emit: Callable | None = None  # (e, n, f) -> the name of its value at row i ("s") or over rows ("v")
    store: Callable | None = None  # (e, n, p): how its result is stored; None: row i of its buffer
    held: bool = True  # a program holds its row as a value (a page table is only stored)
    rows_from: int = -1  # the operand whose leading extent is the node's row count (-1: the first per-row one)


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


# --- row forms ---
def floor_div(v: str, c: int) -> str:
    """Exact floor division by c > 0, whatever the back end's rounding of negatives."""
    return f"tl.where({v} >= 0, {v} // {c}, -((-{v} + {c - 1}) // {c}))"


def _emit_ewise(e, n: Node, f: str) -> str:
    a, b = (e.val(x, f) for x in n.inputs)
    if n.a["fn"] == "ceildiv":  # divisor positive by contract: exact either rounding
        return e.emit(e.name(n, f), f"tl.where({a} >= 0, ({a} + {b} - 1) // {b}, -((-{a}) // {b}))")
    return e.emit(e.name(n, f), BIN[n.a["fn"]].format(a=a, b=b))


def _emit_ewise_const(e, n: Node, f: str) -> str:
    v, c, fn = e.val(n.inputs[0], f), n.a["value"], n.a["fn"]
    if fn == "floordiv":
        return e.emit(e.name(n, f), floor_div(v, c))
    if fn == "mod":  # floor modulo through the exact floor division
        return e.emit(e.name(n, f), f"({v} - ({floor_div(v, c)}) * {c})")
    if fn == "ceildiv":
        return e.emit(e.name(n, f), f"tl.where({v} >= 0, ({v} + {c - 1}) // {c}, -((-{v}) // {c}))")
    return e.emit(e.name(n, f), BIN[fn].format(a=v, b=c))


def _emit_lookup(e, n: Node, f: str) -> str:  # an index outside the table reads entry 0 (the reserved slot)
    p, _, n_tab = e.table(n.inputs[0])
    idx, w = e.val(n.inputs[1], f), e.width(n.name)
    safe = e.emit(f"ix_{e.nm(n.name)}", f"tl.where(({idx} >= 0) & ({idx} < {n_tab}), {idx}, 0)")
    mask = ", mask=m, other=0" if f != "s" else "" if w is None else f", mask={e.columns(w)[1]}, other=0"
    return e.emit(e.name(n, f), f"tl.load({p} + {safe}{mask})")


def _emit_outer(e, n: Node, f: str) -> str:  # this row's scalar against the whole column operand
    a, b, fn = e.val(n.inputs[0], f), e.column(n.inputs[1], e.width(n.name)), n.a["fn"]
    return e.emit(e.name(n, f), f"({a} {CMP[fn]} {b})" if fn in CMP else BIN[fn].format(a=a, b=b))


def _emit_gather_rows(e, n: Node, f: str) -> str:  # table[rows[i], cols[i, :]], -1 outside the row
    table, rows, cols = n.inputs
    tp, stride, width = e.table(table)
    row, c, cm = e.row(table, e.val(rows, f)), e.val(cols, f), e.columns(e.width(n.name))[1]
    ok = e.emit(f"ok_{e.nm(n.name)}", f"({c} >= 0) & ({c} < {width})")
    got = e.emit(f"g_{e.nm(n.name)}", f"tl.load({tp} + {row} * {stride} + {c}, mask={ok} & {cm}, other=0)")
    return e.emit(e.name(n, f), f"tl.where({ok}, {got}, -1)")


def _emit_reduce(e, n: Node, f: str) -> str:
    fn = n.a["fn"]
    return e.emit(f"r_{e.nm(n.name)}", f"tl.{fn}(tl.where(m, {e.val(n.inputs[0], 'v')}, {IDENT[fn]}), axis=0)")


def _emit_cumsum(e, n: Node, f: str) -> str:
    x = n.inputs[0]
    if f == "v":
        return e.emit(e.name(n, "v"), f"tl.cumsum({e.val(x, 'v')}, axis=0)")
    excl = e.emit(f"e_{e.nm(n.name)}", f"tl.sum(tl.where(offs < i, {e.val(x, 'v')}, 0), axis=0)")
    inc = e.emit(e.name(n, "s"), f"{excl} + {e.val(x, 's')}")
    return excl if n.a["leading_zero"] else inc


def _store_cumsum(e, n: Node, p: str) -> bool:
    if not n.a["leading_zero"]:
        return False
    e.lines.append(f"    tl.store({p} + i + 1, {e.val(n.name, 's')} + {e.val(n.inputs[0], 's')})")
    e.lines.append(f"    if i == 0:\n        tl.store({p}, 0)")
    return True


def _store_reduce(e, n: Node, p: str) -> bool:
    e.lines.append(f"    if i == 0:\n        tl.store({p}, {e.val(n.name, 's')})")
    return True


def _store_repeat(e, n: Node, p: str) -> bool:
    times, t = int(n.a["times"]), f"t_{e.nm(n.name)}"
    e.meta["TP2"] = max(1, 1 << (times - 1).bit_length())
    e.lines.append(f"    {t} = tl.arange(0, TP2)")
    e.lines.append(f"    tl.store({p} + i * {times} + {t}, {e.val(n.inputs[0], 's')} + {t} * 0, mask={t} < {times})")
    return True


def _store_gather(e, n: Node, p: str) -> bool:
    """Row i's entries at indptr[i]: guarded, a row outside the table reads row 0, a column past the
    row reads 0, and nothing is written outside the output buffer."""
    table, rows, lens, indptr, *jump = n.inputs
    tp, stride, width = e.table(table)
    x = e.nm(n.name)
    start = e.val(indptr, "s") if indptr in e.group else e.emit(f"st_{x}", f"tl.load({e.arg(indptr)} + i)")
    cols = "o"
    if jump:  # a branch's draft slots: entries from split on read shift columns further
        split, shift = (e.val(v, "s") for v in jump)
        cols = f"(o + tl.where(o >= {split}, {shift}, 0))"
    e.meta["GBLOCK"] = GATHER_BLOCK
    row = e.row(table, e.val(rows, "s"))
    e.lines += [
        f"    n_{x} = {e.val(lens, 's')}",
        f"    at_{x} = {start}.to(tl.int64)",
        f"    for j in range(0, n_{x}, GBLOCK):",
        "        o = j + tl.arange(0, GBLOCK)",
        f"        c = {cols}",
        f"        w = (o < n_{x}) & (at_{x} + o >= 0) & (at_{x} + o < {int(n.type.shape[0])})",
        f"        v = tl.load({tp} + {row} * {stride} + c, mask=w & (c >= 0) & (c < {width}), other=0)",
        f"        tl.store({p} + at_{x} + o, v, mask=w)",
    ]
    return True


def _store_page_table(e, n: Node, p: str) -> bool:
    table, rows, lens = n.inputs
    tp, stride, width = e.table(table)
    P, W, x = int(n.a["page_size"]), int(n.a["width"]), e.nm(n.name)
    e.meta["PBLOCK"] = PAGE_BLOCK
    e.lines += [
        f"    row_{x} = {e.row(table, e.val(rows, 's'))}",
        f"    np_{x} = tl.minimum(tl.minimum(({e.val(lens, 's')} + {P - 1}) // {P}, {W}), ({width} + {P - 1}) // {P})",
        f"    for c in range(0, {W}, PBLOCK):",
        "        cols = c + tl.arange(0, PBLOCK)",
        f"        ok = cols < np_{x}",
        f"        pg = tl.load({tp} + row_{x} * {stride} + cols * {P}, mask=ok, other=0)",
        f"        pg = pg // {P}",
        f"        tl.store({p} + i * {W} + cols, tl.where(ok, pg, 0), mask=cols < {W})",
    ]
    return True


def _store_flatten(e, n: Node, p: str) -> bool:  # row-major: program i writes its row
    c, cm = e.columns(e.width(n.inputs[0]))
    e.lines.append(f"    tl.store({p} + i * {e.width(n.inputs[0])} + {c}, {e.val(n.name, 's')}, mask={cm})")
    return True


def _flatten_ok(n: Node, fit: Fit) -> bool:
    s = fit.types[n.inputs[0]].shape
    return (len(s) == 2 and s[0] == fit.rows and s[1].is_Integer and int(s[1]) > 1
            and n.inputs[0] not in fit.unheld)


def _outer_ok(n: Node, fit: Fit) -> bool:
    m, col = fit.fixed_width(n), fit.types[n.inputs[1]]
    return (m is not None and (n.a["fn"] in BIN or n.a["fn"] in CMP) and fit.row_like(n.inputs[0])
            and n.inputs[1] not in fit.group and col.shape == (m,) and not col.placement.on_host)


def _gather_rows_ok(n: Node, fit: Fit) -> bool:
    m = fit.fixed_width(n)
    return m is not None and n.inputs[0] not in fit.group and fit.row_like(n.inputs[1]) and fit.row2d(n.inputs[2], m)


def _ragged_gather_ok(n: Node, fit: Fit) -> bool:
    table, rows, lens, indptr, *jump = n.inputs  # a fused indptr can only be a prefix sum: the one (rows+1) op
    return (table not in fit.group and all(fit.row_like(x) for x in (rows, lens, *jump))
            and fit.types[indptr].shape == (fit.rows + 1,))


def _same(e, n: Node, f: str) -> str:  # a copy or a flatten is its input's value
    return e.val(n.inputs[0], f)


def _emit_cast(e, n: Node, f: str) -> str:
    return e.emit(e.name(n, f), f"{e.val(n.inputs[0], f)}.to({TL[n.a['dtype'].value]})")


def _emit_clamp(e, n: Node, f: str) -> str:
    return e.emit(e.name(n, f), f"tl.minimum(tl.maximum({e.val(n.inputs[0], f)}, {n.a['lo']}), {n.a['hi']})")


def _emit_log2_scale(e, n: Node, f: str) -> str:
    x = f"{e.val(n.inputs[0], f)}.to(tl.float32) / {float(n.a['divisor'])}"
    return e.emit(e.name(n, f), f"(tl.maximum(tl.log2({x}), 1.0) * {n.a['scale']}).to(tl.int32)")


def _emit_compare(e, n: Node, f: str) -> str:
    a, b = (e.val(x, f) for x in n.inputs)
    return e.emit(e.name(n, f), f"({a} {CMP[n.a['fn']]} {b})")


def _emit_where(e, n: Node, f: str) -> str:
    c, a, b = (e.val(x, f) for x in n.inputs)
    return e.emit(e.name(n, f), f"tl.where({c}, {a}, {b})")


def _page_table_ok(n: Node, fit: Fit) -> bool:
    return n.inputs[0] not in fit.group and fit.row_like(n.inputs[1]) and fit.row_like(n.inputs[2])


def _per_row_input(n: Node, fit: Fit) -> bool:
    return _rows_of(n.inputs[0], fit)


ROWFORMS: dict[Op, RowForm] = {
    Op.ewise: RowForm(_ewise_ok, _emit_ewise),
    Op.ewise_const: RowForm(_ewise_const_ok, _emit_ewise_const),
    Op.cast: RowForm(_elementwise, _emit_cast),
    Op.clamp: RowForm(_elementwise, _emit_clamp),
    Op.log2_scale: RowForm(_elementwise, _emit_log2_scale),
    Op.compare: RowForm(_elementwise, _emit_compare),
    Op.where: RowForm(_elementwise, _emit_where),
    Op.copy: RowForm(_elementwise, _same),
    Op.lookup: RowForm(_lookup_ok, _emit_lookup, rows_from=1),
    Op.outer: RowForm(_outer_ok, _emit_outer),
    Op.gather_rows: RowForm(_gather_rows_ok, _emit_gather_rows, rows_from=1),
    Op.flatten: RowForm(_flatten_ok, _same, _store_flatten),
    Op.reduce: RowForm(_per_row_input, _emit_reduce, _store_reduce),
    Op.cumsum: RowForm(_per_row_input, _emit_cumsum, _store_cumsum),
    Op.ragged_gather: RowForm(_ragged_gather_ok, None, _store_gather, held=False, rows_from=1),
    Op.page_table: RowForm(_page_table_ok, None, _store_page_table, held=False, rows_from=1),
    Op.repeat: RowForm(_per_row_input, None, _store_repeat, held=False),
}
# ops that never join a fused kernel: host work, syncs, data-dependent shapes, constants (made at bind),
# views (slices), and whole-row reorders no program can do on its own row alone
NOT_FUSED = {Op.item, Op.to_host, Op.to_device, Op.nonzero, Op.host_call, Op.split_at, Op.slice, Op.full, Op.arange,
             Op.sort_rows, Op.reduce_rows}
assert set(ROWFORMS) | NOT_FUSED == set(Op) and not set(ROWFORMS) & NOT_FUSED, \
    f"every op needs a row form or a place in NOT_FUSED: {sorted(o.value for o in set(Op) - set(ROWFORMS) - NOT_FUSED)}"
