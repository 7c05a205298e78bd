"""pass-through: an output that exposes a device batch input, or a value another output exposes, becomes a copy
node that fusion can store from its kernel."""

from __future__ import annotations

import attrs

from ..ir import Graph, Node, Op, Region, Role
from .registry import PassContext, register_pass


@register_pass("pass-through")
def pass_through(g: Graph, ctx: PassContext) -> Graph:
    """Requires a verified, shape-inferred, CSE'd graph. Every output whose value is a batch input read on the
    device (a length or row array handed to the kernels as a metadata field: FlashMLA's ``cache_seqlens``,
    TRT-LLM MLA's ``seq_lens_k``), or an in_graph value an earlier output already exposes (a multi-step
    drafter's per-step copies of one split count), gets an explicit in_graph ``copy`` node, and the output
    reads it. After CSE, which would merge the copies of one value back into one.

    Why: an input lives in the staging buffer and a field in its own, so lowering copies one into the other
    on every replay, a graph node of its own. As a node, the copy is fused into the row-parallel kernel that
    already reads the input (fuse), stored from there, one launch fewer per step. Nothing else changes: the
    copy's value and type are its source's. Host values and constants are left alone (a constant is written once
    per field at bind, not per step)."""
    inputs = {i.name: i for i in g.inputs}
    by_name, consts = {n.name: n for n in g.nodes}, set(g.constants())
    taken = set(by_name) | set(inputs)
    nodes, outputs, first, seen = list(g.nodes), [], {}, set()  # first: input -> the copy its first field reads
    for o in g.outputs:
        i, n = inputs.get(o.value), by_name.get(o.value)
        device_input = i is not None and i.role is Role.batch and not i.type.placement.on_host
        again = n is not None and n.region is Region.in_graph and o.value in seen and o.value not in consts
        seen.add(o.value)
        if not (device_input or again):
            outputs.append(o)
            continue
        name = f"{o.field}_field"
        while name in taken:
            name += "_"
        taken.add(name)
        nodes.append(Node(name, Op.copy, (o.value,), (), (i or n).type, Region.in_graph,
                          origin="pass:pass-through"))
        outputs.append(attrs.evolve(o, value=name))
        if device_input:
            first.setdefault(o.value, name)
    if len(nodes) == len(g.nodes):
        return g
    # a planner that binds such a field (FlashMLA's scheduler, cache_seqlens) binds the field's value: the copy
    nodes = [attrs.evolve(n, attrs={**n.a, "binds": n.a["binds"].rename(lambda v: first.get(v, v))})
             if n.op is Op.host_call and "binds" in n.a else n for n in nodes]
    return attrs.evolve(g, nodes=tuple(nodes), outputs=tuple(outputs))
