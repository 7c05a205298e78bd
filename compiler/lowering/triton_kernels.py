"""Triton kernels for metadata ops.

Without a GPU the kernels run in Triton's CPU interpreter; TRITON_INTERPRET
must be set before ``triton.jit`` decorates them, hence the set-default at
import time.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from ..ir.ops import gather_columns  # noqa: E402
from .launch import launch  # noqa: E402

GATHER_BLOCK = 128
# On a GPU host, tensors on the CPU cannot reach compiled Triton: they take the torch path below.
# Without a GPU the kernels run in Triton's interpreter (what the tests check), unless a caller
# that measures host time (attnmeta bench) switches CPU tensors to the torch path.
CPU_KERNELS = "triton" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") else "torch"


def set_cpu_kernels(impl: str) -> None:
    global CPU_KERNELS
    if impl not in ("triton", "torch"):
        raise ValueError(f"cpu kernels are 'triton' (interpreter) or 'torch', not {impl!r}")
    CPU_KERNELS = impl


@triton.jit
def _ragged_gather_kernel(table, table_stride, width, rows, lens, indptr, split, shift, out,
                          JUMP: tl.constexpr, BLOCK: tl.constexpr):
    # One program per request row: copy table[rows[i], cols] to out[indptr[i]:], where cols run
    # 0..lens[i], or with JUMP skip shift[i] columns from entry split[i] on (a draft branch's slots).
    i = tl.program_id(0)
    row = tl.load(rows + i).to(tl.int64)
    n = tl.load(lens + i)
    start = tl.load(indptr + i).to(tl.int64)
    for j in range(0, n, BLOCK):
        offs = j + tl.arange(0, BLOCK)
        cols = offs
        if JUMP:
            cols = offs + tl.where(offs >= tl.load(split + i), tl.load(shift + i), 0)
        m = (offs < n) & (cols < width)  # device-side guard: never read past the row
        v = tl.load(table + row * table_stride + cols, mask=m)
        tl.store(out + start + offs, v, mask=m)


def ragged_gather(table: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor, indptr: torch.Tensor,
                  out: torch.Tensor, split: torch.Tensor | None = None, shift: torch.Tensor | None = None
                  ) -> torch.Tensor:
    n = rows.shape[0]
    if n == 0:
        return out
    if out.device.type == "cpu" and CPU_KERNELS == "torch":
        launch(lambda: _ragged_gather_torch(table, rows, lens, indptr, out, split, shift))  # one opaque launch
        return out
    jump = split is not None
    args = (table, table.stride(0), table.shape[1], rows, lens, indptr,
            split if jump else lens, shift if jump else lens, out)  # unread placeholders without a jump
    launch(lambda: _ragged_gather_kernel[(n,)](*args, JUMP=jump, BLOCK=GATHER_BLOCK))
    return out


def _ragged_gather_torch(table, rows, lens, indptr, out, split=None, shift=None):
    """The kernel's CPU twin, row by row (its reads of lens and indptr are device-side reads)."""
    width, bs = table.shape[1], rows.shape[0]
    jumps = zip(split.tolist(), shift.tolist(), strict=True) if split is not None else [(None, 0)] * bs
    for r, n, s, (sp, sh) in zip(rows.tolist(), lens.tolist()[:bs], indptr.tolist()[:bs], jumps, strict=True):
        if sp is None:  # the plain gather: one slice copy
            n = min(n, width)
            out[s : s + n] = table[r, :n]
            continue
        cols = gather_columns(n, sp, sh)
        keep = cols < width
        out[s : s + n][keep] = table[r, cols[keep]]
