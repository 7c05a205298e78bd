"""Real CUDA graphs for FlashAttention's window-pool fields (a sliding-window model whose window layers keep
their KV in a pool of their own): decode, target verify and draft extend at pages 1 and 16, captured short,
replayed with other batches and padded, the translated pages and write slots == hand-computed values
(tests/runtime/test_fa3_window_pool.py's, which also holds them against the reference interpreter on the CPU)."""

import pytest
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ReplayView
from tests.batches import capture_on_cuda
from tests.runtime.test_fa3_window_pool import ROWS, D, L, batch, check, paged_pool, window_table

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
MODES = [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND]


@pytest.mark.parametrize("P", [1, 16])
@pytest.mark.parametrize("mode", MODES, ids=[m.name.lower() for m in MODES])
def test_fa3_window_pool_capture_replay_on_cuda(mode, P):
    dev = torch.device("cuda")
    pool, f2s = paged_pool(P, 1).to(dev), window_table(P, 2).to(dev)
    cb = compile_backend("flashattention", CompileOptions(
        max_bs=8, capture_sizes=(4, 8), max_context_len=L, page_size=P, sliding_window=24, window_pool=True,
        num_draft_tokens=D, modes=(mode.name.lower(),)))
    be = cb.instantiate(pool, device=dev, pools={"full_to_swa": f2s})
    per = 1 if mode is ForwardMode.DECODE else D
    for bs in (8, 4):
        g = capture_on_cuda(be, bs, L, ROWS, mode, per, dev)
        for seed, raw in [(3, bs), (4, bs - 3)]:  # another batch, and one padded to the captured size
            fb = batch(mode, raw, seed, dev)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            torch.cuda.synchronize()
            check(cb, be, fb, bs, pool, f2s, P, interpreter=False)
