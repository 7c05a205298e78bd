"""The ``ingest`` op: a device-resident batch input checked on the device, at the head of in_graph.

A batch input the kernels read on the device reaches them one of three ways on a step: staged from the host
(written into the staging buffer and checked there, before anything runs), fed from the device (an engine that
keeps no host mirror: out_graph copies the live values into the input's *feed*, an int64 buffer holding the
sentinel past them), or read in place from the engine's own buffer by a graph captured on it (the *engine*
input, selected by the backend's *word*). The host sees no value of the last two without a sync, so ``ingest``
checks them where they are read (a staged value the host checked already): each value against [lo, hi]
(``engine_lo`` for the engine's buffers, whose padding rows hold row 0), a bad one replaced by a safe one (a
length clamped, a row or a slot by 0, the reserved entry) so no kernel reads outside its tables, and the first
bad row kept in the *record* (four int64 words: set, code, row, value), which the host reads in place one step
later.

On a staged step it also checks the *generation*: each staged step writes two words, the size it staged for
and the size of the graph that pads it where that size has no graph of its own (``pad_target``; the same size
otherwise), and a graph of ``P`` rows (its input's length over ``per_row``, known when it runs, so one kernel
serves every size) finds ``P`` in one of them: the plan of that size run eagerly, or the captured graph that pads
it. Anything else is a graph replayed over another size's staging, recorded like a bad row (code ``code | 0xFF``,
row: ``P``, value: the staged size), and the padded staging is read. The op's value is the checked input, in its
own dtype.

A row range of an input (a TBO child's rows) is checked where it is sliced (its rows recorded as the child's,
``field`` names the child's input); its last operand is then the whole input, whose length gives ``P``
(``sized``). With ``index`` the op reads the input at the rows the operand after the pools names (a lookup: a
multi-step drafter's branches read their request's row), checking what is read, and records the row read.
Inputs: ``(staged, feed, engine, word, generation, record, *pools[, index][, whole])``; a pool gives ``hi`` the
extents it names (R, N): ``hi_of`` pairs each of ``hi``'s free symbols, by name order, with (input position,
axis).
"""

from __future__ import annotations

import sympy
import torch

from .errors import ShapeError
from .types import DType, Placement, TensorType, dim

SENTINEL = -(2**63)  # a feed's rows past the live ones: read the staged value there (the fill)
GENERATION = 0xFF  # code | GENERATION: the record's code of a graph replayed over another size's staging


def pad_target(bs: int, captured) -> int:
    """The size of the graph a staging for ``bs`` rows is for: ``bs`` itself if it is captured or past every
    captured size (an eager step), else the next captured size, whose graph pads it."""
    above = [int(s) for s in captured if int(s) >= bs]
    return min(above) if above else bs


def graph_rows(ins, a) -> int:
    """``P``, the rows of the graph this op runs in: its input's length over ``per_row``."""
    whole = ins[-1] if a["sized"] else ins[0]
    return whole.shape[0] // int(a["per_row"])


def _hi(hi) -> sympy.Expr:
    """A bound as an expression: given as one, or as its text (a kernel's keyword: ``"R - 1"``, where sympy's own
    parser would read N as its function)."""
    return dim(hi) if isinstance(hi, str) else sympy.sympify(hi)


def hi_symbols(hi) -> list[sympy.Symbol]:
    return sorted(_hi(hi).free_symbols, key=lambda s: s.name)


def bound_hi(ins, a, dtype: torch.dtype) -> int:
    """``hi`` with the pools' extents bound (an extent no pool gives leaves the dtype's largest value)."""
    hi, pairs = _hi(a["hi"]), [int(x) for x in a["hi_of"]]
    syms = hi_symbols(hi)
    if len(pairs) != 2 * len(syms):
        return torch.iinfo(dtype).max
    sub = {s: int(ins[pairs[2 * k]].shape[pairs[2 * k + 1]]) for k, s in enumerate(syms)}
    return min(int(hi.xreplace(sub)), torch.iinfo(dtype).max)


