from __future__ import annotations

import attrs

from ..ir import Graph, Role
from .registry import PassContext, register_pass

ALIGN = 16  # bytes: every slot starts aligned for any dtype and vector copies


@register_pass("pack-inputs")
def pack_inputs(g: Graph, ctx: PassContext) -> Graph:
    """Requires a mode-generic graph (``bs`` unbound). Guarantees every batch
    input has a byte ``offset`` in one packed staging buffer laid out for
    ``max_bs``, so per step all inputs reach their static buffers in one
    host->device copy. Inputs staged from the same source (a device field and
    its host mirror) share one slot: the host side reads the staging buffer,
    the device side its copy.

    Runs before specialize-batch on purpose: one layout must serve every
    captured size, so offsets are computed once, at max_bs.
    """
    env = {**ctx.options.symbols(), "bs": ctx.options.max_bs}
    slots: dict[tuple[str, str, int], int] = {}  # (source, dtype, fill) -> offset
    end, inputs = 0, []
    for i in g.inputs:
        if i.role is not Role.batch:
            inputs.append(i)
            continue
        key = (i.source, i.type.dtype.value, i.fill or 0)
        if key not in slots:
            slots[key] = end
            end += -(-i.type.numel(env) * i.type.dtype.torch.itemsize // ALIGN) * ALIGN
        inputs.append(attrs.evolve(i, offset=slots[key]))
    new = tuple(inputs)
    return g if new == g.inputs else attrs.evolve(g, inputs=new)
