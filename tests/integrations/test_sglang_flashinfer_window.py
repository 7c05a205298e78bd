"""``attnmeta_flashinfer`` on a sliding-window model, through SGLang's serving flow on a CPU.

SGLang's runner resolves the window W (``sliding_window_size``) and the memory layout (one plain pool, or
``SWAKVPool`` with its full-to-window slot table); SGLang's FlashInfer backend then runs two wrappers, the window
layers' first, the window's over the last min(seq, W + 1) slots of each request (translated into the window pool
where there is one), and writes the window layers' KV at the step's slots translated the same way
(``DecodeMetadata.swa_out_cache_loc``). FlashInfer is ``tests/fake_flashinfer.py``. The oracle for the streams
is SGLang's own *Triton* backend on a runner whose window is W + 1 (its window is min(seq, W) slots: the same
stream FlashInfer reads at W) over the same seeded pools, eager; decode and idle steps of attnmeta's are eager or
replayed through SGLang's decode graph runner. Under EAGLE (topk 1), verify and draft extend plan the window
layers' prefill wrapper the same way over the last window slots and the step's queries, checked against SGLang's
own triton's verify window and the request rows; what it cannot serve is refused with the way out."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import itertools
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


EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3"]


def eagle_servers(page: int, window_pool: bool) -> tuple[Server, Server]:
    """attnmeta_flashinfer verifying (topk 1; attnmeta's triton drafter, as the drafter refusal says), and the
    oracle: SGLang's own triton at W verifying on the same seeded pools (its window: the prefix's last min(seq, W))."""
    flags = [*EAGLE, "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--page-size", str(page)]
    ours = Server(["--attention-backend", "attnmeta_flashinfer", *flags, "--speculative-draft-attention-backend",
                   "attnmeta_triton"], seed=page, window=W, window_pool=window_pool)
    oracle = Server(["--attention-backend", "triton", *flags, "--speculative-draft-attention-backend", "triton"],
                    seed=page, window=W, window_pool=window_pool)
    assert torch.equal(ours.runner.req_to_token_pool.req_to_token, oracle.runner.req_to_token_pool.req_to_token)
    return ours, oracle


@pytest.mark.parametrize("page, window_pool", [(1, False), (16, True)], ids=["page1-one-pool", "page16-window-pool"])
def test_eagle_verify_and_draft_extend_window_wrappers(page, window_pool):
    """EAGLE (topk 1) on a window model: attnmeta_flashinfer's verify plans the window layers' wrapper over each
    request's last min(seq, W) cached slots (SGLang's own triton's verify window, the oracle) and then its D drafts
    (the request's row), planned causal with FlashInfer's window_left W and no tree mask: FlashInfer then counts
    each draft's window back from its own place (the chain's drafts are the list's last D); with a window pool, the
    drafts' write slots translated. Draft extend (attnmeta_flashinfer built on the draft runner, as SGLang's factory
    builds an extend backend) reads the last min(seq, W + D) slots of its rows, whose last D are its queries. Eager
    and replayed through SGLang's verify and draft-extend graph runners."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from tests.integrations.served_pairs import drive
    from tests.integrations.sglang_server import draft_extend, verify

    with pytest.MonkeyPatch.context() as mp:
        fi = fake_flashinfer.into_sglang(mp)
        s, o = eagle_servers(page, window_pool)
        D, r2t = s.spec.speculative_num_draft_tokens, s.runner.req_to_token_pool.req_to_token
        f2s = s.runner.token_to_kv_pool.full_to_swa_index_mapping if window_pool else None
        with s.active():
            ext = ATTENTION_BACKENDS["attnmeta_flashinfer"](s.draft_runner)
        runners = {"verify": Runners(s, s.backend, "fi", D), "extend": Runners(s, ext, "fe", D)}
        makers = {"verify": lambda rows, seq, seed: verify(s, rows, seq, random.Random(seed)),
                  "extend": lambda rows, seq, seed: draft_extend(s, rows, seq)}
        with s.active():
            for key, r in runners.items():
                r.capture(lambda bs, r=r, key=key: makers[key]([0] * bs, [r.fill if key == "verify" else 1] * bs,
                                                               bs), key)
        tri = o.own("triton")
        rng, L, seen = random.Random(page + 2 * window_pool), s.model_config.context_len, set()
        for step in range(12):
            key, replayed = ("verify", "extend")[step % 2], step % 4 < 2
            n = rng.randint(1, max(s.sizes))
            rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L - D)
            loc = torch.tensor(rng.sample(range(1, s.slots), n * D))
            r = runners[key]
            with s.active():
                fb = writing(s, makers[key](rows, seq, step), loc)
                drive(r, fb, key, n, replayed)
            seen.add((key, replayed))
            m, sm = r.backend.attnmeta.forward_metadata, r.backend.forward_metadata
            assert sm.prefill_wrappers == [m.plan_window, m.plan]  # SGLang's index of a window layer's wrapper: 0
            assert (m.plan_window._window_left, m.plan_window._causal, m.plan_window._custom_mask_buf) == (W, True,
                                                                                                          None)
            assert getattr(m.plan, "_window_left", -1) == -1
            if key == "verify":
                with o.active():
                    tri.init_forward_metadata(writing(o, verify(o, rows, seq, random.Random(step)), loc))
                t = tri.forward_metadata
                cut = t.window_kv_indptr[: n + 1].tolist()
                drafts = [r2t[row, q: q + D].long() for row, q in zip(rows, seq, strict=True)]
                want = torch.cat([x for i in range(n) for x in (t.window_kv_indices[cut[i]: cut[i + 1]].long(),
                                                                 f2s[drafts[i]] if window_pool else drafts[i])])
                keys = [cut[i + 1] - cut[i] + D for i in range(n)]
            else:  # the sequence (seq counts the D slots) ends in its queries: its last min(seq, W + D) slots
                ends = [q + D for q in seq]
                keys = [min(e, W + D) for e in ends]
                want = torch.cat([r2t[row, e - k: e].long() for row, e, k in zip(rows, ends, keys, strict=True)])
                want = f2s[want] if window_pool else want
            assert m.window_kv_indptr[1: n + 1].tolist() == list(itertools.accumulate(keys)), (key, step)
            assert torch.equal(m.window_kv_indices[: sum(keys)].long(), want), (key, step, replayed)
            if window_pool:
                assert torch.equal(sm.swa_out_cache_loc[: n * D].long(), f2s[loc].long()), (key, step)
            else:
                assert sm.swa_out_cache_loc is None
        assert seen == {(k, r) for k in runners for r in (True, False)}
        assert fi is not None