def infer_ingest(ins, a):
    if len(ins) < 6 + bool(a["index"]) + bool(a["sized"]):
        raise ShapeError(f"ingest takes (staged, feed, engine, word, generation, record, *pools[, index]), got "
                         f"{len(ins)}")
    staged, feed, engine, word, gen, record = ins[:6]
    if len(staged.shape) != 1 or staged.placement.on_host:
        raise ShapeError(f"ingest checks a 1-D device value, got {staged}")
    for what, t in (("feed", feed), ("engine", engine)):
        if t.shape != staged.shape or t.placement.on_host:
            raise ShapeError(f"ingest {what} must be a device value shaped like the staged one {staged}, got {t}")
    if feed.dtype is not DType.int64:
        raise ShapeError(f"ingest feed must be int64 (it holds the sentinel), got {feed}")
    if word.shape != () or word.dtype is not DType.int32 or word.placement.on_host:
        raise ShapeError(f"ingest word must be a device int32 scalar, got {word}")
    if gen.shape != (2,) or gen.dtype is not DType.int32 or gen.placement.on_host:
        raise ShapeError(f"ingest generation must be device int32[2] (the staged size, the graph's that pads it), "
                         f"got {gen}")
    if record.shape != (4,) or record.dtype is not DType.int64 or record.placement is not Placement.pinned:
        raise ShapeError(f"ingest record must be pinned int64[4], got {record}")
    if len(a["hi_of"]) != 2 * len(hi_symbols(a["hi"])):
        raise ShapeError(f"ingest hi={a['hi']} needs (input, axis) for each of its symbols, got {a['hi_of']}")
    if a["index"]:
        idx = ins[-1 - bool(a["sized"])]
        if len(idx.shape) != 1 or idx.dtype not in (DType.int32, DType.int64) or idx.placement.on_host:
            raise ShapeError(f"ingest index must be a 1-D device integer value, got {idx}")
        return TensorType(staged.dtype, idx.shape, Placement.device)
    return TensorType(staged.dtype, staged.shape, Placement.device)


def fault(record: torch.Tensor, code: int, row: int, value: int) -> None:
    """Keep the first fault: a record already set is left as it is."""
    if int(record[0]) == 0:
        record[1:] = torch.tensor([code, row, value], dtype=torch.int64)
        record[0] = 1


def ref_ingest(ins, a):
    staged, feed, engine, word, gen, record = ins[:6]
    rows_read = torch.arange(staged.shape[0])
    P = graph_rows(ins, a)
    if a["index"]:  # the rows a lookup reads (outside the input: row 0, as a lookup guards them)
        idx = ins[-1 - bool(a["sized"])].long()
        rows_read = torch.where((idx >= 0) & (idx < staged.shape[0]), idx, 0)
        staged, feed, engine = staged[rows_read], feed[rows_read], engine[rows_read]
    n = staged.shape[0]
    if n == 0:  # a row range of no rows (a TBO child of size 0): nothing to read, nothing to check
        return staged.clone()
    hi = bound_hi(ins, a, staged.dtype)
    if int(word) == 1:
        v, lo = engine[:n].to(torch.int64), a["engine_lo"]
    else:
        if P not in (int(gen[0]), int(gen[1])):
            fault(record, a["code"] | GENERATION, P, int(gen[0]))
        f = feed[:n].to(torch.int64)
        v, lo = torch.where(f == SENTINEL, staged.to(torch.int64), f), a["lo"]
    # what the host staged it checked (a row of 0 there is padding, or a capture's dummy row): only values that
    # come from the device are checked here
    bad = ((v < lo) | (v > hi)) & ((f != SENTINEL) if int(word) != 1 else True)
    safe = v.clamp(lo, hi) if a["clamp"] else torch.zeros_like(v)
    if bool(bad.any()):
        r = int(bad.nonzero()[0, 0])
        fault(record, a["code"], int(rows_read[r]), int(v[r]))
    return torch.where(bad, safe, v).to(staged.dtype)
