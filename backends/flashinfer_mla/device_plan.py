"""FlashInfer's MLA work partition computed on the GPU, in the recorded graph.

A graph-mode ``BatchMLAPagedAttentionWrapper``'s ``plan()`` runs FlashInfer's ``MLAPlan`` on the
host every step: it balances the step's query tiles and KV chunks over the GPU's clusters with a
min-heap of their accumulated costs (``2 * tile rows + kv tokens`` a work item), splits a tile's KV
past a length limit (with merge rows for the partial outputs), then copies the per-cluster work
lists into the wrapper's int workspace at offsets fixed per batch size. In graph mode everything
but those lists stays fixed (the plan info: cluster size, cluster count, offsets), which is what
lets a recorded kernel read a partition recomputed on the device.

``mla_plan`` is ``MLAPlan`` in Python, line by line, with ``std::pop_heap`` / ``std::push_heap``
as libstdc++ runs them (ties between equal costs decide which cluster gets a work item, so the
heap's exact moves are part of the answer): the oracle. ``_mla_plan`` is the same algorithm as one
Triton program, the heap held in registers, launched after the metadata graph from the device
``qo_indptr`` / ``kv_indptr`` / ``kv_lens`` the graph just wrote. Pass one places the work items
in FlashInfer's order and records each one's cluster and rank in it; after a barrier, pass two
scatters them to their flattened places (``work_indptr[cluster] + rank``). Items past the live
count are left as they were (the kernel reads ``work_indptr``'s range only); the merge arrays are
written whole, as FlashInfer's are.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch
import triton
import triton.language as tl

from attnmeta.compiler.lowering.launch import launch

MAX_WORKS = 16384  # FlashInfer's max_total_num_works: the length of each work array
CTA_TILE_Q = 64
RECORD = 7  # scratch words per work item: cluster, rank, request, q_start, kv_start, kv_end, partial
NAMES = ("q_indptr", "kv_indptr", "partial_indptr", "merge_start", "merge_end", "merge_partial_start",
         "merge_partial_end", "merge_partial_stride", "q_len", "kv_len", "q_start", "kv_start", "kv_end",
         "work_indptr")  # MLAPlanInfo's offsets, in its order (entries 2..15)
WORK = ("q_indptr", "kv_indptr", "partial_indptr", "q_len", "kv_len", "q_start", "kv_start", "kv_end")
MERGE = ("merge_start", "merge_end", "merge_partial_start", "merge_partial_end", "merge_partial_stride")


@attrs.frozen
class MLALayout:
    """One wrapper's partition problem and where its answer lives (int workspace byte offsets, from
    the plan info FlashInfer's first ``plan()`` returned for this batch size)."""

    bs: int
    heads: int
    causal: bool
    cluster: int  # CTAs per cluster (plan info's num_blks_x)
    clusters: int  # clusters (num_blks_y)
    num_sm: int  # the merge arrays' length
    offsets: tuple[int, ...]  # byte offsets, in NAMES' order

    @staticmethod
    def of(info, bs: int, heads: int, causal: bool, num_sm: int) -> MLALayout | None:
        try:
            info = [int(x) for x in info]
        except (TypeError, ValueError):
            return None
        if len(info) != 18 or info[1] != num_sm // info[0] or any(x % 4 for x in info[2:16]):
            return None  # not the plan info this module knows (or a grid it does not size as FlashInfer)
        return MLALayout(bs, heads, causal, info[0], info[1], num_sm, tuple(info[2:16]))

    def at(self, name: str) -> int:
        """The word offset of array ``name``."""
        return self.offsets[NAMES.index(name)] // 4


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _limit(x: int) -> int:
    """MLAPlan's KV length limit per work item, from the average KV per cluster."""
    for top, v in ((8, 32), (16, 64), (32, 128), (64, 192)):
        if x <= top:
            return v
    return _cdiv(x, 256) * 256


