"""Range checks of batch values that live on the device, done on the device.

Two kinds of input reach the metadata graph from the device without the host ever holding them:

- a device-only field of a staged step (``req_pool_indices`` when the engine keeps no host mirror,
  a DSV4 ``out_cache_loc``), which out_graph copies into a guarded buffer of the plan (``feed``);
- an engine's own static buffer that a captured graph reads in place (``runtime/engine.py``): the
  buffers an engine's graph runner refills before every replay.

Both reach the graph's buffers through one kernel, ``ingest``, recorded with the metadata kernels:
it narrows each value into the buffer the fused kernel reads, replaces a value outside its range by
a safe one (a row or a slot by 0, the reserved entry; a length by its nearest bound) so no kernel
reads outside its tables, and keeps the first such value in a record of four words (set, field,
row, value). The record lives in host memory the kernel writes directly (pinned and mapped into
the device's address space), so the host reads it without a launch or a copy: the next step's
out_graph looks at one word and raises a ``BatchError`` naming the field, row and value. That is
the contract: a bad device value is served safely and reported one step late, never silent
(``ATTNMETA_SYNC_CHECKS=1`` synchronizes and raises within the step, for debugging). The record
is zeroed when it is made, so nothing reads a word nobody wrote.
"""

from __future__ import annotations

import os

import attrs
import torch
import triton
import triton.language as tl

from attnmeta.compiler.lowering.binding import Kind
from attnmeta.compiler.lowering.launch import launch
from attnmeta.compiler.lowering.triton_kernels import torch_on

from .errors import BatchError

INTS = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)  # what a batch's integer field may be
SENTINEL = -(2**63)  # a guarded buffer's rows past the live ones: not checked, staged as the fill
BLOCK = 256


@triton.jit
def _ingest_one(src, dst, n, lo, hi, fill, sentinel, flag, field, CLAMP: tl.constexpr, PADDED: tl.constexpr,
                BLOCK: tl.constexpr):
    # src[:n] narrowed into dst[:n]; a value outside [lo, hi] replaced (a length clamped, anything else by 0),
    # a sentinel (PADDED) written as the fill; the first bad row into the record unless it already holds one
    # (set last, so a host that sees it set may read the rest after a sync).
    first = n + 0 * tl.program_id(0)  # a tensor from the start: it is carried through the loop
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < n
        v = tl.load(src + offs, mask=m, other=0).to(tl.int64)
        pad = m & (v == sentinel) & PADDED
        bad = m & ((v < lo) | (v > hi)) & (pad == 0)
        if CLAMP:
            safe = tl.minimum(tl.maximum(v, lo), hi)
        else:
            safe = tl.zeros_like(v)
        out = tl.where(pad, fill, tl.where(bad, safe, v))
        tl.store(dst + offs, out.to(dst.dtype.element_ty), mask=m)
        first = tl.minimum(first, tl.min(tl.where(bad, offs, n), axis=0))
    if first < n:
        if tl.load(flag) == 0:
            tl.store(flag + 1, field + 0 * first.to(tl.int64))
            tl.store(flag + 2, first.to(tl.int64))
            tl.store(flag + 3, tl.load(src + first).to(tl.int64))
            tl.store(flag, 1)


@triton.jit
def _gated(w, W: tl.constexpr, src, dst, n, lo, hi, fill, sentinel, flag, field, CLAMP: tl.constexpr,
           PADDED: tl.constexpr, BLOCK: tl.constexpr):
    if W == -1:  # resolved when compiled: an ungated field has no branch
        _ingest_one(src, dst, n, lo, hi, fill, sentinel, flag, field, CLAMP, PADDED, BLOCK)
    else:
        if w == W:
            _ingest_one(src, dst, n, lo, hi, fill, sentinel, flag, field, CLAMP, PADDED, BLOCK)


# a 1 would become a constant: every count, bound, fill and field index stays an argument
_SCALARS = [f"{k}{i}" for i in range(4) for k in ("n", "lo", "hi", "fill", "field")]


