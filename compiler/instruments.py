"""Pass instruments: observe the pipeline from outside, so passes carry no
debug code. Dumps are in dumps.py."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from .ir import Graph, print_graph_or_say_why
from .ir import verify as verify_graph
from .passes.registry import PassContext


class Instrument:
    """Hooks on every stage: ``start`` (a mode's spec graph), ``should_run``/``before``/``after``
    (each pass), ``lowered`` (a plan lowered, and the seconds it took)."""

    def start(self, g: Graph, ctx: PassContext) -> None:
        pass

    def should_run(self, name: str, ctx: PassContext) -> bool:
        return True

    def before(self, name: str, g: Graph, ctx: PassContext) -> None:
        pass

    def after(self, name: str, g: Graph, ctx: PassContext) -> None:
        pass

    def lowered(self, plan, ctx: PassContext, seconds: float) -> None:
        pass

    def failed(self, name: str, g: Graph, ctx: PassContext, error: BaseException) -> None:
        """Pass ``name`` raised on ``g`` (its input)."""

    def aborted(self, error: BaseException) -> None:
        """The compile stopped with ``error`` (in a pass, or outside any: the spec's builder raised)."""

    def finish(self, timing: dict[str, float]) -> None:
        """The compile is done; ``timing``: seconds per pass over every size."""


class VerifyEach(Instrument):
    """Run the verifier after every pass (always on in tests)."""

    def after(self, name, g, ctx):
        verify_graph(g)


class DisablePasses(Instrument):
    """Skip passes by name, for bisecting a miscompile."""

    def __init__(self, names):
        self.names = set(names)

    def should_run(self, name, ctx):
        return name not in self.names


class PrintIR(Instrument):
    """Print the IR around passes to a stream: after every pass (``after=None``), after the named
    ones, before the named ones, only where a pass changed it, and the input of a pass that failed;
    for the selected modes and sizes (``select``, dumps.Selection: every one by default)."""

    def __init__(self, stream: TextIO = sys.stderr, after=None, before=(), only_changes: bool = False,
                 on_failure: bool = True, select=None):
        self.stream, self.after_names, self.before_names = stream, after, set(before)
        self.only_changes, self.on_failure, self.select, self._prev = only_changes, on_failure, select, None

    def _covers(self, ctx) -> bool:
        return self.select is None or self.select.covers(ctx)

    def _print(self, what: str, name: str, g: Graph, ctx) -> None:
        where = ctx.mode.name.lower() + ("" if ctx.bs is None else f", bs={ctx.bs}")
        self.stream.write(f"// -----// IR Dump {what} {name} ({where}) //----- //\n{print_graph_or_say_why(g)}")

    def before(self, name, g, ctx):
        self._prev = g
        if name in self.before_names and self._covers(ctx):
            self._print("Before", name, g, ctx)

    def after(self, name, g, ctx):
        wanted = self.after_names is None or name in self.after_names
        if wanted and self._covers(ctx) and not (self.only_changes and g == self._prev):
            self._print("After", name, g, ctx)

    def failed(self, name, g, ctx, error):
        if self.on_failure:
            self._print("Before failed", name, g, ctx)


def PrintAfterAll(stream: TextIO = sys.stderr, only_changes: bool = False) -> PrintIR:  # noqa: N802
    """The IR after every pass (or every pass that changed it)."""
    return PrintIR(stream, only_changes=only_changes, on_failure=False)


class Timing(Instrument):
    """Accumulated seconds per pass name."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._t0 = 0.0

    def before(self, name, g, ctx):
        self._t0 = time.perf_counter()

    def after(self, name, g, ctx):
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - self._t0

    def lowered(self, plan, ctx, seconds):
        self.seconds["lower"] = self.seconds.get("lower", 0.0) + seconds
