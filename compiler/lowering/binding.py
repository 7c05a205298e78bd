"""The typed binding: what the runtime needs to run lowered plans, decided by the compiler.

A ``Layout`` places every static buffer of a compiled backend, every mode: the mode's regions
(pack-inputs, plan-buffers) shifted by the mode's base, so modes never share memory. A
``Binding`` describes one plan (mode, bs): every placeholder of its lowered modules with its
kind and span, the staging slots with their fills and bounds, and the per-step copies. The
runtime allocates the spaces once, takes views, and binds by kind; it reads no IR.
"""

from __future__ import annotations

import enum
import math

import attrs
import sympy
import torch

from ..ir.graph import Kind, aligned
from ..ir.graph import Space as IRSpace  # the IR's three spaces; Memory splits them by device
from ..ir.graph import Use as IRUse
from ..ir.types import SYMBOLS
from ..modes import ForwardMode


class Memory(enum.Enum):
    staging_host = "staging_host"  # packed per-step inputs, pinned on a GPU
    staging_dev = "staging_dev"  # its device twin, one copy per step
    arena = "arena"  # static device buffers: fields, intermediates, crossings, constants
    host = "host"  # static host buffers out_graph writes in place
    local_dev = "local_dev"  # owned by one plan, allocated when it is bound: constants that differ per size
    local_host = "local_host"  # the same, on the host

    @property
    def on_host(self) -> bool:
        return self in (Memory.staging_host, Memory.host, Memory.local_host)


@attrs.frozen
class Span:
    """A typed span of ``space``: ``shape`` elements of ``dtype`` from byte ``offset``."""

    space: Memory
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class ArgKind(enum.Enum):
    batch = "batch"  # a staged batch input: a view of the staging buffer
    pool = "pool"  # an engine tensor bound at instantiate (req_to_token, full_to_swa)
    field = "field"  # a metadata field's static buffer, written in place
    scratch = "scratch"  # a static buffer a fused kernel stores an intermediate into
    const = "const"  # a constant, evaluated when the plan (or the mode) is bound
    crossing = "crossing"  # an out_graph device value the graph reads: copied into a static buffer
    host = "host"  # a static host buffer an out_graph host value is written into
    view = "view"  # rows [start, stop) of another argument (a TBO child's batch rows)
    device = "device"  # the torch device
    planners = "planners"  # the plan's planner calls: host_call node -> its planner bound to its site
    # the device guard's (guard-inputs):
    feed = "feed"  # a device input's feed: the plan's int64 buffer of values handed over on the device
    engine = "engine"  # the engine's buffer of a device input: the feed (``of``) until a capture binds one
    word = "word"  # the backend's engine word
    generation = "generation"  # the staged batch size, in the staging buffer's device twin
    record = "record"  # the backend's device-fault record (pinned, mapped)


@attrs.frozen
class Arg:
    """One placeholder of a lowered module, in placeholder order."""

    name: str  # the IR value, field or pool it stands for
    kind: ArgKind
    span: Span | None = None
    of: str | None = None  # view: the argument it slices
    start: int = 0
    stop: int = 0


@attrs.frozen
class PlannerSite:
    """One planner (``host_call``) of a plan, typed like the buffers: what it is called on, what it
    plans into (role -> the field's argument, from the spec's ``binds``) and which field its
    result becomes. The runtime hands the planner these fields' views as its site."""

    node: str  # the host_call node (``plan``; ``tbo0_plan``, ``step2_plan`` once inlined)
    target: str  # the planner's name (``flashinfer.decode_plan``)
    inputs: tuple[Arg, ...]  # its host operands, in call order
    binds: tuple[tuple[str, Arg], ...]
    field: str | None  # the metadata field set to its result every step

    def describe(self) -> str:
        binds = ", ".join(f"{r}={a.name}" for r, a in self.binds) or "no field"
        return (f"  planner {self.node} -> {self.target}({', '.join(a.name for a in self.inputs)}) plans into "
                f"{binds}{f'; result is field {self.field}' if self.field else ''}")


@attrs.frozen
class Slot:
    """One ForwardBatch field staged per step: live rows, then the fill, then checked."""

    source: str  # the ForwardBatch field read (a host mirror where the spec declares one)
    device_field: str | None  # the device field the mirror mirrors: read only if it is a CPU tensor
    host: Span  # in staging_host, at this plan's size
    dev: Span | None  # in staging_dev: None when only host ops read it
    per_row: int  # values per request
    capacity: int  # values the slot holds at max_bs
    fill: int
    kind: Kind
    lo: int
    hi: sympy.Expr  # may name R (pool rows) and N (KV slots): bound at instantiate
    why: str  # where hi comes from, for the error
    fix: str = ""  # what to change when a value is past hi
    # a per-row bound beside hi: (the other slot's source, b) with value[r] - other[r] <= b (a draft extend's
    # keys, seq - extend + D, fit L); checked where both are staged from the host
    relation: tuple[str, int, str] | None = attrs.field(default=None, converter=lambda r: None if r is None else
                                                         (r[0], int(r[1]), r[2]))  # (+ the spec's bound, said)
    feed: Span | None = None  # the device input's feed, where in_graph checks it (guard-inputs)
    engine: str | None = None  # the in_graph argument an engine's own buffer of it binds to at capture

    def bounds(self, env: dict[str, int]) -> tuple[int, int]:
        """(lo, hi) with the pool sizes bound; an unbound N (no slot table) leaves the dtype's max."""
        hi = sympy.sympify(self.hi.xreplace({SYMBOLS[k]: v for k, v in env.items() if k in SYMBOLS}))
        cap = torch.iinfo(self.host.dtype).max
        return self.lo, min(int(hi), cap) if hi.is_Integer else cap


