"""Kernel launch indirection.

Every Triton launch goes through ``launch`` so that a graph emulator (the
runtime's CPU stand-in for CUDA graphs) can record it: the Triton CPU
interpreter does not go through torch's dispatcher, so the emulator could not
see it otherwise. The hook lives here, not in runtime/, to keep the
dependency direction compiler <- runtime.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

LaunchHook = Callable[[Callable[[], None]], None]
LAUNCH_HOOK: contextvars.ContextVar[LaunchHook | None] = contextvars.ContextVar("attnmeta_launch_hook", default=None)


def launch(fn: Callable[[], None]) -> None:
    hook = LAUNCH_HOOK.get()
    if hook is None:
        fn()
    else:
        hook(fn)


# Work the next fused kernel launched runs first, inside itself (the runtime's range check of the step's
# device values, ``ingest.Prologue``): set by the runtime around a step's metadata graph, taken by its first
# fused kernel, so a captured step is one graph node.
PROLOGUE: contextvars.ContextVar[list | None] = contextvars.ContextVar("attnmeta_prologue", default=None)


def take_prologue():
    """The pending prologue, now no longer pending; None when there is none."""
    pending = PROLOGUE.get()
    return pending.pop() if pending else None
