"""attnmeta's SGLang backends driven by SGLang's real classes: its ``ForwardBatch`` and ``ForwardMode``,
the replay view of its graph runner (``build_replay_fb_view``), its ``AttentionBackend`` base and
``ForwardMetadata`` classes, and its own kernels as the oracle (the kv-indices gather, the split
heuristic and the split-KV decode attention, in Triton's interpreter). Every mode SGLang captures,
eager and captured/replayed, random batches with the lengths around page and split boundaries."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend as SGLangAttentionBackend
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.model_executor.forward_batch_info import ForwardMode as SGLangMode

from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.integrations.sglang.backend import KINDS
from attnmeta.runtime import EmulatedGraph
from tests.integrations.sglang_world import (
    EDGES,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    MAX_BS,
    SIZES,
    D,
    L,
    Pool,
    attention_oracle,
    extend_oracle,
    fa_extend_oracle,
    make_pool,
    page_rows,
    replay_view,
    sglang_batch,
    sglang_kv_indices,
    sglang_num_kv_splits,
    triton_extend_oracle,
)

MODES = ("decode", "idle", "target_verify", "draft_extend")
SM = 6  # few SMs: the split heuristic's SM-count term varies over these small batches, so it is checked
# (backend, page size, plan_on_device: FlashInfer without host indptrs)
CASES = [("triton", 1, False), ("flashinfer", 1, False), ("flashinfer", 1, True), ("flashattention", 1, False),
         ("flashattention", 16, False), ("flashattention", 64, False)]


@pytest.fixture(scope="module", params=CASES, ids=[f"{k}-p{p}{'-on-device' if o else ''}" for k, p, o in CASES])
def compiled(request):
    kind, P, on_device = request.param
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, modes=MODES, page_size=P,
                          num_draft_tokens=D, num_heads=HEADS, num_kv_heads=KV_HEADS, sm_count=SM,
                          plan_on_device=on_device)
    return kind, compile_backend(kind, opts)


def new_backend(kind, compiled, req_to_token):
    return KINDS[kind](compiled, req_to_token, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM)


def capture_graph(be, cap):
    """SGLang's capture of one size: a dummy batch on pool row 0, out_graph with in_capture=True, then
    in_graph recorded (into attnmeta's emulated graph on a CPU)."""
    cap.req_pool_indices.zero_()
    be.init_forward_metadata_out_graph(cap, in_capture=True)
    g = EmulatedGraph()
    with g.capture():
        be.init_forward_metadata_in_graph(cap)
    return g


def extend_batch(mode: str, rng: random.Random, pool, mask: bool = False):
    """(lengths, accepted tokens, batch): three requests of lengths at the draft count and the page
    and block edges; draft extend accepts 1..D tokens each, verify extends by the D drafts."""
    lens = [rng.choice([D, D + 1, 16, 17, 255, 256, L - D]) for _ in range(3)]
    ext = None if mode == "target_verify" else [rng.randint(1, D) for _ in lens]
    return lens, ext, sglang_batch(mode, lens, rng, ext=ext, mask=mask, pool=pool)


def attention_rig(kind: str, seed: int, P: int = 1):
    """A backend of ``kind`` compiled for every mode, over a fresh pool, its KV pool and one layer."""
    c = compile_backend(kind, CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L, modes=MODES,
                                             num_draft_tokens=D, num_heads=HEADS, num_kv_heads=KV_HEADS, page_size=P))
    req_to_token = make_pool(seed=seed, P=P)
    be = new_backend(kind, c, req_to_token)
    be.init_cuda_graph_state(MAX_BS, MAX_BS * D)
    layer = RadixAttention(HEADS, HEAD_DIM, HEAD_DIM ** -0.5, KV_HEADS, layer_id=0)
    return be, req_to_token, Pool(int(req_to_token.max()) + 1), layer


def random_lens(rng: random.Random, n: int) -> list[int]:
    return [rng.choice(EDGES) if rng.random() < 0.6 else rng.randint(1, L - D) for _ in range(n)]


