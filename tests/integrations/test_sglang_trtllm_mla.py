"""attnmeta's ``trtllm_mla`` spec (and ``cutedsl_mla``, the same spec) against SGLang's own
``TRTLLMMLABackend`` and ``CuteDslMLABackend`` metadata code on the same request table and batches.

TRT-LLM's MLA kernels run on Blackwell only, and SGLang's backend is built for one; its metadata code
is not. The oracle is SGLang's own capture-and-replay body (``_init_cuda_graph_metadata``, then
``_apply_cuda_graph_metadata``: its page-table kernel ``create_flashmla_kv_indices_triton`` in the
Triton interpreter, its key lengths and draft-extend query layout), called on a backend object made
with ``__new__`` and given the attributes its ``__init__`` and ``init_cuda_graph_state`` set, inside
a SGLang server context started from its flags on a DeepSeek-V2-shaped model. Compared on every
step: the pages each row's keys cover, the int32 key lengths, the draft-extend query indptr and
lengths, and the table's padded width."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.trtllm_mla_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch
from sglang.srt.layers.attention.cutedsl_mla_backend import CuteDslMLABackend
from sglang.srt.layers.attention.trtllm_mla_backend import TRTLLMMLABackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode as SGLangMode

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch
from tests import fake_flashinfer
from tests.integrations.sglang_server import ROWS, Server
from tests.integrations.test_sglang_serving import lens

D, MAX_BS = 4, 8
MODES = ((ForwardMode.DECODE, SGLangMode.DECODE), (ForwardMode.TARGET_VERIFY, SGLangMode.TARGET_VERIFY),
         (ForwardMode.DRAFT_EXTEND, SGLangMode.DRAFT_EXTEND_V2))


@pytest.fixture(scope="module", params=[64, 32], ids=["page64", "page32"])
def server(request):
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang_mla(mp)
        yield Server(["--attention-backend", "flashinfer", "--page-size", str(request.param)], seed=7,
                     model="deepseek")


def sglangs(server, cls):
    """SGLang's backend ``cls`` as its __init__ and init_cuda_graph_state leave what the metadata code
    reads."""
    r = server.runner
    t = cls.__new__(cls)
    t.page_size, t.max_context_len, t.num_draft_tokens = r.page_size, server.model_config.context_len, D
    t.req_to_token, t.kv_index_translator, t.device = r.req_to_token_pool.req_to_token, r.kv_index_translator, "cpu"
    t.decode_cuda_graph_metadata = {}
    t.decode_cuda_graph_kv_indices = torch.full((MAX_BS, t._calc_padded_blocks(t.max_context_len)), -1,
                                                dtype=torch.int32)
    return t


@pytest.mark.parametrize(("name", "cls"), [("trtllm_mla", TRTLLMMLABackend), ("cutedsl_mla", CuteDslMLABackend)])
def test_every_mode_writes_what_sglangs_code_writes(server, name, cls):
    s, rng = server, random.Random(3)
    r2t = s.runner.req_to_token_pool.req_to_token
    P = s.runner.page_size
    cb = compile_backend(name, CompileOptions(
        max_bs=MAX_BS, capture_sizes=(MAX_BS,), max_context_len=r2t.shape[1], page_size=P,
        num_draft_tokens=D, modes=("decode", "target_verify", "draft_extend")))
    be = cb.instantiate(r2t)
    t = sglangs(s, cls)
    for step in range(12):
        ours_mode, theirs_mode = MODES[step % 3]
        n = rng.randint(1, MAX_BS)
        rows = rng.sample(range(1, ROWS), n)
        seq = lens(rng, n, s.model_config.context_len - D)
        seq_t, rpi = torch.tensor(seq, dtype=torch.int32), torch.tensor(rows, dtype=torch.int64)
        be.init_forward_metadata(ForwardBatch(ours_mode, n, req_pool_indices=rpi, req_pool_indices_cpu=rpi,
                                              seq_lens=seq_t, seq_lens_cpu=seq_t, seq_lens_sum=int(seq_t.sum())))
        m = be.forward_metadata
        with s.active():
            t.decode_cuda_graph_metadata.clear()
            t._init_cuda_graph_metadata(n, n * D, theirs_mode, seq_t.long(), torch.device("cpu"))
            t._apply_cuda_graph_metadata(None, n, rpi, seq_t.long(), theirs_mode)
        want = t.decode_cuda_graph_metadata[n]
        keys = want.seq_lens_k[:n].tolist()
        assert m.seq_lens_k[:n].tolist() == keys, (step, ours_mode)
        assert keys == [x + D for x in seq] if ours_mode is ForwardMode.TARGET_VERIFY else keys == seq
        assert m.block_kv_indices.shape[1] >= want.block_kv_indices.shape[1]  # covers SGLang's padded width
        for i, k in enumerate(keys):
            pages = -(-k // P)
            assert m.block_kv_indices[i, :pages].tolist() == want.block_kv_indices[i, :pages].tolist(), (step, i)
        if ours_mode is ForwardMode.DRAFT_EXTEND:
            assert m.cu_seqlens_q[: n + 1].tolist() == want.cu_seqlens_q[: n + 1].tolist()
            assert m.seq_lens_q[:n].tolist() == want.seq_lens_q[:n].tolist()
