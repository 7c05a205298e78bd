"""MultiStep (S draft steps, topk 1) around FlashInfer and Triton: every
step's metadata == the inner twin on the batch with s + 1 drafted tokens,
through capture and replay; an IDLE batch inside the wrapper stays IDLE."""

import pytest

from attnmeta.backends.eager import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, OptionsError, compile_backend
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import capture, make_batch, make_pool
from tests.oracles import assert_metadata_equal, padded

L, ROWS, MAX_BS, SIZES, S = 48, 12, 8, (1, 4, 8), 3


@pytest.mark.parametrize("inner", ["flashinfer", "triton"])
def test_every_step_matches_the_twin(inner):
    name = f"multistep_{inner}"
    cb = compile_backend(name, CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, num_steps=S))
    pool = make_pool(ROWS, L, seed=2)
    twin = get_eager(name)(pool, MAX_BS, num_steps=S)
    assert all(r["kernels"] == "1" for r in cb.summary())  # every step's metadata in one kernel
    for bs in SIZES:
        be = cb.instantiate(pool)
        g = capture(be, make_batch(bs, L, ROWS, seed=bs, max_len=3))
        for seed, raw in [(41, bs), (42, bs - 1)]:
            fb = make_batch(raw, L, ROWS, seed=seed, max_len=L - S)  # room for the S drafted tokens
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            full = padded(fb, bs)
            assert_metadata_equal(be.forward_metadata, twin.init_forward_metadata(full), full.seq_lens_cpu)


def test_idle_inside_the_wrapper_is_not_run_as_decode():
    """The replay after a real batch is IDLE: every step must see only fill rows (length 1 + s + 1
    in pool row 0), not the previous batch's requests."""
    cb = compile_backend("multistep_flashinfer", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L,
                                                               num_steps=S))
    pool = make_pool(ROWS, L, seed=3)
    be = cb.instantiate(pool)
    g = capture(be, make_batch(4, L, ROWS, seed=1))
    be.init_forward_metadata_out_graph(ReplayView.of(make_batch(4, L, ROWS, seed=9), 4))
    g.replay()
    be.init_forward_metadata_out_graph(ReplayView.of(ForwardBatch(ForwardMode.IDLE, 0), 4))
    g.replay()
    m = be.forward_metadata
    for s in range(S):
        lens = 1 + s + 1
        assert getattr(m, f"step{s}_kv_indptr").tolist() == [lens * r for r in range(5)]
        assert not bool(getattr(m, f"step{s}_kv_indices")[: 4 * lens].any())  # pool row 0: all zero
        assert getattr(m, f"step{s}_plan").batch_size == 4


def test_topk_above_one_is_refused_clearly():
    with pytest.raises(OptionsError, match="supports topk 1, got topk=2"):
        compile_backend("multistep_flashinfer", CompileOptions(max_bs=4, topk=2))
