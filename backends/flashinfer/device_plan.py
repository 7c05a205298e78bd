"""FlashInfer's split-KV work partition computed on the GPU, in the recorded graph.

A graph-mode FlashInfer wrapper's ``plan()`` does two things: once per batch
size it fixes the shape of the work (padded grid, workspace offsets, split or
not), which stays constant in graph mode; every step it recomputes, on the
host, the partition of this step's KV lengths into work items (request, query
tile, KV tile per CTA; output and merge offsets; the chunk size; which CTAs are
live) and copies it into the wrapper's int workspace, where the captured kernel
reads it. This module does the second part on the GPU: one Triton kernel,
launched after the metadata graph (``BoundPlan.after_in``) from the device KV
indptr the graph just wrote, writes those same words at the offsets the first
``plan()`` chose. So a step calls no planner at all.

Both FlashInfer 0.6 planners are covered, in graph mode: the CUDA-core decode
planner (``DecodePlan``: binary search on the pages per chunk under the grid
the occupancy allows) and the fa2 prefill planner the tensor-core decode and the
paged prefill wrappers use (``PrefillPlan``: query tiles times KV chunks under
``2 * SMs / kv_heads`` CTAs). Which words a kernel reads is exact: the work
items up to the live count, the indptrs, the chunk size, the live mask; items
past the live count are written 0 (FlashInfer leaves them stale; the kernels
skip them by the mask).

The adapter checks a device planner against FlashInfer's own on the first
batch and on synthetic ones before trusting it, and keeps FlashInfer's host
planner for any wrapper where they differ.

The verify tree mask's packing to bits (``pack_mask``) is the other piece of
FlashInfer's per-step work this module moves into the recorded graph.
"""

from __future__ import annotations

import logging

import attrs
import torch
import triton
import triton.language as tl

from attnmeta.compiler.lowering.launch import launch

log = logging.getLogger("attnmeta.runtime.backends")


