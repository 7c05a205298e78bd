"""What the runtime checks outside the per-step staging: the engine's pools against the compiled
spec (at instantiate), and, before every replay, that what a captured graph holds on to is still
there: the pools' storage, the planners' result objects, and (first replay) every buffer address."""

from __future__ import annotations

import attrs
import torch

from attnmeta.compiler.ir.errors import UserError
from attnmeta.compiler.lowering.binding import ArgKind

from .staging import BatchError


class StaleBufferError(UserError, RuntimeError):
    """A buffer or object the captured graph reads was replaced after capture."""

    rule = "stale-buffer"


def check_pools(specs, pools: dict) -> dict[str, int]:
    """Every pool the spec reads is bound, with its dtype and fixed extents; returns the extents the
    pools decide (R: pool rows, N: KV slots), for the range checks."""
    env: dict[str, int] = {}
    for p in specs:
        t = pools.get(p.name)
        if t is None:
            raise BatchError(f"the spec reads pool {p.name!r}; pass it to instantiate(pools={{{p.name!r}: ...}})")
        ok = isinstance(t, torch.Tensor) and t.dim() == len(p.shape) and t.dtype == p.dtype
        for k, d in enumerate(p.shape if ok else ()):
            if d.is_Integer:
                ok &= t.shape[k] == int(d)
            elif d.is_Symbol:
                ok &= env.setdefault(d.name, t.shape[k]) == t.shape[k]
        if not ok:
            want = ", ".join(str(d) if d.is_Integer else "rows" for d in p.shape)
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise BatchError(f"pool {p.name} must be {str(p.dtype).removeprefix('torch.').replace('int', 'i')}"
                             f"[{want}] (the L it was compiled for), got {got}")
        if t.dim() > 1 and t.shape[-1] > 1 and t.stride(-1) != 1:  # the kernels step rows by one stride only
            raise BatchError(f"pool {p.name} has column stride {t.stride(-1)} (a transposed or column-sliced view); "
                             f"the kernels read each row's entries consecutively: pass {p.name}.contiguous(), or a "
                             "view that keeps whole rows")
    return env


@attrs.define
class Capture:
    """What a captured graph holds on to: the pools' storage and the planners' results."""

    pools: list[tuple[str, torch.Tensor, int]]  # (name, tensor, data_ptr) the graph reads
    planned: list  # planner results at capture: replays must get the same objects
    in_ptrs: list[int]
    checked: bool = False


def _ptrs(args: list) -> list[int]:
    return [a.data_ptr() if isinstance(a, torch.Tensor) else id(a) for a in args]


def _same(new, old) -> bool:
    return new is old or (isinstance(old, int | float | str | bool | type(None)) and new == old)


def capture_record(b) -> Capture:
    """At capture: the pools, planner results and buffer addresses the graph now holds."""
    pools = [(a.name, t, t.data_ptr()) for a, t in zip(b.binding.in_args, b.in_args, strict=True)
             if a.kind is ArgKind.pool]
    return Capture(pools, [getattr(b.meta, f) for f in b.binding.planned], _ptrs(b.in_args))


def check_replay(b, pools: dict) -> None:
    """Before a replay: every buffer and planner result the graph captured is still the one it reads."""
    c = b.capture
    for name, t, ptr in c.pools:
        if pools[name] is not t or t.data_ptr() != ptr:
            raise StaleBufferError(f"pool {name} of {b.binding.graph} was rebound after capture; the graph still "
                                   "reads the old storage. Write into the bound pool in place instead.")
    for field, old in zip(b.binding.planned, c.planned, strict=True):
        if not _same(getattr(b.meta, field), old):
            raise StaleBufferError(f"planner field {field} of {b.binding.graph} is a new object at replay; the "
                                   "captured graph keeps the capture-time one. A planner must return the same "
                                   "object every call (a graph-mode wrapper planned in place).")
    if not c.checked:  # internal buffers are bound once; check them on the first replay only
        fresh = _ptrs(b.in_args)
        if fresh != c.in_ptrs:
            names = [a.name for a, x, y in zip(b.binding.in_args, fresh, c.in_ptrs, strict=True) if x != y]
            raise StaleBufferError(f"buffers {names} of {b.binding.graph} were rebound after capture; the graph "
                                   "still reads the old ones. Write new values in place (copy_) instead.")
        c.checked = True

