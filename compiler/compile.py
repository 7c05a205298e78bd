"""compile_backend: spec -> per-(mode, bs) lowered plans, ahead of serving."""

from __future__ import annotations

import importlib
import time
from collections.abc import Sequence

import attrs

from .instruments import DumpDir, Instrument, Timing, VerifyEach
from .ir import Graph, Op, Region, print_graph
from .ir.graph import Space
from .lowering.binding import Arg, Layout, PoolSpec, pool_specs
from .lowering.binding import Space as Mem
from .lowering.fx import LoweredPlan, lower, lower_init
from .modes import ForwardMode
from .options import CompileOptions, OptionsError
from .passes.pack_inputs import aligned
from .passes.registry import PassContext
from .pipeline import GENERIC_PASSES, PER_BS_PASSES, run_passes
from .spec import BackendSpec


@attrs.define
class CompiledBackend:
    """The compiled artifact: generic graph per mode, lowered plan per (mode, bs)."""

    spec: BackendSpec
    options: CompileOptions
    generic: dict[ForwardMode, Graph]
    plans: dict[tuple[ForwardMode, int], LoweredPlan]
    timing: Timing
    layout: Layout
    inits: dict[ForwardMode, tuple[object, tuple[Arg, ...]]]  # per mode: shared constants, at max_bs
    pools: tuple[PoolSpec, ...]  # the engine tensors every mode reads, bound at instantiate
    seconds: float = 0.0

    def plan(self, mode: ForwardMode, bs: int) -> LoweredPlan:
        """The plan for (mode, bs); sizes never captured (eager batches) compile on first use."""
        key = mode.graph_key
        if key not in self.generic:
            raise KeyError(f"backend {self.spec.name!r} was compiled for modes "
                           f"{[m.name.lower() for m in self.generic]}, not {mode.name.lower()}; "
                           f"add it to CompileOptions.modes")
        if not 0 <= bs <= self.options.max_bs:
            raise ValueError(f"batch size {bs} exceeds max_bs={self.options.max_bs} this backend was compiled "
                             f"for; recompile with a larger max_bs (--max-bs)")
        if (key, bs) not in self.plans:  # an eager size: same pipeline, no dumps
            inst = [VerifyEach()] if self.options.verify_each else []
            self.plans[(key, bs)] = _compile_bs(self.generic[key], self.options, key, bs, inst, self.layout)
        return self.plans[(key, bs)]

    @property
    def modes(self) -> tuple[ForwardMode, ...]:
        return self.options.modes

    def kernels(self, mode: ForwardMode, bs: int) -> int:
        """Device launches per step in the plan's graph: fused kernels plus unfused ops (slices are views)."""
        p = self.plan(mode, bs)
        return len(p.kernels) + sum(1 for n in p.graph.region_nodes(Region.in_graph)
                                    if n.name not in p.consts and not n.kernel and n.op is not Op.slice)

    def summary(self) -> list[dict]:
        """Per mode: node counts, host ops and bytes copied per step at the largest captured size,
        and the range of kernels per step over every captured size."""
        rows = []
        for mode in self.options.modes:
            bs = max(self.options.sizes)
            p = self.plan(mode, bs)
            g = p.graph
            ks = sorted({self.kernels(mode, b) for b in self.options.sizes})
            staged = sum(c[1].nbytes for c in p.binding.copies)
            rows.append({
                "mode": mode.name.lower(), "bs": bs,
                "out_graph": len(g.region_nodes(Region.out_graph)), "in_graph": len(g.region_nodes(Region.in_graph)),
                "host_ops": sum(1 for n in g.region_nodes(Region.out_graph) if n.name not in p.consts),
                "kernels": str(ks[0]) if len(ks) == 1 else f"{ks[0]}-{ks[-1]}",
                "bytes_per_step": staged, "captured_sizes": len(self.options.sizes),
                "arena_kib": round(_mode_bytes(self.generic[mode.graph_key], Space.arena) / 1024, 1),
            })
        return rows

    def instantiate(self, req_to_token, device=None, planners=None, pools=None):
        """Bind pools (``req_to_token`` and any other the spec reads, e.g. ``full_to_swa``) and a
        device: an AttentionBackend with its static buffers allocated once."""
        from attnmeta.runtime.compiled import CompiledAttentionBackend  # runtime sits above compiler

        return CompiledAttentionBackend(self, req_to_token, device=device, planners=planners, pools=pools)


def _compile_bs(g: Graph, options: CompileOptions, mode: ForwardMode, bs: int,
                instruments: Sequence[Instrument], layout: Layout) -> LoweredPlan:
    ctx = PassContext(options, mode, bs, g)
    plan = lower(run_passes(g, PER_BS_PASSES, ctx, instruments), mode, g.stable_constants(), layout.base(mode),
                 options.max_bs)
    for i in instruments:
        if isinstance(i, DumpDir):
            i.artifact(ctx, "lowered.py", plan.code())
    return plan


