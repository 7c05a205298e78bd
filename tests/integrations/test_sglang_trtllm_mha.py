"""attnmeta's ``trtllm_mha`` spec against SGLang's own ``TRTLLMHAAttnBackend`` metadata code on the same
request table and batches.

TRT-LLM's MHA kernels need a Hopper or Blackwell GPU, and SGLang's backend is built for one (its
``__init__`` JIT-compiles CUDA modules); its metadata code is not. The oracle is SGLang's own
capture-and-replay body: ``init_cuda_graph_state`` (its buffers), ``_build_cuda_graph_metadata``
(its metadata object over them) and ``_apply_cuda_graph_metadata`` (its fused graph-metadata
kernel, ``update_trtllm_mha_graph_metadata``, in the Triton interpreter), called on a backend
object made with ``__new__`` and given the attributes its ``__init__`` sets, inside a SGLang
server context started from its flags on a Llama-shaped model. Compared on every step of decode,
target verify and draft extend V2 interleaved: the key lengths, both indptrs, and the pages each
row's keys cover."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.trtllm_mha_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random
from types import SimpleNamespace

import torch
from sglang.srt.layers.attention.trtllm_mha_backend import TRTLLMHAAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode as SGLangMode

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch
from tests.integrations.sglang_server import ROWS, Server
from tests.integrations.test_sglang_serving import lens

D, MAX_BS = 4, 8
MODES = ((ForwardMode.DECODE, SGLangMode.DECODE), (ForwardMode.TARGET_VERIFY, SGLangMode.TARGET_VERIFY),
         (ForwardMode.DRAFT_EXTEND, SGLangMode.DRAFT_EXTEND_V2))


@pytest.fixture(scope="module", params=[16, 64, 1], ids=["page16", "page64", "page1"])
def server(request):
    return Server(["--attention-backend", "triton", "--page-size", str(request.param)], seed=11)


def sglangs(server):
    """SGLang's TRT-LLM MHA backend as its __init__ and init_cuda_graph_state leave what the metadata code
    reads (no sliding window, no encoder-only verify, no unified KV pool)."""
    r, t = server.runner, TRTLLMHAAttnBackend.__new__(TRTLLMHAAttnBackend)
    t.page_size, t.max_context_len, t.device = r.page_size, server.model_config.context_len, "cpu"
    t.max_num_pages = -(-t.max_context_len // t.page_size)
    t.req_to_token, t.kv_index_translator = r.req_to_token_pool.req_to_token, r.kv_index_translator
    t.use_sliding_window_kv_pool, t.expand_encoder_only_verify, t._swa_full_to_swa_mapping = False, False, None
    t._swa_kv_pool = None
    t.speculative_num_draft_tokens = D
    t.init_cuda_graph_state(MAX_BS, MAX_BS * D)
    return t


def test_every_mode_writes_what_sglangs_code_writes(server):
    s, rng = server, random.Random(5)
    r2t = s.runner.req_to_token_pool.req_to_token
    P, L = s.runner.page_size, s.model_config.context_len
    cb = compile_backend("trtllm_mha", CompileOptions(
        max_bs=MAX_BS, capture_sizes=(MAX_BS,), max_context_len=r2t.shape[1], page_size=P, num_draft_tokens=D,
        modes=("decode", "target_verify", "draft_extend")))
    be = cb.instantiate(r2t)
    t = sglangs(s)
    for step in range(12):
        ours_mode, theirs_mode = MODES[step % 3]
        n = rng.randint(1, MAX_BS)
        rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L - D)
        seq_t, rpi = torch.tensor(seq, dtype=torch.int32), torch.tensor(rows, dtype=torch.int64)
        be.init_forward_metadata(ForwardBatch(ours_mode, n, req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                                              seq_lens=seq_t, seq_lens_cpu=seq_t, seq_lens_sum=int(seq_t.sum())))
        m = be.forward_metadata
        spec = None if theirs_mode is SGLangMode.DECODE else \
            SimpleNamespace(ragged_verify_layout=None, num_tokens_per_req=D)
        with s.active():
            t._build_cuda_graph_metadata(n, n * (1 if spec is None else D), theirs_mode, spec, torch.device("cpu"))
            t._apply_cuda_graph_metadata(n, rpi, seq_t.long(), theirs_mode, spec)
        want = t.forward_metadata
        keys = want.cache_seqlens_int32[:n].tolist()
        assert keys == ([x + D for x in seq] if ours_mode is ForwardMode.TARGET_VERIFY else seq)  # the oracle ran
        assert m.cache_seqlens_int32[:n].tolist() == keys, (step, ours_mode)
        assert m.cu_seqlens_k[: n + 1].tolist() == want.cu_seqlens_k[: n + 1].tolist(), (step, ours_mode)
        assert m.cu_seqlens_q[: n + 1].tolist() == want.cu_seqlens_q[: n + 1].tolist(), (step, ours_mode)
        if ours_mode is not ForwardMode.DECODE:
            assert int(m.max_seq_len_q) == want.max_seq_len_q == D
        for i, k in enumerate(keys):
            pages = -(-k // P)
            assert m.page_table[i, :pages].tolist() == want.page_table[i, :pages].tolist(), (step, i)