@attrs.frozen
class PlanLayout:
    """One wrapper's partition problem and where its answer lives in the int workspace (byte
    offsets), read from the plan info FlashInfer's first ``plan()`` returned for this batch size."""

    prefill: bool  # the fa2 prefill planner (tensor-core decode, verify, draft extend); else CUDA-core decode
    bs: int
    split: bool
    padded: int  # work items the grid covers (FlashInfer's padded batch size)
    limit: int  # most work items the chunk-size search may produce
    min_chunk: int  # fewest pages per chunk: max(128 // page_size, 1)
    page_size: int
    group: int  # query heads per KV head (prefill: a request's packed query length is q_len * group)
    cta_tile_q: int  # prefill: packed query rows per tile
    rows: int  # prefill: query rows the merge indptr covers (the graph's fixed total)
    request: int
    kv_tile: int
    o_indptr: int
    chunk: int
    valid: int  # -1: no live mask (CUDA-core decode without split)
    qo_tile: int = -1
    merge: int = -1
    total_rows: int = -1

    @staticmethod
    def decode(info, bs: int, page_size: int) -> PlanLayout | None:
        """From a ``DecodePlanInfo`` vector (10 entries). Graph mode splits when the batch leaves SMs
        idle, and then the padded size is the grid's CTAs per KV head: the bound the search tests
        (``items * kv_heads > grid`` is ``items > grid // kv_heads`` in integers)."""
        info = [int(x) for x in info]
        if len(info) != 10 or not info[8]:
            return None
        padded, _, _, req, kvt, o, valid, chunk, _, split = info
        return PlanLayout(False, bs, bool(split), padded, padded, max(128 // page_size, 1), page_size, 1, 1, 0,
                          req, kvt, o, chunk, valid if split else -1)

    @staticmethod
    def prefill_plan(info, bs: int, heads: tuple[int, int], page_size: int, num_sm: int) -> PlanLayout | None:
        """From a ``PrefillPlanInfo`` vector (15 entries), fa2, graph mode (which always splits). The
        search's bound is ``2 * SMs // kv_heads``; the padded size FlashInfer chose must agree."""
        info = [int(x) for x in info]
        if len(info) != 15 or not info[13] or not info[14]:
            return None
        padded, rows, rows_off, cta, req, qot, kvt, merge, o, chunk, _, _, valid, _, _ = info
        hq, hkv = heads
        group, limit = hq // hkv, 2 * num_sm // hkv
        if padded != max(limit, -(-rows * group // cta) + bs - 1):
            return None  # a grid this module does not know how FlashInfer sized
        return PlanLayout(True, bs, True, padded, limit, max(128 // page_size, 1), page_size, group, cta, rows,
                          req, kvt, o, chunk, valid, qot, merge, rows_off)

    def aligned(self) -> bool:
        words = (self.request, self.kv_tile, self.o_indptr, self.chunk)
        extra = (self.qo_tile, self.merge, self.total_rows) if self.prefill else ()
        return all(x >= 0 and x % 4 == 0 for x in words + extra)


def plan_on_device(layout: PlanLayout, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor | None,
                   workspace: torch.Tensor) -> None:
    """Write this step's partition into ``workspace`` (a wrapper's uint8 int workspace) from the
    device ``kv_indptr`` (pages) and, for the prefill planner, ``qo_indptr``. One program, static
    grid, no host read: recordable."""
    launch(_kernel_call(layout, kv_indptr, qo_indptr, workspace))


def _kernel_call(L: PlanLayout, kv_indptr, qo_indptr, workspace):
    """The kernel launch with every argument bound: the views and constants are made once."""
    block_r = triton.next_power_of_2(L.bs + 1)
    args = (kv_indptr, kv_indptr if qo_indptr is None else qo_indptr, workspace.view(torch.int32), workspace, L.bs,
            L.limit, L.min_chunk, L.page_size, L.group, L.cta_tile_q, L.padded, L.rows, L.request // 4,
            L.qo_tile // 4, L.kv_tile // 4, L.o_indptr // 4, L.merge // 4, L.chunk // 4, L.total_rows // 4, L.valid)
    meta = dict(PREFILL=L.prefill, SPLIT=L.split, HAS_VALID=L.valid >= 0, BLOCK_R=block_r,
                BLOCK_K=max(4, min(64, 4096 // block_r)), BLOCK_P=256, num_warps=4 if block_r <= 256 else 8)
    kernel = _plan[(1,)]
    return lambda: kernel(*args, **meta)


@triton.jit
def _cdiv(a, b):
    return (a + b - 1) // b


@triton.jit
def _plan(kv_indptr, qo_indptr, words, bytes_, bs, limit, min_chunk, page_size, group, cta, n_items, n_rows,
          req_at, qot_at, kvt_at, o_at, merge_at, chunk_at, rows_at, valid_at,
          PREFILL: tl.constexpr, SPLIT: tl.constexpr, HAS_VALID: tl.constexpr, BLOCK_R: tl.constexpr,
          BLOCK_K: tl.constexpr, BLOCK_P: tl.constexpr):
    # Requests are lanes; each request scatters its own work items (query tile outer, KV chunk inner)
    # and merge rows, BLOCK_K at a time: no items x requests matrix (it spills registers at bs 256).
    r = tl.arange(0, BLOCK_R)
    rm = r < bs
    kv = tl.load(kv_indptr + r + 1, mask=rm, other=0) - tl.load(kv_indptr + r, mask=rm, other=0)
    kv1 = tl.where(rm, tl.maximum(kv, 1), 0)
    if PREFILL:
        q = tl.load(qo_indptr + r + 1, mask=rm, other=0) - tl.load(qo_indptr + r, mask=rm, other=0)
        tiles = _cdiv(q * group, cta)
        # PrefillBinarySearchKVChunkSize: fewest pages per chunk whose work fits the CTA bound
        low = tl.full([], 0, tl.int32) + min_chunk
        high = tl.max(tl.where(rm, kv1, 1), 0)
        while low < high:
            mid = (low + high) // 2
            big = tl.sum(tiles * _cdiv(kv1, mid), 0) > limit
            low = tl.where(big, mid + 1, low)
            high = tl.where(big, high, mid)
        chunk = low
    else:
        q = tl.where(rm, 1, 0)
        tiles = q
        if SPLIT:  # PartitionPagedKVCacheBinarySearchMinNumPagePerBatch (its search counts empty rows as 0)
            low = tl.full([], 0, tl.int32) + min_chunk
            high = tl.max(tl.where(rm, kv, 0), 0)
            while low < high:
                mid = (low + high) // 2
                big = tl.sum(tl.where(rm, _cdiv(kv, mid), 0), 0) > limit
                low = tl.where(big, mid + 1, low)
                high = tl.where(big, high, mid)
            chunk = low
        else:  # one item per request, its whole sequence
            chunk = tl.maximum(tl.max(tl.where(rm, kv, 1), 0), 1)
    chunks = tl.where(rm, _cdiv(kv1, chunk), 0)
    counts = tiles * chunks
    starts = tl.cumsum(counts, 0) - counts
    live = tl.sum(counts, 0)
    outs = tl.cumsum(q * chunks, 0)  # o_indptr[1:]: partial outputs per request (rows x chunks)
    tl.store(words + o_at + r + 1, outs, mask=rm)
    tl.store(words + o_at + r, tl.zeros_like(r), mask=r == 0)
    tl.store(words + chunk_at, chunk * page_size)
    k = tl.arange(0, BLOCK_K)
    for k0 in range(0, tl.max(counts, 0), BLOCK_K):
        kk = k0 + k[None, :]
        at = starts[:, None] + kk
        # (past n_items only if rows of no pages overflow the decode search: FlashInfer writes past its
        # arrays there; the grid never reads those items, and the next array is not ours to clobber)
        m = rm[:, None] & (kk < counts[:, None]) & (at < n_items)
        per = tl.maximum(chunks, 1)[:, None]
        tl.store(words + req_at + at, tl.zeros_like(kk) + r[:, None], mask=m)
        tl.store(words + kvt_at + at, kk % per, mask=m)
        if PREFILL:
            tl.store(words + qot_at + at, kk // per, mask=m)
    p = tl.arange(0, BLOCK_P)
    for p0 in range(0, n_items, BLOCK_P):  # items past the live count: 0, and not live
        j = p0 + p
        dead = (j >= live) & (j < n_items)
        tl.store(words + req_at + j, tl.zeros_like(j), mask=dead)
        tl.store(words + kvt_at + j, tl.zeros_like(j), mask=dead)
        if PREFILL:
            tl.store(words + qot_at + j, tl.zeros_like(j), mask=dead)
        if HAS_VALID:
            tl.store(bytes_ + valid_at + j, (j < live).to(tl.uint8), mask=j < n_items)
    if PREFILL:
        # merge_indptr[row + 1], a request's rows back to back: its first partial output plus
        # (row within the request + 1) x its chunks; and the live row count (graph mode reads it)
        tl.store(words + rows_at, tl.sum(q, 0))
        tl.store(words + merge_at, 0)
        qstart = tl.cumsum(q, 0) - q
        ostart = outs - q * chunks
        for k0 in range(0, tl.max(q, 0), BLOCK_K):
            kk = k0 + k[None, :]
            row = qstart[:, None] + kk
            m = rm[:, None] & (kk < q[:, None]) & (row < n_rows)
            tl.store(words + merge_at + row + 1, ostart[:, None] + (kk + 1) * chunks[:, None], mask=m)


class DevicePlanner:
    """A wrapper's partition, planned on the GPU after the metadata graph: the hook the adapter adds
    to the bound plan's ``after_in`` (captured with it)."""

    def __init__(self, layout: PlanLayout, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor | None,
                 workspace: torch.Tensor) -> None:
        self.layout, self.workspace = layout, workspace
        self._call = _kernel_call(layout, kv_indptr, qo_indptr, workspace)

    def __call__(self) -> None:
        launch(self._call)


def live_regions(layout: PlanLayout, workspace: torch.Tensor) -> list[tuple[int, int]]:
    """The (byte offset, bytes) of every word a kernel reads, for the live count FlashInfer's plan in
    ``workspace`` has (its live mask, else every padded item)."""
    L = layout
    live = L.padded if L.valid < 0 else int(workspace[L.valid : L.valid + L.padded].sum())
    regions = [(L.request, 4 * live), (L.kv_tile, 4 * live), (L.o_indptr, 4 * (L.bs + 1)), (L.chunk, 4)]
    if L.valid >= 0:
        regions.append((L.valid, L.padded))
    if L.prefill:
        regions += [(L.qo_tile, 4 * live), (L.merge, 4 * (L.rows + 1)), (L.total_rows, 4)]
    return regions


def checked_planner(layout: PlanLayout | None, kv_indptr: torch.Tensor, qo_indptr: torch.Tensor | None,
                    workspace: torch.Tensor, replan, samples: list[torch.Tensor], plan_info) -> DevicePlanner | None:
    """A device planner for a wrapper FlashInfer has just planned, or None where it would not write
    what FlashInfer writes. ``replan(host_kv_indptr)`` runs FlashInfer's own planner on the wrapper
    (the int workspace, ``plan_info()`` its result); for each sample (the first batch last, so the
    wrapper is left as FlashInfer planned it) both planners run and every word a kernel reads must
    agree, and the plan info must stay what it was: graph mode fixes it per batch size, which is
    what lets the recorded kernels read a partition recomputed on the device. Once per wrapper, at
    its first step; it synchronizes."""
    if layout is None or not layout.aligned():
        return None
    first = list(plan_info())
    try:
        agree = all(_agrees(layout, sample, qo_indptr, workspace, replan, plan_info, first) for sample in samples)
    except Exception as e:  # FlashInfer refusing a sample: nothing to compare with, so not trusted
        log.warning("checking the device planner against FlashInfer's: %s", e)
        agree = False
    if not agree and samples:
        replan(samples[-1])  # leave the wrapper planned for the batch at hand
    return DevicePlanner(layout, kv_indptr, qo_indptr, workspace) if agree else None


def _agrees(layout, sample, qo_indptr, workspace, replan, plan_info, first) -> bool:
    replan(sample)
    if list(plan_info()) != first:
        return False
    want = workspace.clone()
    mine = DevicePlanner(layout, sample.to(workspace.device, non_blocking=False), qo_indptr, workspace.clone())
    mine()
    return all(torch.equal(mine.workspace[at : at + n], want[at : at + n]) for at, n in live_regions(layout, want))


def pack_mask(mask: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, out: torch.Tensor,
              out_indptr: torch.Tensor, per_request: int) -> None:
    """The bool tree mask (request i: ``qo_len_i x kv_len_i`` entries, row-major, back to back) packed
    to bits into ``out`` as FlashInfer's kernel reads it (little bit order, each request from a byte
    boundary), and the packed byte offsets into ``out_indptr``. One Triton kernel, a program per
    request and chunk of ``per_request`` (the most mask entries a request has) from the device
    indptrs the graph just wrote: static grid, recordable, no host sync (FlashInfer's own packing
    reads its offsets back to the host)."""
    n, block = qo_indptr.numel() - 1, 256
    grid = (max(n, 1), triton.cdiv(triton.cdiv(per_request, 8), block))
    launch(lambda: _pack_mask[grid](mask, qo_indptr, kv_indptr, out, out_indptr, n,
                                    BLOCK=block, BLOCK_R=triton.next_power_of_2(n + 1)))


@triton.jit
def _pack_mask(mask, qo, kv, out, out_indptr, n_req, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr):
    me, chunk = tl.program_id(0), tl.program_id(1)
    # a chunk past its request's bytes has nothing to do (a step's requests are mostly shorter than the longest
    # the grid is sized for): it leaves before the batch-wide sums, unless it is the one that writes the offsets
    live = me < n_req
    qa = tl.load(qo + me, mask=live, other=0).to(tl.int64)
    qb = tl.load(qo + me + 1, mask=live, other=0).to(tl.int64)
    ka = tl.load(kv + me, mask=live, other=0).to(tl.int64)
    kb = tl.load(kv + me + 1, mask=live, other=0).to(tl.int64)
    if (chunk * BLOCK < ((qb - qa) * (kb - ka) + 7) // 8) | ((me == 0) & (chunk == 0)):
        r = tl.arange(0, BLOCK_R)
        rm = r < n_req
        q0 = tl.load(qo + r, mask=rm, other=0).to(tl.int64)
        q1 = tl.load(qo + r + 1, mask=rm, other=0).to(tl.int64)
        k0 = tl.load(kv + r, mask=rm, other=0).to(tl.int64)
        k1 = tl.load(kv + r + 1, mask=rm, other=0).to(tl.int64)
        seg = (q1 - q0) * (k1 - k0)  # mask entries of request r (0 past the batch)
        nbytes = (seg + 7) // 8
        seg_end, byte_end = tl.cumsum(seg, 0), tl.cumsum(nbytes, 0)
        if me == 0 and chunk == 0:
            tl.store(out_indptr + r + 1, byte_end.to(tl.int32), mask=rm)
            tl.store(out_indptr + r, (byte_end - nbytes).to(tl.int32), mask=r == 0)
        mine = (r == me) & rm  # this program's request: its first entry, entries, first byte, bytes
        first = tl.sum(tl.where(mine, seg_end - seg, 0), 0)
        entries = tl.sum(tl.where(mine, seg, 0), 0)
        at = tl.sum(tl.where(mine, byte_end - nbytes, 0), 0)
        count = tl.sum(tl.where(mine, nbytes, 0), 0)
        p = chunk * BLOCK + tl.arange(0, BLOCK)
        bit = tl.arange(0, 8)
        src = (p * 8)[:, None] + bit[None, :]
        bits = tl.load(mask + first + src, mask=(p < count)[:, None] & (src < entries), other=0).to(tl.int32)
        tl.store(out + at + p, tl.sum(bits << bit[None, :], 1).to(tl.uint8), mask=p < count)
