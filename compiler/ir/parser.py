"""Parser for the canonical text form (see printer.py)."""

from __future__ import annotations

import json
import re

import sympy

from .graph import Graph, Input, Node, Output, Role
from .ops import OPS, Op
from .types import DType, Dynamic, Placement, Region, TensorType, dim


class ParseError(ValueError):
    def __init__(self, lineno: int, line: str, why: str):
        super().__init__(f"line {lineno}: {why}\n  {line.strip()}")


_STR = r'"(?:[^"\\]|\\.)*"'
_TYPE = r"(\w+)\[(.*?)\]@(\w+)"
_HEADER = re.compile(rf"^graph ({_STR}) \[(.*)\] \{{$")
_INPUT = re.compile(rf"^input %(\w+): {_TYPE} (\w+)(?: fill=(-?\d+))?(?: mirror=(\w+))?(?: offset=(\d+))?"
                    rf"(?: @({_STR}))?$")
_NODE = re.compile(rf"^%(\w+) = (\w+)\((.*?)\)(?: \{{(.*)\}})? : {_TYPE} (\w+)( movable)?(?: kernel=(\w+))?"
                   rf"(?: @({_STR}))?$")
_OUTPUT = re.compile(r"^output (\w+) = %(\w+)(?: ragged_by (\w+))?(?: offset=(\d+))?$")
_ATTR = re.compile(rf"\s*(\w+)=({_STR}|\[[^\]]*\]|[^,\s]+)\s*(?:,|$)")


def _split_top(s: str) -> list[str]:
    """Split at commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _dim(s: str):
    return Dynamic(s[1:]) if s.startswith("?") else dim(s)


def _type(dt: str, dims: str, pl: str) -> TensorType:
    return TensorType(DType(dt), tuple(_dim(d) for d in _split_top(dims)), Placement(pl))


def _attr(op: Op, key: str, raw: str):
    ty = OPS[op].attrs.get(key)
    if ty is None:
        raise ValueError(f"{op.value} has no attribute {key!r}")
    if ty is bool:
        return {"true": True, "false": False}[raw]
    if ty is int:
        return int(raw)
    if ty is str:
        return json.loads(raw)
    if ty is DType:
        return DType(raw)
    if ty is Placement:
        return Placement(raw)
    if ty is tuple:
        return tuple(_dim(d) for d in json.loads(raw))
    return _dim(json.loads(raw))  # a dim


def _attrs(op: Op, s: str | None) -> dict:
    if not s:
        return {}
    return {m.group(1): _attr(op, m.group(1), m.group(2)) for m in _ATTR.finditer(s)}


def parse(text: str) -> Graph:
    """Parse the canonical text form back into a Graph."""
    lines = [(i + 1, ln) for i, ln in enumerate(text.splitlines()) if ln.strip()]
    if not lines:
        raise ParseError(0, "", "empty text")
    lineno, first = lines[0]
    m = _HEADER.match(first.strip())
    if not m:
        raise ParseError(lineno, first, 'expected `graph "name" [symbols] {`')
    name = json.loads(m.group(1))
    symbols = {k: int(v) for k, v in (p.split("=") for p in _split_top(m.group(2)))}
    inputs, nodes, outputs = [], [], []
    for lineno, line in lines[1:]:
        s = line.strip()
        try:
            if s == "}":
                break
            if mi := _INPUT.match(s):
                n, dt, dims, pl, role, fill, mirror, offset, origin = mi.groups()
                inputs.append(Input(n, _type(dt, dims, pl), Role(role), None if fill is None else int(fill),
                                    json.loads(origin) if origin else "", mirror,
                                    None if offset is None else int(offset)))
            elif mn := _NODE.match(s):
                n, op, args, at, dt, dims, pl, region, movable, kernel, origin = mn.groups()
                opv = Op(op)
                ins = tuple(a.strip()[1:] for a in args.split(",") if a.strip())
                nodes.append(Node(n, opv, ins, _attrs(opv, at), _type(dt, dims, pl), Region(region),
                                  bool(movable), json.loads(origin) if origin else "", kernel or ""))
            elif mo := _OUTPUT.match(s):
                off = mo.group(4)
                outputs.append(Output(mo.group(1), mo.group(2), mo.group(3), None if off is None else int(off)))
            else:
                raise ValueError("not an input, node or output line")
        except (ValueError, KeyError, sympy.SympifyError) as e:
            raise ParseError(lineno, line, str(e)) from e
    return Graph(name, tuple(inputs), tuple(nodes), tuple(outputs), symbols)
