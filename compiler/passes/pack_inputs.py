from __future__ import annotations

import attrs

from ..ir import Graph, Role
from ..ir.graph import Buffer, Space, Use, aligned
from .registry import PassContext, register_pass


@register_pass("pack-inputs")
def pack_inputs(g: Graph, ctx: PassContext) -> Graph:
    """Requires a mode-generic graph (``bs`` unbound). Guarantees every batch input has a slot
    (a ``staging`` buffer) in one packed staging layout laid out at ``max_bs``, so per step all
    inputs reach their static buffers in one host->device copy. Inputs staged from the same
    ForwardBatch field (a device field and its host mirror) share one slot: the host side reads
    the staging buffer, the device side its copy. Offsets are relative to the mode's staging
    region; modes never share slots.

    Runs before specialize-batch on purpose: one layout must serve every captured size, so
    offsets are computed once, at max_bs.
    """
    env = {**ctx.options.symbols(), "bs": ctx.options.max_bs}
    slots: dict[tuple[str, str, int], list] = {}  # (source, dtype, fill) -> [name, inputs, bytes]
    for i in g.inputs:
        if i.role is not Role.batch:
            continue
        key = (i.source, i.type.dtype.value, i.fill or 0)
        if key not in slots:
            taken = sum(k[0] == i.source for k in slots)  # same field, another dtype or fill: a slot of its own
            name = i.source if not taken else f"{i.source}_{taken}"
            slots[key] = [name, [], i.type.numel(env) * i.type.dtype.torch.itemsize]
        slots[key][1].append(i.name)
    bufs, end = [], 0
    for name, values, nbytes in slots.values():
        bufs.append(Buffer(Space.staging, Use.input, name, tuple(values), end, nbytes))
        end += aligned(nbytes)
    kept = tuple(b for b in g.buffers if b.space is not Space.staging)
    new = kept + tuple(bufs)
    return g if new == g.buffers else attrs.evolve(g, buffers=new)
