"""Executable lowering of each op: torch calls and Triton launches that
write into a given ``out`` buffer when one is bound (static metadata
buffers), or allocate otherwise. Used by the lowered fx modules."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy
import torch

from ..ir import OPS, Node, Op
from ..ir import ops_guard as gd
from ..ir import ops_index as ix
from ..ir.ops import EWISE, REDUCE
from ..ir.types import DType, Placement
from . import triton_kernels
from .launch import launch


def kernel_kwargs(n: Node) -> dict:
    """Attributes as the kernel functions take them (ints, torch dtypes)."""
    kw = {}
    for k, v in n.attrs:
        if isinstance(v, DType):
            v = v.torch
        elif isinstance(v, Placement):
            continue
        elif isinstance(v, tuple):
            v = [int(d) for d in v]
        elif isinstance(v, sympy.Expr):
            v = int(v) if v.is_Integer else str(v)  # a bound naming a pool's extent (ingest's hi): its text
        kw[k] = v
    return kw


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


_INTO = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}


def k_ewise_const(x, fn, value, out=None):
    # min/max against a Python number as clamp: a scalar tensor would be an H2D copy inside capture
    if out is not None and out.dtype is x.dtype:  # straight into the bound buffer: one op, no temporary
        if fn in _INTO:
            return _INTO[fn](x, value, out=out)
        if fn in ("min", "max"):
            return torch.clamp(x, **{"max" if fn == "min" else "min": value}, out=out)
    r = x.clamp(max=value) if fn == "min" else x.clamp(min=value) if fn == "max" else EWISE[fn](x, value)
    return r.to(x.dtype) if out is None else out.copy_(r)


def k_ragged_gather(table, rows, lens, indptr, *jump, capacity, out=None):
    if out is None:
        out = torch.empty(capacity, dtype=table.dtype, device=rows.device)
    return triton_kernels.ragged_gather(table, rows, lens, indptr, out, *jump)


def k_clamp(x, lo, hi, out=None):
    return _into(x.clamp(lo, hi), out)


def k_log2_scale(x, scale, divisor, out=None):
    f = torch.log2(x.to(torch.float32) / divisor)
    return _into((f.clamp(min=1.0) * scale).to(torch.int32), out)


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


def k_host_call(calls: Mapping[str, Callable], target: str, *args, key: str = ""):
    """``calls`` maps each planner node of the plan (``key``: ``plan``, ``step2_plan``, ``tbo0_plan``)
    to its planner, bound to the node's site when the plan was bound; ``target`` names it in
    tracebacks and dumps."""
    return calls[key](*args)


def _into(r, out):
    return r if out is None else out.copy_(r)


def k_slice(x, start, stop, out=None):
    return _into(x[start:stop], out)


def k_split_at(x, k, out=None):
    return x[: int(k)]


def k_compare(x, y, fn, out=None):
    return _into(ix.CMP[fn](x, y), out)


def k_where(c, x, y, out=None):
    return _into(torch.where(c, x, y), out)


def k_page_table(table, rows, lens, page_size, width, out=None):
    """Static width with an on-device row guard: no host max is baked in."""
    cols = torch.arange(width, device=rows.device)
    cap = min(width, -(-table.shape[1] // page_size))
    src = (cols.clamp(max=cap - 1) * page_size)[None, :]
    pages = torch.gather(table[ix.safe_rows(rows, table.shape[0])], 1, src.expand(rows.shape[0], -1)) // page_size
    valid = (cols[None, :] * page_size < lens[:, None]) & (cols[None, :] < cap)
    return _into(torch.where(valid, pages, 0).to(torch.int32), out)


def k_repeat(x, times, out=None):
    return _into(torch.repeat_interleave(x, times, output_size=x.shape[0] * times), out)


def k_lookup(table, idx, out=None):
    return _into(table[ix.safe_rows(idx, table.shape[0])], out)


def k_sort_rows(x, out=None):
    return _into(torch.sort(x, dim=1).values, out)


def k_reduce_rows(x, fn, out=None):
    return _into(ix.ref_reduce_rows([x], {"fn": fn}), out)


def k_flatten(x, out=None):
    return x.reshape(-1) if out is None else out.copy_(x.reshape(-1))


def k_copy(x, out=None):
    return x.clone() if out is None else out.copy_(x)


def k_outer(x, y, fn, out=None):
    r = ix.ref_outer([x, y], {"fn": fn})
    return _into(r, out)


def k_gather_rows(table, rows, cols, out=None):
    """Static shapes, a guard on every column: nothing past a row is read."""
    return _into(ix.ref_gather_rows([table, rows, cols], {}), out)


def k_ingest(*ins, out=None, **a):
    """The device check on CPU tensors: one opaque launch (its reads of the word, the generation and the record
    are the device's own, so an emulated capture records it whole, as a CUDA graph records the kernel)."""
    shape = ins[-1 - bool(a["sized"])].shape if a["index"] else ins[0].shape  # a lookup's: its index's
    res = out if out is not None else torch.empty(shape, dtype=ins[0].dtype, device=ins[0].device)
    launch(lambda: res.copy_(gd.ref_ingest(ins, a)), *ins, res)
    return res


KERNELS: dict[Op, Callable] = {
    Op.outer: k_outer, Op.gather_rows: k_gather_rows, Op.flatten: k_flatten,
    Op.clamp: k_clamp, Op.log2_scale: k_log2_scale, Op.slice: k_slice, Op.split_at: k_split_at,
    Op.compare: k_compare, Op.where: k_where,
    Op.page_table: k_page_table, Op.repeat: k_repeat, Op.lookup: k_lookup, Op.sort_rows: k_sort_rows,
    Op.reduce_rows: k_reduce_rows, Op.copy: k_copy,
    Op.full: k_full, Op.arange: k_arange, Op.cumsum: k_cumsum, Op.cast: k_cast, Op.ewise: k_ewise,
    Op.ewise_const: k_ewise_const, Op.ragged_gather: k_ragged_gather, Op.reduce: k_reduce, Op.item: k_item,
    Op.to_host: k_to_host, Op.to_device: k_to_device, Op.nonzero: k_nonzero, Op.host_call: k_host_call,
    Op.ingest: k_ingest,
}
assert set(KERNELS) == set(OPS), "every op in the table needs a lowering"
