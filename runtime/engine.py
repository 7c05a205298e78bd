"""A captured plan bound to the engine's own graph buffers: zero host work per replayed step.

An engine's graph runner copies every live batch into static buffers whose addresses its capture
saw (SGLang's ``CudaGraphBufferRegistry``: ``req_pool_indices``, ``seq_lens``, ``out_cache_loc``,
draft-extend lengths), padding the rows past the live ones with safe values, and hands the backend
a view of them. Staging those values again into attnmeta's own buffers every step is host work for
nothing. So when the batch a plan is captured on carries such buffers (every field the graph reads
from the batch is an integer tensor on the backend's device), the capture binds them: each is the
plan's argument for its input's ``engine`` operand (compiler/ir/ops_guard.py), so the recorded
``ingest`` reads it in place, range-checked, whenever the engine word says so. A later step whose view
hands the same buffers (data pointer and length: attribute reads, no tensor op) is one call of the
plan's *step* (``make_step``): the device record's flag, the word, the plan made current, what the
adapter publishes. Nothing is copied, nothing is allocated, no aten op runs.

Where the step finds each buffer on a view is data, never code: a ``Path`` (an attribute chain) per
field, the field's own name unless an adapter's ``Sources`` says otherwise (SGLang's draft extend keeps
its lengths on ``spec_info``). Every path is resolved on the capture batch, which must hand the very
buffer the plan bound; one that does not resolve is a ``ContractError`` at capture naming it, never a
silent slow path at every replay. A view of other tensors (an eager step, another engine) takes the
staging path, correct and slower.

The padding rows are the engine's: a bound graph reads what the engine padded with, which is the
spec's fill when the engine asks the backend for it (SGLang's ``get_cuda_graph_seq_len_fill_value``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
import torch

from attnmeta.compiler.ir.errors import ContractError
from attnmeta.compiler.lowering.binding import ArgKind

from .codegen import load
from .record import INTS


@attrs.frozen
class Path:
    """Where a value sits on an engine's batch: an attribute chain (``("spec_info", "custom_mask")``)."""

    attrs: tuple[str, ...] = attrs.field(converter=tuple)

    def __attrs_post_init__(self):
        if not self.attrs or not all(isinstance(a, str) and a.isidentifier() for a in self.attrs):
            raise ValueError(f"a path is a non-empty chain of attribute names, got {self.attrs!r}")

    def get(self, obj):
        for a in self.attrs:
            obj = getattr(obj, a)
        return obj

    def __str__(self) -> str:
        return ".".join(self.attrs)


@attrs.frozen
class Fed:
    """Views an engine's runner fed without handing the buffers it captured on: it copied their values into
    those buffers and replays this very graph next, but hands its own tensors (SGLang's draft-decode runner
    with no row padded: ``Fed(Path(("num_padding",)), 0)``). Such a view's tensors, each exactly its buffer's
    dtype, device and length, are copied into the buffers (one grouped device copy, no staging)."""

    path: Path
    equals: object


@attrs.frozen
class Sources:
    """What an engine adapter declares of its batches, once: where each field's buffer sits on them (alternatives,
    the first that holds a value read, every step; default the field's own name), and which views its runner fed
    (``Fed``)."""

    paths: Mapping[str, tuple[Path, ...]] = attrs.field(factory=dict)
    fed: Fed | None = None

    def of(self, field: str) -> tuple[Path, ...]:
        return self.paths.get(field, (Path((field,)),))


DEFAULT = Sources()


@attrs.define(eq=False)
class Input:
    """One engine buffer a bound graph reads: the batch field, its first ``n`` values, the plan's arguments
    it is bound to."""

    name: str
    tensor: torch.Tensor
    n: int
    args: tuple[int, ...]


def bind_engine(b, fb, device: torch.device) -> list[Input] | None:
    """At capture: the engine buffers ``fb`` hands for every slot the graph reads on the device, bound as the
    plan's engine arguments; or None (nothing bound) when one is not such a buffer (a host tensor, another
    device, too short) or a slot is read on the host only or unchecked."""
    inputs = []
    for s in b.stager.slots:
        if s.dev is None or s.slot.engine is None:  # read on the host (a planner's input), or not by in_graph
            return None
        name = s.device_field or s.source
        t = getattr(fb, name, None)
        n = b.bs * s.per_row
        if not isinstance(t, torch.Tensor) or t.device != device or t.dtype not in INTS or t.dim() != 1 \
                or not t.is_contiguous() or t.shape[0] < n:
            return None
        at = tuple(k for k, a in enumerate(b.binding.in_args) if s.slot.engine in (a.name if a.kind is ArgKind.engine
                                                                                   else None, a.of))
        inputs.append(Input(name, t[:n], n, at))
    for e in inputs:  # the plan holds each buffer for as long as its graph may read it (a TBO child its rows)
        for k in e.args:
            a = b.binding.in_args[k]
            b.in_args[k] = e.tensor if a.kind is ArgKind.engine else e.tensor[a.start : a.stop]
    return inputs or None


def first_of(paths: tuple[Path, ...]):
    """``get(batch)``: the value at the first of ``paths`` that resolves to something (not None) on ``batch``;
    AttributeError where none does. One path: that path's own getter."""
    if len(paths) == 1:
        return paths[0].get
    gets = tuple(p.get for p in paths)

    def get(batch):
        for g in gets:
            try:
                t = g(batch)
            except AttributeError:
                continue
            if t is not None:
                return t
        raise AttributeError(f"none of {' or '.join(map(str, paths))}")

    return get


