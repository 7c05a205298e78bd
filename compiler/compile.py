"""compile_backend: a spec in, the compiled artifact out, ahead of serving."""

from __future__ import annotations

import difflib
import logging
import time
from collections.abc import Sequence

import attrs

from . import artifact
from .dumps import DumpDir, Selection
from .instruments import DisablePasses, Instrument, Timing, VerifyEach
from .ir import Graph, Op, Region
from .ir.errors import NotCompiled, OptionsError
from .ir.graph import Space
from .lowering.binding import Arg, Layout, PoolSpec, mode_bytes
from .lowering.fx import LoweredPlan
from .modes import ForwardMode
from .options import CompileOptions
from .pipeline import GENERIC_PASSES, PER_BS_PASSES, compile_size, compile_spec
from .spec import BackendSpec, get_spec, load_plugin, windowed

log = logging.getLogger("attnmeta.compile")

REQUIRED = ("specialize-batch", "pack-inputs", "plan-buffers")  # the runtime needs their results
# without them a spec the CUDA-graph rules reject compiles, or a device value reaches the kernels unchecked
SAFETY = {"verify": "a malformed graph would compile", "check-split": "specs that break the CUDA-graph rules would "
          "compile and serve wrong metadata", "guard-inputs": "values the engine hands on the device (and a graph "
          "replayed over another size's staging) would reach the kernels unchecked and unreported"}


@attrs.define
class CompiledBackend:
    """The compiled artifact: a graph per mode, a lowered plan (fx modules + typed binding) per
    (mode, bs), the layout of every static buffer, and each mode's shared constants."""

    spec: BackendSpec
    options: CompileOptions
    generic: dict[ForwardMode, Graph]
    plans: dict[tuple[ForwardMode, int], LoweredPlan]
    timing: Timing
    layout: Layout
    inits: dict[ForwardMode, tuple[object, tuple[Arg, ...]]]  # per mode: shared constants, at max_bs
    pools: tuple[PoolSpec, ...]  # the engine tensors every mode reads, bound at instantiate
    stable: dict[ForwardMode, frozenset[str]]
    seconds: float = 0.0
    ref: str = ""  # how the spec was named (a registered name, pkg.module:SPEC, file.py:SPEC)

    @property
    def modes(self) -> tuple[ForwardMode, ...]:
        return self.options.modes

    def plan(self, mode: ForwardMode, bs: int) -> LoweredPlan:
        """The plan for (mode, bs); a size compiled for neither capture nor max_bs is compiled here,
        explicitly (``specialize``)."""
        key = (mode.graph_key, bs)
        return self.plans[key] if key in self.plans else self.specialize(mode, bs)

    def require(self, mode: ForwardMode, bs: int) -> ForwardMode:
        """The graph mode of a (mode, bs) batch this backend can serve, or a ``NotCompiled`` naming what it was
        compiled for (the one mode/size guard: the runtime asks it too, and says it as a ``BatchError``)."""
        key = mode.graph_key
        if key not in self.generic:
            raise NotCompiled(f"backend {self.spec.name!r} was compiled for modes "
                             f"{[m.name.lower() for m in self.generic]}, not {mode.name.lower()}; add it to "
                             "CompileOptions.modes (--modes)")
        if not 0 <= bs <= self.options.max_bs:
            raise NotCompiled(f"batch size {bs} exceeds max_bs={self.options.max_bs} the backend was compiled for; "
                             "recompile with a larger max_bs (--max-bs)")
        return key

    def specialize(self, mode: ForwardMode, bs: int) -> LoweredPlan:
        """Compile the plan of a size that was not compiled ahead (an eager batch), once, and keep it."""
        key = self.require(mode, bs)
        if (key, bs) not in self.plans:
            log.info("compiling the plan of %s at bs=%d (a size not compiled ahead)", key.name.lower(), bs)
            inst = [VerifyEach()] if self.options.verify_each else []
            self.plans[(key, bs)] = compile_size(self.generic[key], self.options, key, bs, self.layout,
                                                 self.stable[key], inst)
        return self.plans[(key, bs)]

    def kernels(self, mode: ForwardMode, bs: int) -> int:
        """Device launches per step in the plan's graph: fused kernels, unfused ops (slices are views), and the
        copies of values an output field passes through into its own buffer (an input or a view exposed under
        another field's name: lowering copies it in in_graph)."""
        p = self.plan(mode, bs)
        consts, fused = set(p.consts), p.graph.kernel_of()
        copies = sum(1 for n in p.in_gm.graph.nodes if n.op == "call_method" and n.target == "copy_")
        return len(p.kernels) + copies + sum(1 for n in p.graph.region_nodes(Region.in_graph)
                                             if n.name not in consts and n.name not in fused and n.op is not Op.slice)

    def summary(self) -> list[dict]:
        """Per mode: node counts, host ops and bytes copied per step at the largest captured size,
        the range of kernels per step over every captured size, and the mode's device buffers."""
        rows = []
        for mode in self.options.modes:
            bs = max(self.options.sizes)
            p = self.plan(mode, bs)
            g = p.graph
            ks = sorted({self.kernels(mode, b) for b in self.options.sizes})
            rows.append({
                "mode": mode.name.lower(), "bs": bs,
                "out_graph": len(g.region_nodes(Region.out_graph)), "in_graph": len(g.region_nodes(Region.in_graph)),
                "host_ops": sum(1 for n in g.region_nodes(Region.out_graph) if n.name not in p.consts),
                "kernels": str(ks[0]) if len(ks) == 1 else f"{ks[0]}-{ks[-1]}",
                "bytes_per_step": sum(c[1].nbytes for c in p.binding.copies),
                "captured_sizes": len(self.options.sizes),
                "arena_kib": round(mode_bytes(self.generic[mode.graph_key], Space.arena) / 1024, 1),
            })
        return rows

    def save(self, path: str, ref: str | None = None) -> str:
        """Write this compiled backend to ``path`` (compiler/artifact.py); ``load_compiled`` reads it back."""
        return artifact.save(self, path, ref)

    def instantiate(self, req_to_token, device=None, planners=None, pools=None):
        """Bind pools (``req_to_token`` and any other the spec reads, e.g. ``full_to_swa``) and a
        device: an AttentionBackend with its static buffers allocated once. The runtime that does
        it is what the installed package registers as ``attnmeta.instantiate`` (an entry point: the compiler
        never imports the runtime)."""
        return load_plugin("attnmeta.instantiate", "default")(self, req_to_token, device=device, planners=planners,
                                                              pools=pools)


