"""Lower a specialized graph to torch.fx GraphModules and the plan's binding.

- ``out_gm``: the out_graph nodes (host ops, planner calls), run before
  every replay; host values are written in place into static host buffers.
- ``in_gm``: the in_graph nodes, captured once and replayed; each metadata
  output is written *in place* into its static buffer.
- ``const_gm``: the plan's own constants, evaluated once when it is bound.
  Constants every size shares (``full``, ``arange``) are written once per
  mode, at max_bs, by the mode's init module (``lower_init``).

Every placeholder is recorded as a typed ``Arg`` in the binding, so the
runtime binds by kind and never parses a name.
"""

from __future__ import annotations

import operator
import re

import attrs
import networkx as nx
import torch
import torch.fx as fx

from ..ir import Graph, Node, Op, Region, Role
from ..ir.ops import CONST_OPS
from ..modes import ForwardMode
from .binding import Arg, ArgKind, Binding, PlannerSite
from .groups import fused_target
from .kernels import KERNELS, kernel_kwargs
from .memo import Memo
from .places import LoweringError, Places

DEVICE, PLANNERS = "on_device", "planners"  # placeholder names (fx prints a torch.device as device(...))


@attrs.frozen
class LoweredPlan:
    graph: Graph
    out_gm: fx.GraphModule  # host ops and planners, before every replay
    in_gm: fx.GraphModule  # device work, captured once and replayed
    const_gm: fx.GraphModule  # this plan's own constants, once at bind
    binding: Binding
    kernels: tuple = ()  # FusedKernel sources launched by in_gm

    @property
    def consts(self) -> tuple[str, ...]:
        return self.graph.constants()

    def code(self) -> str:
        text = (f"# out_graph of {self.graph.name}\n{self.out_gm.code}\n"
                f"# in_graph of {self.graph.name}\n{self.in_gm.code}")
        return text + "".join(f"\n# fused kernel\n{k.source}" for k in self.kernels)


def _ident(name: str) -> str:
    return re.sub(r"\W", "_", name)


class _Builder:
    """One fx graph; each placeholder is recorded with the typed argument it stands for."""

    def __init__(self, resolve) -> None:
        self.g = fx.Graph()
        self.args: list[Arg] = []
        self.env: dict[str, fx.Node] = {}
        self.resolve = resolve  # IR value -> Arg, for values this module reads but does not compute

    def arg(self, key: str, a: Arg) -> fx.Node:
        if key not in self.env:
            self.args.append(a)
            self.env[key] = self.g.placeholder(_ident(key))
        return self.env[key]

    def value(self, x: str) -> fx.Node:
        return self.env[x] if x in self.env else self.arg(x, self.resolve(x))

    def call(self, n: Node, out: fx.Node | None = None) -> fx.Node:
        ins = [self.value(x) for x in n.inputs]
        kw = kernel_kwargs(n)
        if n.op is Op.host_call:
            r = self.g.call_function(KERNELS[Op.host_call], (self.arg(PLANNERS, Arg(PLANNERS, ArgKind.planners)),
                                                              kw["target"], *ins), {"key": n.name})
        elif n.op is Op.to_device or n.op in CONST_OPS:
            dev = torch.device("cpu") if n.type.placement.on_host else self.arg(DEVICE, Arg(DEVICE, ArgKind.device))
            r = self.g.call_function(KERNELS[n.op], tuple(ins), {**(kw if n.op in CONST_OPS else {}),
                                                                 "device": dev, "out": out})
        else:
            r = self.g.call_function(KERNELS[n.op], tuple(ins), {**kw, **({"out": out} if out is not None else {})})
        r.name = _ident(n.name)
        self.env[n.name] = r
        return r

    def module(self, results: list[fx.Node]) -> fx.GraphModule:
        self.g.output(tuple(results))
        # Plans of different batch sizes mostly lower to the same program (shapes live in the bound
        # buffers, not the code): share one module per distinct program, so compiling 256 sizes
        # generates a handful of modules, not 512.
        key = tuple((n.op, n.target, n.name, fx.node.map_arg((n.args, n.kwargs), lambda a: a.name))
                    for n in self.g.nodes)
        return _MODULES.get(key, lambda: fx.GraphModule(torch.nn.Module(), self.g))


_MODULES = Memo("fx modules", 4096)
@attrs.frozen
class Q:
    """Where an argument's buffer is, asked of the plan's ``Places`` when a size is bound: the
    skeleton of a mode's lowering is shared by its sizes, the regions are each size's own."""

    what: str  # a Places method: batch, field, value, host, const; or "local" (the plan's own constant)
    name: str