def test_what_eagle_on_a_flashinfer_window_model_cannot_have_is_refused_with_the_way_out():
    """SGLang's FlashInfer drafter has no window form (SGLang 0.5.23's own asserts one wrapper per step), so the
    draft is named the way out; a tree verify (topk > 1) with FlashInfer's host planner names the device planner
    and topk 1."""
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        with pytest.raises(OptionsError, match="no sliding-window form.*--speculative-draft-attention-backend "
                                               "attnmeta_triton"):
            Server(["--attention-backend", "attnmeta_flashinfer", *EAGLE, "--speculative-eagle-topk", "1",
                    "--speculative-num-draft-tokens", "4"], seed=1, window=W, window_pool=False)
        mp.setenv("ATTNMETA_PLANNER", "host")  # a tree verify's window streams have lengths only the GPU knows
        with pytest.raises(OptionsError, match="plan_on_device=True.*ATTNMETA_PLANNER unset.*topk 1"):
            Server(["--attention-backend", "attnmeta_flashinfer", *EAGLE, "--speculative-eagle-topk", "4",
                    "--speculative-num-draft-tokens", "6", "--speculative-draft-attention-backend", "triton"],
                   seed=1, window=W, window_pool=False)


@pytest.mark.parametrize("window", [W, 0], ids=["window", "no-window"])
def test_a_window_models_prefills_take_sglangs_windowed_paged_path(window):
    """Prefills stay SGLang's FlashInfer code; on a window model its ragged path drops the window (a prefill with
    nothing cached attends to every prompt token: measured in SGLang's engine, docs/SGLANG.md), so
    attnmeta_flashinfer sends them down SGLang's paged path, which plans the window layers' wrapper over the last
    W + new keys and passes window_left. SGLang's own class on the same runner takes the ragged path; without a
    window attnmeta's does too (nothing changes)."""
    from tests.integrations.sglang_server import prefill

    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        s = Server(["--attention-backend", "attnmeta_flashinfer", "--page-size", "1"], seed=3, window=window)
        own = s.own("flashinfer")
        rows, prefix, new = [3, 5, 8], [0, 0, 2 * max(window, 1)], [3 * max(window, 1), 7, 5]
        for mixed in (False, True):
            with s.active():
                s.backend.init_forward_metadata(prefill(s, rows, prefix, new, mixed))
                own.init_forward_metadata(prefill(s, rows, prefix, new, mixed))
            assert s.backend._ours is None  # SGLang's own code planned it
            assert own.forward_metadata.use_ragged
            assert s.backend.forward_metadata.use_ragged is not bool(window)
            if window:  # the window layers' wrapper (index 0): each request's last W + new keys, the new its queries
                qo, kv, _ = s.backend.forward_metadata.prefill_wrappers[0].planned
                seq = [p + e for p, e in zip(prefix, new, strict=True)]
                assert kv.diff().tolist() == [min(q, window + e) for q, e in zip(seq, new, strict=True)]
                assert qo.diff().tolist() == new