def expect(kind, be, mode, seq, rows, ext, req_to_token, live: int, spec=None):
    """forward_metadata on the ``live`` rows against SGLang's formulas and kernels, over the batch as
    SGLang's graph runner padded it (``seq``, ``rows`` of the captured size)."""
    m, P = be.forward_metadata, be.options.page_size
    f = getattr(m, "fields", m)  # FlashInfer: the wrappers' planned buffers
    verify, draft = mode == "target_verify", mode == "draft_extend"
    if kind == "flashinfer" and verify:
        kv_lens = seq + D
    elif kind == "triton" and draft:
        kv_lens = (seq - ext).clamp(min=0)
    else:
        kv_lens = seq
    if kind in ("triton", "flashinfer"):
        indptr = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(kv_lens, 0)])
        assert f.kv_indptr[: live + 1].tolist() == indptr[: live + 1].tolist()
        n = int(indptr[live])
        assert f.kv_indices[:n].tolist() == sglang_kv_indices(req_to_token, rows[:live], kv_lens[:live]).tolist()
        if verify or draft:
            assert f.qo_indptr[: live + 1].tolist() == list(range(0, (live + 1) * D, D))
        if verify:
            mask = torch.cumsum(D * (seq + D), 0)[:live].tolist()
            assert f.mask_indptr[1 : live + 1].tolist() == mask and int(f.mask_indptr[0]) == 0
    if kind == "triton":
        if mode in ("decode", "idle"):
            assert m.num_kv_splits[:live].tolist() == sglang_num_kv_splits(seq, SM)[:live]
            assert m.attn_logits.shape[1:] == (HEADS, 8, HEAD_DIM) and m.max_extend_len is None
        else:
            assert m.max_extend_len == D and m.num_kv_splits is None
        if verify and spec is not None and spec.custom_mask is not None:
            k = spec.custom_mask.numel()
            assert torch.equal(m.custom_mask[:k].cpu(), spec.custom_mask)
    if kind == "flashinfer":
        assert f.kv_last_page_len[:live].tolist() == [1] * live
        wrappers = m.decode_wrappers if mode in ("decode", "idle") else m.prefill_wrappers
        assert wrappers == [f.plan]
    if kind == "flashattention":
        lens = seq + D if verify else seq
        assert m.cache_seqlens_int32[:live].tolist() == lens[:live].tolist()
        assert m.cu_seqlens_k[: live + 1].tolist() == [0] + torch.cumsum(lens, 0)[:live].tolist()
        q = torch.cumsum(ext, 0) if draft else torch.full_like(seq, D if verify else 1).cumsum(0)
        assert m.cu_seqlens_q[: live + 1].tolist() == [0] + q[:live].tolist()
        assert m.max_seq_len_q == (D if verify or draft else 1)
        for i, want in enumerate(page_rows(req_to_token, rows[:live], lens[:live], P)):
            assert m.page_table[i, : len(want)].tolist() == want, (i, P)


def padded(fb, bs: int, fill: int):
    raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
    seq, rows, ext = torch.full((bs,), fill), torch.zeros(bs, dtype=torch.int64), torch.ones(bs, dtype=torch.int64)
    seq[:raw], rows[:raw] = fb.seq_lens[:raw], fb.req_pool_indices[:raw]
    if fb.extend_seq_lens is not None:
        ext[:raw] = fb.extend_seq_lens[:raw]
    return seq, rows, ext, raw


def step_batch(mode, rng, n):
    lens = random_lens(rng, n)
    ext = [rng.randint(1, min(D, s)) for s in lens] if mode == "draft_extend" else None
    return sglang_batch(mode, lens, rng, ext=ext, mask=rng.random() < 0.7)


def test_the_backends_are_sglang_backends():
    for cls in KINDS.values():
        assert issubclass(cls, SGLangAttentionBackend)
        for name in ("init_forward_metadata_out_graph", "init_forward_metadata_in_graph", "init_cuda_graph_state",
                     "get_cuda_graph_seq_len_fill_value", "forward_decode"):
            assert getattr(cls, name) is not getattr(SGLangAttentionBackend, name), (cls, name)


def test_eager_every_mode_interleaved(compiled):
    """SGLang's eager path: init_forward_metadata on real ForwardBatches, modes interleaved."""
    kind, c = compiled
    req_to_token = make_pool(seed=3, P=c.options.page_size)
    be = new_backend(kind, c, req_to_token)
    rng = random.Random(11)
    for step in range(24):
        mode = MODES[step % 3 if step % 7 else 3]  # decode, idle, verify, ... with draft extend between
        if mode == "idle":
            continue
        fb = step_batch(mode, rng, rng.randint(1, MAX_BS))
        be.init_forward_metadata(fb)
        seq, rows, ext, raw = padded(fb, fb.batch_size, 1)
        expect(kind, be, mode, seq, rows, ext, req_to_token, raw, fb.spec_info)