def check_disabled(options: CompileOptions) -> None:
    """Disabling passes is for bisecting: refuse names that are no pass, passes the runtime cannot
    run without, and the safety passes unless forced."""
    known = GENERIC_PASSES + PER_BS_PASSES
    unknown = [p for p in options.disabled_passes if p not in known]
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        raise OptionsError(f"--disable-pass {' '.join(unknown)}: no such pass"
                           f"{f' (did you mean {close[0]!r}?)' if close else ''}; passes: {', '.join(known)}")
    required = [p for p in options.disabled_passes if p in REQUIRED]
    if required:
        raise OptionsError(f"--disable-pass {' '.join(required)}: the runtime allocates and binds from its results; "
                           "it cannot be disabled")
    unsafe = [p for p in options.disabled_passes if p in SAFETY]
    if unsafe and not options.force:
        raise OptionsError(f"--disable-pass {' '.join(unsafe)} switches off a safety check: "
                           f"{'; '.join(SAFETY[p] for p in unsafe)}; add --force to do it anyway")


def _describe(o: CompileOptions) -> str:
    return (f"max_bs={o.max_bs} sizes={list(o.sizes)} modes={[m.name.lower() for m in o.modes]} P={o.page_size} "
            f"L={o.max_context_len} D={o.num_draft_tokens} S={o.num_steps} K={o.topk}")


def check_dump_sizes(options: CompileOptions) -> None:
    """``dump_bs`` and ``dump_modes`` name sizes and graphs that are compiled: another would silently dump
    nothing."""
    compiled = sorted({*options.sizes, options.max_bs})
    missing = sorted(set(options.dump_bs) - set(compiled))
    if missing:
        raise OptionsError(f"dump_bs {missing} are not compiled sizes (compiled: {compiled}); dump one of those, "
                           "or add the size to capture_sizes (--capture-sizes)")
    graphs = sorted({m.graph_key.name.lower() for m in options.modes})  # idle is decode's graph
    stray = sorted({m.lower() for m in options.dump_modes} - set(graphs))
    if stray:
        raise OptionsError(f"dump_modes {stray} are not compiled graphs (--dump-modes): the compile has {graphs}; "
                           "dump one of those, or add the mode to --modes (idle is dumped as decode)")


