"""Graph, nodes, inputs and outputs: a flat SSA program, jaxpr-style.

Everything is frozen; a pass builds a new Graph. Value names are unique
strings; a node defines exactly one value, named ``node.name``.
"""

from __future__ import annotations

import enum
import functools

import attrs
import networkx as nx
import sympy

from .ops import AttrValue, Op, norm_attr
from .types import SYMBOLS, Dim, Region, TensorType, dim

# ops whose row i depends only on row i of their operands (or whole 1-D tables): prefix-preserving
_ROWWISE = (Op.ewise, Op.ewise_const, Op.cast, Op.compare, Op.where, Op.copy, Op.cumsum, Op.lookup, Op.flatten,
            Op.sort_rows, Op.reduce_rows)




class Role(enum.Enum):
    batch = "batch"  # per-step ForwardBatch field, rows padded to the captured bs
    pool = "pool"  # persistent tensor bound once (req_to_token, KV pool)
    # the device guard's inputs (added by guard-inputs; the runtime binds them, no batch field does):
    feed = "feed"  # a device batch input's values handed over on the device, copied by out_graph (int64; past the
    #                live rows the sentinel: there the staged value, the fill, is read)
    engine = "engine"  # the engine's own buffer of a batch input, which a graph captured on it reads in place
    #                    (bound to the input's feed where no engine buffer is)
    word = "word"  # the backend's engine word: 1 while a step's graph reads the engine's buffers, else 0
    generation = "generation"  # the batch size the mode's staging was last written for (staged every step)
    record = "record"  # the device-fault record: pinned and mapped, the device writes it, the host reads it in place

    @property
    def guard(self) -> bool:
        """One of the device guard's inputs (not a batch field, not a pool)."""
        return self not in (Role.batch, Role.pool)


class Kind(enum.Enum):
    """What a batch input's values mean. It sets the range every live value is checked against
    before a step runs, and which padding fills are safe (check-split)."""

    value = "value"  # no index meaning: any value of its dtype
    length = "length"  # a token count: 0 .. hi (default L, the context length)
    row = "row"  # a row of req_to_token: 1 .. R-1 (row 0 is reserved: padded rows read it)
    slot = "slot"  # a KV-cache slot: 0 .. N-1 (slot 0 is reserved: padded rows write it)


class Space(enum.Enum):
    staging = "staging"  # the packed per-step input buffer (pinned host, and its device twin)
    arena = "arena"  # static device buffers: metadata fields, intermediates, crossings
    host = "host"  # static host buffers out_graph writes its host values into


class Use(enum.Enum):
    input = "input"  # batch inputs staged from one ForwardBatch field (a device field and its host mirror)
    field = "field"  # a metadata field the kernels read
    value = "value"  # an in_graph intermediate a fused kernel may store, or a constant
    crossing = "crossing"  # an out_graph device value the graph reads
    host = "host"  # an out_graph host value
    feed = "feed"  # a device batch input's feed (guard-inputs): the sentinel until a step feeds it


ALIGN = 16  # bytes: every region starts aligned for any dtype and vector copies


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@attrs.frozen
class Buffer:
    """A static buffer region of one mode, laid out at max_bs by pack-inputs (staging) and
    plan-buffers (arena, host). Offsets are bytes from the mode's base; regions in one space
    never overlap (the verifier checks it), so no two live values of a mode share memory."""

    space: Space
    use: Use
    name: str  # the staging source field, the metadata field, or the value held
    values: tuple[str, ...]  # the IR values read from or written to it
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


def _attrs(a: dict[str, AttrValue] | tuple) -> tuple[tuple[str, AttrValue], ...]:
    if isinstance(a, tuple):  # passes rebuild nodes with the attributes they had: normalise each once
        return _normal(a)
    return tuple(sorted((k, norm_attr(v)) for k, v in a.items()))


