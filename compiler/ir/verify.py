"""The one verifier: structure and types of a Graph."""

from __future__ import annotations

import sympy
from attrs import evolve as attrs_evolve

from .errors import Diagnostic, UserError
from .graph import Graph, Kind, Role
from .ops import Op, ShapeError, infer
from .types import SYMBOLS, DType, Dynamic, Placement, TensorType


class VerifyError(UserError):
    """A malformed graph. ``problems`` lists every defect found."""

    rule = "verify"

    def __init__(self, graph: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"graph {graph!r} is malformed:\n" + "\n".join(f"  - {p}" for p in problems),
                         [Diagnostic("verify", "", graph, p) for p in problems])


def _same_type(a: TensorType, b: TensorType) -> bool:
    if (a.dtype, a.placement, len(a.shape)) != (b.dtype, b.placement, len(b.shape)):
        return False
    for x, y in zip(a.shape, b.shape, strict=True):
        if isinstance(x, Dynamic) or isinstance(y, Dynamic):
            if not (isinstance(x, Dynamic) and isinstance(y, Dynamic)):
                return False
        elif sympy.simplify(x - y) != 0:
            return False
    return True


def _where(origin: str) -> str:
    return f" (from {origin})" if origin else ""


def verify(g: Graph) -> Graph:
    """Check names, def-before-use, op arity/attributes/types and outputs.

    Raises VerifyError listing every problem; returns ``g`` unchanged.
    """
    bad = _type_problems(g)
    if bad:  # every later check reads these fields: stop before they crash on them
        raise VerifyError(g.name, bad)
    problems: list[str] = []
    types: dict[str, TensorType] = {}
    known = set(SYMBOLS)
    for i in g.inputs:
        if i.name in types:
            problems.append(f"input %{i.name} is defined twice")
        types[i.name] = i.type
        if i.mirror is not None and i.mirror != i.name and any(j.name == i.mirror and j.type.dtype != i.type.dtype
                                                               for j in g.inputs):
            problems.append(f"input %{i.name} mirrors %{i.mirror}, which has another dtype")
        if i.role is Role.pool and i.fill is not None:
            problems.append(f"pool input %{i.name} cannot have a fill value; only batch inputs are padded")
        if i.role is Role.batch and "bs" not in g.env and not _per_row(i.type):
            problems.append(f"batch input %{i.name} has leading extent {i.type.shape[0] if i.type.shape else '()'}: "
                            "batch inputs are per-request rows ([bs] or [k*bs]) that padding fills row by row; "
                            "compute indptrs and totals in the graph")
        if i.kind is not Kind.value and i.type.dtype.value not in ("i32", "i64"):
            problems.append(f"input %{i.name} of kind {i.kind.value} must be an integer, got {i.type}")
        problems += _relation_problems(i, g)
    for n in g.nodes:
        where = _where(n.origin)
        if n.name in types:
            problems.append(f"%{n.name} is defined twice{where}")
        missing = [x for x in n.inputs if x not in types]
        if missing:
            problems.append(f"%{n.name} = {n.op.value}(...) uses undefined value(s) "
                            f"{', '.join('%' + m for m in missing)}{where}; define them earlier in the spec")
            types[n.name] = n.type
            continue
        try:
            want = infer(n.op, [types[x] for x in n.inputs], n.a)
        except ShapeError as e:
            problems.append(f"%{n.name}: {e}{where}")
        else:
            if not _same_type(want, n.type):
                problems.append(f"%{n.name} = {n.op.value}: declared type {n.type} but the op rule gives {want}{where}")
        free = {str(s) for d in n.type.shape if not isinstance(d, Dynamic) for s in d.free_symbols}
        if free - known:
            problems.append(f"%{n.name} uses unknown symbols {sorted(free - known)}{where}")
        types[n.name] = n.type
    fields = [o.field for o in g.outputs]
    for o in g.outputs:
        if o.value not in types:
            problems.append(f"output {o.field} names undefined value %{o.value}")
        if fields.count(o.field) > 1:
            problems.append(f"output field {o.field} is bound twice")
        if o.ragged_by is not None and o.ragged_by not in fields:
            problems.append(f"output {o.field} is ragged_by {o.ragged_by}, which is not an output field")
    bound = {o.value for o in g.outputs}
    for n in g.nodes:
        if n.op is Op.host_call:
            for role, v in n.a["binds"].pairs:
                if v not in bound:
                    problems.append(f"planner %{n.name} binds {role} to %{v}, which is no metadata field"
                                    f"{_where(n.origin)}; a planner plans into fields: bind it with b.outputs too")
    problems += _layout_problems(g, types)
    if problems:
        raise VerifyError(g.name, sorted(set(problems), key=problems.index))
    return g


