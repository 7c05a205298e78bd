"""The compile pipeline, readable in one screen.

    spec(mode) --GENERIC--> mode graph --PER_BS(bs)--> specialized graph --lower--> fx out/in modules
"""

from __future__ import annotations

from collections.abc import Sequence

from .instruments import Instrument
from .ir import Graph, VerifyError
from .passes import (  # noqa: F401  (registration)
    check_split,
    cse,
    dce,
    fuse,
    hoist_upgrades,
    infer_shapes,
    pack_inputs,
    specialize_batch,
    verify,
)
from .passes.check_split import SplitError
from .passes.registry import PassContext, get_pass

GENERIC_PASSES = (
    "verify",  # structure and types, as the author wrote them
    "infer-shapes",  # canonical symbolic shapes; data-dependent dims marked
    "hoist-upgrades",  # recordable device work moves into the graph (DSV4 raw->full upgrades)
    "dce",  # drop what no output or planner needs
    "cse",  # one node per distinct computation
    "pack-inputs",  # one staging layout (at max_bs) for every per-step input: one H2D per step
)
PER_BS_PASSES = (
    "specialize-batch",  # substitute bs and config symbols: every static extent an int
    "check-split",  # the CUDA-graph rules; every violation at once
    "fuse",  # in_graph work into one row-parallel Triton kernel
)


class PassError(RuntimeError):
    """A pass crashed (a compiler bug, not a spec error): names the pass and what ran before it."""

    def __init__(self, name: str, ran: list[str], graph: str, cause: BaseException):
        self.pass_name, self.ran = name, ran
        super().__init__(f"pass {name!r} failed on graph {graph!r} after [{', '.join(ran)}]: "
                         f"{type(cause).__name__}: {cause}")


USER_ERRORS = (SplitError, VerifyError)


def run_passes(g: Graph, names: Sequence[str], ctx: PassContext, instruments: Sequence[Instrument] = ()) -> Graph:
    ran: list[str] = []
    for name in names:
        if not all(i.should_run(name, ctx) for i in instruments):
            continue
        for i in instruments:
            i.before(name, g, ctx)
        try:
            g = get_pass(name)(g, ctx)
        except USER_ERRORS:
            raise
        except Exception as e:
            raise PassError(name, ran, g.name, e) from e
        try:
            for i in instruments:
                i.after(name, g, ctx)
        except VerifyError as e:
            raise PassError(name, ran, g.name, e) from e
        ran.append(name)
    return g
