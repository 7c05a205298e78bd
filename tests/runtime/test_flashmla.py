"""FlashMLA's tile scheduler, recorded with the metadata: the Triton program against FlashMLA's
algorithm in Python (``schedule``, the eager twin's) on edge and random lengths, both against
small cases worked by hand from FlashMLA's source; and the ``flashmla`` spec's planner adding it
after the metadata graph, so a captured graph reruns it on every replay. (Every mode interleaved
against the interpreter and the twin: tests/runtime/test_engine_modes.py.)"""

import random

import pytest
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.planners.flashmla import META_WORDS, SCHEDULED, num_sm_parts, schedule, tile_schedule
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import capture, make_pool

pytestmark = pytest.mark.overflow_checked  # the kernels' own tests: int32 overflow checked

# worked by hand: key blocks of 64 tokens plus 5 of overhead each, the payload ceil(total / parts) + 5; a
# part's words [begin_req, end_req, begin_block, end_block, begin_split, first_split, last_split]
HAND = [
    # two one-block requests over two parts: one request each
    ([64, 1], 2, [[0, 0, 0, 1, 0, 0, 0], [1, 1, 0, 1, 0, 0, 0]], [0, 1, 2]),
    # ten blocks over two parts: the request splits at block 8 (a part of one split request is split at
    # both ends), the second part starting split 1
    ([640], 2, [[0, 0, 0, 8, 0, 1, 1], [0, 0, 8, 10, 1, 1, 1]], [0, 2]),
    # a whole request, then the first 5 of the next one's 10 blocks: only the part's last request is split
    ([64, 640], 2, [[0, 1, 0, 5, 0, 0, 1], [1, 1, 5, 10, 1, 1, 1]], [0, 1, 3]),
]


def kernel(seqlens: list[int], parts: int):
    meta = torch.full((parts, META_WORDS), -7, dtype=torch.int32)
    splits = torch.full((len(seqlens) + 1,), -7, dtype=torch.int32)
    tile_schedule(torch.tensor(seqlens, dtype=torch.int32), meta, splits)
    return meta[:, :SCHEDULED].tolist(), splits.tolist()


@pytest.mark.parametrize(("seqlens", "parts", "meta", "splits"), HAND)
def test_the_schedule_of_cases_worked_by_hand(seqlens, parts, meta, splits):
    assert schedule(seqlens, parts) == (meta, splits)
    assert kernel(seqlens, parts) == (meta, splits)


def test_without_the_interpreter_a_cpu_schedules_on_the_host(monkeypatch):
    """CPU tensors where Triton's interpreter is off (the demo's and the benchmark's torch kernels): the
    scheduler runs as Python, to the same words as the cases worked by hand."""
    from attnmeta.compiler.lowering import triton_kernels

    monkeypatch.setattr(triton_kernels, "CPU_KERNELS", "torch")
    for seqlens, parts, meta, splits in HAND:
        assert kernel(seqlens, parts) == (meta, splits)


def test_the_kernel_schedules_as_flashmla_does():
    rng = random.Random(0)
    edges = [1, 2, 63, 64, 65, 127, 128, 129, 4095, 4096, 4097]
    for _ in range(40):
        bs = rng.choice([1, 2, 3, 8, 33, 64, 256])
        lens = [rng.choice(edges) if rng.random() < 0.4 else rng.randint(1, 8192) for _ in range(bs)]
        parts = num_sm_parts(rng.choice([132, 78, 16]), rng.choice([16, 128, 512]))
        assert kernel(lens, parts) == schedule(lens, parts), (bs, parts)
    assert kernel([], 4) == schedule([], 4)  # a TBO child of no rows: every part empty


def test_the_part_count_follows_flashmlas_host():
    assert num_sm_parts(132, 128) == 66  # DeepSeek decode on an H200: 128 query heads, one KV head
    assert num_sm_parts(132, 4 * 128) == 16  # verify with 4 drafts
    assert num_sm_parts(8, 4096) == 1  # never below one


def test_the_schedule_is_rerun_by_every_replay():
    L, rows = 512, 9
    cb = compile_backend("flashmla", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L, page_size=64,
                                                    num_heads=128))
    be = cb.instantiate(make_pool(rows, L))
    g = capture(be, ForwardBatch(ForwardMode.DECODE, 4, req_pool_indices=torch.zeros(4, dtype=torch.int64),
                                 seq_lens=torch.ones(4, dtype=torch.int32),
                                 seq_lens_cpu=torch.ones(4, dtype=torch.int32)))
    for lens in ([500, 3, 64], [1, 1, 1, 1], [65, 129, 257, 511]):
        rpi = torch.arange(1, len(lens) + 1)
        seq = torch.tensor(lens, dtype=torch.int32)
        be.init_forward_metadata_out_graph(ReplayView.of(
            ForwardBatch(ForwardMode.DECODE, len(lens), req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                         seq_lens=seq, seq_lens_cpu=seq, seq_lens_sum=int(seq.sum())), 4))
        g.replay()
        m = be.forward_metadata
        padded = lens + [1] * (4 - len(lens))
        meta, splits = schedule(padded, num_sm_parts(cb.options.sm_count, 128))
        assert m.tile_scheduler_metadata[:, :SCHEDULED].tolist() == meta and m.num_splits.tolist() == splits
        assert [t.data_ptr() for t in m.plan] == [m.tile_scheduler_metadata.data_ptr(), m.num_splits.data_ptr()]


def test_a_page_size_flashmla_does_not_serve_is_refused():
    with pytest.raises(OptionsError, match=r"backend 'flashmla' serves page sizes \[64\], not 16"):
        compile_backend("flashmla", CompileOptions(max_bs=4, capture_sizes=(4,), page_size=16))
