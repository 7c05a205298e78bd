"""Parser for the canonical text form (see printer.py).

A small cursor over each line, so every error names the line and the column
where the text stops making sense, and what was expected there."""

from __future__ import annotations

import json
import re

import sympy

from .errors import Diagnostic, UserError
from .graph import Buffer, Graph, Input, Kind, Node, Output, Role, Space, Use
from .ops import OPS, Binds, Op
from .types import DType, Dynamic, Placement, Region, TensorType, dim


class ParseError(UserError):
    rule = "parse"

    def __init__(self, lineno: int, line: str, why: str, col: int | None = None):
        self.lineno, self.col = lineno, col
        where = f"line {lineno}" + (f", column {col + 1}" if col is not None else "")
        caret = f"\n  {' ' * col}^" if col is not None else ""
        super().__init__(f"{where}: {why}\n  {line}{caret}",
                         [Diagnostic("parse", "", f"{lineno}:{(col or 0) + 1}", why)])


_NAME = re.compile(r"[A-Za-z_]\w*")
_INT = re.compile(r"-?\d+")
_STR = re.compile(r'"(?:[^"\\]|\\.)*"')


class _Cursor:
    """One line of text and a position in it; every ``expect`` failure names the column."""

    def __init__(self, lineno: int, line: str):
        self.lineno, self.line, self.i = lineno, line, len(line) - len(line.lstrip())

    def fail(self, why: str, at: int | None = None):
        raise ParseError(self.lineno, self.line, why, self.i if at is None else at)

    def ws(self) -> None:
        while self.i < len(self.line) and self.line[self.i] == " ":
            self.i += 1

    def peek(self, lit: str) -> bool:
        self.ws()
        return self.line.startswith(lit, self.i)

    def take(self, lit: str) -> bool:
        if self.peek(lit):
            self.i += len(lit)
            return True
        return False

    def expect(self, lit: str, what: str = "") -> None:
        if not self.take(lit):
            self.fail(f"expected {what or repr(lit)}")

    def match(self, rx: re.Pattern, what: str) -> str:
        self.ws()
        m = rx.match(self.line, self.i)
        if not m:
            self.fail(f"expected {what}")
        self.i = m.end()
        return m.group(0)

    def name(self, what: str = "a name") -> str:
        return self.match(_NAME, f"{what} (a letter or _, then letters, digits or _)")

    def ref(self) -> str:
        self.expect("%", "a value reference %name")
        return self.name("a value name after %")

    def string(self) -> str:
        raw = self.match(_STR, 'a "quoted string"')
        try:
            return json.loads(raw)
        except json.JSONDecodeError as e:  # a bad escape (\q): JSON's rules, said at the string's place
            self.i -= len(raw) - e.pos
            self.fail(f"a bad escape in the string {raw}: use JSON's escapes (\\\\, \\\", \\n, \\uXXXX)")

    def int(self) -> int:
        return int(self.match(_INT, "an integer"))

    def until(self, stop: str) -> str:
        """Text up to ``stop`` at bracket depth 0 (dims hold commas inside parentheses)."""
        start, depth = self.i, 0
        while self.i < len(self.line):
            ch = self.line[self.i]
            if depth == 0 and self.line.startswith(stop, self.i):
                return self.line[start : self.i]
            depth += ch in "(["
            depth -= ch in ")]"
            self.i += 1
        self.fail(f"expected {stop!r}", start)

    def end(self) -> None:
        self.ws()
        if self.i < len(self.line):
            self.fail("unexpected text at the end of the line")

    def enum(self, cls, what: str):
        at = (self.ws(), self.i)[1]
        word = self.match(re.compile(r"[\w.]+"), what)
        try:
            return cls(word)
        except ValueError:
            self.fail(f"{what} must be one of {[e.value for e in cls]}, got {word!r}", at)

    def dim(self, text: str, at: int, names: bool = False):
        text = text.strip()
        if text.startswith("?"):
            return Dynamic(text[1:])
        try:
            return dim(text, names)
        except (sympy.SympifyError, TypeError, SyntaxError, ValueError) as e:
            self.fail(f"not a dimension expression: {text!r} ({e})", at)

    def type(self) -> TensorType:
        dt = self.enum(DType, "a dtype")
        self.expect("[", "'[' opening the shape")
        dims = []
        while not self.take("]"):
            at = self.i
            dims.append(self.dim(self.until_any(",]"), at))
            self.take(",")
        self.expect("@", "'@' before the placement")
        return TensorType(dt, tuple(dims), self.enum(Placement, "a placement"))

    def until_any(self, stops: str) -> str:
        start, depth = self.i, 0
        while self.i < len(self.line):
            ch = self.line[self.i]
            if depth == 0 and ch in stops:
                return self.line[start : self.i]
            depth += ch in "(["
            depth -= ch in ")]"
            self.i += 1
        self.fail(f"expected one of {list(stops)}", start)


