"""``attnmeta_flashinfer`` on a sliding-window model, through SGLang's serving flow on a CPU.

SGLang's runner resolves the window W (``sliding_window_size``) and the memory layout (one plain pool, or
``SWAKVPool`` with its full-to-window slot table); SGLang's FlashInfer backend then runs two wrappers, the window
layers' first, the window's over the last min(seq, W + 1) slots of each request (translated into the window pool
where there is one), and writes the window layers' KV at the step's slots translated the same way
(``DecodeMetadata.swa_out_cache_loc``). FlashInfer is ``tests/fake_flashinfer.py``. The oracle for the streams
is SGLang's own *Triton* backend on a runner whose window is W + 1 (its window is min(seq, W) slots: the same
stream FlashInfer reads at W) over the same seeded pools, eager; decode and idle steps of attnmeta's are eager or
replayed through SGLang's decode graph runner."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch

from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.integrations.sglang.backend import FlashInferBackend
from tests import fake_flashinfer
from tests.integrations.sglang_server import ROWS, Runners, Server, decode, decode_view, rows_read
from tests.integrations.test_sglang_triton_window import lens, writing

W = 40
STREAMS = ("kv_indptr", "kv_indices", "window_kv_indptr", "window_kv_indices")  # same names on both sides


def servers(page: int, window_pool: bool) -> tuple[Server, Server]:
    """attnmeta_flashinfer's server at W, and the oracle's (SGLang's own triton at W + 1) on the same seeded pools."""
    flags = ["--attention-backend", "attnmeta_flashinfer", "--page-size", str(page)]
    ours = Server(flags, seed=page, window=W, window_pool=window_pool)
    oracle = Server(["--attention-backend", "triton", "--page-size", str(page)], seed=page, window=W + 1,
                    window_pool=window_pool)
    assert torch.equal(ours.runner.req_to_token_pool.req_to_token, oracle.runner.req_to_token_pool.req_to_token)
    if window_pool:
        assert torch.equal(ours.runner.token_to_kv_pool.full_to_swa_index_mapping,
                           oracle.runner.token_to_kv_pool.full_to_swa_index_mapping)
    return ours, oracle


# each layout at one page size (the window's stream is the same per token at both; CI's time is short)
@pytest.mark.parametrize("page, window_pool", [(1, False), (16, True)], ids=["page1-one-pool", "page16-window-pool"])
def test_window_wrappers_read_sglangs_window_stream(page, window_pool):
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        s, o = servers(page, window_pool)
        be, tri = s.backend, o.own("triton")
        assert isinstance(be, FlashInferBackend) and be.attnmeta.compiled.options.sliding_window == W
        assert be.attnmeta.compiled.options.window_pool is window_pool is be.use_sliding_window_kv_pool
        run = Runners(s, be, "fi")
        with s.active():
            run.capture(lambda bs: decode(s, [0] * bs, [1] * bs), "decode")
        rng, L, seen = random.Random(page + window_pool), s.model_config.context_len, set()
        for step in range(14):
            replayed, idle = step % 3 != 2, step % 7 == 6
            n = rng.randint(1, max(s.sizes))
            rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L)
            loc = torch.tensor(rng.sample(range(1, s.slots), n))
            with s.active():
                fb = decode(s, rows, seq, idle=idle)
                fb = fb if idle else writing(s, fb, loc)
                if idle or replayed:
                    run.replay(fb, "decode", decode_view(fb, run.bucket(max(fb.batch_size, 1)), run.fill, 1))
                else:
                    be.init_forward_metadata(fb)
            seen.add((replayed or idle, idle))
            m, sm = be.attnmeta.forward_metadata, be.forward_metadata
            assert sm.decode_wrappers == [m.plan_window, m.plan]  # SGLang's index of a window layer's wrapper: 0
            if idle:
                continue
            with o.active():
                tri.init_forward_metadata(writing(o, decode(o, rows, seq), loc))
            for f in STREAMS:
                a, b = rows_read(m, tri.forward_metadata, f, n)
                assert torch.equal(a.long(), b.long()), (step, f, a[:8].tolist(), b[:8].tolist())
            if window_pool:
                want = s.runner.token_to_kv_pool.full_to_swa_index_mapping[loc]
                assert torch.equal(sm.swa_out_cache_loc[:n].long(), want.long())
                assert torch.equal(tri.forward_metadata.swa_out_cache_loc[:n].long(), want.long())
            else:
                assert sm.swa_out_cache_loc is None
        assert seen >= {(True, False), (False, False), (True, True)}, seen


