"""Pass instruments: observe the pipeline from outside, so passes carry no
debug code. Hooks: ``should_run``, ``before``, ``after``."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO

from .ir import Graph, print_graph
from .ir import verify as verify_graph
from .ir.dot import to_dot
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


class PrintAfterAll(Instrument):
    def __init__(self, stream: TextIO = sys.stderr, only_changes: bool = False):
        self.stream, self.only_changes, self._prev = stream, only_changes, None

    def before(self, name, g, ctx):
        self._prev = g

    def after(self, name, g, ctx):
        if self.only_changes and g == self._prev:
            return
        self.stream.write(f"// after {name} ({ctx.mode.name.lower()}, bs={ctx.bs})\n{print_graph(g)}")


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


def dump_path(root: str, backend: str, ctx: PassContext, bs: int) -> str:
    return os.path.join(root, backend, f"{ctx.mode.name.lower()}-bs{bs}")


class DumpDir(Instrument):
    """Writes ``<root>/<backend>/<mode>-bs<N>/NN-<pass>.ir`` and ``.dot``.

    Mode-generic passes run once per mode, before any bs exists; their dumps
    are kept and written at the head of each bs folder, so every folder holds
    the whole history and ``ls`` shows the pipeline order.
    """

    def __init__(self, root: str, backend: str):
        self.root, self.backend = root, backend
        self._generic: dict[str, list[tuple[str, Graph]]] = {}
        self._count: dict[str, int] = {}

    def start(self, g: Graph, ctx: PassContext) -> None:
        self._generic[ctx.mode.name] = [("spec", g)]

    def _write(self, d: str, name: str, g: Graph) -> None:
        n = self._count.get(d, 0)
        self._count[d] = n + 1
        base = os.path.join(d, f"{n:02d}-{name}")
        with open(base + ".ir", "w") as f:
            f.write(print_graph(g))
        with open(base + ".dot", "w") as f:
            f.write(to_dot(g))

    def folder(self, ctx: PassContext) -> str:
        assert ctx.bs is not None
        d = dump_path(self.root, self.backend, ctx, ctx.bs)
        if d not in self._count:
            os.makedirs(d, exist_ok=True)
            for stale in os.listdir(d):  # only ever delete what this instrument writes
                if stale[:2].isdigit() and stale.endswith((".ir", ".dot", ".py")):
                    os.remove(os.path.join(d, stale))
            self._count[d] = 0
            for name, g in self._generic.get(ctx.mode.name, []):
                self._write(d, name, g)
        return d

    def after(self, name, g, ctx):
        if ctx.bs is None:
            self._generic.setdefault(ctx.mode.name, []).append((name, g))
        else:
            self._write(self.folder(ctx), name, g)

    def lowered(self, plan, ctx, seconds) -> None:
        d = self.folder(ctx)
        n = self._count[d]
        self._count[d] = n + 1
        with open(os.path.join(d, f"{n:02d}-lowered.py"), "w") as f:
            f.write(plan.code())