@attrs.frozen
class _Skeleton:
    out_gm: fx.GraphModule
    in_gm: fx.GraphModule
    const_gm: fx.GraphModule
    out_args: tuple[Arg, ...]
    in_args: tuple[Arg, ...]
    const_args: tuple[Arg, ...]
    crossing: tuple[Arg, ...]
    planned: tuple[str, ...]
    fields: tuple[tuple[str, Arg], ...]
    kernels: tuple
    sites: tuple[PlannerSite, ...]


_SKELETONS = Memo("lowering skeletons", 4096)


def _columns(g: Graph) -> tuple:
    """The extents a fused kernel's code holds as constants: every matrix's width and every outer's
    column length. Sizes share a skeleton only where these agree (a [rows, bs + 1] matrix does not)."""
    types = g.types()
    return (tuple(t.shape[1] for t in types.values() if len(t.shape) == 2),
            tuple(types[n.inputs[1]].shape for n in g.nodes if n.op is Op.outer))


def lower(g: Graph, mode: ForwardMode, stable: frozenset[str], base: dict[str, int], max_bs: int) -> LoweredPlan:
    """Requires a specialized, split-checked graph whose layout (pack-inputs, plan-buffers) sits at
    ``base`` in the backend's spaces. Produces the three fx modules and the plan's binding.
    ``stable``: the mode's constants whose shared buffer the mode's init writes at max_bs; the
    plan's other constants get buffers of their own, written by ``const_gm`` when it is bound.
    Sizes whose graphs differ only in extents share one skeleton (modules, kernels, argument
    kinds); each gets its own regions."""
    places = Places(g, mode, base, max_bs)
    consts = g.constants()
    local = tuple(c for c in consts if c not in stable)
    inputs = {i.name for i in g.inputs}
    fields = {o.value for o in g.outputs}
    # A static row range of a batch input (a TBO child's rows) is a view of a static buffer: taken
    # once when the plan is bound. The code then holds no batch-size-dependent bounds, so every
    # size shares one module, and no step spends a call (or, on the host, a copy) on it.
    views = {n.name for n in g.nodes if n.op is Op.slice and n.inputs[0] in inputs and n.name not in fields}
    shared = (set(consts) - set(local)) | views  # made outside the modules: their attributes are no code
    key = (mode, tuple((n.name, n.op, n.inputs, n.region, () if n.name in shared else n.attrs) for n in g.nodes),
           tuple((i.name, i.role, i.type.placement, i.type.dtype) for i in g.inputs),
           tuple((o.field, o.value) for o in g.outputs), g.kernels, local, _columns(g))
    sk = _SKELETONS.get(key, lambda: _skeleton(g, places, consts, local, views))
    local_regions = places.locals(local)
    nodes = g.producers()

    def at(a: Arg) -> Arg:  # the argument with this size's region
        if not isinstance(a.span, Q):
            return a
        q = a.span
        r = local_regions[q.name] if q.what == "local" else getattr(places, q.what)(q.name)
        if a.kind is ArgKind.view:
            v = nodes[a.name]
            return attrs.evolve(a, span=r, start=int(v.a["start"]), stop=int(v.a["stop"]))
        return attrs.evolve(a, span=r)

    binding = Binding(mode, g.env["bs"], g.name, places.slots(), places.copies(),
                      tuple(map(at, sk.out_args)), tuple(map(at, sk.in_args)), tuple(map(at, sk.const_args)),
                      tuple(map(at, sk.crossing)), sk.planned, tuple((f, at(a)) for f, a in sk.fields),
                      places.local_bytes(local_regions),
                      tuple(attrs.evolve(s, inputs=tuple(map(at, s.inputs)),
                                         binds=tuple((r, at(a)) for r, a in s.binds)) for s in sk.sites),
                      places.generation(), places.generation_for(), places.guards())
    return LoweredPlan(g, sk.out_gm, sk.in_gm, sk.const_gm, binding, sk.kernels)


