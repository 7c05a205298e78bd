"""Triton kernels for metadata ops, and where kernels run for CPU tensors.

Importing attnmeta never changes the host process's environment. On a host
without CUDA, Triton kernels run in Triton's interpreter only when the process
asked for it (``TRITON_INTERPRET=1`` before triton is imported, as the test
suite does: it checks the kernels themselves); otherwise work on CPU tensors
runs as plain torch, op by op through the same kernel table, which is also
what the demo and the benchmark choose (the interpreter is slow).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..ir.errors import OptionsError
from ..ir.ops import gather_columns
from .launch import launch

GATHER_BLOCK = 128
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")  # the process's choice, read once
# CPU tensors reach Triton only through its interpreter; otherwise they take the torch path.
CPU_KERNELS = "triton" if INTERPRET else "torch"
jit = triton.jit  # kernels are jitted as Triton decides (compiled, or interpreted under TRITON_INTERPRET)


def set_cpu_kernels(impl: str) -> None:
    """How kernels run on CPU tensors: ``torch`` (fast), or ``triton`` (the interpreter: the process
    must have set TRITON_INTERPRET=1 before importing triton)."""
    global CPU_KERNELS
    if impl not in ("triton", "torch"):
        raise OptionsError(f"cpu kernels are 'triton' (interpreter) or 'torch', not {impl!r}")
    if impl == "triton" and not INTERPRET and not torch.cuda.is_available():
        raise OptionsError("Triton kernels on CPU need its interpreter: set TRITON_INTERPRET=1 before starting "
                           "the process (the test suite does), or use the torch kernels")
    CPU_KERNELS = impl


def torch_on(t: torch.Tensor) -> bool:
    """Whether work on ``t`` runs as torch rather than Triton."""
    return t.device.type == "cpu" and CPU_KERNELS == "torch"


@jit
def _ragged_gather_kernel(table, table_stride, width, nrows, rows, lens, indptr, split, shift, split2, shift2, out,
                          capacity, JUMPS: tl.constexpr, BLOCK: tl.constexpr):
    # One program per request row: copy table[rows[i], cols] to out[indptr[i]:], where cols run
    # 0..lens[i], each of the JUMPS (split, shift) pairs adding shift[i] columns from entry split[i] on
    # (a window's first column; a draft branch's slots). Guarded on device: a row outside the table
    # reads row 0 (reserved), a column outside the row reads 0, and nothing is written outside out,
    # whatever the lengths and indptr hold.
    i = tl.program_id(0)
    row = tl.load(rows + i).to(tl.int64)
    row = tl.where((row >= 0) & (row < nrows), row, 0)
    n = tl.load(lens + i)
    start = tl.load(indptr + i).to(tl.int64)
    for j in range(0, n, BLOCK):
        offs = j + tl.arange(0, BLOCK)
        cols = offs
        if JUMPS >= 1:
            cols = cols + tl.where(offs >= tl.load(split + i), tl.load(shift + i), 0)
        if JUMPS >= 2:
            cols = cols + tl.where(offs >= tl.load(split2 + i), tl.load(shift2 + i), 0)
        w = (offs < n) & (start + offs >= 0) & (start + offs < capacity)
        v = tl.load(table + row * table_stride + cols, mask=w & (cols >= 0) & (cols < width), other=0)
        tl.store(out + start + offs, v, mask=w)


def ragged_gather(table: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor, indptr: torch.Tensor,
                  out: torch.Tensor, *jumps: torch.Tensor) -> torch.Tensor:
    """``jumps``: none, (split, shift) or (split, shift, split2, shift2), one entry per row each."""
    n = rows.shape[0]
    if n == 0:
        return out
    if torch_on(out):
        # one opaque launch
        launch(lambda: _ragged_gather_torch(table, rows, lens, indptr, out, *jumps), table, rows, lens, indptr, out,
               *jumps)
        return out
    pairs = (*jumps, *(lens,) * (4 - len(jumps)))  # unread placeholders for the pairs not given
    args = (table, table.stride(0), table.shape[1], table.shape[0], rows, lens, indptr, *pairs, out, out.shape[0])
    launch(lambda: _ragged_gather_kernel[(n,)](*args, JUMPS=len(jumps) // 2, BLOCK=GATHER_BLOCK),
           *(a for a in args if isinstance(a, torch.Tensor)))
    return out


def _ragged_gather_torch(table, rows, lens, indptr, out, *jumps):
    """The kernel's CPU twin, row by row (its reads of lens and indptr are device-side reads), with
    the same guards: rows outside the table read row 0, nothing lands outside ``out``."""
    width, bs, cap = table.shape[1], rows.shape[0], out.shape[0]
    per_row = list(zip(*(j.tolist() for j in jumps), strict=True)) if jumps else [()] * bs
    for r, n, s, jump in zip(rows.tolist(), lens.tolist()[:bs], indptr.tolist()[:bs], per_row, strict=True):
        r, n = (r if 0 <= r < table.shape[0] else 0), max(n, 0)
        if not jump and 0 <= s and s + n <= cap:  # the plain gather: one slice copy (then zeros past the row)
            k = min(n, width)
            out[s : s + k] = table[r, :k]
            out[s + k : s + n] = 0
            continue
        cols = gather_columns(n, *jump)
        at = s + torch.arange(n)
        write = (at >= 0) & (at < cap)
        read = write & (cols >= 0) & (cols < width)
        out[at[write]] = 0
        out[at[read]] = table[r, cols[read]]