def tree_server(window_pool: bool, seed: int) -> tuple[Server, Runners]:
    """attnmeta_flashinfer under EAGLE topk 4 on the window model, its verify graphs captured by SGLang's runner."""
    from tests.integrations.sglang_server import verify

    s = Server(["--attention-backend", "attnmeta_flashinfer", *EAGLE, "--speculative-eagle-topk", "4",
                "--speculative-num-draft-tokens", "6", "--speculative-draft-attention-backend", "triton"],
               seed=seed, window=W, window_pool=window_pool)
    run = Runners(s, s.backend, "fi", s.spec.speculative_num_draft_tokens)
    with s.active():
        run.capture(lambda bs: verify(s, [0] * bs, [run.fill] * bs, random.Random(bs)), "verify")
    return s, run


def tree_verify_step(s: Server, run: Runners, rng: random.Random, seed: int, replayed: bool) -> None:
    """One tree verify of a random batch, eager or replayed, then its metadata against the request rows and the mask
    SGLang's worker wrote: the window wrapper's items (per draft query: the last min(seq, W) cached slots, then the
    drafts its mask row shows; translated into the window pool, with the write slots, where there is one), planned
    causal with window_left W and no mask; the full layers' wrapper over every key."""
    from tests.integrations.served_pairs import drive
    from tests.integrations.sglang_server import verify

    D, r2t = s.spec.speculative_num_draft_tokens, s.runner.req_to_token_pool.req_to_token
    f2s = s.runner.token_to_kv_pool.full_to_swa_index_mapping if s.backend.use_sliding_window_kv_pool else None
    n = rng.randint(1, max(s.sizes))
    rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, s.model_config.context_len - D)
    loc = torch.tensor(rng.sample(range(1, s.slots), n * D))
    with s.active():
        fb = writing(s, verify(s, rows, seq, random.Random(seed)), loc)
        drive(run, fb, "verify", n, replayed)
    m, sm = s.backend.attnmeta.forward_metadata, s.backend.forward_metadata
    assert sm.prefill_wrappers == [m.plan_window, m.plan]
    w = m.plan_window
    assert (w._window_left, w._causal, w._custom_mask_buf) == (W, True, None)
    assert w._qo_indptr_buf[: n * D + 1].tolist() == list(range(n * D + 1))  # one query per item
    mask, at, want, keys = fb.spec_info.custom_mask.cpu(), 0, [], []
    for row, q in zip(rows, seq, strict=True):
        shown = mask[at: at + D * (q + D)].view(D, q + D)[:, q:]
        at += D * (q + D)
        for j in range(D):
            cols = [*range(q - min(q, W), q), *(q + c for c in range(D) if shown[j, c])]
            want.append(r2t[row, cols].long())
            keys.append(len(cols))
    want = torch.cat(want)
    want = f2s[want] if f2s is not None else want
    assert m.window_kv_indptr[1: n * D + 1].tolist() == list(itertools.accumulate(keys)), seed
    assert torch.equal(m.window_kv_indices[: sum(keys)].long(), want), (seed, replayed)
    full = torch.cat([r2t[row, : q + D].long() for row, q in zip(rows, seq, strict=True)])
    assert torch.equal(m.kv_indices[: full.numel()].long(), full)
    if f2s is not None:
        assert torch.equal(sm.swa_out_cache_loc[: n * D].long(), f2s[loc].long()), seed


