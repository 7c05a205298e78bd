"""The integration's plumbing against SGLang's real classes: the mode mapping over SGLang's own enum,
the registry and draft factory SGLang builds backends through, what a misconfigured server or a bad
batch gets, and the metadata object reused per plan."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES
from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
from sglang.srt.model_executor.forward_batch_info import ForwardMode as SGLangMode

from attnmeta.compiler import ForwardMode
from attnmeta.compiler.ir.errors import ContractError, OptionsError
from attnmeta.integrations.sglang import MODES, attnmeta_mode, compile_options, register
from attnmeta.runtime import BatchError
from tests.integrations.sglang_server import ROWS, Server, decode


def test_modes_map_sglang_enum_by_name():
    assert set(MODES) <= {m.name for m in SGLangMode}
    assert attnmeta_mode(SGLangMode.DRAFT_EXTEND_V2) is ForwardMode.DRAFT_EXTEND
    assert attnmeta_mode(SGLangMode.IDLE) is ForwardMode.IDLE
    with pytest.raises(BatchError, match="SGLang forward mode 'DLLM_EXTEND' has no attnmeta counterpart"):
        attnmeta_mode(SGLangMode.DLLM_EXTEND)


def test_register_names_every_kind_in_sglangs_registry_and_draft_factory():
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    names = register()
    kinds = ("triton", "flashinfer", "dsv4", "flashmla", "trtllm_mha", "fa3", "trtllm_mla", "cutedsl_mla")
    assert names == [f"attnmeta_{k}" for k in kinds]
    for n in names:
        assert n in ATTENTION_BACKENDS and n in ATTENTION_BACKEND_CHOICES
    assert getattr(DraftBackendFactory._create_backend, "attnmeta", False)
    assert register() == names  # idempotent: SGLang's spawned workers import the launcher again


def test_the_draft_attention_backend_flag_names_attnmeta_kinds():
    """``--speculative-draft-attention-backend attnmeta_triton`` through SGLang's own parser and resolution:
    accepted, the draft worker keeps it (SGLang's own check of its draft choices, which otherwise falls back to
    flashinfer with a warning), and its draft factory builds attnmeta's drafter from it."""
    from sglang.srt.speculative.draft_worker_common import resolve_draft_worker_attention_backend

    from attnmeta.integrations.sglang.draft import TritonDraftBackend

    s = Server(["--attention-backend", "triton", "--speculative-algorithm", "EAGLE",
                "--speculative-draft-attention-backend", "attnmeta_triton"])
    assert s.args.speculative_draft_attention_backend == "attnmeta_triton"
    with s.active():
        assert resolve_draft_worker_attention_backend(algo_label="EAGLE") == "attnmeta_triton"
        s.draft_runner.draft_attention_backend = "attnmeta_triton"
        from sglang.srt.speculative.draft_utils import DraftBackendFactory

        f = DraftBackendFactory(s.draft_runner, s.spec.speculative_eagle_topk, s.spec.speculative_num_steps)
        assert isinstance(f.create_decode_backend(), TritonDraftBackend)


@pytest.fixture(scope="module")
def server():
    return Server(["--attention-backend", "attnmeta_triton", "--cuda-graph-max-bs-decode", "8"])


def test_compile_options_ahead_of_serving_are_what_the_server_resolves(server):
    """``compile_options`` (for an artifact) gives what the server's backend compiled for itself."""
    with server.active():
        ahead = compile_options(server.args, server.model_config)
    o = server.backend.attnmeta.compiled.options
    for name in ("page_size", "max_context_len", "num_heads", "num_kv_heads", "modes"):
        assert getattr(ahead, name) == getattr(o, name), name
    assert ahead.max_bs >= o.max_bs