def dump_selection(options: CompileOptions) -> Selection:
    """The sizes and modes dumps cover: those named, else the largest captured size, every mode."""
    return Selection(options.dump_modes, options.dump_bs or (max(options.sizes),))


def compile_backend(spec_or_name: BackendSpec | str, options: CompileOptions | None = None,
                    instruments: Sequence[Instrument] = ()) -> CompiledBackend:
    """Compile a backend spec (or a registered name, or ``pkg.module:SPEC``) for every (mode,
    captured bs) in ``options``."""
    options = options or CompileOptions()
    if not isinstance(options, CompileOptions):
        raise OptionsError(f"options must be a CompileOptions (e.g. CompileOptions(max_bs=64)), got "
                           f"{type(options).__name__}: {options!r:.80}")
    if not isinstance(spec_or_name, str | BackendSpec):
        raise OptionsError(f"compile_backend takes a BackendSpec or its name ('triton', 'pkg.module:SPEC', "
                           f"'path/to/file.py:SPEC'), got {type(spec_or_name).__name__}: {spec_or_name!r:.80}")
    spec = get_spec(spec_or_name)
    unsupported = [m for m in options.modes if m.graph_key not in spec.modes]
    if unsupported:
        raise OptionsError(f"backend {spec.name!r} does not support modes {[m.name.lower() for m in unsupported]}; "
                           f"it supports {[m.name.lower() for m in spec.modes]}")
    if spec.page_sizes and options.page_size not in spec.page_sizes:
        raise OptionsError(f"backend {spec.name!r} serves page sizes {list(spec.page_sizes)}, not "
                           f"{options.page_size} (--page-size)")
    if options.sliding_window and not spec.windows:
        raise OptionsError(f"backend {spec.name!r} does not plan sliding-window layers (sliding_window="
                           f"{options.sliding_window}); backends that do: {windowed()}; or "
                           f"compile without --sliding-window")
    if options.backend is not None and not (spec.options_type and isinstance(options.backend, spec.options_type)):
        takes = f"takes {spec.options_type.__name__}" if spec.options_type else "has no options of its own"
        raise OptionsError(f"backend {spec.name!r} {takes}, got backend={options.backend!r}")
    spec.check(options)
    for m in options.modes:  # columns a mode reads past each sequence: the context must leave room for one token
        room = spec.headroom(m, options)
        if options.max_context_len - room < 1:
            raise OptionsError(f"backend {spec.name!r} in {m.name.lower()} reads {room} request-table columns past "
                               f"each sequence, which max_context_len={options.max_context_len} leaves no room for; "
                               f"raise max_context_len above {room} (--max-context-len)")
    check_disabled(options)
    check_dump_sizes(options)
    timing = Timing()
    inst: list[Instrument] = [timing, *instruments]
    if options.verify_each:
        inst.append(VerifyEach())
    if options.disabled_passes:
        inst.append(DisablePasses(options.disabled_passes))
    if options.dump_dir:
        inst.append(DumpDir(options.dump_dir, spec.name, dump_selection(options), _describe(options)))
    t0 = time.perf_counter()
    try:
        s = compile_spec(spec, options, inst)
    except BaseException as e:
        for i in inst:
            i.aborted(e)
        raise
    finally:  # a failed compile's dumps are finished too: they are what a person debugs it with
        for i in inst:
            i.finish(timing.seconds)
    log.info("compiled %s: %d plans in %.3f s", spec.name, len(s.plans), time.perf_counter() - t0)
    return CompiledBackend(spec, options, s.generic, s.plans, timing, s.layout, s.inits, s.pools, s.stable,
                           time.perf_counter() - t0, ref=spec_or_name if isinstance(spec_or_name, str) else spec.name)


def load_compiled(path: str, spec: BackendSpec | str | None = None) -> CompiledBackend:
    """A compiled backend saved by ``CompiledBackend.save`` (``attnmeta compile --out``), lowered in
    this process without running a pass; refused (``ArtifactError``) when stale. ``spec``
    overrides where the saved reference says the spec is."""
    spec, options, s, ref, seconds = artifact.read(path, spec)
    timing = Timing()
    timing.seconds["load"] = seconds
    log.info("loaded %s from %s: %d plans in %.3f s", spec.name, path, len(s.plans), seconds)
    return CompiledBackend(spec, options, s.generic, s.plans, timing, s.layout, s.inits, s.pools, s.stable, seconds,
                           ref=ref)