def _attr(c: _Cursor, op: Op, key: str, at: int):
    ty = OPS[op].attrs.get(key)
    if ty is None:
        c.fail(f"{op.value} has no attribute {key!r}; it takes {sorted(OPS[op].attrs)}", at)
    if ty is bool:
        at = (c.ws(), c.i)[1]
        word = c.match(re.compile(r"\w+"), "true or false")
        if word not in ("true", "false"):
            c.fail(f"{op.value} attribute {key} must be true or false, got {word!r}", at)
        return word == "true"
    if ty is int:
        return c.int()
    if ty is str:
        return c.string()
    if ty is DType:
        return c.enum(DType, "a dtype")
    if ty is Placement:
        return c.enum(Placement, "a placement")
    if ty is Binds:
        start = (c.ws(), c.i)[1]
        try:
            pairs, c.i = json.JSONDecoder().raw_decode(c.line, start)
        except json.JSONDecodeError:
            c.fail('expected a JSON object of "role": "value"', start)
        if not isinstance(pairs, dict) or not all(isinstance(v, str) for v in pairs.values()):
            c.fail('binds maps each role to a value name: {"kv_indptr": "kv_indptr"}', start)
        return Binds(tuple(pairs.items()))
    if ty is tuple:
        start = (c.ws(), c.i)[1]
        raw = c.until_any(",}") if not c.peek("[") else c.match(re.compile(r"\[[^\]]*\]"), "a [list]")
        try:
            return tuple(c.dim(d, start) for d in json.loads(raw))
        except json.JSONDecodeError:
            c.fail("expected a JSON list of dims", start)
    start = (c.ws(), c.i)[1]
    return c.dim(c.string(), start)


def _input(c: _Cursor) -> Input:
    name = c.ref()
    c.expect(":", "':' before the type")
    t = c.type()
    role = c.enum(Role, "a role")
    kw: dict = {}
    while c.peek("fill=") or c.peek("mirror=") or c.peek("kind=") or c.peek("hi="):
        key = c.name()
        c.expect("=")
        at = c.i
        if key == "fill":
            kw["fill"] = c.int()
        elif key == "mirror":
            kw["mirror"] = c.name("a field name")
        elif key == "kind":
            kw["kind"] = c.enum(Kind, "an input kind")
        else:
            kw["hi"] = c.dim(c.string(), at, names=True)
    origin = c.string() if c.take("@") else ""
    c.end()
    return Input(name, t, role, kw.get("fill"), origin, kw.get("mirror"), kw.get("kind", Kind.value), kw.get("hi"))