@triton.jit(do_not_specialize=_SCALARS)
def _ingest_kernel(flag, word, sentinel,
                   src0, dst0, n0, lo0, hi0, fill0, field0, src1, dst1, n1, lo1, hi1, fill1, field1,
                   src2, dst2, n2, lo2, hi2, fill2, field2, src3, dst3, n3, lo3, hi3, fill3, field3,
                   NUM: tl.constexpr, C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
                   P0: tl.constexpr, P1: tl.constexpr, P2: tl.constexpr, P3: tl.constexpr,
                   W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W3: tl.constexpr,
                   GATED: tl.constexpr, BLOCK: tl.constexpr):
    # One program, up to four fields one after another (one launch, one graph node, for a step's fields);
    # the first bad value of the first bad field is the one recorded, as launches in this order would.
    # Field i runs always (Wi == -1) or, on a graph bound to an engine's buffers, only on the steps the
    # word says were fed its way (Wi == word): the engine's buffers and the staged copies of the same
    # slots share one launch, each side gated.
    w = 0
    if GATED:
        w = tl.load(word)
    _gated(w, W0, src0, dst0, n0, lo0, hi0, fill0, sentinel, flag, field0, C0, P0, BLOCK)
    if NUM > 1:
        _gated(w, W1, src1, dst1, n1, lo1, hi1, fill1, sentinel, flag, field1, C1, P1, BLOCK)
    if NUM > 2:
        _gated(w, W2, src2, dst2, n2, lo2, hi2, fill2, sentinel, flag, field2, C2, P2, BLOCK)
    if NUM > 3:
        _gated(w, W3, src3, dst3, n3, lo3, hi3, fill3, sentinel, flag, field3, C3, P3, BLOCK)


def _ingest_torch(f: Feed, flag, word) -> None:
    """The kernel's CPU twin for one field (one opaque launch: its reads of the device values are device-side
    reads)."""
    if f.when != -1 and int(word[0]) != f.when:
        return
    v = f.src[:f.n].to(torch.int64)
    pad = v == SENTINEL if f.padded else torch.zeros_like(v, dtype=torch.bool)
    bad = ((v < f.lo) | (v > f.hi)) & ~pad
    safe = v.clamp(f.lo, f.hi) if f.clamp else torch.zeros_like(v)
    f.dst[:f.n].copy_(torch.where(pad, torch.full_like(v, f.fill), torch.where(bad, safe, v)))
    rows = bad.nonzero()
    if rows.numel() and int(flag[0]) == 0:
        row = int(rows[0, 0])
        flag[1:] = torch.tensor([f.field, row, int(f.src[row])], dtype=torch.int64)
        flag[0] = 1


@attrs.frozen
class Feed:
    """One field for ``ingest``: ``src[:n]`` checked against [lo, hi] and narrowed into ``dst[:n]``."""

    src: torch.Tensor
    dst: torch.Tensor
    n: int
    lo: int
    hi: int
    clamp: bool  # a length is clamped into range; anything else replaced by 0
    field: int  # its index in the record
    fill: int = 0
    padded: bool = False  # src rows holding SENTINEL are padding: written as the fill, not checked
    when: int = -1  # -1: every launch; 0 or 1: only when the launch's word says so


def ingest(feeds: list[Feed], flag: torch.Tensor, word: torch.Tensor | None = None) -> None:
    """Every feed's values checked and narrowed into its buffer on the device (see the module doc), up to four
    fields per launch; a feed with ``when`` 0 or 1 only when ``word[0]`` says so (read by the kernel, so a
    replayed graph follows it)."""
    feeds = [f for f in feeds if f.n > 0]
    if not feeds:
        return
    gated = any(f.when != -1 for f in feeds)
    if gated and word is None:
        raise ValueError("a feed gated by the word (when 0 or 1) needs the word")
    if torch_on(feeds[0].dst):
        for f in feeds:
            launch(lambda f=f: _ingest_torch(f, flag, word))
        return
    for k in range(0, len(feeds), 4):
        group = feeds[k : k + 4]
        pad = group + [group[0]] * (4 - len(group))  # unused slots: never run (NUM), any valid arguments
        args = [flag, word if gated else flag, SENTINEL]
        for f in pad:
            args += [f.src, f.dst, f.n, f.lo, f.hi, f.fill, f.field]
        flags = {"NUM": len(group), "GATED": gated, "BLOCK": BLOCK}
        for i, f in enumerate(pad):
            flags |= {f"C{i}": f.clamp, f"P{i}": f.padded, f"W{i}": f.when}
        launch(lambda args=args, flags=flags: _ingest_kernel[(1,)](*args, **flags))


