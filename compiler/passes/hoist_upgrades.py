from __future__ import annotations

import attrs

from ..ir import OPS, Graph, Op, Region
from .registry import PassContext, register_pass


def _device_recordable(n) -> bool:
    return (OPS[n.op].recordable and n.op is not Op.host_call and not n.type.placement.on_host
            and not n.type.is_dynamic)


@register_pass("hoist-upgrades")
def hoist_upgrades(g: Graph, ctx: PassContext) -> Graph:
    """Requires a verified graph. Moves out_graph nodes into in_graph when
    they are recordable device work on device inputs and nothing on the host
    reads them: every node the author marked ``movable`` (a DSV4-style
    raw->full upgrade) and any other pure device op. Per-step host work
    shrinks to staging and planners; the moved steps are recorded and re-run
    by every replay. A movable node that cannot move stays put, and
    check-split reports it (unstable-buffer)."""
    types, users = g.types(), g.users()
    cand = {n.name for n in g.nodes if n.region is Region.out_graph and _device_recordable(n)
            and all(not types[x].placement.on_host for x in n.inputs)}
    changed = True
    while changed:  # drop candidates a host step still reads, until nothing changes
        changed = False
        for name in sorted(cand):
            if any(u.region is Region.out_graph and u.name not in cand for u in users.get(name, [])):
                cand.discard(name)
                changed = True
    if not cand:
        return g
    nodes = tuple(attrs.evolve(n, region=Region.in_graph) if n.name in cand else n for n in g.nodes)
    return attrs.evolve(g, nodes=nodes)