def test_graph_runner_capture_and_replay(compiled):
    """As SGLang's graph runner drives a backend: init_cuda_graph_state, capture each size with
    in_capture=True (in_graph recorded), then replay real batches through SGLang's replay view,
    padded by the runner, IDLE replaying DECODE's graph."""
    kind, c = compiled
    req_to_token = make_pool(seed=4, P=c.options.page_size)
    be = new_backend(kind, c, req_to_token)
    be.init_cuda_graph_state(MAX_BS, MAX_BS * D)
    fill = be.get_cuda_graph_seq_len_fill_value()
    rng = random.Random(5)
    graphs = {}
    for mode in ("decode", "target_verify", "draft_extend"):
        for bs in SIZES:
            fb = sglang_batch(mode, [fill] * bs, rng, ext=[1] * bs if mode == "draft_extend" else None)
            fb.req_pool_indices.zero_()
            be.init_forward_metadata_out_graph(fb, in_capture=True)
            g = graphs[mode, bs] = EmulatedGraph()
            with g.capture():
                be.init_forward_metadata_in_graph(fb)
    for _ in range(30):
        mode = rng.choice(MODES)
        n = rng.randint(1, MAX_BS)
        bs = min(s for s in SIZES if s >= n)
        fb = step_batch(mode if mode != "idle" else "decode", rng, n)
        if mode == "idle":
            fb.forward_mode = SGLangMode.IDLE
        view = replay_view(fb, bs, fill)
        be.init_forward_metadata_out_graph(view)
        graphs["decode" if mode == "idle" else mode, bs].replay()
        seq, rows, ext, raw = padded(fb, bs, fill)
        expect(kind, be, mode, seq, rows, ext, req_to_token, raw, fb.spec_info)


def test_decode_attention_reads_the_metadata(compiled):
    """forward_decode over a KV pool, eager and replayed, against attention computed from the pool by
    hand. For triton this is SGLang's own split-KV decode kernel reading attnmeta's metadata."""
    kind, c = compiled
    req_to_token = make_pool(seed=6, P=c.options.page_size)
    pool = Pool(int(req_to_token.max()) + 1)
    be = new_backend(kind, c, req_to_token)
    be.init_cuda_graph_state(MAX_BS, MAX_BS * D)
    layer = RadixAttention(HEADS, HEAD_DIM, HEAD_DIM ** -0.5, KV_HEADS, layer_id=0)
    rng = random.Random(9)
    g = capture_graph(be, sglang_batch("decode", [1] * 4, rng, pool=pool))
    for replayed in (False, True, True):
        fb = sglang_batch("decode", random_lens(rng, 3), rng, pool=pool)
        q = torch.randn(3, HEADS * HEAD_DIM)
        if replayed:
            be.init_forward_metadata_out_graph(replay_view(fb, 4, 1))
            g.replay()
            q = torch.cat([q, torch.zeros(1, HEADS * HEAD_DIM)])  # the padded row's query
        else:
            be.init_forward_metadata(fb)
        out = be.forward_decode(q, None, None, layer, fb, save_kv_cache=False).view(-1, HEADS, HEAD_DIM)[:3]
        want = attention_oracle(q[:3].view(3, HEADS, HEAD_DIM), pool, req_to_token, fb.req_pool_indices,
                                fb.seq_lens, HEAD_DIM ** -0.5)
        torch.testing.assert_close(out.float(), want, rtol=2e-3, atol=2e-3)



