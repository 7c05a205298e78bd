"""How each op's row form is written in Triton: the lowering's half of the row-form table (the
passes' half, ``passes/rowforms.py``, says what may fuse). The emitter ``e`` (``fusion.py``)
offers ``val(x, f)``, ``emit``, ``name``, ``arg``, ``table``, ``row``, ``columns``, ``column``,
``width``, ``meta``, ``lines``; a value form ``f`` is ``"s"`` (row ``i``) or ``"v"`` (every row,
over ``offs``).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import sympy
import torch

from ..ir import Node, Op
from ..ir.ops_guard import GENERATION, SENTINEL, hi_symbols
from ..passes.rowforms import OUTER_FNS, ROWFORMS

BIN = {"add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "min": "tl.minimum({a}, {b})",
       "max": "tl.maximum({a}, {b})"}
CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
TL = {"i32": "tl.int32", "i64": "tl.int64", "f32": "tl.float32", "bool": "tl.int1", "u8": "tl.uint8"}
IDENT = {"sum": "0", "max": "-2147483648", "min": "2147483647"}
GATHER_BLOCK, PAGE_BLOCK = 128, 64




@attrs.frozen
class RowEmit:
    emit: Callable | None = None  # (e, n, f) -> the name of its value at row i ("s") or over rows ("v")
    store: Callable | None = None  # (e, n, p): how its result is stored; None: row i of its buffer


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
    mask = ", mask=m, other=0" if f != "s" or e.flat else "" if w is None else f", mask={e.columns(w)[1]}, other=0"
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
    for split, shift in zip(jump[::2], jump[1::2], strict=True):  # entries from split on read shift columns further
        cols = f"({cols} + tl.where(o >= {e.val(split, 's')}, {e.val(shift, 's')}, 0))"
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


def _ingest_once(e, n: Node) -> tuple[str, str, str]:
    """Per kernel, once per ingest node: the word and the bounds, and program 0's record of the first bad row it
    reads (and, once per kernel on a staged step, of a generation outside the graph's range). Returns (engine?,
    lo, hi)."""
    staged, feed, engine, word, gen, record, *rest = n.inputs
    key = ("ingest", n.name)
    if key in e.memo:
        return e.memo[key]
    x, a = e.nm(n.name), n.a
    if not a["index"] and staged not in e.row_args:  # its length is the kernel's row count
        e.row_args.append(staged)
    if ("word", word) not in e.memo:  # one load of the word per kernel
        e.memo[("word", word)] = e.emit(f"eng_{x}", f"tl.load({e.arg(word)}) == 1",
                                        "the word: this step's graph reads the engine's buffers")
    eng = e.memo[("word", word)]
    first_check = ("generation", gen) not in e.memo  # one check of the generation per kernel
    e.memo[("generation", gen)] = True
    lo = e.emit(f"lo_{x}", f"tl.where({eng}, {lit(a['engine_lo'])}, {lit(a['lo'])})")
    hi = e.emit(f"hi_{x}", guard_hi(e, n), f"the largest {a['field']} allowed")
    rec, code, sent = e.arg(record), int(a["code"]), lit(SENTINEL)
    if a["sized"] or a["index"]:  # the graph's rows: the whole input's length, passed when the kernel launches
        _, _, width = e.table(n.inputs[-1] if a["sized"] else staged)
        rows = f"({width} // {int(a['per_row'])})"
    else:
        rows = f"(n_rows // {int(a['per_row'])})"
    at = _ingest_rows(e, n, "v")
    vs, vf, ve = _ingest_loads(e, n, at, "m", eng)
    row = f"tl.sum(tl.where(offs == first, {at}, 0), axis=0)" if a["index"] else "first"
    e.lines += [
        f"    if i == 0:  # the record: %{n.name}'s first bad row ({a['field']}), or a staging of another size",
        f"        vs = {vs}",
        f"        vf = {vf}",
        f"        ve = {ve}",
        f"        v = tl.where({eng}, ve, tl.where(vf == {sent}, vs, vf))",
        f"        bad = m & ((v < {lo}) | (v > {hi})) & ({eng} | (vf != {sent}))",
        "        first = tl.min(tl.where(bad, offs, n_rows), axis=0)",
        *([f"        g = tl.load({e.arg(gen)}).to(tl.int64)  # the staged size",
           f"        gp = tl.load({e.arg(gen)} + 1).to(tl.int64)  # the size of the graph that pads it",
           f"        if ({eng} == 0) & (g != {rows}) & (gp != {rows}):",
           f"            if tl.load({rec}) == 0:",
           f"                tl.store({rec} + 1, {code | GENERATION} + 0 * g)",
           f"                tl.store({rec} + 2, {rows} + 0 * g)",
           f"                tl.store({rec} + 3, g)",
           f"                tl.store({rec}, 1 + 0 * g)"] if first_check else []),
        "        if first < n_rows:",
        f"            if tl.load({rec}) == 0:",
        "                fv = tl.sum(tl.where(offs == first, v, 0), axis=0)",
        f"                tl.store({rec} + 1, {code} + 0 * fv)",
        f"                tl.store({rec} + 2, ({row}).to(tl.int64))",
        f"                tl.store({rec} + 3, fv)",
        f"                tl.store({rec}, 1 + 0 * fv)",
    ]
    e.memo[key] = (eng, lo, hi)
    return e.memo[key]


def _ingest_rows(e, n: Node, f: str) -> str:
    """The rows an ingest reads in form ``f``: this program's (``i``) or every row (``offs``); at a lookup's
    rows, those its index names, guarded as a lookup guards them (outside the input: row 0)."""
    if not n.a["index"]:
        return "i" if f == "s" else "offs"
    idx = e.val(n.inputs[-1 - bool(n.a["sized"])], f)
    _, _, size = e.table(n.inputs[0])  # the input's length, passed at launch: one kernel serves every size
    return e.emit(f"{f}x_{e.nm(n.name)}", f"tl.where(({idx} >= 0) & ({idx} < {size}), {idx}, 0)",
                  "the rows a lookup reads, guarded")


def _ingest_loads(e, n: Node, at: str, mask: str | None, eng: str) -> tuple[str, str, str]:
    """The staged, fed and engine values at rows ``at`` (``mask``: the rows a vector form may read)."""
    staged, feed, engine = n.inputs[:3]
    m = f", mask={mask}, other=0" if mask else ""
    em = f", mask={mask} & {eng}, other=0" if mask else f", mask={eng}, other=0"
    return (f"tl.load({e.arg(staged)} + {at}{m}).to(tl.int64)", f"tl.load({e.arg(feed)} + {at}{m}).to(tl.int64)",
            f"tl.load({e.arg(engine)} + {at}{em}).to(tl.int64)")


def lit(v: int) -> str:
    """An integer literal Triton reads as one (the int64 minimum is no literal of its own)."""
    return "(-9223372036854775807 - 1)" if v == -(2**63) else str(v)


def guard_hi(e, n: Node) -> str:
    """An ingest's upper bound as kernel code: its expression with each pool extent it names read off the pool's
    table arguments (its rows or its width); one no pool gives is the dtype's largest value."""
    hi, pairs = n.a["hi"], [int(v) for v in n.a["hi_of"]]
    syms = hi_symbols(hi)
    if len(pairs) != 2 * len(syms):
        return str(torch.iinfo(e.types[n.inputs[0]].dtype.torch).max)
    sub = {}
    for k, s in enumerate(syms):
        pool, axis = n.inputs[pairs[2 * k]], pairs[2 * k + 1]
        _, _, width = e.table(pool)
        one_d = len(e.types[pool].shape) == 1
        sub[s] = sympy.Symbol(width if axis == 1 or one_d else f"nrows_{e.nm(pool)}")
    return f"({sympy.sstr(hi.xreplace(sub))})"


