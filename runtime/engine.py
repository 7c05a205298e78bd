"""A captured plan bound to the engine's own graph buffers: zero host work per replayed step.

An engine's graph runner copies every live batch into static buffers whose addresses its capture
saw (SGLang's ``CudaGraphBufferRegistry``: ``req_pool_indices``, ``seq_lens``, ``out_cache_loc``,
draft-extend lengths), padding the rows past the live ones with safe values, and hands the backend
a view of them. Staging those values again into attnmeta's own buffers every step is host work for
nothing. So when the batch a plan is captured on carries such buffers (every field the graph reads
from the batch is an integer tensor on the backend's device), the capture binds them: the recorded
in_graph ingests them in place (``guard.ingest``, inside the fused kernel: range-checked, narrowed into
the buffers its body reads), and a later step whose view has the same buffers (data pointer and length: attribute
reads, no tensor op) is served by one function generated at capture (``replayer``: the check, the
device record's flag, the plan made current, what the adapter publishes), where no host planner still
needs host data. Nothing is copied, nothing is allocated, no aten op runs.

A view of other tensors (an eager step, another engine) takes the staging path, correct and slower.
One device word says which path fed the step: the ingest of a bound graph runs only when it is set,
the staged device-only fields' guard only when it is clear, so a replay after a staged step reads
what was staged. The word is written (one stream-ordered fill) only when the path changes.

The padding rows are the engine's: a bound graph reads what the engine padded with, which is the
spec's fill when the engine asks the backend for it (SGLang's ``get_cuda_graph_seq_len_fill_value``).
Its checks are the device's: a bad value is replaced and reported at the next step (runtime/guard.py);
a pool row of 0 passes there, as the engine's padding rows hold it.
"""

from __future__ import annotations

import logging

import attrs
import torch

from .guard import INTS, Feed, safe_range

log = logging.getLogger("attnmeta.runtime")


@attrs.define(eq=False)
class Input:
    """One engine buffer a bound graph reads: the batch attribute, its first ``n`` values, the slot."""

    name: str
    tensor: torch.Tensor
    n: int
    slot: object  # the plan's staged slot (runtime/staging.py _Staged): its device buffer, range, record index
    field: int


class Engine:
    """The engine buffers one captured plan reads in place, and the check that a view is backed by them."""

    def __init__(self, inputs: list[Input], word: EngineWord, guard):
        self.inputs, self.word, self.guard = inputs, word, guard
        self.backed = checker(inputs)

    def feeds(self) -> list[Feed]:
        """in_graph: the engine's values into the graph's buffers, on the steps whose view was the engine's."""
        return [Feed(e.tensor, e.slot.dev, e.n, *safe_range(e.slot, bound=True), e.field, when=1) for e in self.inputs]


class EngineWord:
    """The device word that says whether this step's graph reads the engine's buffers (1) or what out_graph
    staged (0), with its host mirror: written only when it changes."""

    def __init__(self, device: torch.device):
        self.tensor = torch.zeros(1, dtype=torch.int32, device=device)
        self.value = 0

    def set(self, v: int) -> None:
        if self.value != v:
            self.tensor.fill_(v)
            self.value = v


def bind_engine(b, fb, device: torch.device, word: EngineWord, guard) -> Engine | None:
    """At capture: the engine buffers ``fb`` hands every slot the graph reads on the device, or None when one
    is not such a buffer (a host tensor, another device, too short) or a slot is read on the host only."""
    inputs = []
    for s in b.stager.slots:
        if s.dev is None:  # read on the host (a planner's input): nothing to bind
            return None
        name = s.device_field or s.source
        t = getattr(fb, name, None)
        n = b.bs * s.per_row
        if not isinstance(t, torch.Tensor) or t.device != device or t.dtype not in INTS or t.dim() != 1 \
                or not t.is_contiguous() or t.shape[0] < n:
            return None
        inputs.append(Input(name, t[:n], n, s, guard.field(name)))
    return Engine(inputs, word, guard) if inputs else None


def _backed(inputs: list[Input], paths: dict[str, str] | None, extra: tuple, ns: dict) -> str:
    """The condition that view ``v`` hands the captured buffers (their data pointers and lengths, as
    ``P{i}`` / ``X{i}`` constants in ``ns``): attribute reads and C calls that allocate nothing."""
    cond = []
    for i, e in enumerate(inputs):
        ns[f"P{i}"] = e.tensor.data_ptr()
        # numel, not shape[0]: no torch.Size is made (a bound input is one-dimensional)
        cond.append(f"(t := {(paths or {}).get(e.name, 'v.' + e.name)}).data_ptr() == P{i} and t.numel() >= {e.n}")
    for i, (expr, ptr) in enumerate(extra):
        ns[f"X{i}"] = ptr
        cond.append(f"{expr}.data_ptr() == X{i}")
    return " and ".join(cond) or "True"