def test_tree_verify_window_wrapper():
    """EAGLE topk 4 on a window model: attnmeta_flashinfer's verify plans the window layers' wrapper with one item
    per draft query (SGLang's tree mask, as its worker writes it, read in the graph): the last min(seq, W) cached
    slots of the request's row, then the slots of the drafts the query's mask row shows, causal with FlashInfer's
    window_left W and no mask; the full layers' wrapper as without a window (every key, the tree mask). Checked
    against the request rows and SGLang's mask, eager and replayed through SGLang's verify graph runner. With a
    window pool (translated, with the drafts' write slots) the same verifies run, eager and replayed, in the test
    below, between prefills and idle steps: one server of that kind per run of the suite (CI time)."""
    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        s, run = tree_server(False, seed=5)
        rng, seen = random.Random(7), set()
        for step in range(8):
            seen.add(replayed := step % 3 != 2)
            tree_verify_step(s, run, rng, step, replayed)
        assert seen == {True, False}


def test_tree_verify_window_between_prefills_and_idle_steps():
    """The target's steps as SGLang's scheduler mixes them under EAGLE topk 4 on a window model (a window pool):
    prefills and chunked prefills (SGLang's own FlashInfer code, eager: attnmeta hands them over), idle steps (a DP
    rank with no requests) and tree verifies, eager and replayed, in random order. Each verify's window is its own
    requests' (``tree_verify_step``'s check), whatever step ran before it; each prefill runs SGLang's own wrappers,
    never attnmeta's planned ones."""
    from tests.integrations.sglang_server import prefill

    with pytest.MonkeyPatch.context() as mp:
        fake_flashinfer.into_sglang(mp)
        s, run = tree_server(True, seed=9)
        rng, seen = random.Random(11), set()
        kinds = ["verify", "prefill", "verify", "idle"]
        for step in range(16):
            kind, replayed = kinds[step] if step < len(kinds) else rng.choice(kinds), rng.random() < 0.6
            if kind == "verify":
                tree_verify_step(s, run, rng, step, replayed)
            elif kind == "prefill":
                n = rng.randint(1, 4)
                rows, prefix = rng.sample(range(1, ROWS), n), [rng.choice([0, 3, W, 2 * W]) for _ in range(n)]
                with s.active():
                    s.backend.init_forward_metadata(prefill(s, rows, prefix, [rng.randint(1, W) for _ in range(n)],
                                                            mixed=rng.random() < 0.3))
                sm = s.backend.forward_metadata
                assert s.backend._ours is None and not hasattr(sm, "plan_window") and not sm.use_ragged
                assert all(w is not s.backend.attnmeta.forward_metadata.plan_window and hasattr(w, "planned")
                           for w in sm.prefill_wrappers)  # SGLang's eager wrappers, each planned for this batch
            else:  # a DP rank with no requests steps too
                with s.active():
                    s.backend.init_forward_metadata(decode(s, [], [], idle=True))
            seen.add((kind, replayed))
        assert {k for k, _ in seen} == {"verify", "prefill", "idle"} and {("verify", True), ("verify", False)} <= seen


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
