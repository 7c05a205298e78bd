"""A plan bound to a backend's buffers: argument lists by kind, the stager, the field namespace.

Binding happens once per (mode, bs): every argument of the plan's modules becomes a view of the
backend's static memory (or a pool, the device, the planner calls), each planner gets its site
(runtime/planning.py), the plan's own constants are evaluated, and ``meta`` (what
``forward_metadata`` is) holds views of the field buffers. A step then only stages, runs out_graph,
and (captured or not) runs in_graph on the same tensors.
"""

from __future__ import annotations

import attrs
import torch

from attnmeta.compiler.lowering.binding import Arg, ArgKind, Binding, Memory
from attnmeta.compiler.lowering.kernels import k_host_call

from .buffers import Buffers, allocate, view
from .metadata import Metadata
from .planning import Site, make_site, planner_call
from .staging import Stager, _Staged


@attrs.define
class BoundPlan:
    plan: object  # the lowered plan: fx modules (out_gm, in_gm, const_gm) and its binding
    binding: Binding
    stager: Stager
    out_fn: object  # the out_graph module's forward (no nn.Module call overhead)
    out_args: list
    in_fn: object
    in_args: list
    crossing: list[torch.Tensor]
    meta: Metadata
    # device work planners add after the metadata graph, recorded with it (FlashInfer's mask packing)
    after_in: list
    sites: dict[str, Site]  # planner node -> its site
    calls: dict  # planner node -> its planner bound to its site (what out_graph calls)
    capture: object | None = None  # what the captured graph holds on to (checks.Capture)
    engine: object | None = None  # the engine buffers the captured graph reads in place (engine.Engine)
    computes: bool = True  # out_graph computes host values besides its planners' inputs (host fields a reader reads)
    step: object | None = None  # a replayed step's whole out_graph on the engine's buffers (engine.make_step)

    def field(self, name: str) -> torch.Tensor:
        """The static buffer of field ``name`` (what the engine writes a field like a verify mask into)."""
        v = getattr(self.meta, name, None)
        if not isinstance(v, torch.Tensor):
            tensors = sorted(k for k, x in vars(self.meta).items() if isinstance(x, torch.Tensor))
            raise KeyError(f"plan {self.binding.graph} has no field {name!r} with a buffer; fields: {tensors}")
        return v

    def rebind_planner(self, target: str, planners: dict) -> None:
        """Every site of planner ``target`` to ``planners[target]``, with fresh state and no hooks of the old one."""
        self.step = None  # the new planner may need host data every step
        for s in self.binding.sites:
            if s.target == target:
                site = self.sites[s.node]
                site.reset()
                self.calls[s.node] = planner_call(planners, site, len(s.inputs))

    @property
    def host_work(self) -> bool:
        """Whether a step needs out_graph's host work: host values it computes (a host indptr, a field read on
        the host), values it copies into the graph, or a planner that still reads host data (a planner whose
        work moved to the device says so: ``Site.host_free``)."""
        return self.computes or bool(self.crossing) or any(not s.host_free for s in self.sites.values())

    @property
    def mode(self):
        return self.binding.mode

    @property
    def bs(self) -> int:
        return self.binding.bs

    def run_out_graph(self) -> None:
        """The host part of a step, after staging: values that cross into the graph are copied to
        their device buffers; the planners' results become metadata fields."""
        if not (self.crossing or self.binding.planned):
            self.out_fn(*self.out_args)
            return
        results = self.out_fn(*self.out_args)
        n = len(self.crossing)
        for buf, val in zip(self.crossing, results[:n], strict=True):
            buf.copy_(val, non_blocking=True)
        for field, val in zip(self.binding.planned, results[n:], strict=True):
            setattr(self.meta, field, val)


def _computes(graph) -> bool:
    """Whether out_graph computes a host value that something other than its planners reads (a host field a
    reader takes from forward_metadata): values that only feed planner calls are the planners' inputs, which a
    planner whose work moved to the device no longer reads."""
    feeds_planners: set = set()
    for n in reversed(graph.nodes):
        if n.op != "call_function":
            continue
        if n.target is k_host_call or (n.users and all(u.target is k_host_call or u in feeds_planners
                                                         for u in n.users)):
            feeds_planners.add(n)
        else:
            return True
    return False


def bind(plan, backend, buffers: Buffers, pools: dict, event: list, dirty: dict) -> BoundPlan:
    """Views for every argument of ``plan``, a site for each of its planners; runs the plan's own
    constants once. Every tensor in the argument lists is held by the bound plan: what a captured graph reads
    or writes lives as long as the plan (the engine's buffers a capture binds too, runtime/engine.py)."""
    b, device, env = plan.binding, backend.device, backend.env
    local = allocate(dict(b.local_bytes), device)
    calls: dict = {}

    def value(a: Arg):
        k = a.kind
        if k is ArgKind.pool:
            return pools[a.name]
        if k is ArgKind.device:
            return device
        if k is ArgKind.planners:
            return calls
        if k is ArgKind.view:  # rows of a pool, or of a static buffer (a feed too: the engine's until a capture binds)
            src = pools[a.of] if a.of in pools else buffers.view(a.span)
            return src[a.start : a.stop]
        if k is ArgKind.word:
            return backend.word.tensor
        if k is ArgKind.record:
            return backend.record.tensor
        own = a.span.space in (Memory.local_dev, Memory.local_host)
        return view(local, a.span) if own else buffers.view(a.span)

    const_args = [value(a) for a in b.const_args]
    if const_args:
        plan.const_gm.forward(*const_args)
    slots = []
    for s in b.slots:
        key = (s.host.space, s.host.offset)
        cap = dirty.setdefault(key, [s.capacity])  # untouched staging holds zeros, not the fill: pad it all once
        full = buffers.view(attrs.evolve(s.host, shape=(s.capacity,)))  # every size's rows: padded past live
        feed = top = None
        if s.feed is not None:  # the mode's feed at max_bs, and how far a step fed it (shared by the sizes)
            feed = buffers.view(attrs.evolve(s.feed, shape=(s.capacity,)))
            top = dirty.setdefault(("feed", s.feed.offset), [0])
        slots.append(_Staged(s, buffers.view(s.host), None if s.dev is None else buffers.view(s.dev), env, cap,
                             full, feed, top))
    copies = [(buffers.view(d), buffers.view(h)) for d, h in b.copies]
    meta = Metadata(**{f: value(a) for f, a in b.fields})
    for f in b.planned:
        setattr(meta, f, None)  # set by the planner before every step
    hooks: list = []
    sites = {s.node: make_site(s, b.mode, b.bs, backend, value, hooks) for s in b.sites}
    calls.update({s.node: planner_call(backend.planners, sites[s.node], len(s.inputs)) for s in b.sites})
    computes = _computes(plan.out_gm.graph)
    backend.record.learn(b.guards)
    gen = None if b.generation is None else buffers.view(b.generation).numpy()
    stager = Stager(slots, copies, event, device, backend.record, backend.word, gen, (b.bs, b.generation_for))
    return BoundPlan(plan, b, stager, plan.out_gm.forward, [value(a) for a in b.out_args], plan.in_gm.forward,
                     [value(a) for a in b.in_args], [value(a) for a in b.crossing], meta, hooks, sites, calls,
                     computes=computes)
