"""Pass registry and the context every pass receives explicitly."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..ir import Graph
from ..ir.errors import InternalError, UnknownName
from ..modes import ForwardMode
from ..options import CompileOptions


@attrs.frozen
class PassContext:
    options: CompileOptions
    mode: ForwardMode
    bs: int | None = None  # bound by the per-bs stage
    generic: Graph | None = attrs.field(default=None, eq=False, repr=False)  # the graph the per-bs stage specializes


Pass = Callable[[Graph, PassContext], Graph]
PASSES: dict[str, Pass] = {}


def register_pass(name: str) -> Callable[[Pass], Pass]:
    """Register ``fn`` under a kebab-case name that matches its file and test."""

    def deco(fn: Pass) -> Pass:
        if name in PASSES:
            raise InternalError(f"pass {name!r} registered twice")
        fn.pass_name = name  # type: ignore[attr-defined]
        PASSES[name] = fn
        return fn

    return deco


def get_pass(name: str) -> Pass:
    try:
        return PASSES[name]
    except KeyError:
        raise UnknownName(f"unknown pass {name!r}; known passes: {sorted(PASSES)}") from None
