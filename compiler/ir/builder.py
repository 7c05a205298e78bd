"""The spec builder DSL: backends declare their metadata steps with it.

    b = SpecBuilder("flashinfer.decode")
    seq_lens = b.input("seq_lens", DType.int32, ["bs"], fill=1)
    with b.in_graph():
        kv_indptr = b.cumsum(seq_lens, leading_zero=True)
    b.outputs(kv_indptr=kv_indptr)
    graph = b.build()

Each node records the spec line that made it, so every later diagnostic
points back at the author's code. Types are inferred by the op table as
nodes are added, so a shape error surfaces at the line that caused it.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import re
import sys
from collections.abc import Iterator

import attrs

from .errors import UserError
from .graph import Graph, Input, Kind, Node, Output, Role
from .ops import AttrValue, Binds, Op, ShapeError, coerce_attrs, infer
from .types import DType, Placement, Region, TensorType, dim

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SpecError(UserError):
    """A malformed spec: names the spec line and what to change."""

    rule = "spec"


class SpecWarning(UserWarning):
    """A legal spec that may not say what its author meant (an op left in the default region)."""


def caller_origin(here: str | None = None) -> str:
    """``path:line`` of the first frame outside the IR package (or the directory ``here``) and outside the code
    attrs generates (its validators run in ``<attrs generated ...>`` frames, no line a user could open)."""
    here = here or os.path.dirname(os.path.abspath(__file__))
    f = sys._getframe(1)
    while f is not None and (f.f_code.co_filename.startswith("<attrs generated")
                             or os.path.abspath(f.f_code.co_filename).startswith(here + os.sep)):
        f = f.f_back
    if f is None:
        return "<unknown>"
    path = os.path.abspath(f.f_code.co_filename)
    rel = os.path.relpath(path, _ROOT) if path.startswith(_ROOT) else os.path.basename(path)
    return f"{rel}:{f.f_lineno}"


_ASSIGN = re.compile(r"^\s*([A-Za-z_]\w*)\s*=(?!=)\s*\w+\.\w+\((.*)$")


def caller_assignment() -> str | None:
    """The variable the spec line being built assigns, when that line is ``name = b.op(...)`` with no
    other call on it (so the value made is the one assigned): a readable name for an unnamed value."""
    here = os.path.dirname(os.path.abspath(__file__))
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == here:
        f = f.f_back
    if f is None:
        return None
    m = _ASSIGN.match(linecache.getline(f.f_code.co_filename, f.f_lineno).split("#", 1)[0])
    if m is None or "(" in m.group(2) or m.group(1) == "_":
        return None
    return m.group(1)


@attrs.frozen
class V:
    """A value handle returned by the builder."""

    name: str
    type: TensorType
    owner: object = attrs.field(default=None, eq=False, repr=False)  # the builder that made it


class SpecBuilder:
    def __init__(self, name: str):
        self.name = name
        self._inputs: list[Input] = []
        self._nodes: list[Node] = []
        self._outputs: list[Output] = []
        self._region = Region.in_graph
        self._movable = False
        self._depth = 0  # in_graph()/out_graph() blocks open: an op outside every one takes the default region
        self.defaulted: list[str] = []  # spec lines of the ops placed by default (in_graph), for the warning
        self._n = 0
        self._names: set[str] = set()

    # --- regions ---
    @contextlib.contextmanager
    def _in(self, region: Region, movable: bool) -> Iterator[None]:
        old = self._region, self._movable
        self._region, self._movable = region, movable
        self._depth += 1
        try:
            yield
        finally:
            self._region, self._movable = old
            self._depth -= 1

    def in_graph(self):
        """Steps recorded into the CUDA graph: static-shape device work."""
        return self._in(Region.in_graph, False)

    def out_graph(self, movable: bool = False):
        """Host-side steps run before every replay. ``movable``: the author
        declares the steps pure device work that hoist-upgrades may record."""
        return self._in(Region.out_graph, movable)

    # --- declarations ---
    def _fresh(self, name: str | None, derive: bool = False) -> str:
        if name is None and derive:  # named after the variable the spec assigns it to, if that is free
            var = caller_assignment()
            if var is not None:
                k, cand = 0, var
                while cand in self._names or re.fullmatch(r"v\d+", cand):
                    k += 1
                    cand = f"{var}_{k}"
                name = cand
        auto = False
        while name is None or (auto and name in self._names):
            auto = True  # auto names skip any taken one (inlined graphs bring their own)
            self._n += 1
            name = f"v{self._n}"
        if name in self._names:
            raise SpecError(f"{caller_origin()}: value name %{name} is used twice in spec {self.name!r}")
        self._names.add(name)
        return name

    def input(self, name: str, dtype: DType, shape: list, placement: Placement = Placement.device,
              fill: int | None = None, role: Role = Role.batch, mirror: str | None = None,
              kind: Kind = Kind.value, hi=None) -> V:
        """A ForwardBatch field (``role=batch``, padded with ``fill``) or a pool. ``mirror`` names a
        host field with the same values, so staging never reads the device copy. ``kind`` says what
        the values mean (a length, a pool row, a KV slot): every live value is checked against its
        range before a step runs; ``hi`` overrides the kind's upper bound (e.g. ``"L - D"``)."""
        if not isinstance(kind, Kind):
            raise SpecError(f"{caller_origin()}: kind must be one of {[k.value for k in Kind]}, got {kind!r}")
        for what, v, cls in (("dtype", dtype, DType), ("placement", placement, Placement), ("role", role, Role)):
            if not isinstance(v, cls):
                raise SpecError(f"{caller_origin()}: input {name!r} has {what} {v!r} ({type(v).__name__}); declare "
                                f"one of {cls.__name__}'s members, e.g. {cls.__name__}.{next(iter(cls)).name} (from "
                                "attnmeta.compiler.ir import DType, Placement, Role)")
        if fill is not None and (isinstance(fill, bool) or not isinstance(fill, int)):
            raise SpecError(f"{caller_origin()}: input {name!r} has fill {fill!r} ({type(fill).__name__}); a fill "
                            "is an int of the input's dtype (padded rows hold it)")
        if kind is not Kind.value and dtype not in (DType.int32, DType.int64):
            raise SpecError(f"{caller_origin()}: input {name!r} holds {kind.value}s but has dtype "
                            f"{getattr(dtype, 'value', dtype)}; {kind.value}s are integers: declare it DType.int32 "
                            "or DType.int64 (a float has no exact value to range-check, a bool no range)")
        try:
            t = TensorType(dtype, tuple(shape), placement)
        except (TypeError, ValueError, SyntaxError) as e:
            raise SpecError(f"{caller_origin()}: input {name!r} has a malformed shape {shape!r}: {e}") from None
        self._check_shape(name, t)
        self._inputs.append(Input(self._fresh(name), t, role, fill, caller_origin(), mirror, kind, hi))
        return V(name, t, self)

    @staticmethod
    def _check_shape(name: str, t: TensorType) -> None:
        neg = [d for d in t.shape if getattr(d, "is_Integer", False) and int(d) < 0]
        if neg:
            raise SpecError(f"{caller_origin()}: {name!r} has a negative extent in shape {t}; extents are >= 0")

    def pool(self, name: str, dtype: DType, shape: list, placement: Placement = Placement.device) -> V:
        """An engine tensor bound at instantiate (``req_to_token``, ``full_to_swa``); its extents may name R
        (pool rows) and N (KV slots), which the bound tensor decides."""
        return self.input(name, dtype, shape, placement, None, Role.pool)

    def op(self, op: Op | str, *ins: V, name: str | None = None, **a: AttrValue) -> V:
        """Any op of the op table by name, with its attributes (the methods below are this, typed)."""
        if not isinstance(op, Op):
            try:
                op = Op(op)
            except ValueError:
                raise SpecError(f"{caller_origin()}: unknown op {op!r}; ops: {sorted(o.value for o in Op)}") from None
        for v in ins:
            if not isinstance(v, V) or v.owner is not self:
                what = f"%{v.name}" if isinstance(v, V) else repr(v)
                raise SpecError(f"{caller_origin()}: {op.value} operand {what} is not a value of spec {self.name!r}; "
                                "use values this builder returned (not another builder's, nor a Python number: "
                                "b.full(...) makes a constant)")
        try:
            a = coerce_attrs(op, a)
        except (TypeError, ValueError, SyntaxError) as e:  # an extent that is no expression of the symbols
            raise SpecError(f"{caller_origin()}: {op.value}: {e}") from None
        return self._op_at(op, list(ins), a, name, caller_origin())

    # --- sugar for the op table ---
    def full(self, value: int, shape: list, dtype: DType, placement=Placement.device, name=None) -> V:
        """A constant tensor of ``shape`` filled with ``value`` (evaluated once, when a plan is bound)."""
        return self.op(Op.full, value=value, shape=tuple(shape), dtype=dtype, placement=placement, name=name)

    def arange(self, n, start=0, step=1, dtype=DType.int32, placement=Placement.device, name=None) -> V:
        """``start, start + step, ...``: ``n`` values (``n`` may be a symbol such as ``"bs + 1"``)."""
        return self.op(Op.arange, start=start, step=step, n=n, dtype=dtype, placement=placement, name=name)

    def cumsum(self, x: V, leading_zero: bool = True, name=None) -> V:
        """Running sum of ``x``; with ``leading_zero`` one longer, starting at 0 (an indptr from lengths)."""
        return self.op(Op.cumsum, x, leading_zero=leading_zero, name=name)

    def cast(self, x: V, dtype: DType, name=None) -> V:
        """``x`` converted to ``dtype`` (int32 <-> int64 narrowing is checked at the boundary, not here)."""
        return self.op(Op.cast, x, dtype=dtype, name=name)

    def ewise(self, fn: str, x: V, y: V | int, name=None) -> V:
        """Elementwise ``fn(x, y)``, ``fn`` one of add, sub, mul, floordiv, ceildiv, mod, min, max; ``y`` a value
        of ``x``'s shape or an int constant."""
        if isinstance(y, bool) or (not isinstance(y, (int, V))):
            raise SpecError(f"{caller_origin()}: ewise {fn!r}'s second operand must be a value or an int constant, got "
                            f"{type(y).__name__} {y!r}")
        if isinstance(y, int):
            if y == 0 and fn in ("floordiv", "ceildiv", "mod"):
                raise SpecError(f"{caller_origin()}: ewise {fn!r} by the constant 0: every step would divide by zero")
            return self.op(Op.ewise_const, x, fn=fn, value=y, name=name)
        return self.op(Op.ewise, x, y, fn=fn, name=name)

    def ragged_gather(self, table: V, rows: V, lens: V, indptr: V, capacity, jump: tuple[V, ...] | None = None,
                      name=None) -> V:
        """Row i's first lens[i] columns of table[rows[i]] at indptr[i]; ``jump=(split, shift)``
        skips shift[i] columns from entry split[i] on (a draft branch's own slots), and a second pair
        ``(split, shift, split2, shift2)`` adds its shift from its own split on (a window that starts past
        column 0 and runs into a branch's slots)."""
        return self.op(Op.ragged_gather, table, rows, lens, indptr, *(jump or ()), capacity=capacity, name=name)

    def clamp(self, x: V, lo: int, hi: int, name=None) -> V:
        """x kept inside [lo, hi]."""
        return self.op(Op.clamp, x, lo=lo, hi=hi, name=name)

    def log2_scale(self, x: V, scale: int, divisor: int, name=None) -> V:
        """int32(scale * max(log2(x / divisor), 1)), computed in float32 (an SM-count heuristic term)."""
        return self.op(Op.log2_scale, x, scale=scale, divisor=divisor, name=name)

    def reduce(self, fn: str, x: V, name=None) -> V:
        """``x`` reduced to a scalar by ``fn`` (sum, max, min): on the device, a 0-d tensor."""
        return self.op(Op.reduce, x, fn=fn, name=name)

    def slice(self, x: V, start, stop, name=None) -> V:
        """Rows ``x[start:stop]`` with static bounds (slice-to-bs, a TBO child's rows)."""
        return self.op(Op.slice, x, start=start, stop=stop, name=name)

    def compare(self, fn: str, x: V, y: V | int, name=None) -> V:
        """Elementwise comparison ``fn(x, y)`` (lt, le, gt, ge, eq, ne) to a bool value."""
        if isinstance(y, int):
            y = self.full(y, [], x.type.dtype, x.type.placement)
        return self.op(Op.compare, x, y, fn=fn, name=name)

    def where(self, cond: V, x: V, y: V | int, name=None) -> V:
        """``x`` where ``cond`` holds, else ``y`` (a value or an int constant)."""
        if isinstance(y, int):
            y = self.full(y, [], x.type.dtype, x.type.placement)
        return self.op(Op.where, cond, x, y, name=name)

    def page_table(self, table: V, rows: V, lens: V, page_size: int, width, name=None) -> V:
        """``out[i, j] = table[rows[i], j * P] // P`` for the pages ``j < ceil(lens[i] / P)``, 0 past them, at a
        static ``width`` (e.g. ``"ceil(L / P)"``); a row outside the table reads row 0."""
        return self.op(Op.page_table, table, rows, lens, page_size=page_size, width=width, name=name)

    def repeat(self, x: V, times, name=None) -> V:
        """Each entry of ``x`` ``times`` times in a row (repeat_interleave by a constant)."""
        return self.op(Op.repeat, x, times=times, name=name)

    def lookup(self, table: V, idx: V, name=None) -> V:
        """``table[idx]`` (e.g. full-pool slots to sliding-window ones); an index outside reads ``table[0]``."""
        return self.op(Op.lookup, table, idx, name=name)

    def outer(self, fn: str, x: V, y: V, name=None) -> V:
        """``out[i, j] = fn(x[i], y[j])`` (an ewise function by name)."""
        return self.op(Op.outer, x, y, fn=fn, name=name)

    def gather_rows(self, table: V, rows: V, cols: V, name=None) -> V:
        """``out[i, j] = table[rows[i], cols[i, j]]``, -1 where a column is outside the row; a row outside the
        table reads row 0."""
        return self.op(Op.gather_rows, table, rows, cols, name=name)

    def flatten(self, x: V, name=None) -> V:
        """``[n, m]`` to ``[n * m]``, row-major (per-request rows to per-token values)."""
        return self.op(Op.flatten, x, name=name)

    def copy(self, x: V, name=None) -> V:
        """A copy of ``x`` (to bind one value to a second output field)."""
        return self.op(Op.copy, x, name=name)

    def host_call(self, target: str, *ins: V, binds: dict[str, V] | None = None, name=None) -> V:
        """A host planner ``target`` run out of graph on the host values ``ins``, planning into the
        fields ``binds`` names (role -> a value bound as a field): the runtime hands the planner
        those fields' static buffers, by role, as its site."""
        pairs = []
        for role, v in (binds or {}).items():
            if not isinstance(v, V) or v.owner is not self:
                raise SpecError(f"{caller_origin()}: host_call {target!r} binds {role!r} to {v!r}, not a value of "
                                f"spec {self.name!r}")
            pairs.append((role, v.name))
        return self.op(Op.host_call, *ins, target=target, binds=Binds(tuple(pairs)), name=name)

    def inline(self, g: Graph, inputs: dict[str, V], bs=None, prefix: str = "",
               subs: dict[str, object] | None = None, rewrite=None) -> dict[str, V]:
        """Re-declare ``g``'s nodes here on ``inputs`` (its input name -> a value of this builder),
        each in its own region; ``bs`` replaces the batch-size symbol in attributes (a child's
        size), ``subs`` any symbol (MultiStep's bs*K rows); ``rewrite(node, ins)`` may change a
        node's inputs (MultiStep's branch gather). Returns ``g``'s outputs as field -> value."""
        from .ops import norm_attr
        from .types import SYMBOLS

        sub = {SYMBOLS[k]: dim(v) for k, v in (subs or {}).items()}
        if bs is not None:
            sub[SYMBOLS["bs"]] = dim(bs)
        env = {i.name: inputs[i.name] for i in g.inputs}
        planners = []  # (index here, node): binds name values that may come later in g's order
        for n in g.nodes:
            a = {k: norm_attr(v.xreplace(sub) if hasattr(v, "xreplace") else
                              tuple(d.xreplace(sub) for d in v) if isinstance(v, tuple) else v)
                 for k, v in n.attrs}
            name = prefix + n.name
            ins = [env[x] for x in n.inputs]
            if n.op is Op.host_call:
                planners.append(len(self._nodes))
            with self._in(n.region, n.movable):  # a name taken here already gets a fresh one
                env[n.name] = self._op_at(n.op, rewrite(n, ins) if rewrite else ins, a,
                                          None if name in self._names else name, n.origin)
        for k in planners:  # a planner's binds follow its fields to their names here
            node = self._nodes[k]
            binds = node.a["binds"].rename(lambda v: env[v].name)
            self._nodes[k] = attrs.evolve(node, attrs=tuple((a, binds if a == "binds" else x) for a, x in node.attrs))
        return {o.field: env[o.value] for o in g.outputs}

    def _op_at(self, op: Op, ins: list[V], a: dict, name: str | None, origin: str) -> V:
        try:
            t = infer(op, [v.type for v in ins], a)
        except ShapeError as e:
            raise SpecError(f"{origin}: {e}") from None
        except (TypeError, ValueError, SyntaxError) as e:  # a malformed attribute (a dim that is no expression)
            raise SpecError(f"{origin}: {op.value}: {e}") from None
        self._check_shape(name or op.value, t)
        if not self._depth and op not in (Op.full, Op.arange):  # a constant is made once at bind, in no region
            self.defaulted.append(origin)
        node = Node(self._fresh(name, derive=True), op, tuple(v.name for v in ins), a, t, self._region,
                    self._movable, origin)
        self._nodes.append(node)
        return V(node.name, t, self)

    def outputs(self, ragged: dict[str, str] | None = None, **fields: V) -> None:
        """Bind metadata fields; ``ragged`` maps a field to the indptr field bounding it."""
        for f, v in fields.items():
            if not isinstance(v, V) or v.owner is not self:
                raise SpecError(f"{caller_origin()}: field {f} is bound to {v!r}, not a value of spec {self.name!r}")
            self._outputs.append(Output(f, v.name, (ragged or {}).get(f)))

    def build(self) -> Graph:
        """The graph, through the verifier: a malformed spec fails here, naming the node and its spec line."""
        from .verify import verify  # the builder's graphs go through the one verifier

        if not self._outputs:
            raise SpecError(f"{caller_origin()}: spec {self.name!r} binds no field: declare what its kernels read with "
                            "b.outputs(kv_indptr=..., ...) before b.build()")
        if self.defaulted:
            import warnings

            warnings.warn(SpecWarning(f"{self.defaulted[0]}: an op of spec {self.name!r} outside `with b.in_graph():` "
                                      f"or `with b.out_graph():` is placed in_graph (the default; "
                                      f"{len(self.defaulted)} such op(s)); say which region it belongs to"),
                          stacklevel=2)
        return verify(Graph(self.name, tuple(self._inputs), tuple(self._nodes), tuple(self._outputs)))
