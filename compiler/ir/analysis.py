"""Dataflow facts check-split needs beyond types: what each batch input is used to index, and the
range of values every integer node can take.

``index_roles``: a batch input reaching the row operand of a gather is a pool row, its length
operand a length, a lookup into an engine table a KV slot; values flow through copies, casts,
repeats, slices, lookups of them and ``where`` branches. ``value_ranges``: an interval per
value from the inputs' declared bounds (a length up to L, less headroom) and each op's rule;
an unknown bound is None. Both run on a specialized graph (every extent an int).
"""

from __future__ import annotations

import math

import sympy

from .graph import Graph, Kind, Role
from .ops import Op
from .types import SYMBOLS, concrete

Interval = tuple[int | None, int | None]

# op -> {operand position: role}: the operands that index memory
_INDEX = {Op.ragged_gather: {1: "row", 2: "length"}, Op.page_table: {1: "row", 2: "length"},
          Op.gather_rows: {1: "row"}}
_FLOW = {Op.ingest: (0,), Op.copy: (0,), Op.cast: (0,), Op.repeat: (0,), Op.slice: (0,), Op.flatten: (0,),
         Op.lookup: (0,),
         Op.where: (1, 2), Op.ewise_const: (0,)}


def index_roles(g: Graph) -> dict[str, set[str]]:
    """Batch input -> the index roles ("row", "length", "slot") its values reach. A property of the
    graph's structure: the same for every size of a mode (the per-size passes ask with the mode's
    graph, computed once)."""
    if "index_roles" not in g.memo:
        g.memo["index_roles"] = _index_roles(g)
    return g.memo["index_roles"]


def _index_roles(g: Graph) -> dict[str, set[str]]:
    pools = {i.name for i in g.inputs if i.role is Role.pool}
    origin: dict[str, set[str]] = {i.name: {i.name} for i in g.inputs if i.role is Role.batch}
    roles: dict[str, set[str]] = {x: set() for x in origin}
    for n in g.nodes:
        src = set().union(*(origin.get(n.inputs[k], set()) for k in _FLOW.get(n.op, ()) if k < len(n.inputs)))
        if src:
            origin[n.name] = src
        uses = dict(_INDEX.get(n.op, {}))
        if n.op is Op.lookup and n.inputs[0] in pools:
            uses[1] = "slot"  # an index into an engine table (full -> SWA slots)
        for k, role in uses.items():
            for x in origin.get(n.inputs[k], ()):
                roles[x].add(role)
    for i in g.inputs:
        if i.role is Role.batch and i.kind is not Kind.value:
            roles[i.name].add(i.kind.value)
    return roles


def kind_range(kind: Kind, hi, dtype) -> tuple[int, sympy.Expr]:
    """(lo, hi) every live value of a batch input of ``kind`` is checked against: a length from 0 to its
    declared bound (``hi``, else L), a pool row from 1 (row 0 is reserved) to R - 1, a KV slot up to N - 1,
    anything else its dtype's range. ``hi`` may still name config symbols, R and N."""
    if kind is Kind.length:
        return 0, sympy.sympify(hi if hi is not None else SYMBOLS["L"])
    if kind is Kind.row:
        return 1, SYMBOLS["R"] - 1
    if kind is Kind.slot:
        return 0, SYMBOLS["N"] - 1
    info = dtype_range(dtype)
    return info[0], sympy.Integer(info[1])


def dtype_range(dtype) -> tuple[int, int]:
    """An integer dtype's range; a float's or a bool's (no index, no range check) the int64 one."""
    import torch

    info = torch.iinfo(dtype.torch if dtype.value in ("i32", "i64", "u8") else torch.int64)
    return int(info.min), int(info.max)


def _input_range(i, env: dict[str, int], roles: set[str], inputs: dict) -> Interval:
    """A length's declared bound (or L for a value used as a length); anything else unknown: the
    analysis claims an overflow only where the values are known."""
    if i.role is Role.batch and (i.kind is Kind.length or i.kind is Kind.value and "length" in roles):
        hi = i.upper(inputs) if i.hi is not None else SYMBOLS["L"]  # a per-row bound at its largest
        v = sympy.sympify(sympy.sympify(hi).xreplace({SYMBOLS[k]: x for k, x in env.items() if k in SYMBOLS}))
        top = int(v) if v.is_Integer else None
        return min(0, i.fill or 0), None if top is None else max(top, i.fill or 0)
    return None, None


