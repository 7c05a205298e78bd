"""The replayed step's safety on the GPU, as the holes were found: two backends on one set of an engine's buffers
(SGLang's own and attnmeta's, graphs in pools of their own, markers allocated after the captures) read only
memory their plans own; a graph replayed over another size's staging is reported by the next step; a host mirror
handed on the device is refused by name in the call. ``tools/shared_buffers.py`` is the first's harness (run it
under compute-sanitizer memcheck too: docs/RELIABILITY.md)."""

import pytest
import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import BatchError, ForwardBatch, ReplayView
from tests.batches import capture_graph, make_pool

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
D = ForwardMode.DECODE


@pytest.mark.parametrize("kind", ["triton", "flashinfer"])
@pytest.mark.parametrize("page", [1, 16])
def test_two_backends_on_one_set_of_engine_buffers_read_only_what_their_plans_own(kind, page):
    pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="needs SGLang's Python code")
    from tools.shared_buffers import run

    res = run(kind, page, steps=40, device="cuda", do_trace=False)
    assert res["error"] is None, res
    assert res["steps"] == 40 * 4 * 2 * 2


def test_a_graph_replayed_over_another_sizes_staging_is_reported_by_the_next_step():
    dev = torch.device("cuda")
    be = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=64)).instantiate(
        make_pool(12, 64, 3).to(dev), device=dev)
    rows, seq = torch.tensor([4, 5, 6, 7], device=dev), torch.full((4,), 9, dtype=torch.int64, device=dev)
    cap = ReplayView(4, D, D, 4, req_pool_indices=rows, seq_lens=seq, seq_lens_cpu=seq.cpu())
    g = capture_graph(be, cap, dev)
    small = ReplayView(2, D, D, 2, req_pool_indices=torch.tensor([1, 2], device=dev),
                       seq_lens=torch.tensor([3, 5], device=dev), seq_lens_cpu=torch.tensor([3, 5]))
    be.init_forward_metadata_out_graph(small)
    g.replay()
    torch.cuda.synchronize()
    assert be.bound(D, 4).meta.kv_indptr.tolist() == [0, 3, 8, 9, 10]  # the staging's own rows, padded
    with pytest.raises(BatchError, match="replayed the graph of 4 rows over a batch staged for 2 rows"):
        be.init_forward_metadata_out_graph(small)


def test_a_host_mirror_on_the_device_is_refused_in_the_call():
    dev = torch.device("cuda")
    be = compile_backend("flashinfer", CompileOptions(max_bs=4, capture_sizes=(2, 4), max_context_len=16)).instantiate(
        make_pool(12, 16, 3).to(dev), device=dev)
    seq = torch.tensor([3, 25], device=dev)
    fb = ForwardBatch(forward_mode=D, batch_size=2, req_pool_indices=torch.tensor([1, 2], device=dev), seq_lens=seq,
                      seq_lens_cpu=seq)
    with pytest.raises(BatchError, match="seq_lens_cpu is on cuda:0: it is the host mirror of seq_lens"):
        be.init_forward_metadata(fb)