def _where(r: Span | None) -> str:
    if r is None:
        return ""
    return f" {r.space.value}@{r.offset} {str(r.dtype).removeprefix('torch.')}{list(r.shape)}"


def _arg(a: Arg) -> str:
    extra = f" rows[{a.start}:{a.stop}] of {a.of or 'its slot'}" if a.kind is ArgKind.view else ""
    return f"{a.kind.value} {a.name}{_where(a.span)}{extra}"


@attrs.frozen
class Binding:
    mode: ForwardMode
    bs: int
    graph: str  # the specialized graph's name, for messages
    slots: tuple[Slot, ...]
    copies: tuple[tuple[Span, Span], ...]  # (device, host) byte ranges copied host->device per step
    out_args: tuple[Arg, ...]
    in_args: tuple[Arg, ...]
    const_args: tuple[Arg, ...]  # the plan's own constants' module (run once, at bind)
    crossing: tuple[Arg, ...]  # out_graph results [:n] are copied into these
    planned: tuple[str, ...]  # fields set from the out_graph results after the crossings (planner results)
    fields: tuple[tuple[str, Arg], ...]  # every other field: the static argument holding it
    local_bytes: tuple[tuple[Memory, int], ...]  # this plan's own constant buffers, allocated at bind
    sites: tuple[PlannerSite, ...] = ()  # its planners, in out_graph order
    generation: Span | None = None  # where a step writes its size and the size of the graph that pads it (checked)
    generation_for: int = 0  # the size of the graph that pads this plan's staging (ops_guard.pad_target)
    guards: tuple[tuple[int, str], ...] = ()  # the device record's codes: (code, the field it checks)

    def describe(self) -> str:
        """Everything the runtime binds, one line each: what a reader checks against the code."""
        lines = [f"binding {self.graph} (mode {self.mode.name.lower()}, bs {self.bs})"]
        lines += [f"  slot {s.source} <- fill {s.fill}, {s.kind.value} in [{s.lo}, {s.hi}], {s.per_row}/row"
                  f"{_where(s.host)}{' + device' if s.dev else ''}"
                  f"{f', minus {s.relation[0]} at most {s.relation[1]}' if s.relation else ''}" for s in self.slots]
        lines += [f"  copy {d.nbytes} bytes {h.space.value}@{h.offset} -> {d.space.value}@{d.offset}"
                  for d, h in self.copies]
        for label, args in (("out_graph", self.out_args), ("in_graph", self.in_args), ("const", self.const_args)):
            lines += [f"  {label} arg {_arg(a)}" for a in args]
        lines += [f"  field {f} = {_arg(a)}" for f, a in self.fields]
        lines += [f"  field {f} = planner result, set every step" for f in self.planned]
        lines += [s.describe() for s in self.sites]
        return "\n".join(lines) + "\n"


@attrs.frozen
class Init:
    """A mode's constants evaluated once at max_bs into their shared regions (the prefix of each
    is what every smaller plan reads)."""

    args: tuple[Arg, ...]
    copies: tuple[tuple[Span, Span], ...]  # a constant bound to two fields: into the second too


@attrs.frozen
class PoolSpec:
    """An engine tensor the spec reads, bound at instantiate: its extents may name R (pool rows) or
    N (KV slots), which the bound tensor decides."""

    name: str
    dtype: torch.dtype
    shape: tuple[sympy.Expr, ...]

    def describe(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')}[{', '.join(map(str, self.shape))}]"


def pool_specs(inputs, env: dict[str, int]) -> tuple[PoolSpec, ...]:
    """The pools of every mode's graph, once each, with the compile options' symbols bound."""
    out: dict[str, PoolSpec] = {}
    for i in inputs:
        t = i.type.subs(env)
        out.setdefault(i.name, PoolSpec(i.name, t.dtype.torch, tuple(t.shape)))
    return tuple(out.values())


@attrs.frozen
class Layout:
    sizes: tuple[tuple[Memory, int], ...]  # bytes of each shared space
    bases: tuple[tuple[ForwardMode, tuple[tuple[str, int], ...]], ...]  # mode -> IR space -> base offset
    feeds: tuple[tuple[int, int], ...] = ()  # arena (offset, bytes) of every guarded input's feed: the sentinel

    def size(self, space: Memory) -> int:
        return dict(self.sizes).get(space, 0)

    def base(self, mode: ForwardMode) -> dict[str, int]:
        return dict(dict(self.bases)[mode])


def link(generic: dict) -> Layout:
    """One layout for every mode of a backend: each mode's regions (pack-inputs, plan-buffers) at a
    base of its own in every space, so no two modes ever share memory."""
    end = dict.fromkeys(IRSpace, 0)
    bases, feeds = [], []
    for mode, g in generic.items():
        bases.append((mode, tuple((s.value, end[s]) for s in IRSpace)))
        feeds += [(end[IRSpace.arena] + b.offset, b.nbytes) for b in g.buffers if b.use is IRUse.feed]
        for s in IRSpace:
            end[s] += mode_bytes(g, s)
    sizes = ((Memory.staging_host, end[IRSpace.staging]), (Memory.staging_dev, end[IRSpace.staging]),
             (Memory.arena, end[IRSpace.arena]), (Memory.host, end[IRSpace.host]))
    return Layout(sizes, tuple(bases), tuple(feeds))


def mode_bytes(g, space) -> int:
    """Bytes of a mode's regions in one IR space."""
    return max((aligned(b.end) for b in g.buffers if b.space is space), default=0)
