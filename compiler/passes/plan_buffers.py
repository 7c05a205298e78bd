from __future__ import annotations

import attrs

from ..ir import Graph, Region, Role
from ..ir.graph import Buffer, Space, Use, aligned
from .registry import PassContext, register_pass


@register_pass("plan-buffers")
def plan_buffers(g: Graph, ctx: PassContext) -> Graph:
    """Requires a mode-generic graph. Guarantees every static buffer a plan of this mode can use
    has a region laid out at max_bs, so a backend allocates them once and every captured size
    views the same addresses:

    - ``arena``: each device metadata field (its own region, even when two fields hold one
      value); each in_graph intermediate (a fused kernel may store it, or it is a constant);
      each out_graph device value the graph reads (a crossing);
    - ``arena`` too: each guarded input's feed (guard-inputs);
    - ``host``: each host metadata field, and each other out_graph host value (written in
      place every step, never allocated).

    Regions never overlap within a mode (the verifier checks), and the backend gives every mode
    its own base, so no two live values share memory, in one mode or across modes. Like
    pack-inputs it runs before specialize-batch: one layout for all sizes."""
    env = {**ctx.options.symbols(), "bs": ctx.options.max_bs}
    types, users = g.types(), g.users()
    fields = {o.value for o in g.outputs}

    def static(x: str) -> bool:
        t = types[x]
        return not t.is_dynamic and t.dtype.value != "opaque"

    def nbytes(x: str) -> int:
        return types[x].numel(env) * types[x].dtype.torch.itemsize

    want: list[tuple[Space, Use, str, str]] = []
    for i in g.inputs:  # each guarded input's feed (guard-inputs): the runtime fills it with the sentinel
        if i.role is Role.feed:
            want.append((Space.arena, Use.feed, i.name, i.name))
    host_inputs = {i.name for i in g.inputs if i.type.placement.on_host}  # a field may read their staging slot
    for o in g.outputs:
        if static(o.value) and o.value not in host_inputs:
            want.append((Space.host if types[o.value].placement.on_host else Space.arena, Use.field, o.field, o.value))
    for n in g.nodes:
        if not static(n.name):
            continue
        if n.type.placement.on_host:
            if n.region is Region.out_graph and n.name not in fields:
                want.append((Space.host, Use.host, n.name, n.name))
        elif n.region is Region.in_graph and n.name not in fields:
            want.append((Space.arena, Use.value, n.name, n.name))
        elif n.region is Region.out_graph and any(u.region is Region.in_graph for u in users.get(n.name, [])):
            want.append((Space.arena, Use.crossing, n.name, n.name))
    end = {Space.arena: 0, Space.host: 0}
    bufs = []
    for space, use, name, value in want:
        size = nbytes(value)
        bufs.append(Buffer(space, use, name, (value,), end[space], size))
        end[space] += aligned(size)
    kept = tuple(b for b in g.buffers if b.space is Space.staging)
    new = kept + tuple(bufs)
    return g if new == g.buffers else attrs.evolve(g, buffers=new)
