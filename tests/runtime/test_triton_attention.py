"""The Triton split-KV decode kernel against the per-request torch loop,
on metadata from the compiled Triton backend (interpreter on CPU)."""

import pytest
import torch

from attnmeta.compiler import CompileOptions, compile_backend
from attnmeta.sim import decode_attention_loop
from attnmeta.sim.triton_attention import TritonDecodeAttention
from tests.batches import make_batch, make_pool

pytestmark = pytest.mark.overflow_checked  # the kernels' own tests: int32 overflow checked

L, ROWS = 96, 12


@pytest.mark.parametrize("bs,heads,kv_heads,seed", [(1, 2, 2, 0), (5, 4, 2, 1), (8, 2, 1, 2)])
def test_matches_reference_loop(bs, heads, kv_heads, seed):
    cb = compile_backend("triton", CompileOptions(max_bs=8, capture_sizes=(8,), max_context_len=L))
    pool = make_pool(ROWS, L, seed=seed)
    be = cb.instantiate(pool)
    fb = make_batch(bs, L, ROWS, seed=seed)
    be.init_forward_metadata(fb)
    m = be.forward_metadata
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(ROWS * L + 1, kv_heads, 24, generator=g)
    v = torch.randn(ROWS * L + 1, kv_heads, 24, generator=g)
    q = torch.randn(bs, heads, 24, generator=g)
    out = torch.empty_like(q)
    TritonDecodeAttention(8, heads, 24, int(m.max_kv_splits), "cpu")(q, k, v, m.kv_indptr, m.kv_indices,
                                                                       m.num_kv_splits, out)
    rep = heads // kv_heads
    want = decode_attention_loop(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), m.kv_indptr,
                                 m.kv_indices)
    assert int(m.num_kv_splits.max()) > 1 or bs == 1  # the split path is exercised
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)