def _causal_end(qo_len: int, kv_len: int, tile: int, tile_q: int, tiles: int, group: int) -> int:
    if tile + 1 == tiles:
        return kv_len
    return max(min(kv_len - qo_len + _cdiv((tile + 1) * tile_q, group), kv_len), 0)


class _Heap:
    """FlashInfer's MinHeap as libstdc++ runs it: a max-heap under ``a.cost > b.cost``."""

    def __init__(self, n: int):
        self.h = [(i, np.float32(0)) for i in range(n)]

    def pop_insert(self, add: np.float32) -> int:
        """``pop()`` then ``insert((idx, cost + add))``: the cluster that took the item."""
        h, n = self.h, len(self.h)
        top, value = h[0], h[n - 1]
        hole, child, length = 0, 0, n - 1  # __adjust_heap(first, 0, n - 1, value)
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if h[child][1] > h[child - 1][1]:
                child -= 1
            h[hole], hole = h[child], child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            h[hole], hole = h[child - 1], child - 1
        self._up(hole, 0, value)
        self._up(n - 1, 0, (top[0], np.float32(top[1] + add)))  # push_back + push_heap
        return top[0]

    def _up(self, hole: int, top: int, value) -> None:
        h = self.h
        parent = (hole - 1) // 2
        while hole > top and h[parent][1] > value[1]:
            h[hole], hole = h[parent], parent
            parent = (hole - 1) // 2
        h[hole] = value


