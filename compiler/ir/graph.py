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
from .types import Region, TensorType


class Role(enum.Enum):
    batch = "batch"  # per-step ForwardBatch field, rows padded to the captured bs
    pool = "pool"  # persistent tensor bound once (req_to_token, KV pool)


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
    offset: int | None = None  # byte offset in the packed staging buffer (set by pack-inputs)

    @property
    def source(self) -> str:
        """The ForwardBatch field the runtime stages this input from."""
        return self.mirror or self.name


@attrs.frozen
class Node:
    name: str
    op: Op
    inputs: tuple[str, ...]
    attrs: tuple[tuple[str, AttrValue], ...] = attrs.field(converter=_attrs)
    type: TensorType
    region: Region
    movable: bool = False
    origin: str = ""  # spec line ("backends/flashinfer.py:31") or "pass:<name>"
    kernel: str = ""  # the fused kernel this node lowers into (set by fuse)

    @property
    def a(self) -> dict[str, AttrValue]:
        return dict(self.attrs)


@attrs.frozen
class Output:
    field: str  # metadata field name the kernels read
    value: str
    ragged_by: str | None = None  # indptr output whose last entry bounds the valid prefix
    offset: int | None = None  # byte offset in the device arena of static outputs (set by plan-buffers)


@attrs.frozen
class Graph:
    name: str
    inputs: tuple[Input, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[Output, ...]
    symbols: tuple[tuple[str, int], ...] = attrs.field(converter=lambda s: tuple(sorted(dict(s).items())), default=())

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