def _skeleton(g: Graph, places: Places, consts, local, views) -> _Skeleton:
    inputs = {i.name: i for i in g.inputs}
    fields = {o.value for o in g.outputs}
    skip = set(consts) | set(views)
    in_nodes = [n for n in g.nodes if n.region is Region.in_graph and n.name not in skip]
    out_nodes = [n for n in g.nodes if n.region is Region.out_graph and n.name not in skip]
    out_names = {n.name for n in out_nodes}
    in_names = {n.name for n in in_nodes}

    def resolve(x: str) -> Arg:
        if x in inputs:
            i = inputs[x]
            if i.role.guard:
                return _guard_arg(i)
            return Arg(x, ArgKind.pool) if i.role is Role.pool else Arg(x, ArgKind.batch, Q("batch", x))
        if x in views:
            src = inputs[g.node(x).inputs[0]]
            if src.role in (Role.feed, Role.engine):  # a TBO child's rows of a feed, or of the engine's buffer
                feed = src.name.removesuffix("__engine").removesuffix("__feed") + "__feed"
                return Arg(x, ArgKind.view, Q("feed", feed), src.name if src.role is Role.engine else None)
            pool = src.role is Role.pool
            return Arg(x, ArgKind.view, None if pool else Q("batch", src.name), src.name if pool else None)
        if x in local:
            return Arg(x, ArgKind.const, Q("local", x))
        if x in consts:
            return Arg(x, ArgKind.const, Q("const", x))
        if x in out_names:  # an out_graph value the graph reads: copied into its static buffer
            return Arg(x, ArgKind.crossing, Q("value", x))
        raise LoweringError(f"{g.name}: no place for %{x}")

    crossing = tuple(dict.fromkeys(x for n in in_nodes for x in n.inputs if x in out_names))
    ob = _Builder(resolve)
    for n in out_nodes:  # host tensors land in static host buffers: no allocation per step
        host = n.op is not Op.host_call and places.host(n.name) is not None
        ob.call(n, out=ob.arg(f"hbuf__{n.name}", Arg(n.name, ArgKind.host, Q("host", n.name))) if host else None)
        for f in places.fields_of(n.name)[1:] if host else ():  # a second field of the value: its own copy
            ob.g.call_method("copy_", (ob.arg(f"out__{f}", Arg(f, ArgKind.field, Q("field", f))), ob.env[n.name]))
    planned = tuple(o.field for o in g.outputs if o.value in out_names and places.host(o.value) is None)
    value_of = {o.field: o.value for o in g.outputs}
    out_gm = ob.module([ob.env[x] for x in (*crossing, *(value_of[f] for f in planned))])

    ib = _Builder(resolve)
    bound: dict[str, str] = {}  # value -> first field whose buffer it is written into
    for o in g.outputs:
        if o.value in in_names and o.value not in bound:
            bound[o.value] = o.field

    def out(x: str) -> fx.Node:  # the static buffer value x is stored into: a field's, else scratch
        if x in bound:
            return ib.arg(f"out__{bound[x]}", Arg(bound[x], ArgKind.field, Q("field", bound[x])))
        return ib.arg(f"tmp__{x}", Arg(x, ArgKind.scratch, Q("value", x)))

    users = g.users()
    kernels = []
    for item in _schedule(in_nodes, g.kernel_of()):  # unfused nodes and whole kernels, in dependency order
        if isinstance(item, str):
            n = g.node(item)
            ib.call(n, out=out(n.name) if n.name in bound else None)
            continue
        group = item
        stored = [x for x in group if x in fields or any(u.name not in group for u in users.get(x, []))]
        fk, run = fused_target(g, group, stored)
        kernels.append(fk)
        # every store lands in a static buffer: a field's, or scratch for what another kernel reads,
        # so nothing is allocated per step and sizes share one launcher (and one module)
        call = ib.g.call_function(run, (*(ib.value(a) for a in fk.args), *(out(x) for x in stored)))
        for k, x in enumerate(stored):
            ib.env[x] = ib.g.call_function(operator.getitem, (call, k))
    meta: list[tuple[str, Arg]] = []
    for o in g.outputs:
        if o.field in planned:
            continue
        if o.value in in_names or (o.value in inputs and not inputs[o.value].type.placement.on_host) or (
                o.value in views):
            field = Arg(o.field, ArgKind.field, Q("field", o.field))
            if bound.get(o.value) != o.field:  # passed through, or a second field: copy into its buffer
                ib.g.call_method("copy_", (ib.arg(f"out__{o.field}", field), ib.value(o.value)))
            meta.append((o.field, field))
        elif o.value in out_names or (o.value in consts and o.value not in local):
            meta.append((o.field, Arg(o.field, ArgKind.field, Q("field", o.field))))  # its own buffer
        else:  # a per-size constant, or a host batch input
            meta.append((o.field, resolve(o.value)))
    in_gm = ib.module([])
    sites = _sites(g, out_nodes, dict(meta), planned, resolve, places)

    cb = _Builder(resolve)
    for c in local:
        cb.call(g.node(c), out=cb.arg(f"const__{c}", Arg(c, ArgKind.const, Q("local", c))))
    const_gm = cb.module([])
    return _Skeleton(out_gm, in_gm, const_gm, tuple(ob.args), tuple(ib.args), tuple(cb.args),
                     tuple(resolve(x) for x in crossing), planned, tuple(meta), tuple(kernels), sites)


