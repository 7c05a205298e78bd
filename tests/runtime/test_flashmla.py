"""FlashMLA's tile scheduler, recorded with the metadata: the Triton program against FlashMLA's
algorithm in Python (``schedule``, the eager twin's) on edge and random lengths, both against
small cases worked by hand from FlashMLA's source; and the ``flashmla`` spec's planner adding it
after the metadata graph, so a captured graph reruns it on every replay. (Every mode interleaved
against the interpreter and the twin: tests/runtime/test_engine_modes.py.)"""

import random

import pytest
import torch

from attnmeta.backends.flashmla.planner import META_WORDS, SCHEDULED, num_sm_parts, schedule, tile_schedule
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir.errors import OptionsError
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


def _draft_extend(seq: list[int], ext: list[int], host: bool = True) -> ForwardBatch:
    s, e = torch.tensor(seq, dtype=torch.int32), torch.tensor(ext, dtype=torch.int32)
    rpi = torch.arange(1, len(seq) + 1)
    return ForwardBatch(ForwardMode.DRAFT_EXTEND, len(seq), req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                        seq_lens=s, seq_lens_cpu=s if host else None, extend_seq_lens=e,
                        extend_seq_lens_cpu=e if host else None)


@pytest.fixture(scope="module")
def extender():
    L, D = 512, 4
    cb = compile_backend("flashmla", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L, page_size=64,
                                                    num_draft_tokens=D, modes=("decode", "draft_extend")))
    return cb, make_pool(9, L), L, D


def test_draft_extend_serves_the_end_of_the_context_after_a_full_window(extender):
    """Draft extend reads seq - extend + D keys: lengths L and L - 1 after D accepted tokens read at most L and are
    served, eagerly and replayed, with the key lengths and pages worked by hand; the bound follows each row's
    own extend length, not the worst case (SGLang serves these; a bound of L - (D - 1) refused them)."""
    cb, pool, L, D = extender
    be = cb.instantiate(pool)
    for fb in (_draft_extend([L - 1, L], [D, D]), _draft_extend([L - 1, L, 3], [D, D, 1])):
        be.init_forward_metadata(fb)
        keys = [s - e + D for s, e in zip(fb.seq_lens.tolist(), fb.extend_seq_lens.tolist(), strict=True)]
        m = be.forward_metadata
        assert m.cache_seqlens[: len(keys)].tolist() == keys and max(keys) <= L
        for i, k in enumerate(keys):  # the page of every 64th key of the row, as FlashMLA reads it
            pages = -(-k // 64)
            assert m.block_kv_indices[i, :pages].tolist() == (pool[i + 1, : pages * 64 : 64] // 64).tolist()
    g = capture(be, _draft_extend([1] * 4, [1] * 4))
    be.init_forward_metadata_out_graph(ReplayView.of(_draft_extend([L, L - 1], [D, D]), 4))
    g.replay()
    assert be.forward_metadata.cache_seqlens.tolist() == [L, L - 1, D, D]  # padded rows: 1 - 1 + D


def test_a_draft_extend_row_past_its_own_bound_is_refused_naming_both_lengths(extender):
    """seq - extend + D > L reads past the request's row: refused, naming the row, both lengths and the bound,
    by the generated staging and the general path alike; the next good batch is served."""
    from attnmeta.runtime import BatchError

    cb, pool, L, D = extender
    be = cb.instantiate(pool)
    be.init_forward_metadata(_draft_extend([10, 20], [1, 2]))  # the generated path is bound and warm
    for seq, ext in (([L, 30], [1, 1]), ([30, L - 1], [2, D - 2])):
        with pytest.raises(BatchError, match=rf"seq_lens_cpu\[\d\] = {max(seq)} with extend_seq_lens_cpu\[\d\] = "
                                             rf"\d: the row is past its bound seq_lens - extend_seq_lens <= {L - D}"):
            be.init_forward_metadata(_draft_extend(seq, ext))
    be.init_forward_metadata(_draft_extend([L - D + 1, 7], [1, 7 if D >= 7 else D]))
    assert be.forward_metadata.cache_seqlens[:1].tolist() == [L]


def test_a_per_row_bound_must_relate_two_lengths_of_the_batch():
    """The verifier names what is wrong with a bound that names another input."""
    from attnmeta.compiler.ir import DType, SpecBuilder, VerifyError
    from attnmeta.compiler.ir.graph import Kind

    def spec(hi, other_kind=Kind.length, other_shape=("bs",)):
        b = SpecBuilder("rel")
        e = b.input("e", DType.int32, list(other_shape), fill=1, kind=other_kind, hi="D")
        s = b.input("s", DType.int32, ["bs"], fill=1, kind=Kind.length, hi=hi)
        with b.in_graph():
            out = b.ewise("add", s, e)
        b.outputs(o=out)
        return b.build()

    assert spec("L - D + e").inputs[1].relation[0] == "e"
    for hi, kw, says in (("L - D + nope", {}, "names 'nope', which is not an input"),
                         ("L - D + 2*e", {}, "adds one other input once"),
                         ("L - D + e", {"other_kind": Kind.value}, "relates two lengths")):
        with pytest.raises(VerifyError, match=says):
            spec(hi, **kw)
