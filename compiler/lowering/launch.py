"""Kernel launch indirection.

Every Triton launch goes through ``launch`` so that a graph emulator (the
runtime's CPU stand-in for CUDA graphs) can record it: the Triton CPU
interpreter does not go through torch's dispatcher, so the emulator could not
see it otherwise. The hook lives here, not in runtime/, to keep the
dependency direction compiler <- runtime. A launch names the tensors it
reads and writes, so the emulator can tell which memory a captured graph
touches (what its plan must keep alive); it is read when a kernel is
launched eagerly or captured, never by a replay (a replayed graph runs no
Python).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable

LaunchHook = Callable[[Callable[[], None], tuple], None]
LAUNCH_HOOK: contextvars.ContextVar[LaunchHook | None] = contextvars.ContextVar("attnmeta_launch_hook", default=None)


def launch(fn: Callable[[], None], *tensors) -> None:
    """Run ``fn`` (one kernel launch over ``tensors``), or hand it to the emulator's hook."""
    hook = LAUNCH_HOOK.get()
    if hook is None:
        fn()
    else:
        hook(fn, tensors)