def resolve_spec(spec_or_name: BackendSpec | str) -> BackendSpec:
    if isinstance(spec_or_name, BackendSpec):
        return spec_or_name
    # Looked up lazily: backends/ sits above the compiler in the dependency order.
    backends = importlib.import_module("attnmeta.backends")
    return backends.get_spec(spec_or_name)


def compile_backend(spec_or_name: BackendSpec | str, options: CompileOptions | None = None,
                    instruments: Sequence[Instrument] = ()) -> CompiledBackend:
    """Compile a backend spec for every (mode, captured bs) in ``options``."""
    options = options or CompileOptions()
    spec = resolve_spec(spec_or_name)
    unsupported = [m for m in options.modes if m.graph_key not in spec.modes]
    if unsupported:
        raise OptionsError(f"backend {spec.name!r} does not support modes {[m.name.lower() for m in unsupported]}; "
                           f"it supports {[m.name.lower() for m in spec.modes]}")
    timing = Timing()
    inst: list[Instrument] = [timing, *instruments]
    if options.verify_each:
        inst.append(VerifyEach())
    if options.disabled_passes:
        from .instruments import DisablePasses

        check_disabled(options)
        inst.append(DisablePasses(options.disabled_passes))
    dump = DumpDir(options.dump_dir, spec.name) if options.dump_dir else None
    if dump:
        inst.append(dump)
    t0 = time.perf_counter()
    generic, plans = {}, {}
    for mode in dict.fromkeys(m.graph_key for m in options.modes):
        ctx = PassContext(options, mode)
        g = spec.build(mode, options)
        if dump:
            dump.start(g, ctx)
        generic[mode] = run_passes(g, GENERIC_PASSES, ctx, inst)
    layout = link(generic)
    inits = {}
    for mode, g in generic.items():
        # max_bs too, captured or not: the largest batch is where capacities and int32 sums overflow, so
        # check-split sees it ahead of serving, and an eager batch of max_bs finds its plan ready
        for bs in sorted({*options.sizes, options.max_bs}, reverse=True):
            plans[(mode, bs)] = _compile_bs(g, options, mode, bs, inst, layout)
        at_max = run_passes(g, ("specialize-batch",), PassContext(options, mode, options.max_bs))
        inits[mode] = lower_init(at_max, mode, g.stable_constants(), layout.base(mode))
    pools = pool_specs([i for g in generic.values() for i in g.inputs if i.role.value == "pool"], options.symbols())
    return CompiledBackend(spec, options, generic, plans, timing, layout, inits, pools, time.perf_counter() - t0)


REQUIRED = ("specialize-batch", "pack-inputs", "plan-buffers")  # the runtime needs their results
SAFETY = ("verify", "check-split")  # without them a spec the CUDA-graph rules reject compiles


def check_disabled(options: CompileOptions) -> None:
    """Disabling passes is for bisecting: refuse names that are no pass, passes the runtime cannot
    run without, and the safety passes unless forced."""
    known = GENERIC_PASSES + PER_BS_PASSES
    unknown = [p for p in options.disabled_passes if p not in known]
    if unknown:
        raise OptionsError(f"--disable-pass {' '.join(unknown)}: no such pass; passes: {', '.join(known)}")
    required = [p for p in options.disabled_passes if p in REQUIRED]
    if required:
        raise OptionsError(f"--disable-pass {' '.join(required)}: the runtime allocates and binds from its results; "
                           "it cannot be disabled")
    unsafe = [p for p in options.disabled_passes if p in SAFETY]
    if unsafe and not options.force:
        raise OptionsError(f"--disable-pass {' '.join(unsafe)} switches off a safety check: specs that break the "
                           "CUDA-graph rules would compile and serve wrong metadata; add --force to do it anyway")


def _mode_bytes(g: Graph, space: Space) -> int:
    return max((aligned(b.end) for b in g.buffers if b.space is space), default=0)


def link(generic: dict[ForwardMode, Graph]) -> Layout:
    """One layout for every mode: each mode's regions at a base of its own in every space, so no
    two modes ever share memory (a field of one mode never aliases another mode's)."""
    end = dict.fromkeys(Space, 0)
    bases = []
    for mode, g in generic.items():
        bases.append((mode, tuple((s.value, end[s]) for s in Space)))
        for s in Space:
            end[s] += _mode_bytes(g, s)
    sizes = ((Mem.staging_host, end[Space.staging]), (Mem.staging_dev, end[Space.staging]),
             (Mem.arena, end[Space.arena]), (Mem.host, end[Space.host]))
    return Layout(sizes, tuple(bases))


__all__ = ["CompiledBackend", "compile_backend", "print_graph"]
