"""The one verifier: structure and types of a Graph."""

from __future__ import annotations

import sympy

from .graph import Graph, Role
from .ops import ShapeError, infer
from .types import SYMBOLS, Dynamic, TensorType


class VerifyError(ValueError):
    """A malformed graph. ``problems`` lists every defect found."""

    def __init__(self, graph: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"graph {graph!r} is malformed:\n" + "\n".join(f"  - {p}" for p in problems))


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
    if problems:
        raise VerifyError(g.name, sorted(set(problems), key=problems.index))
    return g
