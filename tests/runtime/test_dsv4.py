"""DSV4: the raw->full upgrade, declared out of graph as movable, ends up
recorded; with hoisting disabled check-split names every step that would not
be; compiled metadata == the eager twin through capture, padding and IDLE."""

import pytest
import torch

from attnmeta.backends.dsv4.eager import EagerDSV4Decode, swa_table
from attnmeta.backends.dsv4.spec import DSV4Options
from attnmeta.compiler import CompileOptions, ForwardMode, SplitError, compile_backend
from attnmeta.compiler.ir import Region
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import capture, make_batch, make_pool
from tests.oracles import assert_metadata_equal, padded

L, ROWS, MAX_BS, SIZES = 600, 12, 8, (1, 3, 8)
OPTS = CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L)


def with_out_loc(fb: ForwardBatch, seed: int) -> ForwardBatch:
    g = torch.Generator().manual_seed(seed)
    fb.out_cache_loc = torch.randint(0, ROWS * L, (fb.batch_size,), generator=g)
    return fb


def test_upgrade_is_hoisted_into_the_graph():
    cb = compile_backend("dsv4", OPTS)
    spec_nodes = cb.spec.build(ForwardMode.DECODE, OPTS).nodes
    assert all(n.region is Region.out_graph and n.movable for n in spec_nodes)  # as the author wrote it
    for bs in SIZES:
        g = cb.plan(ForwardMode.DECODE, bs).graph
        assert not g.region_nodes(Region.out_graph)  # per-step host work: the staging copy only
        producers = g.producers()
        assert all(producers[o.value].region is Region.in_graph for o in g.outputs)
        assert cb.summary()[0]["host_ops"] == 0


def test_without_hoisting_check_split_names_every_step():
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(3,), max_context_len=L, disabled_passes=("hoist-upgrades",))
    with pytest.raises(SplitError) as e:
        compile_backend("dsv4", opts)
    spec = compile_backend("dsv4", OPTS).spec.build(ForwardMode.DECODE, OPTS)
    steps = {n.name for n in spec.nodes} - set(spec.constants())  # constants are made once, at bind
    assert steps >= {n.name for n in spec.nodes if n.op.value == "gather_rows"}
    named = {v.node for v in e.value.violations if v.rule == "unstable-buffer"}
    assert named == steps
    assert all(v.origin.startswith("backends/dsv4") for v in e.value.violations)  # dsv4.py and its parts


@pytest.mark.parametrize("bs", SIZES)
def test_capture_and_replay_match_the_twin(bs):
    pool = make_pool(ROWS, L, seed=bs)
    f2s = swa_table(ROWS * L + 1, "cpu")
    be = compile_backend("dsv4", OPTS).instantiate(pool, pools={"full_to_swa": f2s})
    twin = EagerDSV4Decode(pool, MAX_BS, f2s)
    g = capture(be, with_out_loc(make_batch(bs, L, ROWS, seed=1, max_len=5), 1))
    for seed, raw in [(2, bs), (3, bs - 1), (4, 0)]:
        fb = with_out_loc(make_batch(raw, L, ROWS, seed=seed), seed) if raw else ForwardBatch(ForwardMode.IDLE, 0)
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        g.replay()
        full = padded(fb, bs)
        assert_metadata_equal(be.forward_metadata, twin.init_forward_metadata(full), full.seq_lens_cpu)


