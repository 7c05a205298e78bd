"""Canonical text form. Deterministic; ``parse(print_graph(g)) == g``."""

from __future__ import annotations

import json

import sympy

from .graph import Buffer, Graph, Input, Kind, Node, Output
from .ops import AttrValue, Binds
from .types import DType, Dynamic, Placement, TensorType, dim_str


def fmt_attr(v: AttrValue) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, DType | Placement):
        return v.value
    if isinstance(v, Dynamic | sympy.Expr):
        return json.dumps(dim_str(v))
    if isinstance(v, tuple):
        return json.dumps([dim_str(d) for d in v])
    if isinstance(v, Binds):
        return json.dumps(dict(v.pairs), separators=(", ", ": "))
    raise TypeError(f"cannot print attribute {v!r}")


def fmt_type(t: TensorType) -> str:
    return str(t)


def fmt_input(i: Input) -> str:
    s = f"  input %{i.name}: {fmt_type(i.type)} {i.role.value}"
    if i.fill is not None:
        s += f" fill={i.fill}"
    if i.mirror is not None:
        s += f" mirror={i.mirror}"
    if i.kind is not Kind.value:
        s += f" kind={i.kind.value}"
    if i.hi is not None:
        s += f" hi={json.dumps(dim_str(i.hi))}"
    if i.origin:
        s += f" @{json.dumps(i.origin)}"
    return s


def fmt_node(n: Node, kernel: str = "") -> str:
    args = ", ".join(f"%{x}" for x in n.inputs)
    s = f"  %{n.name} = {n.op.value}({args})"
    shown = [(k, v) for k, v in n.attrs if v != Binds()]  # a planner binding no field: the parser's default
    if shown:
        s += " {" + ", ".join(f"{k}={fmt_attr(v)}" for k, v in shown) + "}"
    s += f" : {fmt_type(n.type)} {n.region.value}"
    if n.movable:
        s += " movable"
    if kernel:
        s += f" kernel={kernel}"
    if n.origin:
        s += f" @{json.dumps(n.origin)}"
    return s


def fmt_output(o: Output) -> str:
    s = f"  output {o.field} = %{o.value}"
    if o.ragged_by:
        s += f" ragged_by {o.ragged_by}"
    return s


def fmt_buffer(b: Buffer) -> str:
    vals = ", ".join(f"%{v}" for v in b.values)
    return f"  buffer {b.space.value} {b.use.value} {b.name} [{vals}] offset={b.offset} bytes={b.nbytes}"


def print_graph(g: Graph) -> str:
    syms = ", ".join(f"{k}={v}" for k, v in g.symbols)
    lines = [f"graph {json.dumps(g.name)} [{syms}] {{"]
    lines += [fmt_input(i) for i in g.inputs]
    kernels = g.kernel_of()
    lines += [fmt_node(n, kernels.get(n.name, "")) for n in g.nodes]
    lines += [fmt_output(o) for o in g.outputs]
    lines += [fmt_buffer(b) for b in g.buffers]
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_graph_or_say_why(g: Graph) -> str:
    """``print_graph(g)``, or, for a graph a failure left unprintable (a field no printer knows), what can be said
    of it and the printer's error: what a failure's dump, repro bundle and failure printer write, so none of them
    raises over the error it reports."""
    try:
        return print_graph(g)
    except Exception as e:  # noqa: BLE001 - the printer failing too must not hide the failure being reported
        nodes = "".join(f"//   {n!r}\n" for n in getattr(g, "nodes", ()))
        return (f"// the IR printer failed on this graph: {type(e).__name__}: {e}\n// graph "
                f"{getattr(g, 'name', '?')!r}: {len(getattr(g, 'inputs', ()))} inputs, "
                f"{len(getattr(g, 'nodes', ()))} nodes\n{nodes}")
