from __future__ import annotations

import attrs

from ..ir import Graph
from .pack_inputs import ALIGN
from .registry import PassContext, register_pass


@register_pass("plan-buffers")
def plan_buffers(g: Graph, ctx: PassContext) -> Graph:
    """Requires a mode-generic graph. Guarantees every device metadata output
    has a byte ``offset`` in one device arena sized for max_bs, so a backend
    allocates its static outputs once, contiguously, and every captured size
    views the same addresses. A value bound to two fields gets one slot.
    Like pack-inputs it runs before specialize-batch: one layout for all sizes."""
    env = {**ctx.options.symbols(), "bs": ctx.options.max_bs}
    types = g.types()
    slots: dict[str, int] = {}
    end, outs = 0, []
    for o in g.outputs:
        t = types[o.value]
        if t.placement.on_host or t.is_dynamic or t.dtype.value == "opaque":
            outs.append(o)
            continue
        if o.field not in slots:
            slots[o.field] = end
            end += -(-t.numel(env) * t.dtype.torch.itemsize // ALIGN) * ALIGN
        outs.append(attrs.evolve(o, offset=slots[o.field]))
    new = tuple(outs)
    return g if new == g.outputs else attrs.evolve(g, outputs=new)
