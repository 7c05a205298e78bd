"""Real FlashMLA (SGLang's ``sgl-flash-mla`` wheel, its dense BF16 SM90 decode kernel) over attnmeta's
``flashmla`` metadata (DeepSeek shapes: 128 query heads, one latent KV head of 512 + a rope key of 64,
64-token pages): decode and target verify captured in CUDA graphs with the attention and replayed with
new batches, against an fp32 oracle read from the pool. The tile schedule the kernel reads is the one
the recorded graph computed (no host scheduler per step); every replay's is also compared, word for
word, with FlashMLA's own ``get_mla_decoding_metadata`` of the same lengths."""

import random

import pytest
import torch

from attnmeta.backends.flashmla.planner import SCHEDULED
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch, ReplayView

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
L, ROWS, D, MAX_BS, SIZES, H, CKV, KPE, PAGE = 4096, 40, 4, 16, (4, 16), 128, 512, 64, 64
SCALE = (128 + KPE) ** -0.5


def paged_pool(rows: int, seed: int, dev) -> torch.Tensor:
    """req_to_token as a 64-token paged allocator writes it: each row's tokens fill whole pages, the
    pages a random permutation (page 0 reserved for row 0, SGLang's padding row)."""
    g = torch.Generator().manual_seed(seed)
    per_row = L // PAGE
    pages = torch.randperm((rows - 1) * per_row, generator=g).view(rows - 1, per_row) + 1
    slots = (pages[:, :, None] * PAGE + torch.arange(PAGE)).view(rows - 1, L)
    return torch.cat([torch.zeros(1, L, dtype=torch.int64), slots]).to(torch.int32).to(dev)


def oracle(q, kv, pool, rows, keys, q_per_req):
    """fp32 MLA: query t of request i sees the first keys[i] - q_per_req + t + 1 of its keys."""
    out = []
    for i, (r, n) in enumerate(zip(rows, keys, strict=True)):
        k = kv[pool[r, :n].long()].float()  # [n, CKV + KPE]
        for t in range(q_per_req):
            see = n - q_per_req + t + 1
            p = torch.softmax(q[i, t].float() @ k[:see].T * SCALE, -1)  # [H, see]
            out.append(p @ k[:see, :CKV])
    return torch.stack(out).view(len(rows), q_per_req, H, CKV)


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY], ids=["decode", "verify"])
def test_flashmla_replayed_over_attnmeta_metadata_matches_the_oracle(mode):
    flash_mla = pytest.importorskip("flash_mla", reason="FlashMLA (sgl-flash-mla) is not installed here")
    from flash_mla.flash_mla_interface import FlashMLASchedMeta

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    q_per_req = D if mode is ForwardMode.TARGET_VERIFY else 1
    pool = paged_pool(ROWS, 5, dev)
    cb = compile_backend("flashmla", CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L,
                                                    modes=(mode.name.lower(),), num_draft_tokens=D, page_size=PAGE,
                                                    num_heads=H, sm_count=sms))
    be = cb.instantiate(pool, device=dev)
    g = torch.Generator().manual_seed(3)
    kv = (torch.randn(ROWS * L + PAGE, CKV + KPE, generator=g) * 0.5).to(dev).bfloat16()
    cache = kv.view(-1, PAGE, 1, CKV + KPE)
    q = torch.zeros(MAX_BS, q_per_req, H, CKV + KPE, dtype=torch.bfloat16, device=dev)
    out = {}
    graphs = {}

    def attend(bs):
        m = be.forward_metadata
        sched = FlashMLASchedMeta(tile_scheduler_metadata=m.tile_scheduler_metadata, num_splits=m.num_splits)
        o, _ = flash_mla.flash_mla_with_kvcache(q[:bs], cache, m.block_kv_indices, m.cache_seqlens, CKV, sched,
                                                softmax_scale=SCALE, causal=True, use_legacy=True)
        return o

    for bs in sorted(SIZES, reverse=True):
        fb = ForwardBatch(mode, bs, req_pool_indices=torch.zeros(bs, dtype=torch.int64, device=dev),
                          seq_lens=torch.full((bs,), D + 1, dtype=torch.int32, device=dev),
                          seq_lens_cpu=torch.full((bs,), D + 1, dtype=torch.int32))
        be.init_forward_metadata_out_graph(fb, in_capture=True)
        be.init_forward_metadata_in_graph(fb)
        attend(bs)  # warm-up outside the graph
        torch.cuda.synchronize()
        graphs[bs] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[bs]):
            be.init_forward_metadata_in_graph(fb)
            out[bs] = attend(bs)
    rng, worst = random.Random(1), 0.0
    for step in range(10):
        raw = rng.randint(1, MAX_BS)
        bs = min(s for s in SIZES if s >= raw)
        lens = [rng.choice([D, 63, 64, 65, 128, L - D]) if rng.random() < 0.5 else rng.randint(D, L - D)
                for _ in range(raw)]
        rows = rng.sample(range(1, ROWS), raw)
        seq, rpi = torch.tensor(lens, dtype=torch.int32), torch.tensor(rows, dtype=torch.int64)
        fb = ForwardBatch(mode, raw, req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi, seq_lens=seq.to(dev),
                          seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        q[:raw] = torch.randn(raw, q_per_req, H, CKV + KPE, generator=g).to(dev).bfloat16()
        graphs[bs].replay()
        torch.cuda.synchronize()
        keys = [x + D if q_per_req > 1 else x for x in lens]
        want = oracle(q[:raw], kv, pool, rows, keys, q_per_req)
        rel = (out[bs][:raw].float() - want).norm() / want.norm()
        worst = max(worst, float(rel))
        assert rel < 1e-2, (step, float(rel))
        m = be.forward_metadata  # the schedule the replay computed, against FlashMLA's own of these lengths
        pad = [1 + (D if q_per_req > 1 else 0)] * (bs - raw)  # padded rows: the fill length 1 (+ the drafts)
        their_meta, their_splits = flash_mla.get_mla_decoding_metadata(
            torch.tensor(keys + pad, dtype=torch.int32, device=dev), q_per_req * H, 1, None, False, None,
            use_legacy=True)
        assert torch.equal(m.tile_scheduler_metadata[:, :SCHEDULED], their_meta[:, :SCHEDULED]), step
        assert torch.equal(m.num_splits, their_splits), step
    print(f"\nflashmla {mode.name.lower()}: worst relative error against fp32 {worst:.2e}")