def test_misconfigurations_and_bad_batches_are_named(server):
    be = server.backend
    with server.active():
        with pytest.raises(OptionsError, match=f"SGLang captures batches up to {be.attnmeta.max_bs * 2} but the "
                                               f"triton backend was compiled for max_bs={be.attnmeta.max_bs}"):
            be.init_cuda_graph_state(be.attnmeta.max_bs * 2, be.attnmeta.max_bs * 2)
        L = be.attnmeta.compiled.options.max_context_len
        with pytest.raises(BatchError, match="seq_lens"):
            be.init_forward_metadata(decode(server, [1], [L + 1]))
        fb, other = decode(server, [1], [3]), decode(server, [2, 3], [4, 5])
        be.init_forward_metadata_out_graph(fb)
        with pytest.raises(ContractError, match="in_graph got a .* batch of 2 rows"):
            be.init_forward_metadata_in_graph(other)
        be.init_forward_metadata(other)  # and it serves the next batch
        assert be.forward_metadata.kv_indptr[:3].tolist() == [0, 4, 9]


def test_an_mla_model_is_refused_by_name(server):
    from attnmeta.integrations.sglang.registry import factory

    runner = server.runner
    runner.use_mla_backend = True
    try:
        with pytest.raises(OptionsError, match="attnmeta_triton serves multi-head attention models; this model uses "
                                               "MLA"):
            factory("triton")(runner)
    finally:
        runner.use_mla_backend = False


def test_a_batch_larger_than_any_capture_runs_sglangs_own_code(server):
    """SGLang runs a decode batch past its largest captured size eagerly; so does the backend, through
    SGLang's own metadata code, instead of refusing it."""
    be, own = server.backend, server.own("triton")
    n = be.attnmeta.max_bs + 2
    rng = random.Random(3)
    rows, seq = rng.sample(range(1, ROWS), n), [rng.randint(1, 900) for _ in range(n)]
    with server.active():
        be.init_forward_metadata(decode(server, rows, seq))
        own.init_forward_metadata(decode(server, rows, seq))
    assert be.forward_metadata.kv_indptr.tolist() == own.forward_metadata.kv_indptr.tolist()


def test_the_shaped_metadata_is_built_once_per_plan(server):
    """forward_metadata's fields are static views, so SGLang's metadata object is built at a plan's
    first step and reused: the next step of that size gets the same object, reading the new batch."""
    be = server.backend
    with server.active():
        be.init_forward_metadata(decode(server, [1, 2], [3, 7]))
        first = be.forward_metadata
        be.init_forward_metadata(decode(server, [3, 4], [5, 9]))
        assert be.forward_metadata is first and first.kv_indptr[:3].tolist() == [0, 5, 14]
        be.init_forward_metadata(decode(server, [1, 2, 3], [5, 9, 2]))
        assert be.forward_metadata is not first and be.forward_metadata.kv_indptr[:4].tolist() == [0, 5, 14, 16]


def test_in_graph_before_out_graph_is_a_contract_error(server):
    be = server.backend
    with server.active():
        be.init_forward_metadata(decode(server, [1], [3]))
        from tests.integrations.sglang_server import prefill

        be.init_forward_metadata(prefill(server, [2], [0], [5]))  # SGLang's own path: nothing of attnmeta's staged
        with pytest.raises(ContractError, match="in_graph before init_forward_metadata_out_graph"):
            be.init_forward_metadata_in_graph(decode(server, [1], [3]))


def test_a_verify_mask_that_cannot_be_one_is_refused():
    """A float (NaN included) mask, or one shorter than its rows need, is named before anything runs."""
    import torch

    from tests.integrations.sglang_server import verify

    s = Server(["--attention-backend", "attnmeta_triton", "--speculative-algorithm", "EAGLE",
                "--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens",
                "4"])
    with s.active():
        fb = verify(s, [1, 2], [5, 9], random.Random(0))
        fb.spec_info.custom_mask = fb.spec_info.custom_mask.float().masked_fill(torch.rand(1) < 2, float("nan"))
        with pytest.raises(BatchError, match="custom_mask must be bool or uint8 .* got torch.float32"):
            s.backend.init_forward_metadata(fb)
        fb = verify(s, [1, 2], [5, 9], random.Random(0))
        fb.spec_info.custom_mask = fb.spec_info.custom_mask[:-3]
        with pytest.raises(BatchError, match=r"custom_mask has 85 entries; the batch's 2 requests need 88"):
            s.backend.init_forward_metadata(fb)
        s.backend.init_forward_metadata(verify(s, [1, 2], [5, 9], random.Random(0)))  # and a good one is served
