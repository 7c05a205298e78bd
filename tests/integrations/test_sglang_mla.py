"""``attnmeta_flashinfer`` on an MLA model (DeepSeek-V2 shapes) through SGLang's serving flow on a CPU,
against SGLang's own ``FlashInferMLAAttnBackend`` on the same runner and batches.

SGLang resolves the flags and, for an MLA model, its registry's FlashInfer factory builds the MLA class;
so does attnmeta's (``FlashInferMLABackend``, the ``flashinfer_mla`` spec planned by
``FlashInferMLAAdapter``). FlashInfer's MLA wrapper is ``tests/fake_flashinfer.py``'s, put where
SGLang's module imports it on a GPU: it keeps what each plan() is given (the host query indptr, kv
indptr and kv lengths its C++ planner reads) and the buffers the kernel reads. SGLang's own backend
plans through the same stand-in (its full plan() at capture and eagerly, its ``fast_mla_*_plan`` at
replay), with its buffers made on the CPU. Both sides: decode (eager, and captured then replayed
through the runners' views), EAGLE target verify and draft extend V2; every step the planner's
host arrays and the buffers the kernel reads must be equal."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.flashinfer_mla_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

from attnmeta.integrations.sglang.mla import FlashInferMLABackend
from tests import fake_flashinfer
from tests.integrations.sglang_server import ROWS, Runners, Server, decode, decode_view, draft_extend, prefill, verify
from tests.integrations.test_sglang_serving import lens

FLAGS = {
    "plain": ["--attention-backend", "attnmeta_flashinfer"],
    "page64": ["--attention-backend", "attnmeta_flashinfer", "--page-size", "64"],
    "eagle": ["--attention-backend", "attnmeta_flashinfer", "--speculative-algorithm", "EAGLE",
              "--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"],
}


@pytest.fixture(scope="module", params=sorted(FLAGS))
def server(request):
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang_mla(mp)
        yield Server(FLAGS[request.param], seed=5, model="deepseek")


def test_attnmeta_planner_picks_the_planner_and_refuses_what_it_does_not_know():
    from attnmeta.compiler.ir.errors import OptionsError

    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang_mla(mp)
        mp.setenv("ATTNMETA_PLANNER", "host")
        assert not Server(FLAGS["plain"], seed=5, model="deepseek").backend.adapter.device_plans
        mp.setenv("ATTNMETA_PLANNER", "gpu")
        with pytest.raises(OptionsError, match="ATTNMETA_PLANNER='gpu'"):
            Server(FLAGS["plain"], seed=5, model="deepseek")


def same_plan(ours, theirs, n: int, what: str) -> None:
    """What FlashInfer's MLA kernel reads, equal: the last plan each wrapper made (the host query and kv
    indptrs and kv lengths its planner turns into work items, the heads, ranks and causality) and, on
    the live rows, the kv indices (``run`` reads the plan and ``_kv_indices_buf``, no other buffer)."""
    assert ours.plans[-1] == theirs.plans[-1], (what, ours.plans[-1][:3], theirs.plans[-1][:3])
    total = ours.plans[-1][1][n]  # the live rows' keys, from the plan's kv indptr
    assert ours._kv_indices_buf[:total].tolist() == theirs._kv_indices_buf[:total].tolist(), (what, "kv_indices")


def test_sglang_built_its_flashinfer_mla_backend_with_attnmeta_metadata(server):
    be = server.backend
    assert isinstance(be, FlashInferMLABackend)
    o, mc = be.attnmeta.compiled.options, server.model_config
    assert (o.num_heads, o.num_kv_heads, o.page_size) == (mc.num_attention_heads, 1, server.runner.page_size)
    assert be.adapter.workspace is be.workspace_buffer  # FlashInfer's workspace: SGLang's own
    assert (be.adapter.ckv, be.adapter.kpe, be.adapter.sm_scale) == (mc.kv_lora_rank, mc.qk_rope_head_dim, mc.scaling)
    assert be.adapter.device_plans  # the default: the partition planned on the GPU where FlashInfer's allows
    if server.speculative:  # draft extend compiled; draft decode SGLang's own MLA drafter (not compiled yet)
        from sglang.srt.layers.attention.flashinfer_mla_backend import FlashInferMLAMultiStepDraftBackend

        assert isinstance(server.draft_extend, FlashInferMLABackend)
        assert type(server.draft_decode) is FlashInferMLAMultiStepDraftBackend


def test_every_step_plans_what_sglangs_own_mla_backend_plans(server):
    s, rng = server, random.Random(8)
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang_mla(mp)
        own = s.own("flashinfer")
        D = s.spec.speculative_num_draft_tokens if s.speculative else 1
        mine, theirs = Runners(s, s.backend, "mla"), Runners(s, own, "mla")
        with s.active():
            for r in (mine, theirs):
                r.capture(lambda bs: decode(s, [0] * bs, [1] * bs), "decode")
        L = s.model_config.context_len
        for step in range(10):
            n = rng.randint(1, max(s.sizes))
            rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L - D)
            with s.active():
                for r in (mine, theirs):
                    fb = decode(s, rows, seq)
                    if step % 2 == 0:
                        r.replay(fb, "decode", decode_view(fb, r.bucket(n), r.fill, 1))
                    else:
                        r.backend.init_forward_metadata(fb)
            w = s.backend.forward_metadata.decode_wrapper
            assert w is s.backend.attnmeta.forward_metadata.plan
            # SGLang's replay plans the wrapper its graph of that size recorded (its forward_metadata is left
            # at the last capture's)
            own_w = own.decode_cuda_graph_metadata[theirs.bucket(n)] if step % 2 == 0 else \
                own.forward_metadata.decode_wrapper
            same_plan(w, own_w, n, f"decode {step}")
            if not s.speculative:
                continue
            with s.active():
                for b in (s.backend, own):
                    b.init_forward_metadata(verify(s, rows, seq, random.Random(step)))
            same_plan(s.backend.forward_metadata.prefill_wrapper, own.forward_metadata.prefill_wrapper, n,
                      f"verify {step}")
            assert s.backend.forward_metadata.prefill_wrapper.plans[-1][5] is True  # causal over the drafts


def test_draft_extend_plans_what_sglangs_own_mla_backend_plans(server):
    if not server.speculative:
        pytest.skip("no draft extend without a speculative algorithm")
    s, rng = server, random.Random(9)
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang_mla(mp)
        _, own = s.own_drafters("flashinfer")
        D = s.spec.speculative_num_draft_tokens
        for step in range(6):
            n = rng.randint(1, max(s.sizes))
            rows, prefix = rng.sample(range(1, ROWS), n), lens(rng, n, s.model_config.context_len - 2 * D)
            with s.active():
                for b in (s.draft_extend, own):
                    b.init_forward_metadata(draft_extend(s, rows, prefix))
            same_plan(s.draft_extend.forward_metadata.prefill_wrapper, own.forward_metadata.prefill_wrapper, n,
                      f"draft extend {step}")


def test_prefill_between_steps_is_sglangs_own_path(server):
    """A server's first request is a prefill: SGLang's own MLA code plans it (its paged MLA wrapper,
    causal, over the prefix and the new tokens), and the decode after it is attnmeta's again."""
    s = server
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang_mla(mp)
        own = s.own("flashinfer")
        rows, prefix, new = [3, 5], [40, 70], [9, 17]
        with s.active():
            for b in (s.backend, own):
                b.init_forward_metadata(prefill(s, rows, prefix, new))
        ours, theirs = s.backend.forward_metadata, own.forward_metadata
        assert s.backend._ours is None  # not attnmeta's: SGLang's own method ran
        assert ours.prefill_wrapper is s.backend.prefill_wrapper_paged and not ours.use_ragged
        assert ours.prefill_wrapper.plans[-1] == theirs.prefill_wrapper.plans[-1]
        assert ours.prefill_wrapper.plans[-1][5] is True  # causal
        with s.active():
            s.backend.init_forward_metadata(decode(s, rows, [p + n + 1 for p, n in zip(prefix, new, strict=True)]))
        assert s.backend.forward_metadata.decode_wrapper is s.backend.attnmeta.forward_metadata.plan