def mla_plan(qo_indptr: list[int], kv_indptr: list[int], kv_lens: list[int], heads: int, causal: bool,
             num_sm: int) -> dict:
    """``MLAPlan`` of one batch: ``cluster`` and ``clusters`` (the grid), and every array it writes
    (work arrays flattened to the live count, merge arrays at ``num_sm``)."""
    bs = len(kv_lens)
    qo = [qo_indptr[i + 1] - qo_indptr[i] for i in range(bs)]
    cluster = 2 if sum(q * heads for q in qo) // bs > 64 else 1
    clusters, tile_q = num_sm // cluster, cluster * CTA_TILE_Q
    tiles = [_cdiv(q * heads, tile_q) for q in qo]
    total = sum(_causal_end(qo[i], kv_lens[i], t, tile_q, tiles[i], heads) if causal else kv_lens[i]
                for i in range(bs) for t in range(tiles[i]))
    limit = _limit(max(_cdiv(total, clusters), 1))
    heap, per = _Heap(clusters), [[] for _ in range(clusters)]
    merge = {k: [0] * num_sm for k in MERGE}
    m = nnz = 0
    for i in range(bs):
        packed = qo[i] * heads
        for t in range(tiles[i] - 1, -1, -1):
            remaining = _causal_end(qo[i], kv_lens[i], t, tile_q, tiles[i], heads) if causal else kv_lens[i]
            kv_start, split = 0, remaining > limit
            rows = min(tile_q, packed - t * tile_q)
            if split:
                chunk = _cdiv(rows, max(remaining * cluster // limit, 1))
                base = qo_indptr[i] * heads + t * tile_q
                for off in range(0, rows, chunk):
                    for k, v in zip(MERGE, (base + off, base + min(off + chunk, rows), nnz + off,
                                            nnz + _cdiv(remaining, limit) * rows, rows), strict=True):
                        merge[k][m] = v
                    m += 1
            zero = remaining == 0
            while remaining > 0 or zero:
                actual = min(remaining, limit)
                c = heap.pop_insert(np.float32(np.float32(2 * tile_q) + np.float32(actual)))
                per[c].append((qo_indptr[i], kv_indptr[i], nnz if split else -1, qo[i], kv_lens[i], t * tile_q,
                               kv_start, kv_start + actual))
                nnz += rows if split else 0
                remaining, kv_start = remaining - actual, kv_start + actual
                if zero:
                    break
    out = {k: [w[j] for items in per for w in items] for j, k in enumerate(WORK)}
    out["work_indptr"] = [0, *np.cumsum([len(x) for x in per]).tolist()]
    return dict(cluster=cluster, clusters=clusters, **out, **merge)


@triton.jit
def _cdiv_t(a, b):
    return (a + b - 1) // b


@triton.jit
def _get(v, lanes, j):
    return tl.sum(tl.where(lanes == j, v, 0), 0)


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _get2(v, lanes, j0, j1):
    """``v[j0], v[j1]`` in one reduction tree (the two lookups share its shuffle rounds)."""
    return tl.reduce((tl.where(lanes == j0, v, 0), tl.where(lanes == j1, v, 0)), 0, _add2)


@triton.jit
def _key(idx, cost):
    """A heap entry as one int64: the cost's float32 bits above the cluster id. Costs are never
    negative, so their bits order as their values: comparing ``key >> 32`` compares costs, and one
    lookup moves an entry whole (half the cross-lane reductions of two arrays)."""
    return (cost.to(tl.int32, bitcast=True).to(tl.int64) << 32) | idx.to(tl.int64)


@triton.jit
def _push_up(heap, c, hole, key):
    """libstdc++'s ``__push_heap``: ``key`` placed at ``hole`` and moved up past every parent that
    costs more; returns the heap."""
    parent = (hole - 1) // 2
    above = _get(heap, c, tl.maximum(parent, 0))
    while (hole > 0) & ((above >> 32) > (key >> 32)):
        heap = tl.where(c == hole, above, heap)
        hole = parent
        parent = (hole - 1) // 2
        above = _get(heap, c, tl.maximum(parent, 0))
    return tl.where(c == hole, key, heap)


@triton.jit
def _causal_end_t(qo_len, kv_len, tile, tile_q, tiles, group, CAUSAL: tl.constexpr):
    end = kv_len
    if CAUSAL:
        part = tl.maximum(tl.minimum(kv_len - qo_len + _cdiv_t((tile + 1) * tile_q, group), kv_len), 0)
        end = tl.where(tile + 1 == tiles, kv_len, part)
    return end


@triton.jit
def _mla_plan(qo_indptr, kv_indptr, kv_lens, words, scratch, bs, heads, num_sm, q_at, kv_at, part_at, ms_at,
              me_at, mps_at, mpe_at, mst_at, ql_at, kl_at, qs_at, ks_at, ke_at, wi_at,
              CLUSTER: tl.constexpr, CLUSTERS: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_C: tl.constexpr,
              BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr, MAX_TILES: tl.constexpr):
    TILE_Q: tl.constexpr = CLUSTER * 64
    r = tl.arange(0, BLOCK_R)
    rm = r < bs
    q0 = tl.load(qo_indptr + r, mask=rm, other=0)
    qlen = tl.load(qo_indptr + r + 1, mask=rm, other=0) - q0
    klen = tl.load(kv_lens + r, mask=rm, other=0)
    tiles = _cdiv_t(qlen * heads, TILE_Q)
    total = tl.zeros([], tl.int64)
    for t in range(0, MAX_TILES):
        end = _causal_end_t(qlen, klen, t, TILE_Q, tiles, heads, CAUSAL)
        total += tl.sum(tl.where(rm & (t < tiles), end, 0).to(tl.int64), 0)
    x = tl.maximum((total + CLUSTERS - 1) // CLUSTERS, 1).to(tl.int32)
    limit = tl.where(x <= 8, 32, tl.where(x <= 16, 64, tl.where(x <= 32, 128, tl.where(x <= 64, 192,
                                                                                            _cdiv_t(x, 256) * 256))))
    c = tl.arange(0, BLOCK_C)
    heap = c.to(tl.int64)  # the heap in libstdc++'s array order: every cluster at cost 0 (``_key``)
    count = tl.zeros([BLOCK_C], tl.int32)  # items per cluster so far
    m = tl.zeros([], tl.int32)
    nnz = tl.zeros([], tl.int32)
    w = tl.zeros([], tl.int32)
    add_tile = 2.0 * TILE_Q
    for i in range(0, bs):
        qi = tl.load(qo_indptr + i)
        ql = tl.load(qo_indptr + i + 1) - qi
        kl = tl.load(kv_lens + i)
        packed = ql * heads
        nt = _cdiv_t(packed, TILE_Q)
        for tt in range(0, nt):
            t = nt - 1 - tt
            remaining = _causal_end_t(ql, kl, t, TILE_Q, nt, heads, CAUSAL)
            kv_start = tl.zeros([], tl.int32)
            split = remaining > limit
            rows = tl.minimum(TILE_Q, packed - t * TILE_Q)
            if split:
                chunk = _cdiv_t(rows, tl.maximum(remaining * CLUSTER // limit, 1))
                base = qi * heads + t * TILE_Q
                pend = nnz + _cdiv_t(remaining, limit) * rows
                for off in range(0, rows, chunk):
                    tl.store(words + ms_at + m, base + off)
                    tl.store(words + me_at + m, base + tl.minimum(off + chunk, rows))
                    tl.store(words + mps_at + m, nnz + off)
                    tl.store(words + mpe_at + m, pend)
                    tl.store(words + mst_at + m, rows)
                    m += 1
            zero = remaining == 0
            going = (remaining > 0) | zero
            while going:
                actual = tl.minimum(remaining, limit)
                # pop: the top leaves; the last element sifts down from the root (__adjust_heap)
                top, last = _get2(heap, c, 0, CLUSTERS - 1)
                hole = tl.zeros([], tl.int32)
                child = tl.zeros([], tl.int32)
                while child < (CLUSTERS - 2) // 2:  # the heap without its last element: CLUSTERS - 1 long
                    child = 2 * (child + 1)
                    right, left = _get2(heap, c, child, child - 1)
                    go_left = (right >> 32) > (left >> 32)
                    child = tl.where(go_left, child - 1, child)
                    heap = tl.where(c == hole, tl.where(go_left, left, right), heap)
                    hole = child
                if (CLUSTERS % 2 == 1) and (CLUSTERS >= 3):  # an even length: a last lone left child
                    last_parent = child == (CLUSTERS - 3) // 2
                    child = tl.where(last_parent, 2 * (child + 1), child)
                    heap = tl.where((c == hole) & last_parent, _get(heap, c, child - 1), heap)
                    hole = tl.where(last_parent, child - 1, hole)
                heap = _push_up(heap, c, hole, last)
                # insert: the popped cluster with its new cost, pushed up from the end (__push_heap)
                top_i = (top & 0xFFFFFFFF).to(tl.int32)
                top_c = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
                new_c = top_c + (add_tile + actual.to(tl.float32))
                heap = _push_up(heap, c, tl.zeros([], tl.int32) + (CLUSTERS - 1), _key(top_i, new_c))
                # the item: its cluster, its rank there, and what pass two needs to write it
                rec = scratch + w * 7
                tl.store(rec, top_i)
                tl.store(rec + 1, _get(count, c, top_i))
                tl.store(rec + 2, i)
                tl.store(rec + 3, t * TILE_Q)
                tl.store(rec + 4, kv_start)
                tl.store(rec + 5, kv_start + actual)
                tl.store(rec + 6, tl.where(split, nnz, -1))
                count = tl.where(c == top_i, count + 1, count)
                w += 1
                nnz += tl.where(split, rows, 0)
                remaining -= actual
                kv_start += actual
                going = (remaining > 0) & (zero == 0)
    cm = c < CLUSTERS
    starts = tl.cumsum(tl.where(cm, count, 0), 0)
    tl.store(words + wi_at + c + 1, starts, mask=cm)
    tl.store(words + wi_at + c, tl.zeros_like(c), mask=c == 0)
    for j0 in range(0, num_sm, BLOCK_W):  # merge rows past the last split: 0, as FlashInfer's fresh vectors
        j = j0 + tl.arange(0, BLOCK_W)
        dead = (j >= m) & (j < num_sm)
        tl.store(words + ms_at + j, tl.zeros_like(j), mask=dead)
        tl.store(words + me_at + j, tl.zeros_like(j), mask=dead)
        tl.store(words + mps_at + j, tl.zeros_like(j), mask=dead)
        tl.store(words + mpe_at + j, tl.zeros_like(j), mask=dead)
        tl.store(words + mst_at + j, tl.zeros_like(j), mask=dead)
    tl.debug_barrier()  # pass one's records and work_indptr, written by this program, read back below
    for j0 in range(0, w, BLOCK_W):
        j = j0 + tl.arange(0, BLOCK_W)
        jm = j < w
        rec = scratch + j * 7
        at = tl.load(words + wi_at + tl.load(rec, mask=jm, other=0), mask=jm, other=0) + \
            tl.load(rec + 1, mask=jm, other=0)
        req = tl.load(rec + 2, mask=jm, other=0)
        qa = tl.load(qo_indptr + req, mask=jm, other=0)
        tl.store(words + q_at + at, qa, mask=jm)
        tl.store(words + kv_at + at, tl.load(kv_indptr + req, mask=jm, other=0), mask=jm)
        tl.store(words + part_at + at, tl.load(rec + 6, mask=jm, other=0), mask=jm)
        tl.store(words + ql_at + at, tl.load(qo_indptr + req + 1, mask=jm, other=0) - qa, mask=jm)
        tl.store(words + kl_at + at, tl.load(kv_lens + req, mask=jm, other=0), mask=jm)
        tl.store(words + qs_at + at, tl.load(rec + 3, mask=jm, other=0), mask=jm)
        tl.store(words + ks_at + at, tl.load(rec + 4, mask=jm, other=0), mask=jm)
        tl.store(words + ke_at + at, tl.load(rec + 5, mask=jm, other=0), mask=jm)


class MLADevicePlanner:
    """A wrapper's MLA partition planned on the GPU after the metadata graph, from the device
    ``qo_indptr`` / ``kv_indptr`` / ``kv_lens`` into ``workspace`` (the wrapper's uint8 int
    workspace): the hook the adapter adds to its site (captured with the graph). ``max_q`` bounds a
    request's query rows (decode 1, verify the draft tokens)."""

    def __init__(self, layout: MLALayout, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_lens: torch.Tensor,
                 workspace: torch.Tensor, max_q: int) -> None:
        L = self.layout = layout
        self.workspace = workspace
        self.scratch = torch.zeros(MAX_WORKS * RECORD, dtype=torch.int32, device=workspace.device)
        tile_q = L.cluster * CTA_TILE_Q
        args = (qo_indptr, kv_indptr, kv_lens, workspace.view(torch.int32), self.scratch, L.bs, L.heads, L.num_sm,
                *(L.at(n) for n in NAMES))
        meta = dict(CLUSTER=L.cluster, CLUSTERS=L.clusters, CAUSAL=L.causal,
                    BLOCK_C=triton.next_power_of_2(L.clusters + 1), BLOCK_R=triton.next_power_of_2(max(L.bs, 1)),
                    BLOCK_W=256, MAX_TILES=_cdiv(max_q * L.heads, tile_q), num_warps=1)
        kernel = _mla_plan[(1,)]
        self._call = lambda: kernel(*args, **meta)

    def __call__(self) -> None:
        launch(self._call)


def read_regions(layout: MLALayout, words: torch.Tensor) -> list[tuple[int, int]]:
    """(word offset, words) of everything FlashInfer's MLA kernel reads, for the live count the
    ``work_indptr`` in ``words`` (an int32 view of an int workspace) holds."""
    L = layout
    wi = L.at("work_indptr")
    live = int(words[wi + L.clusters])
    return ([(wi, L.clusters + 1)] + [(L.at(n), live) for n in WORK] + [(L.at(n), L.num_sm) for n in MERGE])
