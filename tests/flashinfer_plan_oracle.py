"""FlashInfer 0.6.4's graph-mode planners (``include/flashinfer/attention/scheduler.cuh``:
``DecodePlan`` with its work estimation and ``DecodeSplitKVIndptr``; ``PrefillPlan`` with
``PrefillSplitQOKVIndptr`` and ``PrefillBinarySearchKVChunkSize``; ``AlignedAllocator``), read from
the C++ source and written here as plain Python loops. They run on the host only (and need a GPU
to call), so this is the CPU oracle; it shares no code with attnmeta.

Each returns ``(plan_info, workspace)``: the plan-info vector FlashInfer's Python keeps, and the
int workspace bytes the plan copies to the device, unwritten bytes 0xAA (FlashInfer leaves work
items past the live count stale: the kernels skip them by the live mask), plus ``live``: how many
work items are live.
"""

from __future__ import annotations

import numpy as np


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Alloc:
    def __init__(self, size: int):
        self.cur, self.buf = 0, np.full(size, 0xAA, dtype=np.uint8)

    def take(self, nbytes: int, align: int) -> int:
        self.cur = cdiv(self.cur, align) * align
        at, self.cur = self.cur, self.cur + nbytes
        return at

    def put(self, at: int, values, dtype=np.int32) -> None:
        raw = np.asarray(values, dtype=dtype).tobytes()
        self.buf[at : at + len(raw)] = np.frombuffer(raw, dtype=np.uint8)


def decode_plan(indptr: list[int], max_grid: int, kv_heads: int, page_size: int, ws: int = 1 << 16,
                min_chunk: int = 128):
    """DecodePlan, enable_cuda_graph=True. ``max_grid``: blocks per SM x SMs (occupancy); ``min_chunk``:
    the tokens whose pages bound the chunk search from below (128 in FlashInfer; tests change it to make
    a planner that disagrees)."""
    bs, gdy = len(indptr) - 1, kv_heads
    pages = [indptr[i + 1] - indptr[i] for i in range(bs)]
    if bs * gdy >= max_grid:
        split, chunk, new_bs = False, max([1, *pages]), bs
    else:
        low, high = max(min_chunk // page_size, 1), max([0, *pages])
        while low < high:
            mid = (low + high) // 2
            n = sum(cdiv(p, mid) for p in pages)
            if n * gdy > max_grid:
                low = mid + 1
            else:
                high = mid
        chunk, new_bs = low, sum(cdiv(max(p, 1), low) for p in pages)
        split = True  # graph mode always splits when it may
    padded = max_grid // gdy if split else bs
    # FlashInfer writes new_bs items into arrays of padded: past them when rows of no pages (counted 0
    # by the search, 1 after it) tip the count over; a batch the tests must not use as an oracle
    assert new_bs <= padded, "FlashInfer's decode plan overflows its arrays for this batch"
    req, kvt, o = [], [], [0]
    for i in range(bs):
        n = cdiv(max(pages[i], 1), chunk)
        req += [i] * n
        kvt += list(range(n))
        o.append(o[-1] + n)
    a = _Alloc(ws)
    info = [padded, 0, 0, a.take(4 * padded, 16), a.take(4 * padded, 16), a.take(4 * (padded + 1), 16),
            0, a.take(4, 1), 1, int(split)]
    a.put(info[3], req)
    a.put(info[4], kvt)
    a.put(info[5], o)
    a.put(info[7], [chunk * page_size])
    if split:
        info[6] = a.take(padded, 16)
        a.put(info[6], [i < new_bs for i in range(padded)], np.uint8)
    return info, a.buf, new_bs


def cta_tile_q(packed_qo_len: int, head_dim: int) -> int:
    """FA2DetermineCtaTileQ on compute capability 8 or newer."""
    if packed_qo_len > 64 and head_dim < 256:
        return 128
    return 64 if packed_qo_len > 16 else 16


def prefill_plan(qo_indptr: list[int], kv_indptr: list[int], num_sm: int, heads: tuple[int, int], head_dim: int,
                 page_size: int, ws: int = 1 << 16, min_chunk: int = 128, window_left: int = -1):
    """PrefillPlan, fa2, enable_cuda_graph=True, no fixed split, nothing colocated. A sliding window
    (``window_left`` >= 0) bounds each request's keys the partition splits by the window and a query tile:
    min(ceil((window_left + cta) / page), kv)."""
    bs, (hq, hkv) = len(qo_indptr) - 1, heads
    g, rows = hq // hkv, qo_indptr[-1]
    limit = 2 * num_sm // hkv
    packed = [(qo_indptr[i + 1] - qo_indptr[i]) * g for i in range(bs)]
    kv = [kv_indptr[i + 1] - kv_indptr[i] for i in range(bs)]
    cta = cta_tile_q((rows - bs + 1) * g, head_dim)
    if window_left >= 0:
        kv = [min(cdiv(window_left + cta, page_size), k) for k in kv]
    tiles_bound = cdiv(rows * g, cta) + bs - 1
    low, high = max(min_chunk // page_size, 1), max([1, *kv])
    while low < high:
        mid = (low + high) // 2
        n = sum(cdiv(packed[i], cta) * cdiv(max(kv[i], 1), mid) for i in range(bs))
        if n > limit:
            low = mid + 1
        else:
            high = mid
    chunk = low
    req, qot, kvt, merge, o, new_bs = [], [], [], [0], [0], 0
    for i in range(bs):
        nq, nk = cdiv(packed[i], cta), cdiv(max(kv[i], 1), chunk)
        for t in range(nq):
            for c in range(nk):
                new_bs += 1
                req.append(i)
                qot.append(t)
                kvt.append(c)
        for _ in range(packed[i] // g):
            merge.append(merge[-1] + nk)
        o.append(o[-1] + packed[i] // g * nk)
    padded = max(limit, tiles_bound)
    assert new_bs <= padded
    a = _Alloc(ws)
    r_at, q_at, k_at = a.take(4 * padded, 16), a.take(4 * padded, 16), a.take(4 * padded, 16)
    o_at, c_at, rows_at = a.take(4 * (bs + 1), 16), a.take(4, 1), a.take(4, 16)
    a.put(rows_at, [qo_indptr[-1]], np.uint32)
    a.put(r_at, req)
    a.put(q_at, qot)
    a.put(k_at, kvt)
    a.put(o_at, o)
    a.put(c_at, [chunk * page_size])
    m_at, v_at = a.take(4 * (rows + 1), 16), None
    v_at = a.take(padded, 16)
    a.put(m_at, merge)
    a.put(v_at, [i < new_bs for i in range(padded)], np.uint8)
    info = [padded, rows, rows_at, cta, r_at, q_at, k_at, m_at, o_at, c_at, 0, 0, v_at, 1, 1]
    return info, a.buf, new_bs
