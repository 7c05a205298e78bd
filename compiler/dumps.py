"""Dumps that scale: what a compile did, written so a person can read it.

    <dump_dir>/<backend>/run-<date>-<time>-<pid>/     one folder per compile (``latest`` links the newest)
        passes.json                                   the pass table: pass, mode, bs, changed, nodes, time, kernels;
                                                      its status ("complete" or "failed") and the failure
        <mode>/[bs<N>/]NN-<pass>.failed.ir            a failed compile: the IR the failing pass was given
        <mode>/00-spec.ir .. 06-plan-buffers.ir       the mode-generic passes, once per mode
        <mode>/bs<N>/07-specialize-batch.ir ..        the per-size passes, for the selected sizes only
        <mode>/bs<N>/10-lowered.py, graph.dot         the generated code (runs on its own), the final graph

Each ``.ir`` starts with an MLIR-style header line and parses back. Sizes and modes are selected
(``--dump-bs``, ``--dump-modes``; by default every mode and the largest captured size), so a
compile of 256 sizes writes what one size needs, not 256 copies of it.
"""

from __future__ import annotations

import datetime
import json
import os
import time

from .instruments import Instrument
from .ir import Graph, print_graph, print_graph_or_say_why
from .ir.dot import to_dot
from .passes.registry import PassContext


class Selection:
    """Which (mode, bs) a dump or a print covers: every mode unless named, the chosen sizes."""

    def __init__(self, modes=(), sizes=()):
        self.modes = {m.lower() for m in modes}
        self.sizes = set(sizes)

    def covers(self, ctx: PassContext) -> bool:
        mode_ok = not self.modes or ctx.mode.name.lower() in self.modes
        return mode_ok and (ctx.bs is None or ctx.bs in self.sizes)


def header(name: str, ctx: PassContext) -> str:
    where = ctx.mode.name.lower() + ("" if ctx.bs is None else f", bs={ctx.bs}")
    return f"// -----// IR Dump After {name} ({where}) //----- //\n"


def new_run(root: str, backend: str) -> str:
    """A fresh run folder under ``root/backend``, and ``latest`` pointed at it."""
    base = os.path.join(root, backend)
    os.makedirs(base, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run = os.path.join(base, f"run-{stamp}-{os.getpid()}")
    k = 0
    while os.path.exists(run + (f"-{k}" if k else "")):
        k += 1
    run += f"-{k}" if k else ""
    os.makedirs(run)
    link = os.path.join(base, "latest")
    try:
        if os.path.islink(link) or os.path.exists(link):
            os.remove(link)
        os.symlink(os.path.basename(run), link)
    except OSError:  # a file system without links: the newest run folder is still the newest name
        pass
    return run


class DumpDir(Instrument):
    """Writes the run folder above; records the pass table as the compile goes."""

    def __init__(self, root: str, backend: str, select: Selection, options: str = ""):
        self.run, self.select, self.meta = new_run(root, backend), select, {"backend": backend, "options": options}
        self.rows: list[dict] = []
        self.failure: dict | None = None
        self._count: dict[str, int] = {}
        self._generic: dict[str, int] = {}  # mode -> passes dumped in its generic stage
        self._before: Graph | None = None
        self._t0 = 0.0

    def _folder(self, ctx: PassContext) -> str:
        d = os.path.join(self.run, ctx.mode.name.lower(), *(() if ctx.bs is None else (f"bs{ctx.bs}",)))
        if d not in self._count:
            os.makedirs(d, exist_ok=True)
            self._count[d] = self._generic.get(ctx.mode.name, 0) if ctx.bs is not None else 0
        return d

    def _write(self, name: str, g: Graph, ctx: PassContext) -> None:
        d = self._folder(ctx)
        n = self._count[d]
        self._count[d] = n + 1
        if ctx.bs is None:
            self._generic[ctx.mode.name] = n + 1
        with open(os.path.join(d, f"{n:02d}-{name}.ir"), "w") as f:
            f.write(header(name, ctx) + print_graph(g))

    def start(self, g: Graph, ctx: PassContext) -> None:
        if self.select.covers(ctx):
            self._write("spec", g, ctx)

    def before(self, name, g, ctx):


        self._before, self._t0 = g, time.perf_counter()

    def after(self, name, g, ctx):


        if not self.select.covers(ctx):
            return
        self._write(name, g, ctx)
        b = self._before
        self.rows.append({"pass": name, "mode": ctx.mode.name.lower(), "bs": ctx.bs,
                          "changed": g is not b and g != b, "nodes_before": len(b.nodes) if b else None,
                          "nodes_after": len(g.nodes), "seconds": round(time.perf_counter() - self._t0, 6),
                          "kernels": len(set(dict(g.kernels).values())) or None})
        if name == "fuse":
            with open(os.path.join(self._folder(ctx), "graph.dot"), "w") as f:
                f.write(to_dot(g))

    def lowered(self, plan, ctx, seconds) -> None:
        if not self.select.covers(ctx):
            return
        d = self._folder(ctx)
        n = self._count[d]
        self._count[d] = n + 1
        from .lowering.script import standalone

        with open(os.path.join(d, f"{n:02d}-lowered.py"), "w") as f:
            f.write(standalone(plan))
        self.rows.append({"pass": "lower", "mode": ctx.mode.name.lower(), "bs": ctx.bs, "changed": True,
                          "nodes_before": len(plan.graph.nodes), "nodes_after": len(plan.graph.nodes),
                          "seconds": round(seconds, 6), "kernels": len(plan.kernels)})

    def failed(self, name, g, ctx, error) -> None:
        """The pass that raised: what it was given (written whatever the selection: it is what a person
        debugs), and the error with every violation, for passes.json and the report."""
        d = self._folder(ctx)
        n = self._count[d]
        ir = os.path.join(d, f"{n:02d}-{name}.failed.ir")
        with open(ir, "w") as f:
            f.write(header(name, ctx).replace("After", "Before (failed)") + print_graph_or_say_why(g))
        self.failure = {"pass": name, "mode": ctx.mode.name.lower(), "bs": ctx.bs, "error": type(error).__name__,
                        "message": str(error), "ir": os.path.relpath(ir, self.run),
                        "violations": [{"rule": v.rule, "node": v.node, "origin": v.origin, "message": v.message,
                                        "fix": v.fix} for v in getattr(error, "violations", ())]}

    def aborted(self, error: BaseException) -> None:
        """A compile that stopped outside any pass (the spec's builder raised): the run says so, not "complete"."""
        if self.failure is None:
            self.failure = {"pass": "spec", "mode": None, "bs": None, "error": type(error).__name__,
                            "message": str(error), "ir": None,
                            "violations": [{"rule": v.rule, "node": v.node, "origin": v.origin, "message": v.message,
                                            "fix": v.fix} for v in getattr(error, "violations", ())]}

    def finish(self, timing: dict[str, float]) -> None:
        with open(os.path.join(self.run, "passes.json"), "w") as f:
            total = {k: round(v, 6) for k, v in timing.items()}
            status = {"status": "failed", "failure": self.failure} if self.failure else {"status": "complete"}
            json.dump({**self.meta, **status, "passes": self.rows, "seconds_all_sizes": total}, f, indent=1)