def _node(c: _Cursor) -> Node:
    name = c.ref()
    c.expect("=", "'=' after the value name")
    at = (c.ws(), c.i)[1]
    word = c.name("an op name")
    try:
        op = Op(word)
    except ValueError:
        c.fail(f"unknown op {word!r}; ops: {sorted(o.value for o in Op)}", at)
    c.expect("(", "'(' opening the operands")
    ins = _refs(c, ")", "',' or ')' after an operand")
    a = {}
    if c.take("{"):
        while not c.take("}"):
            at = (c.ws(), c.i)[1]
            key = c.name("an attribute name")
            c.expect("=", "'=' after the attribute name")
            a[key] = _attr(c, op, key, at)
            if not c.take(","):
                c.expect("}", "',' or '}' after an attribute")
                break
    if op is Op.host_call:
        a.setdefault("binds", Binds())  # a planner that plans into no field may leave binds out
    c.expect(":", "':' before the result type")
    t = c.type()
    region = c.enum(Region, "a region (in_graph or out_graph)")
    movable = c.take("movable")
    kernel = ""
    if c.take("kernel="):
        kernel = c.name("a kernel name")
    origin = c.string() if c.take("@") else ""
    c.end()
    return Node(name, op, tuple(ins), a, t, region, movable, origin), kernel


def _refs(c: _Cursor, close: str, what: str) -> list[str]:
    """Comma-separated value references up to ``close`` (the opening bracket already taken)."""
    out = []
    while not c.take(close):
        out.append(c.ref())
        if not c.take(","):
            c.expect(close, what)
            break
    return out


def _output(c: _Cursor) -> Output:
    field = c.name("a field name")
    c.expect("=", "'=' after the field name")
    value = c.ref()
    ragged = c.name("a field name") if c.take("ragged_by") else None
    c.end()
    return Output(field, value, ragged)


def _buffer(c: _Cursor) -> Buffer:
    space, use = c.enum(Space, "a buffer space"), c.enum(Use, "a buffer use")
    name = c.name("a buffer name")
    c.expect("[", "'[' opening the values")
    vals = _refs(c, "]", "',' or ']'")
    c.expect("offset=")
    off = c.int()
    c.expect("bytes=")
    n = c.int()
    c.end()
    return Buffer(space, use, name, tuple(vals), off, n)


def parse(text: str) -> Graph:
    """Parse the canonical text form back into a Graph. Lines starting with ``//`` are comments."""
    lines = [(i + 1, ln.rstrip()) for i, ln in enumerate(text.splitlines())
             if ln.strip() and not ln.lstrip().startswith("//")]
    if not lines:
        raise ParseError(0, "", "empty text: expected `graph \"name\" [symbols] {`")
    lineno, first = lines[0]
    c = _Cursor(lineno, first)
    if not c.take("graph"):
        c.fail('expected `graph "name" [symbols] {`')
    name = c.string()
    c.expect("[", "'[' opening the symbol bindings")
    symbols = {}
    while not c.take("]"):
        k = c.name("a symbol")
        c.expect("=")
        symbols[k] = c.int()
        c.take(",")
    c.expect("{", "'{' opening the graph body")
    c.end()
    inputs, nodes, outputs, buffers, kernels = [], [], [], [], []
    closed = None
    for lineno, line in lines[1:]:
        c = _Cursor(lineno, line)
        if closed is not None:
            c.fail(f"text after the closing '}}' of graph {name!r} (line {closed})")
        try:
            if c.take("}"):
                c.end()
                closed = lineno
            elif c.take("input "):
                inputs.append(_input(c))
            elif c.take("output "):
                outputs.append(_output(c))
            elif c.take("buffer "):
                buffers.append(_buffer(c))
            elif c.peek("%"):
                node, kernel = _node(c)
                nodes.append(node)
                if kernel:
                    kernels.append((node.name, kernel))
            else:
                c.fail("expected an input, node, output or buffer line, or '}'")
        except ParseError:
            raise
        except (ValueError, KeyError, TypeError, sympy.SympifyError) as e:
            raise ParseError(lineno, line, str(e)) from e
    if closed is None:
        last, text_last = lines[-1]
        raise ParseError(last, text_last, f"graph {name!r} is not closed: expected '}}' after this line",
                         len(text_last))
    return Graph(name, tuple(inputs), tuple(nodes), tuple(outputs), symbols, tuple(buffers), tuple(sorted(kernels)))
