"""Two-batch overlap: children are static sub-ranges fixed per captured size,
replayed from the replay view alone; TBO on and off give the same attention."""

from types import SimpleNamespace

import pytest
import torch

from attnmeta.backends import get_eager, get_spec
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import Op
from attnmeta.runtime import ForwardBatch, ReplayView
from attnmeta.sim import decode_attention_loop
from tests.batches import capture, make_batch, make_pool

L, ROWS, MAX_BS, SIZES = 24, 20, 9, (1, 2, 5, 8)


@pytest.fixture(scope="module")
def compiled():
    return compile_backend("tbo_flashinfer", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L))


def sub_batch(fb, lo, hi):
    return ForwardBatch(ForwardMode.DECODE, hi - lo, req_pool_indices=fb.req_pool_indices[lo:hi],
                        seq_lens=fb.seq_lens[lo:hi], seq_lens_cpu=fb.seq_lens_cpu[lo:hi])


def test_split_is_a_compile_time_constant_per_size(compiled):
    for bs in SIZES:
        g = compiled.plan(ForwardMode.DECODE, bs).graph
        cuts = {(n.a["start"], n.a["stop"]) for n in g.nodes if n.op is Op.slice}
        assert cuts == {(0, bs // 2), (bs // 2, bs)}  # ints: nothing computed at replay
        assert not [n for n in g.nodes if n.op is Op.split_at]


@pytest.mark.parametrize("bs", SIZES)
def test_every_size_replays_children_from_the_view_alone(compiled, bs):
    pool = make_pool(ROWS, L, seed=bs)
    be = compiled.instantiate(pool)
    cap = make_batch(bs, L, ROWS, seed=1, max_len=2)
    g = capture(be, cap)
    for seed, raw in [(2, bs), (3, bs - 1), (4, 0)]:
        fb = make_batch(raw, L, ROWS, seed=seed) if raw else ForwardBatch(ForwardMode.IDLE, 0)
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))  # no tbo_children: the view alone
        g.replay()
        m = be.forward_metadata
        padded = make_batch(bs, L, ROWS, seed=seed)  # rows past raw: fill values
        padded.seq_lens[raw:], padded.seq_lens_cpu[raw:], padded.req_pool_indices[raw:] = 1, 1, 0
        if raw:
            padded.seq_lens[:raw], padded.seq_lens_cpu[:raw] = fb.seq_lens, fb.seq_lens_cpu
            padded.req_pool_indices[:raw] = fb.req_pool_indices
        for c, (lo, hi) in enumerate([(0, bs // 2), (bs // 2, bs)]):
            ref = get_eager("flashinfer")(pool, MAX_BS).init_forward_metadata(sub_batch(padded, lo, hi))
            n = int(ref.kv_indptr[-1])
            assert torch.equal(getattr(m, f"tbo{c}_kv_indptr"), ref.kv_indptr)
            assert torch.equal(getattr(m, f"tbo{c}_kv_indices")[:n], ref.kv_indices)
            assert torch.equal(getattr(m, f"tbo{c}_kv_indptr_host"), ref.kv_indptr_host)
            assert getattr(m, f"tbo{c}_plan").batch_size == hi - lo  # each child planned every replay


def test_tbo_on_and_off_give_identical_attention(compiled):
    pool = make_pool(ROWS, L, seed=9)
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(ROWS * L + 1, 2, 8, generator=gen), torch.randn(ROWS * L + 1, 2, 8, generator=gen)
    fb = make_batch(8, L, ROWS, seed=10)
    q = torch.randn(8, 2, 8, generator=gen)
    off = compile_backend(get_spec("flashinfer"), CompileOptions(max_bs=MAX_BS, capture_sizes=(8,), max_context_len=L))
    plain = off.instantiate(pool)
    plain.init_forward_metadata(fb)
    whole = decode_attention_loop(q, k, v, plain.forward_metadata.kv_indptr, plain.forward_metadata.kv_indices)
    be = compiled.instantiate(pool)
    be.init_forward_metadata(fb)
    m = be.forward_metadata
    halves = [decode_attention_loop(q[lo:hi], k, v, getattr(m, f"tbo{c}_kv_indptr"), getattr(m, f"tbo{c}_kv_indices"))
              for c, (lo, hi) in enumerate([(0, 4), (4, 8)])]
    assert torch.equal(torch.cat(halves), whole)


@pytest.mark.parametrize("bs,raw", [(8, 8), (8, 5), (8, 3), (5, 2), (1, 0)])
def test_children_num_token_non_padded(compiled, bs, raw):
    be = compiled.instantiate(make_pool(ROWS, L, seed=1))
    g = capture(be, make_batch(bs, L, ROWS, seed=1))
    fb = make_batch(raw, L, ROWS, seed=2) if raw else ForwardBatch(ForwardMode.IDLE, 0)
    be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
    g.replay()
    m, split = be.forward_metadata, bs // 2
    assert (int(m.num_token_non_padded), int(m.tbo0_num_token_non_padded), int(m.tbo1_num_token_non_padded)) == (
        raw, min(raw, split), max(raw - split, 0))


@pytest.mark.parametrize("inner", ["triton", "flashattention"])
@pytest.mark.parametrize("bs", [1, 8])  # at 1, child 0 has no rows: its metadata is a constant
def test_children_of_every_backend_match_the_twin_on_their_halves(inner, bs):
    from tests.oracles import assert_metadata_equal, padded

    cb = compile_backend(f"tbo_{inner}", CompileOptions(max_bs=MAX_BS, capture_sizes=(bs,), max_context_len=L))
    assert cb.kernels(ForwardMode.DECODE, bs) <= 2
    pool = make_pool(ROWS, L, seed=5)
    be = cb.instantiate(pool)
    g = capture(be, make_batch(bs, L, ROWS, seed=1, max_len=2))
    fb = make_batch(bs - 1 or 1, L, ROWS, seed=6)
    be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
    g.replay()
    full = padded(fb, bs)
    for c, (lo, hi) in enumerate([(0, bs // 2), (bs // 2, bs)]):
        half = sub_batch(full, lo, hi)
        ref = get_eager(inner)(pool, MAX_BS).init_forward_metadata(half)
        child = SimpleNamespace(**{f: getattr(be.forward_metadata, f"tbo{c}_{f}") for f in vars(ref)})
        assert_metadata_equal(child, ref, half.seq_lens_cpu)