def test_hand_computed_compression_fields():
    pool = torch.zeros(2, 512, dtype=torch.int32)
    pool[1] = torch.arange(512, dtype=torch.int32) + 1000  # slots 1000.., pages 3 (768..) then 5
    cb = compile_backend("dsv4", CompileOptions(max_bs=1, capture_sizes=(1,), max_context_len=512))
    be = cb.instantiate(pool, pools={"full_to_swa": torch.arange(2000, dtype=torch.int32) * 10})
    seq = torch.tensor([256], dtype=torch.int32)
    be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 1, req_pool_indices=torch.tensor([1]), seq_lens=seq,
                                          seq_lens_cpu=seq.clone(), out_cache_loc=torch.tensor([1255])))
    m = be.forward_metadata
    assert int(m.positions[0]) == 255 and int(m.swa_topk_lengths[0]) == 128
    assert m.swa_page_indices[0, :2].tolist() == [12550, 12540]  # tokens 255, 254 -> slots 1255, 1254
    assert m.page_table[0].tolist() == [1000 // 256, 0]  # one page covers 256 tokens; the second is unused
    assert int(m.seq_lens_casual[0]) == 256 and int(m.raw_out_loc[0]) == 1255
    assert int(m.c4_topk_lengths_raw[0]) == 64 and int(m.c4_topk_lengths_clamp1[0]) == 64
    assert int(m.c128_topk_lengths_clamp1[0]) == 2
    assert int(m.c4_out_loc[0]) == 1255 // 4 and int(m.c128_out_loc[0]) == 1255 // 128  # 256 % r == 0
    # 2 c128 slots per page x 2 pages = 4 columns, padded to 64 with -1 for the sparse kernel
    assert m.c128_page_indices[0].tolist() == [2 * 3, 2 * 3 + 1] + [-1] * 62
    assert int(m.c4_sparse_topk_lengths[0]) == 64 and m.c4_sparse_page_indices.shape == (1, 512)
    assert m.positions.dtype == m.seq_lens_casual.dtype == torch.int32 and m.c4_out_loc.dtype == torch.int64
    short = torch.tensor([3], dtype=torch.int32)  # no compressed block yet: the kernel gets length 1
    be.init_forward_metadata(ForwardBatch(ForwardMode.DECODE, 1, req_pool_indices=torch.tensor([1]),
                                          seq_lens=short, seq_lens_cpu=short.clone(),
                                          out_cache_loc=torch.tensor([1002])))
    m = be.forward_metadata
    assert int(m.c4_topk_lengths_raw[0]) == 0 and int(m.c4_topk_lengths_clamp1[0]) == 1
    assert int(m.c128_topk_lengths_clamp1[0]) == 1 and int(m.c4_sparse_topk_lengths[0]) == 1
    assert m.c128_page_indices[0].tolist() == [-1] * 64 and int(m.c4_out_loc[0]) == 0  # 3 % 4 != 0


@pytest.mark.parametrize("bs", SIZES)
def test_verify_expands_per_token_and_matches_the_twin(bs):
    D = 3
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, num_draft_tokens=D,
                          modes=("target_verify",))
    pool = make_pool(ROWS, L, seed=bs)
    f2s = swa_table(ROWS * L + 1, "cpu")
    cb = compile_backend("dsv4", opts)
    be = cb.instantiate(pool, pools={"full_to_swa": f2s})
    twin = EagerDSV4Decode(pool, MAX_BS, f2s, draft_tokens=D, speculative=True)
    V = ForwardMode.TARGET_VERIFY

    def batch(raw, seed, max_len=L - D):
        fb = make_batch(raw, L, ROWS, seed=seed, max_len=max_len, mode=V)
        fb.out_cache_loc = torch.randint(0, ROWS * L, (raw * D,), generator=torch.Generator().manual_seed(seed))
        return fb

    g = capture(be, batch(bs, 1, max_len=4))
    for seed, raw in [(2, bs), (3, bs - 1)]:
        fb = batch(raw, seed)
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        g.replay()
        full = padded(fb, bs, V)
        full.out_cache_loc = torch.zeros(bs * D, dtype=torch.int64)
        full.out_cache_loc[: raw * D] = fb.out_cache_loc  # token-level: D slots per live request
        ref = twin.init_forward_metadata(full)
        assert be.forward_metadata.positions.shape == (bs * D,)
        tok_lens = (full.seq_lens_cpu[:, None] + 1 + torch.arange(D)).reshape(-1)
        assert_metadata_equal(be.forward_metadata, ref, tok_lens)
    hand = be.forward_metadata.positions[:D].tolist()
    assert hand == [int(full.seq_lens_cpu[0]) + j for j in range(D)]  # token j of request 0: position seq + j


