"""``attnmeta_flashinfer`` through SGLang's serving flow on a CPU.

SGLang builds its FlashInfer backend (and EAGLE's FlashInfer drafter) from the documented flags; the
FlashInfer library is ``tests/fake_flashinfer.py`` (graph-mode wrappers planning with FlashInfer's
planners transcribed, nothing attended), put where SGLang's module would have imported it on a GPU.
SGLang's own FlashInfer backend allocates on ``"cuda"`` whatever the runner's device, so on a CPU the
oracle for the index stream FlashInfer's kernels read (``kv_indptr``, ``kv_indices``, over the length
each mode reads) is SGLang's own *Triton* backend and drafter on the same runner, which gather the
same stream: decode over ``seq_lens``, verify over ``seq_lens + D``, draft extend over ``seq_lens``,
draft decode per step. The H200 test compares with SGLang's own FlashInfer backend itself
(``tests/gpu/test_sglang_engine.py``)."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch

from attnmeta.integrations.sglang.backend import FlashInferBackend
from attnmeta.integrations.sglang.draft import FlashInferDraftBackend
from tests import fake_flashinfer
from tests.integrations.sglang_server import (
    ROWS,
    Runners,
    Server,
    decode,
    decode_view,
    draft_decode,
    draft_decode_view,
    draft_extend,
    verify,
    without_host_lengths,
)
from tests.integrations.test_sglang_serving import lens, same

FLAGS = {
    "plain": ["--attention-backend", "attnmeta_flashinfer"],
    "tp2": ["--attention-backend", "attnmeta_flashinfer", "--tp-size", "2"],
    "eagle": ["--attention-backend", "attnmeta_flashinfer", "--speculative-algorithm", "EAGLE"],
    "eagle-topk1": ["--attention-backend", "attnmeta_flashinfer", "--speculative-algorithm", "EAGLE",
                    "--speculative-eagle-topk", "1", "--speculative-num-steps", "3",
                    "--speculative-num-draft-tokens", "4"],
}
STREAM = ("kv_indptr", "kv_indices")


@pytest.fixture(scope="module", params=sorted(FLAGS))
def server(request):
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        s = Server(FLAGS[request.param], seed=3)
        yield s


def test_sglang_built_its_flashinfer_backend_with_attnmeta_metadata(server):
    be = server.backend
    assert isinstance(be, FlashInferBackend)
    o = be.attnmeta.compiled.options
    assert (o.num_heads, o.num_kv_heads) == (be.num_head, be.num_kv_head)
    assert be.adapter.workspace is be.workspace_buffer  # FlashInfer's float workspace: SGLang's own
    if server.speculative:
        assert isinstance(server.draft_decode, FlashInferDraftBackend)
        assert isinstance(server.draft_extend, FlashInferBackend)


def test_every_step_reads_sglangs_index_stream(server):
    s, rng = server, random.Random(4)
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        tri = s.own("triton")
        D = s.spec.speculative_num_draft_tokens if s.speculative else 1
        run = Runners(s, s.backend, "fi", D)
        with s.active():
            run.capture(lambda bs: decode(s, [0] * bs, [1] * bs), "decode")
        L = s.model_config.context_len
        for step in range(12):
            n = rng.randint(1, max(s.sizes))
            rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L - D)
            # a third of the steps without host lengths, as SGLang's scheduler hands them to a backend that
            # declares needs_cpu_seq_lens = False (attnmeta_flashinfer, its partition planned on the GPU)
            bare = (lambda fb: without_host_lengths(fb)) if step % 3 == 1 else (lambda fb: fb)
            with s.active():
                replayed = step % 2 == 0
                fb = decode(s, rows, seq)
                if replayed:
                    run.replay(fb, "decode", bare(decode_view(fb, run.bucket(n), run.fill, 1)))
                else:
                    s.backend.init_forward_metadata(bare(fb))
                tri.init_forward_metadata(decode(s, rows, seq))
                m = s.backend.attnmeta.forward_metadata
                assert s.backend.forward_metadata.decode_wrappers == [m.plan]
                same(m, tri.forward_metadata, STREAM, n, f"decode {step}")
                assert m.kv_last_page_len[:n].tolist() == [1] * n
                if not s.speculative:
                    continue
                fb = verify(s, rows, seq, random.Random(step))  # keys: the prefix and the D drafts
                s.backend.init_forward_metadata(bare(fb))
                tri.init_forward_metadata(decode(s, rows, [x + D for x in seq]))
                m = s.backend.attnmeta.forward_metadata
                same(m, tri.forward_metadata, STREAM, n, f"verify {step}")
                assert m.qo_indptr[: n + 1].tolist() == list(range(0, (n + 1) * D, D))
                k = fb.spec_info.custom_mask.numel()
                assert torch.equal(m.custom_mask[:k].bool(), fb.spec_info.custom_mask)
                fb = draft_extend(s, rows, seq)  # keys: the whole sequence, the D slots included
                s.draft_extend.init_forward_metadata(bare(fb))
                tri.init_forward_metadata(decode(s, rows, [x + D for x in seq]))
                same(s.draft_extend.attnmeta.forward_metadata, tri.forward_metadata, STREAM, n, f"extend {step}")


def test_draft_steps_read_sglangs_draft_stream(server):
    if not server.speculative:
        pytest.skip("no drafter without a speculative algorithm")
    s, rng = server, random.Random(6)
    K = s.spec.speculative_eagle_topk
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        own_dd, _ = s.own_drafters("triton")
        mine, own = Runners(s, s.draft_decode, "d", K), Runners(s, own_dd, "d", K)
        with s.active():
            for r in (mine, own):
                r.capture(lambda bs: draft_decode(s, [0] * bs, [1] * bs), "draft")
        for step in range(6):
            n = rng.randint(1, max(s.sizes))
            rows = rng.sample(range(1, ROWS), n)
            seq = lens(rng, n, s.model_config.context_len - K * s.spec.speculative_num_steps)
            with s.active():
                for r in (mine, own):
                    fb = draft_decode(s, rows, seq)
                    bare = without_host_lengths if r is mine and step % 3 == 1 else (lambda fb: fb)
                    if step % 2:
                        r.backend.init_forward_metadata(bare(fb))
                    else:
                        r.replay(fb, "draft", bare(draft_decode_view(fb, r.bucket(n), r.fill)))
            m = s.draft_decode.attnmeta.forward_metadata
            for i, child in enumerate(own_dd.attn_backends):
                want = child.forward_metadata if step % 2 else type(child.forward_metadata)(**{
                    **vars(child.forward_metadata), "kv_indptr": own_dd.kv_indptr[i], "kv_indices":
                    own_dd.cuda_graph_kv_indices[i]})
                got = type("S", (), {"kv_indptr": getattr(m, f"step{i}_kv_indptr"),
                                     "kv_indices": getattr(m, f"step{i}_kv_indices")})
                same(got, want, STREAM, n * K, f"draft {step} step {i}")
                assert s.draft_decode.attn_backends[i].forward_metadata.decode_wrappers == [getattr(m, f"step{i}_plan")]


def test_the_scheduler_need_not_copy_the_lengths_back(server):
    """attnmeta_flashinfer plans FlashInfer's partition on the GPU, so no step it serves reads the host lengths:
    it says so (``needs_cpu_seq_lens``), and SGLang's scheduler, asking every backend of a round, then skips
    the per-round copy of the lengths to the host and its wait for the round before (SGLang's own FlashInfer
    backend keeps it). A batch that still goes to SGLang's own code (here a decode batch on the draft-extend
    backend, which compiled draft extend alone) reaches it with them copied back by the backend (SGLang's
    eager FlashInfer path is recorded, not run: the stand-in's eager wrappers plan nothing)."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend
    from sglang.srt.managers.overlap_utils import decide_needs_cpu_seq_lens

    s = server
    round_ = [b for b in (s.backend, s.draft_decode, s.draft_extend) if b is not None]
    with s.active():
        assert FlashInferAttnBackend.needs_cpu_seq_lens and decide_needs_cpu_seq_lens(round_) is False
    if not s.speculative:
        return
    rows, seq, handed = [3, 5, 9], [7, 40, 12], []
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        mp.setattr(FlashInferAttnBackend, "init_forward_metadata",
                   lambda self, fb: handed.append((fb.seq_lens_cpu.tolist(), fb.seq_lens_sum)))
        with s.active():
            s.draft_extend.init_forward_metadata(without_host_lengths(decode(s, rows, seq)))
    assert s.draft_extend._ours is None and handed == [(seq, sum(seq))]  # SGLang's own code, with host lengths
