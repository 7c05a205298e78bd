"""BackendSpec: what a backend declares once."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from .ir import Graph
from .modes import ForwardMode
from .options import CompileOptions


@attrs.frozen
class BackendSpec:
    name: str
    build: Callable[[ForwardMode, CompileOptions], Graph]  # one generic graph per graph-key mode
    modes: tuple[ForwardMode, ...]  # modes the spec supports
    doc: str = ""
    # Columns a step of this mode reads past seq_lens (verify drafts, a multi-step drafter's slots):
    # the runtime refuses a sequence longer than max_context_len minus this, instead of clipping it.
    headroom: Callable[[ForwardMode, CompileOptions], int] = lambda mode, options: 0
