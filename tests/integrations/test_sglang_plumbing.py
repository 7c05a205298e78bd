"""The integration's plumbing against SGLang's real classes: mode mapping over SGLang's own enum,
compile options from ServerArgs' field names, the registry and factory SGLang builds backends
through, and the errors a misconfigured server gets."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random
from types import SimpleNamespace

import msgspec
import torch
from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.model_executor.forward_batch_info import ForwardMode as SGLangMode
from sglang.srt.server_args import ServerArgs

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.compiler.ir.errors import ContractError, OptionsError
from attnmeta.integrations.sglang import MODES, attnmeta_mode, compile_options, register
from attnmeta.integrations.sglang.backend import KINDS
from attnmeta.runtime import BatchError
from tests.integrations.sglang_world import HEAD_DIM, HEADS, KV_HEADS, L, make_pool, sglang_batch


def test_modes_map_sglang_enum_by_name():
    assert set(MODES) <= {m.name for m in SGLangMode}
    assert attnmeta_mode(SGLangMode.DRAFT_EXTEND_V2) is ForwardMode.DRAFT_EXTEND
    assert attnmeta_mode(SGLangMode.IDLE) is ForwardMode.IDLE
    with pytest.raises(BatchError, match="SGLang forward mode 'DLLM_EXTEND' has no attnmeta counterpart"):
        attnmeta_mode(SGLangMode.DLLM_EXTEND)


def server_args(**kw):
    names = {f.name for f in msgspec.structs.fields(ServerArgs)}
    assert set(kw) <= names, f"not ServerArgs fields: {set(kw) - names}"  # the names SGLang really uses
    return SimpleNamespace(**kw)


class ModelConfig:
    num_attention_heads, num_key_value_heads, head_dim, context_len = 32, 8, 128, 8192

    def get_num_kv_heads(self, tp):
        return max(self.num_key_value_heads // tp, 1)


def test_compile_options_follow_server_args():
    args = server_args(cuda_graph_bs_decode=[1, 2, 4, 8, 16], page_size=16, tp_size=2, context_length=None,
                       speculative_algorithm="EAGLE", speculative_num_draft_tokens=5, speculative_eagle_topk=1,
                       speculative_num_steps=4)
    o = compile_options(args, ModelConfig())
    assert (o.max_bs, o.capture_sizes, o.page_size, o.max_context_len) == (16, (1, 2, 4, 8, 16), 16, 8192)
    assert set(o.modes) == {ForwardMode.DECODE, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND}
    assert (o.num_draft_tokens, o.topk, o.num_steps, o.num_heads, o.num_kv_heads) == (5, 1, 4, 16, 4)
    plain = compile_options(server_args(cuda_graph_max_bs_decode=64, context_length=2048))
    assert (plain.max_bs, plain.max_context_len, set(plain.modes)) == (64, 2048, {ForwardMode.DECODE,
                                                                                   ForwardMode.IDLE})
    with pytest.raises(OptionsError, match="the context length is unknown"):
        compile_options(server_args(page_size=1))


def test_registry_builds_backends_from_a_model_runner():
    names = register()
    assert names == ["attnmeta_triton", "attnmeta_flashinfer", "attnmeta_flashattention", "attnmeta_dsv4"]
    for n in names:
        assert n in ATTENTION_BACKENDS and n in ATTENTION_BACKEND_CHOICES
    pool = make_pool(seed=1)
    runner = SimpleNamespace(server_args=server_args(cuda_graph_bs_decode=[1, 4], context_length=L, page_size=1),
                             model_config=SimpleNamespace(num_attention_heads=HEADS, head_dim=HEAD_DIM, context_len=L,
                                                          get_num_kv_heads=lambda tp: KV_HEADS),
                             tp_size=1, device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=pool))
    be = ATTENTION_BACKENDS["attnmeta_triton"](runner)
    assert isinstance(be, KINDS["triton"]) and be.options.capture_sizes == (1, 4) and be.options.num_heads == HEADS
    be.init_forward_metadata(sglang_batch("decode", [5, 300], random.Random(0)))
    assert be.forward_metadata.kv_indptr[:3].tolist() == [0, 5, 305]


def test_misconfigurations_are_named():
    c = compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L,
                                                 num_heads=HEADS, num_kv_heads=KV_HEADS))
    kw = dict(num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    with pytest.raises(OptionsError, match="FlashInferBackend serves attnmeta's 'flashinfer' spec; got a backend "
                                           "compiled from 'triton'"):
        KINDS["flashinfer"](c, make_pool(), **kw)
    be = KINDS["triton"](c, make_pool(), **kw)
    with pytest.raises(OptionsError, match="SGLang captures batches up to 8 but the backend was compiled for max_bs=4"):
        be.init_cuda_graph_state(8, 8)
    rng = random.Random(1)
    with pytest.raises(BatchError, match="compiled for modes \\['decode'\\], not target_verify"):
        be.init_forward_metadata(sglang_batch("target_verify", [3], rng))
    with pytest.raises(BatchError, match="exceeds max_bs=4"):
        be.init_forward_metadata(sglang_batch("decode", [3] * 5, rng))
    with pytest.raises(BatchError, match=f"exceeds {L}"):
        be.init_forward_metadata(sglang_batch("decode", [L + 1], rng))
    fb, other = sglang_batch("decode", [3], rng), sglang_batch("decode", [4], rng)
    be.init_forward_metadata_out_graph(fb)
    with pytest.raises(ContractError, match="in_graph got another batch"):
        be.init_forward_metadata_in_graph(other)
    be.init_forward_metadata(other)  # and the backend serves the next batch
    assert be.forward_metadata.kv_indptr[:2].tolist() == [0, 4]
    assert isinstance(be.forward_metadata.num_kv_splits, torch.Tensor)


def test_an_artifact_must_match_the_server(tmp_path, monkeypatch):
    """ATTNMETA_ARTIFACT: the factory loads a compiled artifact, and refuses one compiled for another
    server (here another page size and context), naming each difference."""
    from attnmeta.integrations.sglang.registry import factory

    pool = make_pool(seed=2)
    mc = SimpleNamespace(num_attention_heads=HEADS, head_dim=HEAD_DIM, context_len=L,
                         get_num_kv_heads=lambda tp: KV_HEADS)
    runner = SimpleNamespace(server_args=server_args(cuda_graph_bs_decode=[1, 4], context_length=L, page_size=1),
                             model_config=mc, tp_size=1, device="cpu",
                             req_to_token_pool=SimpleNamespace(req_to_token=pool))
    good, bad = tmp_path / "good.attnmeta", tmp_path / "bad.attnmeta"
    compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(1, 4), max_context_len=L, num_heads=HEADS,
                                             num_kv_heads=KV_HEADS, sm_count=132)).save(str(good))
    compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(1, 4), max_context_len=L // 2, page_size=16,
                                             num_heads=HEADS, num_kv_heads=KV_HEADS)).save(str(bad))
    monkeypatch.setenv("ATTNMETA_ARTIFACT", str(good))
    be = factory("triton")(runner)
    be.init_forward_metadata(sglang_batch("decode", [5, 300], random.Random(0)))
    assert be.forward_metadata.kv_indptr[:3].tolist() == [0, 5, 305]
    monkeypatch.setenv("ATTNMETA_ARTIFACT", str(bad))
    with pytest.raises(OptionsError, match=f"page_size: artifact 16, server 1; max_context_len: artifact {L // 2}, "
                                           f"server {L}"):
        factory("triton")(runner)


def test_the_shaped_metadata_is_built_once_per_plan():
    """forward_metadata's fields are static views, so the SGLang-shaped object is built at a plan's
    first step and reused: the next step of that size gets the same object, reading the new batch."""
    c = compile_backend("triton", CompileOptions(max_bs=4, capture_sizes=(4,), max_context_len=L,
                                                 num_heads=HEADS, num_kv_heads=KV_HEADS))
    be = KINDS["triton"](c, make_pool(), num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    rng = random.Random(3)
    be.init_forward_metadata(sglang_batch("decode", [3, 7], rng))
    first = be.forward_metadata
    be.init_forward_metadata(sglang_batch("decode", [5, 9], rng))
    assert be.forward_metadata is first and first.kv_indptr[:3].tolist() == [0, 5, 14]
    be.init_forward_metadata(sglang_batch("decode", [5, 9, 2], rng))
    assert be.forward_metadata is not first and be.forward_metadata.kv_indptr[:4].tolist() == [0, 5, 14, 16]