def test_the_oracle_tells_a_window_one_token_short():
    """SGLang's own triton at W (one slot fewer per long request than FlashInfer reads at W) differs from
    attnmeta_flashinfer's window stream, while at W + 1 it equals it."""
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        s, o = servers(1, True)
        short = Server(["--attention-backend", "triton"], seed=1, window=W, window_pool=True)
        with s.active():
            s.backend.init_forward_metadata(writing(s, decode(s, [1, 2], [W + 5, 3]), torch.tensor([5, 9])))
        got = []
        for srv in (o, short):
            tri = srv.own("triton")
            with srv.active():
                tri.init_forward_metadata(writing(srv, decode(srv, [1, 2], [W + 5, 3]), torch.tensor([5, 9])))
            got.append(rows_read(s.backend.attnmeta.forward_metadata, tri.forward_metadata, "window_kv_indptr", 2))
        assert torch.equal(got[0][0].long(), got[0][1].long())
        assert not torch.equal(got[1][0].long(), got[1][1].long())


def test_eagle_on_a_window_model_is_refused_with_the_way_out():
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        with pytest.raises(OptionsError, match="sliding-window layers for decode only.*attnmeta_fa3"):
            Server(["--attention-backend", "attnmeta_flashinfer", "--speculative-algorithm", "EAGLE"], seed=1,
                   window=W, window_pool=False)


def test_sglangs_own_flashinfer_verify_window_reads_a_rows_first_slots():
    """Why attnmeta does not copy SGLang 0.5.23's FlashInfer window under EAGLE (docs/SGLANG.md, "Not built yet"):
    its window wrapper plans a target verify over the *first* min(seq, W) + D slots of each request's row (its
    verify path drops the window's start), so a request longer than the window reads its oldest tokens, not its
    last W and its drafts. Recorded here from SGLang's own backend, by hand against the request rows."""
    from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend

    from tests.integrations.sglang_server import verify

    D, w = 4, 8
    with pytest.MonkeyPatch.context() as mp:
        fi = fake_flashinfer.into_sglang(mp)
        plans = []
        mp.setattr(fi.BatchPrefillWithPagedKVCacheWrapper, "begin_forward",
                   lambda self, qo, kv, indices, *a, **k: plans.append((kv.clone(), indices.clone())), raising=False)
        s = Server(["--attention-backend", "attnmeta_triton", "--speculative-algorithm", "EAGLE",
                    "--speculative-eagle-topk", "1", "--speculative-num-steps", "3", "--speculative-num-draft-tokens",
                    str(D), "--speculative-draft-attention-backend", "triton"], seed=3, window=w)
        rows, seq = [1, 2], [20, 3]
        with s.active():
            own = FlashInferAttnBackend(s.runner)
            own.init_forward_metadata(verify(s, rows, seq, random.Random(0)))
    (kv, idx), _full = plans  # the window layers' wrapper first
    r2t = s.runner.req_to_token_pool.req_to_token
    assert kv.tolist() == [0, w + D, w + D + seq[1] + D]  # min(seq, W) + D keys per request
    assert idx[: w + D].tolist() == r2t[1, : w + D].tolist()  # the row's first slots ...
    assert idx[: w + D].tolist() != r2t[1, seq[0] + D - (w + D): seq[0] + D].tolist()  # ... not its last
