"""DeepSeek-V4's c4 indexer schedule: how the paged MQA-logits kernel splits a step's compressed
keys across the GPU's SMs (DeepGEMM's ``get_paged_mqa_logits_metadata``, which SGLang calls per
step on ``c4_topk_lengths_raw``).

Work comes in blocks of 256 compressed keys: row q has ceil(len_q / 256). With T blocks in all and
S SMs, SM i starts at global block ``i * (T // S) + max(i - (S - T % S), 0)`` (the last T % S SMs
take one block more); the schedule holds, for i = 0 .. S, the row that block falls in and its
block offset inside that row, or (rows, 0) past the end. Computed in the graph from the lengths
the graph already holds: a prefix sum, then per SM a binary search in it.
"""

from __future__ import annotations

from attnmeta.compiler.ir import DType, SpecBuilder, V

I32 = DType.int32
SPLIT = 256  # compressed keys per block (DeepGEMM's split-KV size on SM90 and SM100)
PAGE = 64  # the indexer's page size: a 256-token page holds 64 c4 entries


def indexer_schedule(b: SpecBuilder, lens: V, sm_count: int, max_rows: int) -> V:
    """[sm_count + 1, 2] int32: (row, block offset) where each SM's work starts, over ``lens``
    (at most ``max_rows`` rows). The row is an upper bound in the prefix sum, found by a binary
    search of fixed depth, so every value has the SMs as its rows and every size shares one kernel."""
    blocks = b.ewise("ceildiv", b.ewise("max", lens, 0), SPLIT)
    ex = b.cumsum(blocks)  # ex[q] = blocks of the rows before q
    total = b.reduce("sum", blocks)
    i = b.arange(sm_count + 1)
    pivot = b.ewise("sub", b.full(sm_count, [], I32), b.ewise("mod", total, sm_count))
    start = b.ewise("add", b.ewise("mul", i, b.ewise("floordiv", total, sm_count)),
                    b.ewise("max", b.ewise("sub", i, pivot), 0))
    lo = b.full(0, [sm_count + 1], I32)
    hi = b.ewise("add", lo, b.reduce("sum", b.full(1, [lens.type.shape[0]], I32)))  # the row count
    steps = max_rows.bit_length()
    for step in range(steps):  # the first row that ends after start: ex[q + 1] > start
        mid = b.ewise("floordiv", b.ewise("add", lo, hi), 2)
        active, after = b.compare("lt", lo, hi), b.ewise("add", mid, 1)
        right = b.compare("le", b.lookup(ex, after), start)
        if step < steps - 1:  # the last step only moves lo
            hi = b.where(active, b.where(right, hi, mid), hi)
        lo = b.where(active, b.where(right, after, lo), lo)
    offset = b.where(b.compare("lt", start, total), b.ewise("sub", start, b.lookup(ex, lo)), 0)
    col = b.outer("add", b.full(0, [sm_count + 1], I32), b.arange(2))
    zeros = b.full(0, [2], I32)
    return b.where(b.compare("eq", col, 0), b.outer("add", lo, zeros), b.outer("add", offset, zeros))
