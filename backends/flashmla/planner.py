"""FlashMLA's tile scheduler (``get_mla_metadata``) as a kernel recorded with the metadata graph.

FlashMLA's decode kernel runs ``num_sm_parts`` persistent parts; its scheduler splits every
request's key blocks (64 tokens each, plus a fixed overhead of 5 blocks per request) greedily
across the parts. Each part gets one ``DecodingSchedMeta`` (``tile_scheduler_metadata``, 8 int32
words: ``begin_req, end_req`` (both inclusive), ``begin_block, end_block`` (end exclusive),
``begin_split``, ``first_split, last_split`` (whether the part's first / last request is shared
with another part), one unused word) and every request its cumulative split count
(``num_splits``). SGLang calls it every step from its backend; here it is one Triton program written
from FlashMLA's dense decode scheduler (its single-warp ``get_mla_metadata_kernel`` and the host's
part count, ``max(sm_count / h_k / ceil(q_tokens_per_head_k / 64), 1)``), launched after the
metadata graph from the step's ``cache_seqlens`` into the bound fields, so capture records it and
every replay reruns it. No host work per step. ``schedule`` is the same algorithm in Python, line
by line: the tests' oracle. Both are checked word for word against FlashMLA's own scheduler (SGLang's
``sgl-flash-mla`` wheel) on the H200: ``tests/gpu/test_flashmla_schedule.py``.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from attnmeta.compiler.lowering.launch import launch
from attnmeta.compiler.lowering.triton_kernels import jit, torch_on
from attnmeta.runtime.planning import Site

SCHEDULER = "flashmla.tile_schedule"
BLOCK_N, OVERHEAD, META_WORDS = 64, 5, 8  # key block, fixed overhead in blocks, words per part
SCHEDULED = 7  # the words of a part FlashMLA writes (the eighth is padding)


def num_sm_parts(sm_count: int, q_tokens_per_head_k: int, heads_k: int = 1) -> int:
    """The host's part count for dense BF16 MLA on SM90."""
    return max(sm_count // heads_k // -(-q_tokens_per_head_k // 64), 1)


def schedule(seqlens: list[int], parts: int, block_n: int = BLOCK_N, overhead: int = OVERHEAD):
    """FlashMLA's scheduler in Python: ``(meta [parts][7], num_splits [bs + 1])``."""
    bs = len(seqlens)
    if bs == 0:  # no requests (a TBO child of none): every part empty, ending before request 0
        return [[0, -1, 0, 0, 0, 0, 0] for _ in range(parts)], [0]
    last = [max(s - 1, 0) // block_n for s in seqlens]  # a request's key blocks: 0 .. last
    blocks = [x + 1 for x in last]
    payload = -(-sum(b + overhead for b in blocks) // parts) + overhead
    splits, meta = [0] * (bs + 1), []
    idx = block = n_split = cum = 0
    for _ in range(parts):
        begin_idx, begin_block, begin_split, first_split = idx, block, n_split, block != 0
        remain = payload
        while idx < bs:
            left = blocks[idx] - block
            if remain >= left + overhead:
                cum += n_split + 1
                splits[idx + 1] = cum
                remain -= left + overhead
                idx, block, n_split = idx + 1, 0, 0
            else:
                if remain - overhead > 0:
                    block += remain - overhead
                    n_split += 1
                break
        end_idx = idx if block > 0 else idx - 1
        end_block = block if block > 0 else (0 if seqlens[idx - 1] == 0 else last[idx - 1] + 1)
        last_split = end_block != last[end_idx] + 1 and seqlens[end_idx] != 0
        if begin_idx == end_idx:  # one request: split at either end is split at both
            first_split = last_split = first_split or last_split
        meta.append([begin_idx, end_idx, begin_block, end_block, begin_split, int(first_split), int(last_split)])
    return meta, splits


@jit
def _tile_schedule(seqlens, meta, splits, bs, parts, BLOCK_N: tl.constexpr, OVERHEAD: tl.constexpr,
                   BS: tl.constexpr):
    offs = tl.arange(0, BS)
    s = tl.load(seqlens + offs, mask=offs < bs, other=0)
    total = tl.sum(tl.where(offs < bs, tl.maximum(s - 1, 0) // BLOCK_N + 1 + OVERHEAD, 0), axis=0)
    payload = (total + parts - 1) // parts + OVERHEAD
    tl.store(splits, 0)
    idx = tl.zeros([], tl.int32)
    block = tl.zeros([], tl.int32)
    n_split = tl.zeros([], tl.int32)
    cum = tl.zeros([], tl.int32)
    for p in range(0, parts):
        begin_idx = idx
        first_split = block != 0
        tl.store(meta + p * 8, idx)
        tl.store(meta + p * 8 + 2, block)
        tl.store(meta + p * 8 + 4, n_split)
        remain = payload
        going = idx < bs
        while going:
            left = tl.maximum(tl.load(seqlens + idx) - 1, 0) // BLOCK_N + 1 - block
            if remain >= left + OVERHEAD:
                cum += n_split + 1
                tl.store(splits + idx + 1, cum)
                remain -= left + OVERHEAD
                idx += 1
                block = 0
                n_split = 0
                going = idx < bs
            else:
                if remain - OVERHEAD > 0:
                    block += remain - OVERHEAD
                    n_split += 1
                going = False
        end_idx = tl.where(block > 0, idx, idx - 1)
        s_prev = tl.load(seqlens + tl.maximum(idx - 1, 0), mask=bs > 0, other=0)
        end_block = tl.where(block > 0, block, tl.where(s_prev == 0, 0, tl.maximum(s_prev - 1, 0) // BLOCK_N + 1))
        s_end = tl.load(seqlens + tl.maximum(end_idx, 0), mask=bs > 0, other=0)
        last_split = (end_block != tl.maximum(s_end - 1, 0) // BLOCK_N + 1) & (s_end != 0) & (bs > 0)
        one = begin_idx == end_idx
        first_split = tl.where(one, first_split | last_split, first_split)
        last_split = tl.where(one, first_split, last_split)
        tl.store(meta + p * 8 + 1, end_idx)
        tl.store(meta + p * 8 + 3, end_block)
        tl.store(meta + p * 8 + 5, first_split.to(tl.int32))
        tl.store(meta + p * 8 + 6, last_split.to(tl.int32))


def tile_schedule(seqlens: torch.Tensor, meta: torch.Tensor, splits: torch.Tensor) -> None:
    """FlashMLA's schedule of ``seqlens`` (int32 [bs]) into ``meta`` ([parts, 8]) and ``splits`` ([bs + 1])."""
    bs, parts = seqlens.shape[0], meta.shape[0]
    if torch_on(seqlens):  # CPU tensors without Triton's interpreter: the same algorithm on the host
        launch(lambda: _schedule_into(seqlens, meta, splits))
        return
    launch(lambda: _tile_schedule[(1,)](seqlens, meta, splits, bs, parts, BLOCK_N=BLOCK_N, OVERHEAD=OVERHEAD,
                                         BS=triton.next_power_of_2(max(bs, 1))))


def _schedule_into(seqlens: torch.Tensor, meta: torch.Tensor, splits: torch.Tensor) -> None:
    words, cum = schedule(seqlens.tolist(), meta.shape[0])
    meta[:, :SCHEDULED] = torch.tensor(words, dtype=meta.dtype)
    splits.copy_(torch.tensor(cum, dtype=splits.dtype))


class FlashMLAScheduler:
    """The planner of the ``flashmla`` spec: no host work; on a site's first call it adds the
    scheduler kernel after the metadata graph, on the fields the spec binds, and returns the
    same object every step (``(tile_scheduler_metadata, num_splits)``, SGLang's pair)."""

    def __call__(self, site: Site):
        if not isinstance(site.state, tuple):  # its state is the pair it returns, made on the first call
            seqlens, meta, splits = (site.field(r) for r in ("cache_seqlens", "tile_scheduler_metadata",
                                                            "num_splits"))
            site.state = (meta, splits)
            site.after_graph(functools.partial(tile_schedule, seqlens, meta, splits))
            site.host_free = True  # the schedule is computed in the graph; no host input at all
        return site.state


def standins() -> dict:
    """The scheduler is attnmeta's own kernel, on any device: the spec's planner, not a stand-in."""
    return {SCHEDULER: FlashMLAScheduler}