@functools.lru_cache(maxsize=1 << 16)
def _normal(a: tuple) -> tuple[tuple[str, AttrValue], ...]:
    return tuple(sorted((k, norm_attr(v)) for k, v in a))


@attrs.frozen
class Input:
    name: str  # the ForwardBatch field or pool name it is bound from
    type: TensorType
    role: Role = Role.batch
    fill: int | None = None  # value written into padded rows (batch inputs)
    origin: str = ""
    mirror: str | None = None  # host field holding the same values (staged from it: no device read)
    kind: Kind = Kind.value
    hi: Dim | None = attrs.field(default=None, converter=lambda d: None if d is None else dim(d, names=True))  # bound

    @property
    def source(self) -> str:
        """The ForwardBatch field the runtime stages this input from."""
        return self.mirror or self.name

    @property
    def relation(self) -> tuple[str, Dim] | None:
        """``(other, bound)`` when ``hi`` names another batch input: a per-row bound, ``self[r] - other[r] <=
        bound`` (``hi="L - D + extend_seq_lens"``: a draft extend's keys, seq - extend + D, fit L)."""
        if self.hi is None or not isinstance(self.hi, sympy.Expr):
            return None
        named = sorted((s for s in self.hi.free_symbols if s.name not in SYMBOLS), key=lambda s: s.name)
        return (named[0].name, sympy.expand(self.hi - named[0])) if named else None

    def upper(self, inputs: dict[str, Input]) -> Dim | None:
        """``hi`` as one bound for every row: a relation's other input at its own largest value (its ``hi``, else
        L), what range checks, narrowing and the value analysis use."""
        rel = self.relation
        if rel is None:
            return self.hi
        other = inputs.get(rel[0])
        top = other.hi if other is not None and other.hi is not None else SYMBOLS["L"]
        return sympy.expand(rel[1] + top)


@attrs.frozen
class Node:
    name: str
    op: Op
    inputs: tuple[str, ...]
    attrs: tuple[tuple[str, AttrValue], ...] = attrs.field(converter=_attrs)
    type: TensorType
    region: Region
    movable: bool = False
    origin: str = ""  # spec line ("backends/flashinfer/spec.py:31") or "pass:<name>"

    @property
    def a(self) -> dict[str, AttrValue]:
        return dict(self.attrs)


@attrs.frozen
class Output:
    field: str  # metadata field name the kernels read
    value: str
    ragged_by: str | None = None  # indptr output whose last entry bounds the valid prefix