def _type_problems(g: Graph) -> list[str]:
    """Types whose fields are not the IR's own (a string for a DType, a float for an extent): a graph a pass or
    a hand-made spec built past the builder's checks."""
    out = []
    for what, name, t in [*(("input", i.name, i.type) for i in g.inputs), *(("value", n.name, n.type)
                                                                             for n in g.nodes)]:
        if not isinstance(t, TensorType):
            out.append(f"{what} %{name} has type {t!r}, not a TensorType")
            continue
        for field, v, cls in (("dtype", t.dtype, DType), ("placement", t.placement, Placement)):
            if not isinstance(v, cls):
                out.append(f"{what} %{name} has {field} {v!r} ({type(v).__name__}), not a {cls.__name__}")
        if any(not isinstance(d, sympy.Expr | Dynamic) for d in t.shape):
            out.append(f"{what} %{name} has shape {t.shape!r}: each extent is an expression or Dynamic")
    return out


def _relation_problems(i, g: Graph) -> list[str]:
    """A bound naming another input (``hi="L - D + extend_seq_lens"``) is a per-row bound between two lengths
    of the same rows: one other batch input, added once, itself bounded by a number."""
    rel = i.relation
    if rel is None:
        return []
    other = next((j for j in g.inputs if j.name == rel[0]), None)
    named = [s.name for s in i.hi.free_symbols if s.name not in SYMBOLS]
    where = f"input %{i.name}'s bound hi={i.hi}"
    if other is None:
        return [f"{where} names {rel[0]!r}, which is not an input of this graph (a bound names symbols "
                f"{sorted(SYMBOLS)} or one other batch input)"]
    if len(named) > 1 or any(s.name == rel[0] for s in rel[1].free_symbols):
        return [f"{where}: a per-row bound adds one other input once (like 'L - D + {rel[0]}')"]
    if i.kind is not Kind.length or other.kind is not Kind.length or other.role is not Role.batch:
        return [f"{where}: a per-row bound relates two lengths of the batch (kind=length both)"]
    if other.relation is not None or not _same_type(i.type, attrs_evolve(other.type, dtype=i.type.dtype)):
        return [f"{where}: {rel[0]!r} must have one value per row like {i.name!r} and a bound of its own"]
    return []


def _per_row(t: TensorType) -> bool:
    """A leading extent k*bs (k >= 1 free of bs): padding fills whole rows of it."""
    if not t.shape or isinstance(t.shape[0], Dynamic):
        return False
    bs, e = SYMBOLS["bs"], sympy.expand(t.shape[0])
    k = sympy.simplify(e / bs)
    return e.subs(bs, 0) == 0 and bs not in k.free_symbols and k != 0


def _layout_problems(g: Graph, types: dict[str, TensorType]) -> list[str]:
    """The no-alias invariant: regions of one space never overlap, and name values that exist."""
    problems = []
    by_space: dict = {}
    for b in g.buffers:
        missing = [v for v in b.values if v not in types]
        if missing:
            problems.append(f"buffer {b.name} holds undefined value(s) {', '.join('%' + m for m in missing)}")
        if b.offset < 0 or b.nbytes < 0:
            problems.append(f"buffer {b.name} has a negative offset or size ({b.offset}, {b.nbytes})")
        by_space.setdefault(b.space, []).append(b)
    for space, bufs in by_space.items():
        reach = None  # the region reaching furthest so far: any later start before its end overlaps it
        for b in sorted((b for b in bufs if b.nbytes), key=lambda b: b.offset):
            if reach is not None and b.offset < reach.end:
                problems.append(f"{space.value} buffers {reach.use.value} {reach.name} [{reach.offset}, {reach.end}) "
                                f"and {b.use.value} {b.name} [{b.offset}, {b.end}) overlap: their values would alias")
            if reach is None or b.end > reach.end:
                reach = b
    return problems