def _getter(inp: Input, paths: tuple[Path, ...], batch):
    """``inp``'s getter along ``paths``, checked on the capture batch: it must hand ``inp``'s buffer there."""
    get = first_of(paths)
    try:
        t = get(batch)
    except AttributeError:
        t = None
    if isinstance(t, torch.Tensor) and t.data_ptr() == inp.tensor.data_ptr() and t.numel() >= inp.n:
        return get
    got = "nothing" if t is None else f"a {type(t).__name__}{' of other memory' if isinstance(t, torch.Tensor) else ''}"
    raise ContractError(f"the capture batch hands {got} at {' or '.join(map(str, paths))}, not the engine buffer of "
                        f"{inp.name} the graph was bound to: a replay could never be recognised as reading it. "
                        "Declare where the engine's batch keeps it (engine.Sources paths)")


def _expr(paths: tuple[Path, ...], var: str) -> list[str]:
    """Lines putting the value at the first of ``paths`` holding one on ``v`` into ``var`` (attribute names only:
    each path's parts are checked identifiers)."""
    if len(paths) == 1:
        return [f"{var} = v.{paths[0]}"]
    lines = [f"{var} = None"]
    for p in paths:
        lines.append(f"if {var} is None:")
        head, last = ("v." + ".".join(p.attrs[:-1])) if len(p.attrs) > 1 else "v", p.attrs[-1]
        lines.append(f"    {var} = getattr({head}, {last!r}, None)")
    lines.append(f"if {var} is None:")
    lines.append("    return False")
    return lines


def make_step(backend, b, batch, sources: Sources = DEFAULT, requires: tuple = (),
              publish: Callable | None = None) -> Callable:
    """``b``'s whole replayed out_graph on the engine buffers its capture bound, for views shaped like ``batch``
    (the engine's own capture batch): ``step(view) -> bool``. False (nothing done) when the view does not hand
    those buffers (nor, with ``sources.fed``, is one its runner fed); else what an earlier step's device checks
    found is raised, the engine word set, ``b`` made ``backend``'s current plan, ``publish(view)`` called, True.
    ``requires``: (path, tensor) pairs a replay also needs (a buffer the engine writes in place: the verify mask).
    Each path is resolved here, on the capture batch: one that does not resolve is an error now. The step is
    generated straight-line (runtime/codegen.py): it runs every step, with the host's caches cold."""
    paths = [sources.of(e.name) for e in b.engine]
    for e, ps in zip(b.engine, paths, strict=True):
        _getter(e, ps, batch)  # hands the bound buffer on the capture batch, or a ContractError naming the paths
    for p, _ in requires:
        try:
            p.get(batch)
        except AttributeError:
            raise ContractError(f"the capture batch has no {p}, which a replay requires") from None
    c = dict(FLAG=backend.record.host_np, RAISE=backend.record.raise_pending, WORD=backend.word,
             SET=backend.word.set, AM=backend, B=b, META=b.meta, PUBLISH=publish)
    backed, fetch = [], []
    for k, (e, ps) in enumerate(zip(b.engine, paths, strict=True)):
        c[f"P{k}"] = e.tensor.data_ptr()
        fetch += _expr(ps, f"t{k}")
        # numel, not shape[0]: no torch.Size is made (a bound input is one-dimensional)
        backed.append(f"t{k}.data_ptr() == P{k} and t{k}.numel() >= {e.n}")
    needs = []
    for k, (p, t) in enumerate(requires):
        c[f"X{k}"] = t.data_ptr()
        needs.append(f"v.{p}.data_ptr() == X{k}")
    body = ["def step(v):", "    try:", *(f"        {x}" for x in fetch)]
    ok = " and ".join(backed) or "True"
    fed = sources.fed
    if fed is None:
        body += [f"        if not ({ok}):", "            return False"]
    else:  # a fed view: its own tensors, exactly the buffers' dtype, length and device, copied into the buffers
        c |= {"FOREACH": torch._foreach_copy_, "DSTS": [e.tensor for e in b.engine], "FEDV": fed.equals}
        exact = " and ".join(f"t{k}.dtype is T{k} and t{k}.numel() == {e.n} and t{k}.get_device() == G{k}"
                             for k, e in enumerate(b.engine))
        for k, e in enumerate(b.engine):
            c[f"T{k}"], c[f"G{k}"] = e.tensor.dtype, e.tensor.get_device()
        srcs = ", ".join(f"t{k}" for k in range(len(b.engine)))
        body += [f"        if not ({ok}):", f"            if not (v.{fed.path} == FEDV and {exact or 'True'}):",
                 "                return False", f"            FOREACH(DSTS, [{srcs}])"]
    if needs:
        body += [f"        if not ({' and '.join(needs)}):", "            return False"]
    body += ["    except (AttributeError, TypeError):  # a view of another shape (no spec_info): not this graph's",
             "        return False", "    if FLAG[0]:", "        RAISE()", "    if WORD.value != 1:", "        SET(1)",
             "    AM._current = B", "    AM.forward_metadata = META"]
    if publish is not None:
        body.append("    PUBLISH(v)")
    body.append("    return True")
    return load("step", body, c)