@attrs.frozen
class Graph:
    name: str
    inputs: tuple[Input, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Output, ...]
    symbols: tuple[tuple[str, int], ...] = attrs.field(converter=lambda s: tuple(sorted(dict(s).items())), default=())
    buffers: tuple[Buffer, ...] = ()  # the static layout (pack-inputs, plan-buffers); empty before them
    kernels: tuple[tuple[str, str], ...] = ()  # node -> the fused kernel it lowers into (fuse); sorted
    # what analyses derive from this graph (its constants, index roles), kept with it: a new graph
    # (attrs.evolve) starts empty, so nothing global is keyed by a graph's id
    memo: dict = attrs.field(factory=dict, init=False, eq=False, repr=False)

    def kernel_of(self) -> dict[str, str]:
        return dict(self.kernels)

    def buffer_of(self, space: Space, use: Use, name: str) -> Buffer | None:
        return next((b for b in self.buffers if b.space is space and b.use is use and b.name == name), None)

    # --- lookups (derived, never stored) ---
    def types(self) -> dict[str, TensorType]:
        t = {i.name: i.type for i in self.inputs}
        t.update((n.name, n.type) for n in self.nodes)
        return t

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named %{name} in graph {self.name}")

    def input(self, name: str) -> Input:
        for i in self.inputs:
            if i.name == name:
                return i
        raise KeyError(f"no input named %{name} in graph {self.name}")

    def producers(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}

    def users(self) -> dict[str, list[Node]]:
        u: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                u.setdefault(i, []).append(n)
        return u

    def constants(self) -> tuple[str, ...]:
        if "constants" not in self.memo:
            self.memo["constants"] = self._constants()
        return self.memo["constants"]

    def _constants(self) -> tuple[str, ...]:
        """Values fixed once a plan is bound, in program order: ``full``/``arange``, and recordable
        ops over those alone (``arange // K``, ``outer`` of two constants), evaluated at bind
        instead of every step. Never through a metadata field: the engine may write into a field's
        buffer (the verify mask), and what reads it must see that. An op with an empty operand (a
        TBO child of size 0) is one too: with no rows, what it yields depends on no data at all
        (an empty result, an identity, an untouched buffer), whatever its other operands hold."""
        from .ops import CONST_OPS, OPS

        types, fields, out = self.types(), {o.value for o in self.outputs}, {}
        empty = {x for x, t in types.items() if any(isinstance(d, sympy.Integer) and d == 0 for d in t.shape)}
        bound = {i.name for i in self.inputs}  # what a plan has when it is bound: inputs, row ranges of them
        bound |= {n.name for n in self.nodes if n.op is Op.slice and n.inputs[0] in bound and n.name not in fields}
        for n in self.nodes:
            if n.op in CONST_OPS:
                out[n.name] = None
            elif n.inputs and OPS[n.op].recordable and n.op is not Op.host_call:
                rowless = any(x in empty for x in n.inputs) and all(x in out or x in bound for x in n.inputs)
                if rowless or all(x in out and x not in fields for x in n.inputs):
                    out[n.name] = None
        return tuple(out)

    def stable_constants(self) -> frozenset[str]:
        """Constants of a mode-generic graph whose value at any batch size is the row-major prefix
        of their value at max_bs, so one shared buffer, written once at max_bs, serves every size
        (``full``, ``arange(bs+1)*D``, ``z // K``). Not so: a reduction over rows, a slice whose
        start moves with bs, an ``outer`` whose column count does: those are evaluated per size."""
        from .ops import CONST_OPS

        bs, types, consts = SYMBOLS["bs"], self.types(), set(self.constants())

        def free(x: str) -> bool:  # no extent depends on bs
            return all(isinstance(d, sympy.Expr) and bs not in d.free_symbols for d in types[x].shape)

        def rows(x: str) -> bool:  # bs only in the leading extent: rows of a fixed width
            return all(isinstance(d, sympy.Expr) and bs not in d.free_symbols for d in types[x].shape[1:])

        def attr_free(v) -> bool:
            return bs not in sympy.sympify(v).free_symbols

        stable: set[str] = set()
        for n in self.nodes:
            ins = n.inputs
            if n.name not in consts:
                continue
            if n.op in CONST_OPS:
                stable.add(n.name)
            elif not all(x in stable for x in ins):  # e.g. a scalar whose value is a sum over bs rows
                continue
            elif all(free(x) for x in ins) and free(n.name):
                stable.add(n.name)
            elif n.op in _ROWWISE and all(rows(x) for x in (*ins, n.name)):
                stable.add(n.name)
            elif (n.op is Op.outer and free(ins[1])) or (n.op is Op.repeat and attr_free(n.a["times"])) or (
                    n.op is Op.slice and attr_free(n.a["start"])):
                stable.add(n.name)
        return frozenset(stable)

    def region_nodes(self, region: Region) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.region is region)

    @property
    def env(self) -> dict[str, int]:
        return dict(self.symbols)

    def to_nx(self) -> nx.DiGraph:
        """Dataflow as a networkx DiGraph (values are vertices)."""
        g = nx.DiGraph()
        for i in self.inputs:
            g.add_node(i.name, kind="input", role=i.role.value)
        for n in self.nodes:
            g.add_node(n.name, kind="node", op=n.op.value, region=n.region.value)
            g.add_edges_from((i, n.name) for i in n.inputs)
        return g