def _fed(inputs: list[Input], paths: dict[str, str] | None, when: str, ns: dict) -> tuple[str, str]:
    """The condition that view ``v`` is one an engine's runner fed (``when``, the adapter's expression for it)
    and hands, in place of each captured buffer, a tensor of exactly its values' shape (the buffer's dtype and
    device, ``n`` values); and the one grouped device copy that puts them where the graph reads."""
    cond, srcs = [when], []
    ns["FOREACH"] = torch._foreach_copy_
    ns["DSTS"] = [e.tensor for e in inputs]
    for i, e in enumerate(inputs):
        ns[f"T{i}"], ns[f"G{i}"] = e.tensor.dtype, e.tensor.get_device()
        expr = (paths or {}).get(e.name, "v." + e.name)
        cond.append(f"(t := {expr}).dtype is T{i} and t.numel() == {e.n} and t.get_device() == G{i}")
        srcs.append(expr)
    return " and ".join(cond), f"FOREACH(DSTS, [{', '.join(srcs)}])"


def _generate(name: str, src: str, ns: dict):
    exec(compile(src, f"<attnmeta {name}>", "exec"), ns)  # noqa: S102
    return ns[name]


def checker(inputs: list[Input], paths: dict[str, str] | None = None, extra: tuple = (), helpers: dict | None = None):
    """``backed(view)``: whether ``view`` hands the captured buffers, generated straight-line (a step pays a
    few attribute reads). ``paths`` reads an input another way than ``v.<name>`` (an engine's own batch,
    whose fields sit elsewhere); ``extra`` adds (expression, data pointer) pairs a caller also requires."""
    ns = dict(helpers or {})
    cond = _backed(inputs, paths, extra, ns)
    return _generate("backed", "def backed(v):\n    try:\n        return " + cond +
                     "\n    except (AttributeError, IndexError, TypeError):\n        return False\n", ns)


VIEW = object()  # in ``replayer``'s assignments: the step's view itself


def replayer(b, backend, paths: dict[str, str] | None = None, extra: tuple = (), helpers: dict | None = None,
             then: tuple = (), fed: str | None = None):
    """A replayed step's whole out_graph on the engine buffers ``b.engine`` binds, as one generated function
    ``replay(view) -> bool``: False (nothing done) when the view does not hand those buffers (``checker``'s
    condition), else what an earlier step's device checks found is raised, the engine word set, ``b`` made
    ``backend``'s current plan, ``then``'s ``(object, attribute, value)`` assignments made (``VIEW``: the
    view), True. Every object is a constant of the function: the step makes no call but the checks' C
    calls, because a replayed step's host time is the serving loop's, paid every step with cold caches.
    ``fed``: an expression true of a view whose runner has put its values into the captured buffers and
    replays this very graph next, but hands its own tensors (SGLang's draft-decode runner with no row
    padded); such a view is copied into the buffers (``_fed``: one grouped device copy, no staging, no
    wait). Only an adapter that knows its runner says so: a view of other tensors in general may be
    followed by a larger graph's replay (an engine that dispatches before it pads), whose rows past this
    view's must then read the staging path's padding, not the buffers' stale rows."""
    e = b.engine
    ns = dict(helpers or {}, FLAG=memoryview(e.guard.host_np), RAISE=e.guard.raise_pending, WORD=e.word,
              SET=e.word.set, AM=backend, B=b)
    lines = ["def replay(v):", "    try:", f"        if not ({_backed(e.inputs, paths, extra, ns)}):"]
    if fed is None:
        lines.append("            return False")
    else:
        cond, copy = _fed(e.inputs, paths, fed, ns)
        lines += [f"            if not ({cond} and {_backed([], None, extra, ns)}):", "                return False",
                  f"            {copy}"]
    lines += ["    except (AttributeError, IndexError, TypeError):", "        return False",
              "    if FLAG[0]:", "        RAISE()", "    if WORD.value != 1:", "        SET(1)",
              "    AM._current = B", "    AM.forward_metadata = B.meta"]
    for i, (obj, attr, value) in enumerate(then):
        if not attr.isidentifier():
            raise ValueError(f"replayer: {attr!r} is not an attribute name")
        ns[f"O{i}"] = obj
        if value is VIEW:
            lines.append(f"    O{i}.{attr} = v")
        else:
            ns[f"V{i}"] = value
            lines.append(f"    O{i}.{attr} = V{i}")
    return _generate("replay", "\n".join(lines + ["    return True", ""]), ns)