@pytest.mark.parametrize("mode", ["target_verify", "draft_extend"])
def test_flashinfer_extend_attention_reads_the_metadata(mode):
    """FlashInferBackend.forward_extend without FlashInfer (the torch reference over kv_indptr,
    kv_indices and the tree mask), eager and replayed, against attention read from the pool."""
    be, req_to_token, pool, layer = attention_rig("flashinfer", seed=8)
    rng = random.Random(2)
    verify = mode == "target_verify"
    g = capture_graph(be, sglang_batch(mode, [D + 1] * 4, rng, ext=[1] * 4 if not verify else None, pool=pool))
    for replayed in (False, True, True):
        lens, _, fb = extend_batch(mode, rng, pool, mask=True)
        masks = []
        if verify:
            m = fb.spec_info.custom_mask
            sizes = [D * (n + D) for n in lens]
            masks = list(torch.split(m, sizes))
            for x in masks:
                x.view(D, -1)[:, 0] = True  # every query sees a key
        q = torch.randn(3 * D, HEADS * HEAD_DIM)
        if replayed:
            be.init_forward_metadata_out_graph(replay_view(fb, 4, 1))
            g.replay()
            q = torch.cat([q, torch.zeros(D, HEADS * HEAD_DIM)])  # the padded request's queries
        else:
            be.init_forward_metadata(fb)
        out = be.forward_extend(q, None, None, layer, fb, save_kv_cache=False).view(-1, HEADS, HEAD_DIM)[: 3 * D]
        want = extend_oracle(q[: 3 * D].view(-1, HEADS, HEAD_DIM), pool, req_to_token, fb.req_pool_indices,
                             fb.seq_lens, verify, masks, HEAD_DIM ** -0.5)
        torch.testing.assert_close(out.float(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("mode", ["target_verify", "draft_extend"])
def test_triton_extend_attention_is_sglangs_kernel_over_the_metadata(mode):
    """TritonBackend.forward_extend runs SGLang's own extend kernel (Triton's interpreter here) over
    attnmeta's qo/kv indptrs, kv indices, tree mask and mask indptr, eager and replayed, against the
    attention read by hand from the pool and the new tokens' K/V."""
    be, req_to_token, pool, layer = attention_rig("triton", seed=12)
    rng, g = random.Random(4), torch.Generator().manual_seed(4)
    verify = mode == "target_verify"
    graph = capture_graph(be, sglang_batch(mode, [D + 1] * 4, rng, ext=None if verify else [1] * 4, pool=pool))
    for replayed in (False, True):
        lens, ext, fb = extend_batch(mode, rng, pool, mask=True)
        masks = []
        if verify:  # a tree mask: every draft sees the whole prefix
            masks = list(torch.split(fb.spec_info.custom_mask, [D * (n + D) for n in lens]))
            for x, n in zip(masks, lens, strict=True):
                x.view(D, -1)[:, :n] = True
                x.view(D, -1)[:, n] = True
        n_rows = 4 if replayed else 3
        q = torch.randn(n_rows * D, HEADS * HEAD_DIM, generator=g)
        k_ext = torch.randn(n_rows * D, KV_HEADS * HEAD_DIM, generator=g)
        v_ext = torch.randn(n_rows * D, KV_HEADS * HEAD_DIM, generator=g)
        if replayed:
            be.init_forward_metadata_out_graph(replay_view(fb, 4, 1))
            graph.replay()
        else:
            be.init_forward_metadata(fb)
        out = be.forward_extend(q, k_ext, v_ext, layer, fb, save_kv_cache=False).view(-1, HEADS, HEAD_DIM)[: 3 * D]
        want = triton_extend_oracle(q[: 3 * D].view(-1, HEADS, HEAD_DIM), k_ext.view(-1, KV_HEADS, HEAD_DIM),
                                    v_ext.view(-1, KV_HEADS, HEAD_DIM), pool, req_to_token, fb.req_pool_indices,
                                    fb.seq_lens, ext, verify, masks, HEAD_DIM ** -0.5)
        torch.testing.assert_close(out.float(), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("P", [1, 16])
@pytest.mark.parametrize("mode", ["target_verify", "draft_extend"])
def test_flashattention_extend_attention_reads_the_page_table(mode, P):
    """FlashAttentionBackend.forward_extend (the torch reference over the page table, cu_seqlens_q
    and the lengths), eager and replayed, against attention read by hand from the pool."""
    be, req_to_token, pool, layer = attention_rig("flashattention", seed=13, P=P)
    rng, g = random.Random(5), torch.Generator().manual_seed(5)
    verify = mode == "target_verify"
    graph = capture_graph(be, sglang_batch(mode, [D + 1] * 4, rng, ext=None if verify else [1] * 4, pool=pool))
    for replayed in (False, True):
        lens, ext, fb = extend_batch(mode, rng, pool)
        q = torch.randn(4 * D, HEADS * HEAD_DIM, generator=g)  # the runner's static rows; past the queries: padding
        if replayed:
            be.init_forward_metadata_out_graph(replay_view(fb, 4, 1))
            graph.replay()
        else:
            be.init_forward_metadata(fb)
        n = 3 * D if verify else sum(ext)
        out = be.forward_extend(q, None, None, layer, fb, save_kv_cache=False).view(-1, HEADS, HEAD_DIM)[:n]
        want = fa_extend_oracle(q[:n].view(-1, HEADS, HEAD_DIM), pool, req_to_token, fb.req_pool_indices,
                                fb.seq_lens, ext, verify, HEAD_DIM ** -0.5)
        torch.testing.assert_close(out.float(), want, rtol=2e-3, atol=2e-3)
