"""Generated staging with fields the engine hands on the device (DSV4's ``out_cache_loc``): the input's feed
(where the graph's check reads it) gets the live entries whether the source is exactly the live count or longer,
the rows past them the sentinel, the same as the general path writes."""

import random

import pytest
import torch

from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir.ops_guard import SENTINEL
from attnmeta.runtime import ReplayView
from tests.batches import make_pool
from tests.runtime.test_stagegen import MAX_BS, ROWS, D, L, batch

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY])
def test_device_fields_are_staged_like_the_general_path(mode):
    dev = torch.device("cuda")
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(4, MAX_BS), max_context_len=L, num_draft_tokens=D,
                          modes=("decode", "target_verify"))
    be = compile_backend("dsv4", opts).instantiate(make_pool(ROWS, L, 1).to(dev),
                                                   pools={"full_to_swa": swa_table(ROWS * L + 1, "cpu").to(dev)})
    rng, per = random.Random(5), D if mode is ForwardMode.TARGET_VERIFY else 1
    for step, (raw, shape) in enumerate([(8, "exact"), (3, "exact"), (3, "longer"), (7, "exact"), (2, "longer")]):
        bs = 4 if raw <= 4 else MAX_BS
        st = be.bound(mode, bs).stager
        (i, slot), = [(i, s) for i, s in enumerate(st.slots) if s.source == "out_cache_loc"]
        fb = batch(mode, raw, rng)
        loc = fb.out_cache_loc.to(dev)
        fb.out_cache_loc = loc if shape == "exact" else torch.cat([loc, loc[:5] * 0 + 7])
        view = ReplayView.of(fb, bs)
        st.fast(view, bs, raw)
        torch.cuda.synchronize()
        got = slot.feed[: bs * per].cpu()
        st.stage(view, bs, raw)
        torch.cuda.synchronize()
        assert torch.equal(got, slot.feed[: bs * per].cpu()), (step, shape)
        assert torch.equal(got[: raw * per], loc.cpu()), (step, shape)
        assert (got[raw * per:] == SENTINEL).all(), (step, shape)