def _guard_arg(i) -> Arg:
    """The device guard's inputs (guard-inputs): a feed and the engine buffer that defaults to it, the staged
    generation, and what the backend owns (the word, the record)."""
    if i.role is Role.feed:
        return Arg(i.name, ArgKind.feed, Q("feed", i.name))
    if i.role is Role.engine:
        feed = i.name.removesuffix("__engine") + "__feed"
        return Arg(i.name, ArgKind.engine, Q("feed", feed), feed)
    if i.role is Role.generation:
        return Arg(i.name, ArgKind.generation, Q("batch", i.name))
    return Arg(i.name, ArgKind.word if i.role is Role.word else ArgKind.record)


def _sites(g: Graph, out_nodes, meta: dict[str, Arg], planned, resolve, places) -> tuple[PlannerSite, ...]:
    """Each planner with the arguments of what it reads and of the fields its ``binds`` name."""
    first = {}  # value -> the first field bound to it (the buffer a planner's binding views)
    for o in g.outputs:
        first.setdefault(o.value, o.field)
    result = {o.value: o.field for o in g.outputs if o.field in planned}
    computed = {n.name for n in out_nodes}

    def operand(x: str) -> Arg:  # a static host buffer, a batch input or constant, else a per-step value
        if places.host(x) is not None:
            return Arg(x, ArgKind.host, Q("host", x))
        return Arg(x, ArgKind.host) if x in computed else resolve(x)

    out = []
    for n in out_nodes:
        if n.op is not Op.host_call:
            continue
        ins = tuple(operand(x) for x in n.inputs)
        binds = []
        for role, v in n.a["binds"].pairs:
            f = first.get(v)
            if f not in meta:  # the verifier makes it a field; one a planner sets is no buffer to plan into
                raise LoweringError(f"{g.name}: planner %{n.name} binds {role} to %{v}, which is no static field")
            binds.append((role, meta[f]))
        out.append(PlannerSite(n.name, n.a["target"], ins, tuple(binds), result.get(n.name)))
    return tuple(out)


def lower_init(g: Graph, mode: ForwardMode, stable: frozenset[str], base: dict[str, int]) -> tuple[fx.GraphModule,
                                                                                                    tuple[Arg, ...]]:
    """The mode's init module: its stable constants, on the graph specialized at max_bs, written
    once into their shared regions (and into every further field bound to the same value)."""
    places = Places(g, mode, base, g.env["bs"])
    order = [c for c in g.constants() if c in stable]
    b = _Builder(lambda x: Arg(x, ArgKind.const, places.const(x)))
    for c in order:
        b.call(g.node(c), out=b.arg(f"const__{c}", Arg(c, ArgKind.const, places.const(c))))
        for f in places.fields_of(c)[1:]:
            b.g.call_method("copy_", (b.arg(f"out__{f}", Arg(f, ArgKind.field, places.field(f))), b.env[c]))
    return b.module([]), tuple(b.args)


def _schedule(in_nodes, kernel_of: dict[str, str]) -> list:
    """Topological order over unfused node names and fused groups (lists of names)."""
    kernel = {n.name: kernel_of[n.name] for n in in_nodes if n.name in kernel_of}
    dag = nx.DiGraph()
    for n in in_nodes:
        me = kernel.get(n.name) or n.name
        dag.add_node(me)
        for x in n.inputs:
            src = kernel.get(x) or x
            if src in dag and src != me:
                dag.add_edge(src, me)
    members: dict[str, list[str]] = {}
    for n in in_nodes:
        if n.name in kernel:
            members.setdefault(kernel[n.name], []).append(n.name)
    first: dict[str, int] = {}  # ties broken by program order: a kernel sits where its first node was
    for i, n in enumerate(in_nodes):
        first.setdefault(kernel.get(n.name) or n.name, i)
    order = list(nx.lexicographical_topological_sort(dag, key=first.__getitem__))
    return [members.get(v, v) for v in order]
