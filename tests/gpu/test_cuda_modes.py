"""Real CUDA graphs for the metadata of DSV4 decode and of every backend's
TARGET_VERIFY: captured short, replayed long and padded, == the eager twin."""

import pytest
import torch

from attnmeta.backends import get_eager
from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.backends.dsv4.spec import DSV4Options
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ReplayView
from tests.batches import capture_on_cuda, make_batch, make_pool, spec_step
from tests.oracles import assert_metadata_equal, padded

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
L, ROWS, MAX_BS, D = 1024, 40, 32, 4
V, DEC, E = ForwardMode.TARGET_VERIFY, ForwardMode.DECODE, ForwardMode.DRAFT_EXTEND


BOTH = (4, 128)  # DSV4's compression ratios; a pool with one of them gets only its fields
CASES = [("dsv4", DEC, BOTH), ("dsv4", V, BOTH), ("dsv4", E, BOTH), ("dsv4", DEC, (128,)), ("dsv4", V, (4,)),
         ("flashinfer", V, BOTH), ("triton", V, BOTH), ("flashattention", V, BOTH), ("flashinfer", E, BOTH),
         ("triton", E, BOTH), ("flashattention", E, BOTH)]


@pytest.mark.parametrize("name,mode,ratios", CASES)
def test_capture_replay_on_cuda(name, mode, ratios):
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=1, device=dev)
    cb = compile_backend(name, CompileOptions(max_bs=MAX_BS, capture_sizes=(8, 32), max_context_len=L,
                                              num_draft_tokens=D, modes=(mode.name.lower(),),
                                              backend=DSV4Options(compress_ratios=ratios) if name == "dsv4" else None))
    extra = {"full_to_swa": swa_table(ROWS * L + 1, dev)} if name == "dsv4" else {}
    be = cb.instantiate(pool, device=dev, pools=extra)
    cls = get_eager(name)
    twin = (cls(pool, MAX_BS, extra["full_to_swa"], draft_tokens=D, speculative=mode is not DEC, ratios=ratios)
            if name == "dsv4" else cls(pool, MAX_BS, draft_tokens=D))  # verify/draft extend: the speculative rings
    per = D if name == "dsv4" and mode is not DEC else 1  # DSV4 verify/draft extend: a KV slot per token
    for bs in (32, 8):
        g = capture_on_cuda(be, bs, L, ROWS, mode, per, dev)
        for seed, raw in [(3, bs), (4, bs - 3)]:
            fb = spec_step(raw, L, ROWS, seed, mode, per, ROWS * L, D, dev)
            be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
            g.replay()
            torch.cuda.synchronize()
            full = padded(fb, bs, mode, per)
            lens = full.seq_lens_cpu + (D if name == "flashattention" and mode is V else 0)  # verify: + drafts
            if per > 1 and mode is V:  # per-token causal lengths
                lens = (full.seq_lens_cpu[:, None] + 1 + torch.arange(D)).reshape(-1)
            elif per > 1:  # draft extend (SGLang's V2 layout): the last D positions, seq - D + 1 .. seq
                lens = (full.seq_lens_cpu[:, None] - D + 1 + torch.arange(D)).reshape(-1)
            ref = twin.init_forward_metadata(full)
            assert_metadata_equal(be.forward_metadata, ref, lens, 256 if name == "dsv4" else 1)
            if name == "dsv4":  # nothing of a ratio the pool lacks, everything of the others
                assert set(vars(be.forward_metadata)) == set(vars(ref))


@pytest.mark.parametrize("inner", ["flashinfer", "triton"])
@pytest.mark.parametrize(("topk", "page"), [(1, 1), (4, 1), (3, 16)])
def test_multistep_on_cuda(inner, topk, page):
    """S draft steps x topk branches (the branch layout on P 1 and P 16 pools), compiled Triton."""
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=2, device=dev)
    name = f"multistep_{inner}"
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(16,), max_context_len=L, num_steps=3, topk=topk,
                          page_size=page)
    cb = compile_backend(name, opts)
    be = cb.instantiate(pool, device=dev)
    twin = get_eager(name)(pool, MAX_BS, num_steps=3, topk=topk, page_size=page)
    g = capture_on_cuda(be, 16, L, ROWS, DEC, 1, dev)
    for seed, raw in [(5, 16), (6, 11)]:
        fb = make_batch(raw, L, ROWS, seed=seed, device=dev, max_len=L - cb.spec.headroom(DEC, opts))
        be.init_forward_metadata_out_graph(ReplayView.of(fb, 16))
        g.replay()
        torch.cuda.synchronize()
        full = padded(fb, 16)
        assert_metadata_equal(be.forward_metadata, twin.init_forward_metadata(full), full.seq_lens_cpu)