def safe_range(s, bound: bool = False) -> tuple[int, int, bool]:
    """(lo, hi, clamp) a guarded slot's values are held to: a length clamped into its range, a row or a slot
    replaced by 0. A pool row must not be 0 (reserved) in a live row; an engine's buffer (``bound``) carries
    its padding rows at row 0 and cannot say which rows are live, so there 0 passes."""
    kind = s.slot.kind
    lo = (0 if bound else 1) if kind is Kind.row else s.lo
    return lo, s.hi, kind is Kind.length


class DeviceGuard:
    """The record of a backend's device checks, and the staged path's guarded buffers. ``feed`` (out_graph)
    copies a device-only field's live values into the slot's guarded buffer; ``apply`` (in_graph, recorded
    when captured) ingests them into the graph's buffer; ``raise_pending`` (the next out_graph) reports
    what the record holds."""

    def __init__(self, device: torch.device):
        self.device = device
        # four int64 words the device writes and the host reads in place: pinned (mapped) on a GPU
        self.flag = torch.zeros(4, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.host_np = self.flag.numpy()  # read without a torch op: the generated staging checks it
        self.names: list[str] = []
        self.sync = os.environ.get("ATTNMETA_SYNC_CHECKS") == "1"

    def field(self, name: str) -> int:
        """The index of field ``name`` in the record."""
        if name not in self.names:
            self.names.append(name)
        return self.names.index(name)

    def feed(self, s, src: torch.Tensor, live: int, total: int, name: str, capture: bool) -> tuple:
        """``src``'s ``live`` values (any integer dtype) into ``s``'s guarded buffer, rows past them the
        sentinel; a capture batch's rows (the engine's dummy ones) are not checked: all sentinel."""
        raw = s.raw
        if raw is None:  # the slot's first step: its buffer, and its name in the record
            raw = s.raw = torch.full((s.dev.numel(),), SENTINEL, dtype=torch.int64, device=self.device)
            s.field = self.field(name)
        if capture:
            live = 0
        if live:
            raw[:live].copy_(src, non_blocking=True)
        if s.raw_top > live:  # rows a larger step left
            raw[live:s.raw_top].fill_(SENTINEL)
        s.raw_top = live
        return s, total, s.field

    def feeds(self, entries: list[tuple], when: int = -1) -> list[Feed]:
        """The fed values' feeds for ``ingest``: each checked and narrowed into the graph's buffer; ``when`` 0 on
        a graph bound to an engine's buffers (runtime/engine.py): only on steps that staged."""
        feeds = []
        for s, total, field in entries:
            lo, hi, clamp = safe_range(s)
            feeds.append(Feed(s.raw, s.dev, total, lo, hi, clamp, field, fill=s.fill, padded=True, when=when))
        return feeds

    def apply(self, entries: list[tuple]) -> None:
        """Check and narrow the fed values into the graph's buffers now (device work)."""
        ingest(self.feeds(entries), self.flag)

    def raise_pending(self, when: str = "an earlier step") -> None:
        """Raise what the record holds, if anything. An error path: it waits for the device, so the
        record is whole and no step still in flight writes it again after it is cleared."""
        if not self.host_np[0]:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        _, field, row, value = (int(v) for v in self.host_np)
        self.host_np[:] = 0
        name = self.names[field] if 0 <= field < len(self.names) else f"field {field}"
        raise BatchError(f"{when} staged {name}[{row}] = {value} from the device, outside its range: the value "
                         "was replaced on the device (no kernel read outside its tables) and that step's metadata "
                         f"is wrong for this row; pass the host mirror of {name} to have bad values refused before "
                         "the step, or fix the engine's batch")

    def check_now(self) -> None:
        """The debugging mode (``ATTNMETA_SYNC_CHECKS=1``): wait for this step's checks and raise in it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.raise_pending("this step")
