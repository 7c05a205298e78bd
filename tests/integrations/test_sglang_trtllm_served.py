"""``attnmeta_trtllm_mha``, ``attnmeta_trtllm_mla`` and ``attnmeta_cutedsl_mla`` built by SGLang's registry
from its flags and served through its graph runners' capture and replay, against SGLang's own
``TRTLLMHAAttnBackend`` / ``TRTLLMMLABackend`` / ``CuteDslMLABackend`` built the same way on the same runner
and batches.

Both sides are SGLang's classes (attnmeta's subclass them), so both need, on a CPU, the same stand-ins for
what their ``__init__`` reaches that a CPU lacks (``fake_flashinfer.into_sglang_trtllm``: FlashInfer's
wrappers, its SM count and trtllm-gen counter size, TRT-LLM MLA's JIT build of a CUDA kernel). Their
metadata code is SGLang's own: its fused graph-metadata kernel and page-table kernel run in the Triton
interpreter. No attention kernel runs (trtllm-gen and CuTe-DSL need Blackwell). Compared on every step of
decode, target verify and draft extend V2 interleaved, eager and replayed: what the kernels read (key
lengths, query and key indptrs, the pages each row's keys cover, the query layout of draft extend)."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.trtllm_mla_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch

from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.integrations.sglang.trtllm import CuteDSLMLABackend, TRTLLMMHABackend, TRTLLMMLABackend
from tests import fake_flashinfer
from tests.integrations.served_pairs import serve, side_by_side
from tests.integrations.sglang_server import ROWS, Server, decode
from tests.integrations.test_sglang_serving import lens

EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1", "--speculative-num-steps", "3",
         "--speculative-num-draft-tokens", "4"]
CASES = {  # kind, model, --page-size, EAGLE, the page size SGLang's rule for the kind sets
    "trtllm_mha-page16-eagle": ("trtllm_mha", "llama", 16, True, 16),
    "trtllm_mha-page1-is-64": ("trtllm_mha", "llama", 1, False, 64),  # TRT-LLM MHA has no 1-token pages
    "trtllm_mla-page64-eagle": ("trtllm_mla", "deepseek", 64, True, 64),
    "cutedsl_mla-page32": ("cutedsl_mla", "deepseek", 32, False, 32),
}
CLASSES = {"trtllm_mha": TRTLLMMHABackend, "trtllm_mla": TRTLLMMLABackend, "cutedsl_mla": CuteDSLMLABackend}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    kind, model, page, eagle, expected_page = CASES[request.param]
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang_trtllm(mp)
        s = Server(["--attention-backend", f"attnmeta_{kind}", "--page-size", str(page), *(EAGLE if eagle else [])],
                   seed=13, model=model)
        s.expected_page = expected_page
        yield kind, s, mp


def test_sglang_built_attnmeta_from_its_flags(case):
    kind, s, _ = case
    assert type(s.backend) is CLASSES[kind]
    o = s.backend.attnmeta.compiled.options
    assert (o.page_size, o.max_bs) == (s.runner.page_size, max(s.sizes))
    assert s.runner.page_size == s.expected_page  # SGLang's page rule of the kind applied to attnmeta's name
    if s.speculative:  # draft extend compiled (cutedsl_mla's is TRT-LLM MLA's, as SGLang's); draft decode SGLang's
        assert isinstance(s.draft_extend, TRTLLMMHABackend if kind == "trtllm_mha" else TRTLLMMLABackend)
        assert not hasattr(s.draft_decode, "attnmeta")


def _meta(be, mla: bool, replayed: bool, bs: int):
    """What the kernels read after a step: TRT-LLM MLA reads ``forward_decode_metadata`` (after a replay,
    SGLang's own is its per-size graph metadata), TRT-LLM MHA ``forward_metadata``."""
    if not mla:
        return be.forward_metadata
    if replayed and not hasattr(be, "attnmeta"):
        return be.decode_cuda_graph_metadata[bs]
    return be.forward_decode_metadata


def _same(ours, theirs, mla: bool, live: int, P: int, replayed: bool, what: str) -> None:
    keys_f = "seq_lens_k" if mla else "cache_seqlens_int32"
    keys = getattr(theirs, keys_f)[:live].tolist()
    assert getattr(ours, keys_f)[:live].tolist() == keys, (what, keys_f)
    table_f = "block_kv_indices" if mla else "page_table"
    a, b = getattr(ours, table_f), getattr(theirs, table_f)
    for i, k in enumerate(keys):
        pages = -(-k // P)
        assert a[i, :pages].tolist() == b[i, :pages].tolist(), (what, table_f, i)
    if not mla:
        for f in ("cu_seqlens_q", "cu_seqlens_k"):
            assert getattr(ours, f)[: live + 1].tolist() == getattr(theirs, f)[: live + 1].tolist(), (what, f)
        assert int(ours.max_seq_len_q) == int(theirs.max_seq_len_q), what
        return
    if replayed:  # eager, SGLang tells the kernel the batch's longest; its graphs (and attnmeta) the context
        assert ours.max_seq_len_k == theirs.max_seq_len_k, what
    if theirs.seq_lens_q is not None:  # draft extend: D query slots per request
        assert ours.cu_seqlens_q[: live + 1].tolist() == theirs.cu_seqlens_q[: live + 1].tolist(), what
        assert ours.seq_lens_q[:live].tolist() == theirs.seq_lens_q[:live].tolist(), what
        assert ours.max_seq_len_q == theirs.max_seq_len_q, what


def test_every_step_equals_sglangs_own_backend(case):
    kind, s, mp = case
    mla, P, rng = kind != "trtllm_mha", s.runner.page_size, random.Random(4)
    modes, pairs, D = side_by_side(s, kind)  # an EAGLE target verifies (its drafter decodes); a plain one decodes
    L = s.model_config.context_len
    for step in range(20):
        mode, replayed = modes[step % len(modes)], step % 4 != 3
        n = rng.randint(1, max(s.sizes))
        rows = rng.sample(range(1, ROWS), n)
        runners = pairs[mode]
        seq = lens(rng, n, L - 2 * D)
        serve(s, runners, mode, rows, seq, step, replayed, bare=step % 5 == 4)
        bs = runners[0].bucket(n)
        _same(_meta(runners[0].backend, mla, replayed, bs), _meta(runners[1].backend, mla, replayed, bs), mla, n,
              P, replayed, f"{kind} {mode} step {step} replayed={replayed}")


def test_a_model_of_the_other_family_is_refused_by_name():
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang_trtllm(mp)
        with pytest.raises(OptionsError, match="attnmeta_trtllm_mla serves MLA models"):
            Server(["--attention-backend", "attnmeta_trtllm_mla", "--page-size", "64"], model="llama")
        with pytest.raises(OptionsError, match="attnmeta_trtllm_mha serves multi-head attention models"):
            Server(["--attention-backend", "attnmeta_trtllm_mha", "--page-size", "64"], model="deepseek")


def test_the_comparison_can_fail(case):
    """A page table one page off, and a key length one off, are caught."""
    kind, s, _ = case
    mla = kind != "trtllm_mha"
    with s.active():
        s.backend.init_forward_metadata(decode(s, [3, 5], [70, 130]))
    m = _meta(s.backend, mla, False, 2)
    table, keys = ("block_kv_indices", "seq_lens_k") if mla else ("page_table", "cache_seqlens_int32")
    twin = type(m)(**{**vars(m), table: getattr(m, table).clone(), keys: getattr(m, keys).clone()})
    getattr(twin, table)[1, 1] += 1
    with pytest.raises(AssertionError):
        _same(m, twin, mla, 2, s.runner.page_size, False, "page")
    getattr(twin, table)[1, 1] -= 1
    _same(m, twin, mla, 2, s.runner.page_size, False, "restored")
    getattr(twin, keys)[0] += 1
    with pytest.raises(AssertionError):
        _same(m, twin, mla, 2, s.runner.page_size, False, "key")
    assert torch.equal(getattr(m, keys), torch.tensor([70, 130], dtype=torch.int32))