def _emit_ingest(e, n: Node, f: str) -> str:
    staged = n.inputs[0]
    eng, lo, hi = _ingest_once(e, n)
    x, sent = e.nm(n.name), lit(SENTINEL)
    loads = _ingest_loads(e, n, _ingest_rows(e, n, f), None if f == "s" else "m", eng)
    vs, vf, ve = (e.emit(f"{f}{w}_{x}", ld) for w, ld in zip("sfe", loads, strict=True))
    v = e.emit(f"{f}v_{x}", f"tl.where({eng}, {ve}, tl.where({vf} == {sent}, {vs}, {vf}))")
    bad = e.emit(f"{f}b_{x}", f"(({v} < {lo}) | ({v} > {hi})) & ({eng} | ({vf} != {sent}))")
    safe = f"tl.minimum(tl.maximum({v}, {lo}), {hi})" if n.a["clamp"] else "0"
    dt = TL[e.types[staged].dtype.value]
    return e.emit(e.name(n, f), f"tl.where({bad}, {safe}, {v}).to({dt})", f"%{n.name}: {n.a['field']}, checked")


ROWEMIT: dict[Op, RowEmit] = {
    Op.ewise: RowEmit(_emit_ewise),
    Op.ewise_const: RowEmit(_emit_ewise_const),
    Op.cast: RowEmit(_emit_cast),
    Op.clamp: RowEmit(_emit_clamp),
    Op.log2_scale: RowEmit(_emit_log2_scale),
    Op.compare: RowEmit(_emit_compare),
    Op.where: RowEmit(_emit_where),
    Op.copy: RowEmit(_same),
    Op.lookup: RowEmit(_emit_lookup),
    Op.outer: RowEmit(_emit_outer),
    Op.gather_rows: RowEmit(_emit_gather_rows),
    Op.flatten: RowEmit(_same, _store_flatten),
    Op.reduce: RowEmit(_emit_reduce, _store_reduce),
    Op.cumsum: RowEmit(_emit_cumsum, _store_cumsum),
    Op.ragged_gather: RowEmit(None, _store_gather),
    Op.page_table: RowEmit(None, _store_page_table),
    Op.repeat: RowEmit(None, _store_repeat),
    Op.ingest: RowEmit(_emit_ingest),
}
assert set(ROWEMIT) == set(ROWFORMS), \
    f"every fusible op needs its Triton form: {sorted(o.value for o in set(ROWFORMS) ^ set(ROWEMIT))}"
assert set(BIN) | set(CMP) == OUTER_FNS, "an outer function fuse admits has no Triton form, or the reverse"
