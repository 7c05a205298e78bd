"""Real CUDA graphs for triton's sliding-window layers: decode, target verify and draft extend, the window's KV in
the full pool or in a pool of its own (slots translated through a full-to-window table), captured short, replayed
long and padded, == the eager twin (request by request)."""

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ReplayView
from tests.batches import capture_on_cuda, make_pool, spec_step
from tests.oracles import assert_metadata_equal, padded

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
L, ROWS, MAX_BS, D, W = 1024, 40, 32, 4, 100
MODES = [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND]


@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
@pytest.mark.parametrize("mode", MODES, ids=[m.name.lower() for m in MODES])
def test_window_capture_replay_on_cuda(mode, window_pool):
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=1, device=dev)
    slots = ROWS * L + 1
    f2s = torch.randperm(slots, generator=torch.Generator().manual_seed(2)).to(dev) if window_pool else None
    cb = compile_backend("triton", CompileOptions(max_bs=MAX_BS, capture_sizes=(8, 32), max_context_len=L,
                                                  num_draft_tokens=D, modes=(mode.name.lower(),), sliding_window=W,
                                                  window_pool=window_pool))
    be = cb.instantiate(pool, device=dev, pools={"full_to_swa": f2s} if window_pool else None)
    twin = get_eager("triton")(pool, MAX_BS, draft_tokens=D, sliding_window=W, full_to_swa=f2s)
    per = 1 if mode is ForwardMode.DECODE else D  # write slots per request
    for bs in (32, 8):
        g = capture_on_cuda(be, bs, L, ROWS, mode, per, dev)
        for seed, raw in [(3, bs), (4, bs - 3)]:  # lengths past the window, and padding
            fb = spec_step(raw, L, ROWS, seed, mode, per, slots, D, dev)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            torch.cuda.synchronize()
            full = padded(fb, bs, mode, per)
            ref = twin.init_forward_metadata(full)
            assert "window_kv_indices" in vars(ref) and ("swa_out_cache_loc" in vars(ref)) is window_pool
            assert_metadata_equal(be.forward_metadata, ref, full.seq_lens_cpu)
