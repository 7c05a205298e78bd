"""compiled eager == capture == replay == eager twin == interpreter, on
random batches, padded sizes, IDLE, and replay data unlike capture data."""

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.runtime import ForwardBatch, ReplayView
from attnmeta.sim import DecodeModel, GraphRunner, decode_attention_loop
from tests.batches import capture, interp_inputs, make_batch, make_pool

L, ROWS, MAX_BS, SIZES = 40, 24, 12, (1, 3, 8)
FIELDS = ("kv_indptr", "kv_indices", "kv_last_page_len", "kv_indptr_host")
FILLS = {"seq_lens": 1, "seq_lens_cpu": 1, "req_pool_indices": 0}


@pytest.fixture(scope="module")
def compiled():
    return compile_backend("flashinfer", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L))


def check_against_oracles(compiled, meta, fb, bs, pool):
    """Live rows against the eager twin; all rows (padding included) against the interpreter."""
    raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
    if raw:
        ref = get_eager("flashinfer")(pool, MAX_BS).init_forward_metadata(fb)
        n = int(ref.kv_indptr[-1])
        assert torch.equal(meta.kv_indptr[: raw + 1], ref.kv_indptr)
        assert torch.equal(meta.kv_indices[:n], ref.kv_indices)
        assert torch.equal(meta.kv_last_page_len[:raw], ref.kv_last_page_len)
        assert torch.equal(meta.kv_indptr_host[: raw + 1], ref.kv_indptr_host)
    want = eval_graph(compiled.plan(ForwardMode.DECODE, bs).graph, interp_inputs(fb, bs, pool, FILLS))
    total = int(want["kv_indptr"][-1])
    assert torch.equal(meta.kv_indptr, want["kv_indptr"])
    assert torch.equal(meta.kv_indices[:total], want["kv_indices"][:total])
    assert torch.equal(meta.kv_last_page_len, want["kv_last_page_len"])
    assert torch.equal(meta.kv_indptr_host, want["kv_indptr_host"])
    assert meta.plan.batch_size == bs and meta.plan.total_kv == total


@pytest.mark.parametrize("raw", [1, 2, 3, 5, 8, 11, 12])
def test_compiled_eager_matches_oracles(compiled, raw):
    pool = make_pool(ROWS, L, seed=raw)
    be = compiled.instantiate(pool)
    fb = make_batch(raw, L, ROWS, seed=100 + raw)
    be.init_forward_metadata(fb)
    check_against_oracles(compiled, be.forward_metadata, fb, raw, pool)


@pytest.mark.parametrize("bs", SIZES)
def test_capture_then_replay_unlike_data(compiled, bs):
    """Capture with short sequences on some rows, replay with long ones on others (and padding)."""
    pool = make_pool(ROWS, L, seed=bs)
    be = compiled.instantiate(pool)
    cap = make_batch(bs, L, ROWS, seed=1, max_len=3)
    g = capture(be, cap)
    check_against_oracles(compiled, be.forward_metadata, cap, bs, pool)
    captured_meta = be.forward_metadata
    for seed, raw in [(2, bs), (3, bs - 1), (4, max(bs - 2, 0)), (5, bs)]:
        fb = make_batch(raw, L, ROWS, seed=seed)
        view = ReplayView.of(fb, bs)
        be.init_forward_metadata_out_graph(view)
        g.replay()
        assert be.forward_metadata is captured_meta  # same static views, never rebound
        check_against_oracles(compiled, be.forward_metadata, fb, bs, pool)


def test_idle_replay_pads_every_row(compiled):
    pool = make_pool(ROWS, L, seed=7)
    be = compiled.instantiate(pool)
    cap = make_batch(3, L, ROWS, seed=8)
    g = capture(be, cap)
    idle = ForwardBatch(ForwardMode.IDLE, 0)
    be.init_forward_metadata_out_graph(ReplayView.of(idle, 3))
    g.replay()
    m = be.forward_metadata
    assert m.kv_indptr.tolist() == [0, 1, 2, 3]  # every row a fill-1 sequence
    assert m.kv_indices[:3].tolist() == [0, 0, 0]  # reading reserved pool row 0
    check_against_oracles(compiled, m, idle, 3, pool)


def test_runner_serving_steps_match_eager_and_attention(compiled):
    """The GraphRunner over changing batches: replays, padding, IDLE, eager fallback past the largest size."""
    pool = make_pool(ROWS, L, seed=11)
    be = compiled.instantiate(pool)
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(ROWS * L + 1, 2, 8, generator=g), torch.randn(ROWS * L + 1, 2, 8, generator=g)
    model = DecodeModel(k, v, MAX_BS, L)
    runner = GraphRunner(be, model, SIZES, "cpu")
    runner.capture()
    for step, raw in enumerate([3, 2, 0, 8, 7, 1, 11, 5, 8, 4]):
        fb = make_batch(raw, L, ROWS, seed=50 + step) if raw else ForwardBatch(ForwardMode.IDLE, 0)
        q = torch.randn(raw, 2, 8, generator=g)
        out = runner.run(fb, q)
        assert out.shape == (raw, 2, 8)
        if raw:
            ref = get_eager("flashinfer")(pool, MAX_BS).init_forward_metadata(fb)
            torch.testing.assert_close(out, decode_attention_loop(q, k, v, ref.kv_indptr, ref.kv_indices),
                                       rtol=0, atol=1e-5)
            assert torch.equal(be.forward_metadata.kv_indptr[: raw + 1], ref.kv_indptr)
    assert runner.stats["eager"] == 1  # only the batch of 11 > largest captured 8
    assert runner.stats["replay"] == 9
    assert runner.stats["padded_rows"] == (3 - 2) + (1 - 0) + (8 - 7) + (8 - 5) + (8 - 4)
