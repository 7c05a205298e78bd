"""DSV4's compressor plans handed to SGLang as its own plan objects, read back by SGLang's own code
(the positions its compressors rotate by), with SGLang's ring sizes; views of the compiled buffers."""

import random

import pytest
import torch

pytest.importorskip("sglang.kernels.ops.attention.dsv4.compress")

from sglang.kernels.ops.attention.dsv4.compress import CompressorDecodePlan, CompressorPrefillPlan  # noqa: E402
from sglang.srt.layers.attention.dsv4.compressor_v2 import _extract_positions_from_plan  # noqa: E402
from sglang.srt.mem_cache.deepseek_v4_memory_pool import get_compress_state_ring_size  # noqa: E402

from attnmeta.backends.dsv4.compress import ring_size  # noqa: E402
from attnmeta.backends.dsv4.eager import swa_table  # noqa: E402
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend  # noqa: E402
from attnmeta.compiler.ir.errors import UserError  # noqa: E402
from attnmeta.integrations.sglang.dsv4 import compress_metadata, indexer_inputs  # noqa: E402
from attnmeta.runtime import ForwardBatch  # noqa: E402
from tests.batches import make_pool  # noqa: E402

L, ROWS, D = 1100, 10, 3
M = ForwardMode


@pytest.mark.parametrize("drafts", [0, D])
def test_ring_sizes_are_sglangs(drafts):
    for r in (4, 128):
        assert ring_size(r, drafts > 0) == get_compress_state_ring_size(r, drafts)


def batch(mode, n: int, rng: random.Random) -> ForwardBatch:
    seq = torch.tensor([rng.choice([1, 3, 4, 127, 128, 255, 256, 300, L - D]) for _ in range(n)], dtype=torch.int32)
    rpi = torch.tensor(rng.sample(range(1, ROWS), n), dtype=torch.int64)
    per = 1 if mode is M.DECODE else D
    loc = torch.tensor([rng.randrange(ROWS * L) for _ in range(n * per)], dtype=torch.int64)
    return ForwardBatch(mode, n, req_pool_indices=rpi, req_pool_indices_cpu=rpi, seq_lens=seq, seq_lens_cpu=seq,
                        seq_lens_sum=int(seq.sum()), out_cache_loc=loc)


def test_sglang_reads_the_plans():
    be = compile_backend("dsv4", CompileOptions(max_bs=8, capture_sizes=(8,), max_context_len=L, num_draft_tokens=D,
                                                modes=("decode", "target_verify", "draft_extend"))).instantiate(
        make_pool(ROWS, L, 1), pools={"full_to_swa": swa_table(ROWS * L + 1, "cpu")})
    rng = random.Random(1)
    for step in range(6):
        be.init_forward_metadata(batch(M.DECODE if step % 2 == 0 else M.TARGET_VERIFY, 6, rng))
        m = be.forward_metadata
        for r in (4, 128):
            plan = compress_metadata(m, r)
            if step % 2 == 0:  # decode: one entry per request, its length first; positions seq - r
                assert isinstance(plan, CompressorDecodePlan) and plan.plan_d.shape == (6, 16)
                field = getattr(m, f"c{r}_plan_d")
                assert plan.plan_d.dtype == torch.uint8 and plan.plan_d.data_ptr() == field.data_ptr()  # a view
                assert torch.equal(_extract_positions_from_plan(plan, r), m.seq_lens_casual - r)
            else:  # verify: an entry per token that completes a block, at length p + 1 = a multiple of r
                assert isinstance(plan, CompressorPrefillPlan)
                assert plan.plan_c.shape == (6 * D, 16) and plan.plan_w.shape == (6 * D, 8)
                got = _extract_positions_from_plan(plan, r)
                words = getattr(m, f"c{r}_plan_c")[:, 0]
                valid = words != -1
                assert torch.equal(got[valid], words[valid] - r) and not (words[valid] % r).any()
                want = sorted(int(s) for s in m.seq_lens_casual if s % r == 0)
                assert sorted(words[valid].tolist()) == want
        inputs = indexer_inputs(m)
        assert inputs["compressed_page_size"] == 64 and inputs["page_size"] == 256
    be.init_forward_metadata(batch(M.DRAFT_EXTEND, 2, rng))
    with pytest.raises(UserError, match="draft extend is SWA only"):
        compress_metadata(be.forward_metadata, 4)
