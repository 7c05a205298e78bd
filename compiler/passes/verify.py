from __future__ import annotations

from ..ir import Graph
from ..ir import verify as verify_graph
from .registry import PassContext, register_pass


@register_pass("verify")
def verify(g: Graph, ctx: PassContext) -> Graph:
    """Requires nothing. Guarantees the graph is well formed (ir.verify); returns it unchanged."""
    return verify_graph(g)
