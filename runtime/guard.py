"""Range checks of batch values that live on the device, done on the device.

Two kinds of input reach the metadata graph from the device without the host ever holding them:

- a device-only field of a staged step (``req_pool_indices`` when the engine keeps no host mirror,
  a DSV4 ``out_cache_loc``), which out_graph copies into a guarded buffer of the plan (``feed``);
- an engine's own static buffer that a captured graph reads in place (``runtime/engine.py``): the
  buffers an engine's graph runner refills before every replay.

Both reach the graph's buffers through one check, ``ingest`` (compiler/lowering/ingest.py), recorded with the
metadata kernels: the prologue of the step's first fused kernel (``prologue``: a captured step is one graph
node), or a launch of its own where the step starts otherwise. It narrows each value into the buffer the fused
kernel reads, replaces a value outside its range by a safe one (a row or a slot by 0, the reserved entry; a
length by its nearest bound) so no kernel reads outside its tables, and keeps the first such value in a record
of four words (set, field, row, value). The record lives in host memory the kernel writes directly (pinned and
mapped into the device's address space), so the host reads it without a launch or a copy: the next step's
out_graph looks at one word and raises a ``BatchError`` naming the field, row and value. That is the contract:
a bad device value is served safely and reported one step late, never silent (``ATTNMETA_SYNC_CHECKS=1``
synchronizes and raises within the step, for debugging). The record is zeroed when it is made, so nothing
reads a word nobody wrote.
"""

from __future__ import annotations

import os

import attrs
import torch
import triton

from attnmeta.compiler.lowering.binding import Kind
from attnmeta.compiler.lowering.ingest import BLOCK, SCALARS, SLOTS, Group, Prologue, ingest_group
from attnmeta.compiler.lowering.launch import launch
from attnmeta.compiler.lowering.triton_kernels import torch_on

from .errors import BatchError

INTS = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)  # what a batch's integer field may be
SENTINEL = -(2**63)  # a guarded buffer's rows past the live ones: not checked, staged as the fill


# the check as a launch of its own (one program, one group; a step whose graph starts with no fused kernel): the
# same function the fused kernels call, jitted again as a kernel whose counts, bounds and fields stay arguments
_ingest_kernel = triton.jit(do_not_specialize=[f"{k}{i}" for i in range(SLOTS) for k in SCALARS])(ingest_group.fn)


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


def _live(feeds: list[Feed], word) -> tuple[list[Feed], bool]:
    feeds = [f for f in feeds if f.n > 0]
    gated = any(f.when != -1 for f in feeds)
    if gated and word is None:
        raise ValueError("a feed gated by the word (when 0 or 1) needs the word")
    return feeds, gated


def _groups(feeds: list[Feed]) -> list[Group]:
    out = []
    for k in range(0, len(feeds), SLOTS):
        group = feeds[k : k + SLOTS]
        pad = group + [group[0]] * (SLOTS - len(group))  # unused slots: never run (NUM), any valid arguments
        args = tuple(a for f in pad for a in (f.src, f.dst, f.n, f.lo, f.hi, f.fill, f.field))
        out.append(Group(args, len(group), tuple(f.clamp for f in pad), tuple(f.padded for f in pad),
                         tuple(f.when for f in pad)))
    return out


def ingest(feeds: list[Feed], flag: torch.Tensor, word: torch.Tensor | None = None) -> None:
    """Every feed's values checked and narrowed into its buffer on the device (see the module doc), up to four
    fields per launch; a feed with ``when`` 0 or 1 only when ``word[0]`` says so (read by the kernel, so a
    replayed graph follows it)."""
    feeds, gated = _live(feeds, word)
    if not feeds:
        return
    if torch_on(feeds[0].dst):
        for f in feeds:
            launch(lambda f=f: _ingest_torch(f, flag, word))
        return
    for g in _groups(feeds):
        args = (flag, word if gated else flag, SENTINEL, *g.args)
        flags = g.constants() | {"GATED": gated, "BLOCK": BLOCK}
        launch(lambda args=args, flags=flags: _ingest_kernel[(1,)](*args, **flags))


def prologue(feeds: list[Feed], flag: torch.Tensor, word: torch.Tensor | None = None) -> Prologue | None:
    """``ingest(feeds, ...)`` as the prologue of the step's first fused kernel (compiler/lowering/ingest.py),
    or None when there is nothing to check."""
    feeds, gated = _live(feeds, word)
    if not feeds:
        return None
    return Prologue((flag, word if gated else flag, SENTINEL), tuple(_groups(feeds)), gated,
                    lambda: ingest(feeds, flag, word))


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