def _combine(fn: str, a: Interval, b: Interval) -> Interval:
    (al, ah), (bl, bh) = a, b
    if None in (al, ah, bl, bh):
        if fn == "min" and ah is not None and bh is not None:
            return None, min(ah, bh)
        if fn == "max" and al is not None and bl is not None:
            return max(al, bl), None
        return None, None
    if fn in ("add", "sub", "mul", "min", "max"):
        op = {"add": int.__add__, "sub": int.__sub__, "mul": int.__mul__, "min": min, "max": max}[fn]
        if fn == "sub":
            return al - bh, ah - bl
        cands = [op(x, y) for x in (al, ah) for y in (bl, bh)]
        return min(cands), max(cands)
    if fn in ("floordiv", "ceildiv") and bl > 0:
        return min(al // bh, al // bl), max(-(-ah // bl), ah // bl)
    if fn == "mod" and bl > 0:
        return 0, bh - 1
    return None, None


def value_ranges(g: Graph, roles: dict[str, set[str]] | None = None) -> dict[str, Interval]:
    env, types = dict(g.env), g.types()
    roles = index_roles(g) if roles is None else roles

    def extent(x: str) -> int | None:  # the element count of x, when static
        ds = [concrete(d) for d in types[x].shape]
        return None if None in ds else int(math.prod(ds))

    def scaled(iv: Interval, m: int | None) -> Interval:  # a sum of m values in iv (and the empty sum 0)
        lo, hi = iv
        if m is None:
            return None, None
        return None if lo is None else min(0, lo * m), None if hi is None else max(0, hi * m)

    named = {i.name: i for i in g.inputs}
    r: dict[str, Interval] = {i.name: _input_range(i, env, roles.get(i.name, set()), named) for i in g.inputs}
    for n in g.nodes:
        a, ins = n.a, [r.get(x, (None, None)) for x in n.inputs]
        if n.op is Op.full:
            r[n.name] = (a["value"], a["value"])
        elif n.op is Op.arange:
            k = concrete(a["n"])
            last = None if k is None else a["start"] + a["step"] * max(k - 1, 0)
            r[n.name] = (None, None) if last is None else (min(a["start"], last), max(a["start"], last))
        elif n.op is Op.cumsum or (n.op is Op.reduce and a["fn"] == "sum"):
            r[n.name] = scaled(ins[0], extent(n.inputs[0]))
        elif n.op in (Op.ewise, Op.outer):
            r[n.name] = _combine(a["fn"], ins[0], ins[1]) if a["fn"] not in ("lt", "le", "gt", "ge", "eq", "ne") \
                else (0, 1)
        elif n.op is Op.ewise_const:
            r[n.name] = _combine(a["fn"], ins[0], (a["value"], a["value"]))
        elif n.op is Op.compare:
            r[n.name] = (0, 1)
        elif n.op is Op.where:
            (l1, h1), (l2, h2) = ins[1], ins[2]
            r[n.name] = (None if None in (l1, l2) else min(l1, l2), None if None in (h1, h2) else max(h1, h2))
        elif n.op in (Op.copy, Op.cast, Op.repeat, Op.slice, Op.flatten, Op.sort_rows, Op.ingest) or (
                n.op in (Op.reduce, Op.reduce_rows) and a["fn"] in ("max", "min")):
            r[n.name] = ins[0]
        elif n.op in (Op.lookup, Op.ragged_gather, Op.gather_rows, Op.page_table):
            lo, hi = ins[0]
            if n.op is Op.page_table and lo is not None:
                lo, hi = lo // int(a["page_size"]), hi // int(a["page_size"])
            r[n.name] = (None if lo is None else min(lo, -1), hi)  # guarded reads yield 0 or -1 too
        else:
            r[n.name] = (None, None)
    return r
