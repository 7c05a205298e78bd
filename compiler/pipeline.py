"""The compile pipeline, readable in one screen.

    spec(mode) --GENERIC_PASSES--> mode graph            (one per mode)
    mode graphs --link--> layout                          (every mode's buffers, disjoint)
    mode graph --PER_BS_PASSES(bs)--> specialized graph   (one per captured size, and max_bs)
    specialized graph --lower--> plan                     (fx modules + the typed binding)
    mode graph at max_bs --lower_init--> init             (the constants every size shares)

Each stage runs under the instruments (verify, dumps, timing, printing, disabling); lowering
is a stage like the passes. A pass that crashes is a compiler bug: PassError names it, what ran
before it, and a repro bundle.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs

from .instruments import Instrument
from .ir import Graph, VerifyError
from .ir.errors import InternalError, UserError
from .lowering.binding import Arg, Layout, PoolSpec, link, pool_specs
from .lowering.fx import LoweredPlan, lower, lower_init
from .modes import ForwardMode
from .options import CompileOptions
from .passes import (  # noqa: F401  (registration)
    check_split,
    cse,
    dce,
    fuse,
    guard_inputs,
    hoist_upgrades,
    infer_shapes,
    pack_inputs,
    pass_through,
    plan_buffers,
    specialize_batch,
    verify,
)
from .passes.registry import PassContext, get_pass
from .repro import write_repro
from .spec import BackendSpec, build_graph

GENERIC_PASSES = (
    "verify",  # structure and types, as the author wrote them
    "infer-shapes",  # canonical symbolic shapes; data-dependent dims marked
    "hoist-upgrades",  # recordable device work moves into the graph (DSV4 raw->full upgrades)
    "dce",  # drop what no output or planner needs
    "cse",  # one node per distinct computation
    "pass-through",  # a device input or a second field of a value: a copy node, fused with its kernel
    "pack-inputs",  # one staging layout (at max_bs) for every per-step input: one H2D per step
    "guard-inputs",  # device inputs read through a check at in_graph's head: staged, fed or the engine's own
    "plan-buffers",  # a region (at max_bs) for every static buffer: fields, intermediates, host values
)
PER_BS_PASSES = (
    "specialize-batch",  # substitute bs and config symbols: every static extent an int
    "check-split",  # the CUDA-graph rules; every violation at once
    "fuse",  # in_graph work into one row-parallel Triton kernel
)


class PassError(InternalError):
    """A pass crashed (a compiler bug, not a spec error): names the pass, what ran before it, and
    the repro bundle written for it."""

    def __init__(self, name: str, ran: list[str], graph: str, cause: BaseException, repro: str | None = None):
        self.pass_name, self.ran, self.repro = name, ran, repro
        where = f"; repro bundle: {repro} (python {repro}/repro.py)" if repro else ""
        super().__init__(f"pass {name!r} failed on graph {graph!r} after [{', '.join(ran)}]: "
                         f"{type(cause).__name__}: {cause}{where}")


def run_passes(g: Graph, names: Sequence[str], ctx: PassContext, instruments: Sequence[Instrument] = ()) -> Graph:
    ran: list[str] = []
    for name in names:
        if not all(i.should_run(name, ctx) for i in instruments):
            continue
        for i in instruments:
            i.before(name, g, ctx)
        try:
            out = get_pass(name)(g, ctx)
        except UserError as e:
            for i in instruments:
                i.failed(name, g, ctx, e)
            raise  # the spec, not the pass, is wrong
        except Exception as e:
            for i in instruments:
                i.failed(name, g, ctx, e)
            raise PassError(name, ran, g.name, e, write_repro(g, name, ctx)) from e
        g = out
        try:
            for i in instruments:
                i.after(name, g, ctx)
        except VerifyError as e:
            raise PassError(name, ran, g.name, e) from e
        ran.append(name)
    return g


@attrs.frozen
class Stages:
    """What the pipeline makes of a spec: everything the artifact holds."""

    generic: dict[ForwardMode, Graph]
    layout: Layout
    plans: dict[tuple[ForwardMode, int], LoweredPlan]
    inits: dict[ForwardMode, tuple[object, tuple[Arg, ...]]]
    pools: tuple[PoolSpec, ...]
    stable: dict[ForwardMode, frozenset[str]]  # per mode: the constants its init writes once


def compile_spec(spec: BackendSpec, options: CompileOptions, instruments: Sequence[Instrument]) -> Stages:
    generic = {}
    for mode in dict.fromkeys(m.graph_key for m in options.modes):
        ctx = PassContext(options, mode)
        g = build_graph(spec, mode, options)
        for i in instruments:
            i.start(g, ctx)
        generic[mode] = run_passes(g, GENERIC_PASSES, ctx, instruments)
    layout = link(generic)
    plans = {}
    stable = {mode: g.stable_constants() for mode, g in generic.items()}
    for mode, g in generic.items():
        # max_bs too, captured or not: the largest batch is where capacities and int32 sums overflow, so
        # check-split sees it ahead of serving, and an eager batch of max_bs finds its plan ready
        for bs in sorted({*options.sizes, options.max_bs}, reverse=True):
            plans[(mode, bs)] = compile_size(g, options, mode, bs, layout, stable[mode], instruments)
    return _finish(generic, layout, plans, stable, options)


def lower_stages(generic: dict[ForwardMode, Graph], finals: dict[tuple[ForwardMode, int], Graph],
                 options: CompileOptions) -> Stages:
    """Lowering alone, from graphs the passes already made (a compiled artifact): the mode-generic
    graphs and each plan's final graph. No pass runs."""
    layout = link(generic)
    stable = {mode: g.stable_constants() for mode, g in generic.items()}
    plans = {(m, bs): lower(g, m, stable[m], layout.base(m), options.max_bs) for (m, bs), g in finals.items()}
    return _finish(generic, layout, plans, stable, options)


def _finish(generic, layout: Layout, plans: dict, stable: dict, options: CompileOptions) -> Stages:
    # each mode's shared constants are written once, from its largest plan's graph
    inits = {m: lower_init(plans[(m, options.max_bs)].graph, m, stable[m], layout.base(m)) for m in generic}
    pools = pool_specs([i for g in generic.values() for i in g.inputs if i.role.value == "pool"], options.symbols())
    return Stages(generic, layout, plans, inits, pools, stable)


def compile_size(g: Graph, options: CompileOptions, mode: ForwardMode, bs: int, layout: Layout,
                 stable: frozenset[str], instruments: Sequence[Instrument] = ()) -> LoweredPlan:
    """One (mode, bs) plan: the per-size passes, then lowering against the backend's layout."""
    ctx = PassContext(options, mode, bs, g)
    specialized = run_passes(g, PER_BS_PASSES, ctx, instruments)
    for i in instruments:  # lowering is the last pass: --print-before lower shows the IR it lowers
        i.before("lower", specialized, ctx)
    t0 = time.perf_counter()
    plan = lower(specialized, mode, stable, layout.base(mode), options.max_bs)
    for i in instruments:
        i.lowered(plan, ctx, time.perf_counter() - t0)
    return plan