def test_draft_extend_is_swa_only_and_matches_the_twin():
    T, bs, raw = 3, 8, 6
    E = ForwardMode.DRAFT_EXTEND
    pool = make_pool(ROWS, L, seed=4)
    f2s = swa_table(ROWS * L + 1, "cpu")
    cb = compile_backend("dsv4", CompileOptions(max_bs=MAX_BS, capture_sizes=(bs,), max_context_len=L,
                                               num_draft_tokens=T, modes=("draft_extend",)))
    be = cb.instantiate(pool, pools={"full_to_swa": f2s})
    twin = EagerDSV4Decode(pool, MAX_BS, f2s, draft_tokens=T, speculative=True)

    def batch(n, seed):
        fb = make_batch(n, L, ROWS, seed=seed, mode=E)
        fb.seq_lens_cpu[0] = fb.seq_lens[0] = 1  # shorter than T: its first tokens see nothing
        fb.out_cache_loc = torch.randint(0, ROWS * L, (n * T,), generator=torch.Generator().manual_seed(seed))
        return fb

    g = capture(be, batch(bs, 1))
    fb = batch(raw, 2)
    be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
    g.replay()
    full = padded(fb, bs, E)
    full.out_cache_loc = torch.zeros(bs * T, dtype=torch.int64)
    full.out_cache_loc[: raw * T] = fb.out_cache_loc
    ref = twin.init_forward_metadata(full)
    assert not hasattr(be.forward_metadata, "c4_out_loc")  # no compression in draft extend
    lens = (full.seq_lens_cpu[:, None] - T + 1 + torch.arange(T)).reshape(-1)  # V2: seq-T+1 .. seq
    assert_metadata_equal(be.forward_metadata, ref, lens, page_size=256)
    s1 = int(fb.seq_lens_cpu[1])
    assert be.forward_metadata.positions[T:2 * T].tolist() == [s1 - 3, s1 - 2, s1 - 1]  # by hand, T = 3
    assert be.forward_metadata.seq_lens_casual[:T].tolist() == [-1, 0, 1]  # the request of length 1
    assert be.forward_metadata.swa_page_indices[:2].eq(-1).all()  # tokens at lengths <= 0 read nothing


@pytest.mark.parametrize("ratios", [(4,), (128,), ()], ids=["c4", "c128", "none"])
def test_fewer_ratios_match_the_twin_field_for_field(ratios):
    """A pool with fewer compression ratios: the compiled backend and the twin build the same set of
    fields (plans included), equal, in decode and verify, with the rings of speculative decoding."""
    D, bs = 3, 3
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(bs,), max_context_len=L, num_draft_tokens=D,
                          backend=DSV4Options(compress_ratios=ratios), modes=("decode", "target_verify"))
    pool = make_pool(ROWS, L, seed=5)
    f2s = swa_table(ROWS * L + 1, "cpu")
    be = compile_backend("dsv4", opts).instantiate(pool, pools={"full_to_swa": f2s})
    twin = EagerDSV4Decode(pool, MAX_BS, f2s, draft_tokens=D, speculative=True, ratios=ratios)
    for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY):
        fb = make_batch(bs, L, ROWS, seed=6, max_len=L - D, mode=mode)
        per = D if mode is ForwardMode.TARGET_VERIFY else 1
        fb.out_cache_loc = torch.randint(0, ROWS * L, (bs * per,), generator=torch.Generator().manual_seed(6))
        be.init_forward_metadata(fb)
        ref = twin.init_forward_metadata(fb)
        assert set(vars(be.forward_metadata)) == set(vars(ref))
        lens = fb.seq_lens_cpu if per == 1 else (fb.seq_lens_cpu[:, None] + 1 + torch.arange(D)).reshape(-1)
        assert_metadata_equal(be.forward_metadata, ref, lens)
