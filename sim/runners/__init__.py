"""Graph runners: capture per size, pad, replay, fall back to eager.

- ``GraphRunner`` (graph.py): decode and every graphed mode, per captured size.
- ``BreakableGraph``, ``PiecewiseRunner`` (piecewise.py): graphs with eager holes (EXTEND).
- ``DraftRunner`` (draft.py): the EAGLE drafter's steps over a MultiStep backend.
"""

from .draft import DraftRunner
from .graph import GraphRunner, OutputView, StaleOutputError, dummy_batch
from .piecewise import BreakableGraph, PiecewiseRunner

__all__ = ["BreakableGraph", "DraftRunner", "GraphRunner", "OutputView", "PiecewiseRunner", "StaleOutputError",
           "dummy_batch"]
