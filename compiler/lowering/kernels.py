"""Executable lowering of each op: torch calls and Triton launches that
write into a given ``out`` buffer when one is bound (static metadata
buffers), or allocate otherwise. Used by the lowered fx modules."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ..ir import OPS, Op
from ..ir.ops import EWISE, REDUCE
from . import triton_kernels


def k_full(value, shape, dtype, device=None, out=None):
    if out is None:
        return torch.full(shape, value, dtype=dtype, device=device)
    return out.fill_(value)


def k_arange(start, step, n, dtype, device=None, out=None):
    r = torch.arange(n, dtype=torch.int64, device=device).mul_(step).add_(start).to(dtype)
    return r if out is None else out.copy_(r)


def k_cumsum(x, leading_zero, out=None):
    """A bound ``out`` is a static buffer zeroed at allocation whose entry 0 nothing else writes,
    so the leading zero is already there: one op per step, not two."""
    n = x.shape[0]
    if out is None:
        out = torch.zeros(n + int(leading_zero), dtype=x.dtype, device=x.device)
    if leading_zero:
        torch.cumsum(x, 0, dtype=x.dtype, out=out[1:])
    else:
        torch.cumsum(x, 0, dtype=x.dtype, out=out)
    return out


def k_cast(x, dtype, out=None):
    return x.to(dtype) if out is None else out.copy_(x)


def k_ewise(x, y, fn, out=None):
    r = EWISE[fn](x, y)
    return r.to(x.dtype) if out is None else out.copy_(r)


def k_ewise_const(x, fn, value, out=None):
    r = EWISE[fn](x, value)
    return r.to(x.dtype) if out is None else out.copy_(r)


def k_ragged_gather(table, rows, lens, indptr, capacity, out=None):
    if out is None:
        out = torch.empty(capacity, dtype=table.dtype, device=rows.device)
    return triton_kernels.ragged_gather(table, rows, lens, indptr, out)


def k_reduce(x, fn, out=None):
    r = REDUCE[fn](x).to(x.dtype) if x.numel() else torch.zeros((), dtype=x.dtype, device=x.device)
    return r if out is None else out.copy_(r)


def k_item(x, out=None):
    return x.cpu()


def k_to_host(x, out=None):
    return x.cpu()


def k_to_device(x, device, out=None):
    return x.to(device, non_blocking=True) if out is None else out.copy_(x, non_blocking=True)


def k_nonzero(x, out=None):
    return torch.nonzero(x).flatten()


def k_host_call(planners: Mapping[str, Callable], target: str, *args):
    try:
        fn = planners[target]
    except KeyError:
        raise KeyError(f"no planner bound for host_call target {target!r}; bound: {sorted(planners)}") from None
    return fn(*args)


KERNELS: dict[Op, Callable] = {
    Op.full: k_full, Op.arange: k_arange, Op.cumsum: k_cumsum, Op.cast: k_cast, Op.ewise: k_ewise,
    Op.ewise_const: k_ewise_const, Op.ragged_gather: k_ragged_gather, Op.reduce: k_reduce, Op.item: k_item,
    Op.to_host: k_to_host, Op.to_device: k_to_device, Op.nonzero: k_nonzero, Op.host_call: k_host_call,
}
assert set(KERNELS) == set(OPS), "every op in the table needs a lowering"
