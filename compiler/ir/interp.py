"""Reference interpreter: evaluates any graph on CPU tensors via the op
table's reference implementations. The oracle for every pass and lowering."""

from __future__ import annotations

import torch

from .errors import UserError
from .graph import Graph, Role
from .ops import OPS, Op
from .ops_guard import SENTINEL


class InterpError(UserError):
    """The interpreter was not given every input the graph reads."""

    rule = "interp"


def eval_graph(g: Graph, inputs: dict[str, torch.Tensor],
               written: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor | None]:
    """Run ``g`` on ``inputs`` (name -> tensor); returns output field -> value. ``written``: constant buffers
    something outside the graph writes before a step (the tree mask a drafter writes into a verify plan's
    ``custom_mask``), by node name, in place of the constant's initial value."""
    env: dict[str, torch.Tensor | None] = {}
    written = written or {}
    for i in g.inputs:
        if i.name in inputs:
            env[i.name] = inputs[i.name].cpu()
        elif not i.role.guard:
            raise InterpError(f"graph {g.name!r} needs input %{i.name} ({i.type})")
    for i in g.inputs:  # the device guard's, where not given: a step staged from the host for this graph's size
        if i.name not in env:
            env[i.name] = _staged_step(g, i, env)
    calls = []
    for n in g.nodes:
        args = [env[x] for x in n.inputs]
        if n.op is Op.host_call:
            calls.append((n.a["target"], args))
        env[n.name] = written[n.name].cpu() if n.name in written and n.op is Op.full else OPS[n.op].ref(args, n.a)
    out = {o.field: env[o.value] for o in g.outputs}
    return out


def _staged_step(g: Graph, i, env: dict) -> torch.Tensor:
    """A guard input of a step staged from the host (guard-inputs): no value fed from the device (every feed row
    the sentinel; the engine's buffer is the feed), the engine word clear, the staging written for the graph's own
    size, a fresh record."""
    if i.role in (Role.feed, Role.engine):
        x = i.name.removesuffix("__feed").removesuffix("__engine")
        return torch.full((env[x].numel(),), SENTINEL, dtype=torch.int64)
    if i.role is Role.generation:  # the graph's own size: what an ingest reads its rows as (ops_guard.graph_rows)
        from .ops_guard import graph_rows

        n = next(n for n in g.nodes if n.op is Op.ingest)
        rows = graph_rows([env[x] if x in env else None for x in n.inputs], n.a)
        return torch.tensor([rows, rows], dtype=torch.int32)
    if i.role is Role.word:
        return torch.tensor(0, dtype=torch.int32)
    return torch.zeros(4, dtype=torch.int64)


def valid_prefix(g: Graph, outs: dict[str, torch.Tensor | None], field: str) -> torch.Tensor:
    """The meaningful part of an output: ragged outputs end at their indptr's last entry."""
    o = next(o for o in g.outputs if o.field == field)
    t = outs[field]
    assert t is not None
    if o.ragged_by is None:
        return t
    ind = outs[o.ragged_by]
    assert ind is not None
    return t[: int(ind[-1])] if ind.numel() else t[:0]
