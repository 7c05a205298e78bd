"""TARGET_VERIFY and DRAFT_EXTEND for every backend: compiled capture/replay
== eager twin == interpreter, with padding, unlike-capture replays and
hand-computed cases."""

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir import eval_graph
from attnmeta.runtime import ForwardBatch, ReplayView
from tests.batches import capture, interp_inputs, make_batch, make_pool
from tests.oracles import assert_metadata_equal, padded

L, ROWS, MAX_BS, SIZES, D = 64, 16, 8, (1, 3, 8), 3
V = ForwardMode.TARGET_VERIFY
FILLS = {"seq_lens": 1, "seq_lens_cpu": 1, "req_pool_indices": 0}
E = ForwardMode.DRAFT_EXTEND


def with_extend(fb, seed):
    """Accepted tokens per request: 1..D, never more than the sequence."""
    g = torch.Generator().manual_seed(seed)
    ext = torch.randint(1, D + 1, (fb.batch_size,), generator=g, dtype=torch.int32)
    fb.extend_seq_lens_cpu = torch.minimum(ext, fb.seq_lens_cpu)
    fb.extend_seq_lens = fb.extend_seq_lens_cpu.to(fb.seq_lens.device)
    return fb
CASES = [("flashinfer", 1), ("triton", 1), ("flashattention", 1), ("flashattention", 16)]


def twin(name, pool, page_size):
    cls = get_eager(name)
    if name == "flashattention":
        return cls(pool, MAX_BS, page_size, draft_tokens=D)
    return cls(pool, MAX_BS, draft_tokens=D)


@pytest.mark.parametrize("mode", [V, E], ids=["target_verify", "draft_extend"])
@pytest.mark.parametrize("name,page_size", CASES)
def test_spec_modes_capture_and_replay_match_the_twin(name, page_size, mode):
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, page_size=page_size,
                          num_draft_tokens=D, modes=(mode.name.lower(),))
    cb = compile_backend(name, opts)
    pool = make_pool(ROWS, L, seed=page_size)
    fills = {**FILLS, "extend_seq_lens": 1, "extend_seq_lens_cpu": 1} if mode is E else FILLS
    for bs in SIZES:
        be = cb.instantiate(pool)
        g = capture(be, with_extend(make_batch(bs, L, ROWS, seed=bs, max_len=3, mode=mode), bs))
        for seed, raw in [(21, bs), (22, bs - 1)]:
            fb = with_extend(make_batch(raw, L, ROWS, seed=seed, mode=mode, max_len=L - D), seed)  # + D fits in L
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            full = padded(fb, bs, mode)
            lens = full.seq_lens_cpu + (D if name == "flashattention" and mode is V else 0)
            assert_metadata_equal(be.forward_metadata, twin(name, pool, page_size).init_forward_metadata(full),
                                  lens, page_size)
            want = eval_graph(cb.plan(mode, bs).graph, interp_inputs(fb, bs, pool, fills))
            for field in ("qo_indptr", "kv_indptr", "mask_indptr", "cu_seqlens_q", "cu_seqlens_k", "page_table"):
                if field in want:
                    assert torch.equal(getattr(be.forward_metadata, field), want[field]), field


def test_verify_hand_computed_flashinfer():
    cb = compile_backend("flashinfer", CompileOptions(max_bs=2, capture_sizes=(2,), max_context_len=16,
                                                     num_draft_tokens=2, modes=("target_verify",)))
    be = cb.instantiate(make_pool(4, 16))
    seq = torch.tensor([3, 5], dtype=torch.int32)
    be.init_forward_metadata(ForwardBatch(V, 2, req_pool_indices=torch.tensor([1, 2]), seq_lens=seq,
                                          seq_lens_cpu=seq.clone()))
    m = be.forward_metadata
    assert m.qo_indptr.tolist() == [0, 2, 4]
    assert m.kv_indptr.tolist() == [0, 5, 12]  # prefix + 2 drafts each
    assert m.mask_indptr.tolist() == [0, 10, 24]  # 2 rows x (3+2), then 2 x (5+2)
    assert m.kv_indptr_host.tolist() == [0, 5, 12] and m.plan.total_kv == 12


def test_verify_mask_buffer_is_static_and_keeps_what_the_drafter_writes():
    """The drafter writes the tree mask into the backend's buffer before replay (as engines do):
    the buffer is allocated once at capacity, padded with True, and never refilled by a step."""
    for name in ("flashinfer", "triton"):
        cb = compile_backend(name, CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=L,
                                                  num_draft_tokens=D, modes=("target_verify",)))
        be = cb.instantiate(make_pool(ROWS, L))
        g = capture(be, make_batch(4, L, ROWS, seed=1, mode=V))
        mask = be.forward_metadata.custom_mask
        assert mask.dtype == torch.bool and mask.numel() == 4 * D * (L + D) and bool(mask.all())
        mask[:7] = False  # the drafter's rows for this step
        be.init_forward_metadata_out_graph(ReplayView.of(make_batch(3, L, ROWS, seed=2, mode=V), 4))
        g.replay()
        be.init_forward_metadata(make_batch(2, L, ROWS, seed=3, mode=V))  # another size, eagerly
        for m in (be.bound(V, 4).meta, be.bound(V, 2).meta):
            assert m.custom_mask.data_ptr() == mask.data_ptr()
        assert not bool(mask[:7].any()) and bool(mask[7:].all())


def test_extend_runs_eagerly_and_matches_the_twin():
    cb = compile_backend("flashinfer", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                     modes=("decode", "extend")))
    pool = make_pool(ROWS, L, seed=5)
    be = cb.instantiate(pool)
    for raw in (1, 4, 8):
        fb = make_batch(raw, L, ROWS, seed=raw, mode=ForwardMode.EXTEND)
        g = torch.Generator().manual_seed(raw)
        ext = torch.minimum(torch.randint(1, 20, (raw,), generator=g, dtype=torch.int32), fb.seq_lens_cpu)
        fb.extend_seq_lens_cpu, fb.extend_seq_lens = ext, ext.clone()
        fb.extend_prefix_lens_cpu = fb.seq_lens_cpu - ext
        fb.extend_prefix_lens = fb.extend_prefix_lens_cpu.clone()
        be.init_forward_metadata(fb)
        ref = get_eager("flashinfer")(pool, MAX_BS).init_forward_metadata(fb)
        assert_metadata_equal(be.forward_metadata, ref, fb.extend_prefix_lens_cpu)
        assert be.forward_metadata.plan.total_kv == int(fb.extend_prefix_lens_cpu.sum())
