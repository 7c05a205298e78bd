"""``attnmeta_fa3`` on a sliding-window model in one plain pool, against SGLang's own ``fa3`` on the same runner.

FlashAttention-3 applies a layer's window inside its kernel (``window_size`` from the layer), so SGLang builds the
same metadata with a window as without: these tests check that on SGLang's runner with a 40-token window
(``sliding_window_size``), decode at pages 1 and 16, EAGLE topk 1's verify, draft extend and every draft decode
step, eager and replayed, every field FA3 reads equal to SGLang's own; that a window under the compiled
metadata is really in force on SGLang's side (its backend says ``has_swa``); and that what attnmeta_fa3 does not
plan of windows (a separate window pool, topk > 1's merged window metadata) is refused by name."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch

from attnmeta.compiler.ir.errors import OptionsError
from tests import fake_fa3
from tests.integrations.served_pairs import drive, serve, side_by_side
from tests.integrations.sglang_server import ROWS, Runners, Server, draft_decode
from tests.integrations.test_sglang_fa3_served import eagle, same, same_expand
from tests.integrations.test_sglang_triton_window import W, lens, writing


@pytest.fixture
def fa3():
    with pytest.MonkeyPatch.context() as mp:
        fake_fa3.into_sglang(mp)
        yield


def same_swa_spec(ours, theirs, rows: int, what: str) -> None:
    """topk > 1's window attention (``swa_spec_metadata``): per draft query row, its keys (cached, then the drafts
    its tree-mask row shows), their token slots, both indptrs."""
    assert (ours is None) is (theirs is None), what
    keys = theirs.cache_seqlens_int32[:rows].tolist()
    assert ours.cache_seqlens_int32[:rows].tolist() == keys, (what, "swa_spec cache_seqlens_int32")
    for r, k in enumerate(keys):
        assert ours.page_table[r, :k].tolist() == theirs.page_table[r, :k].tolist(), (what, "swa_spec page_table", r)
    for f in ("cu_seqlens_q", "cu_seqlens_k"):
        assert getattr(ours, f)[: rows + 1].tolist() == getattr(theirs, f)[: rows + 1].tolist(), (what, "swa_spec", f)
    assert int(ours.max_seq_len_q) == int(theirs.max_seq_len_q) == 1, what


@pytest.mark.parametrize("page, topk", [(1, 0), (16, 0), (16, 1), (1, 4)],
                         ids=["page1", "page16", "page16-eagle", "page1-topk4"])
def test_window_steps_equal_sglangs_own_fa3(fa3, page, topk):
    s = Server(["--attention-backend", "attnmeta_fa3", "--page-size", str(page), *(eagle(topk) if topk else [])],
               seed=21 + page, window=W)
    own = s.own("fa3")
    assert s.backend.has_swa and own.has_swa and own.sliding_window_size == W  # the window is in force
    rng, P, L = random.Random(page + topk), s.runner.page_size, s.model_config.context_len
    modes, pairs, D = side_by_side(s, "fa3")
    for step in range(18):
        mode, replayed = modes[step % len(modes)], step % 4 != 3
        n = rng.randint(1, max(s.sizes))
        rows = rng.sample(range(1, ROWS), n)
        seq = lens(rng, n, L - 2 * D)  # below, at and past the window, and past a page
        runners = pairs[mode]
        serve(s, runners, mode, rows, seq, step, replayed, bare=step % 5 == 4)
        ours, theirs = runners[0].backend, runners[1].backend
        assert ours._ours is not None  # attnmeta's compiled plan served it
        what = f"window page {P} {mode} step {step}"
        same(ours.forward_metadata, theirs.forward_metadata, n, P, what)
        if mode == "verify" and topk > 1:  # the tree's two attentions, and the window layers' one
            same_expand(ours.forward_metadata_spec_decode_expand, theirs.forward_metadata_spec_decode_expand, n * D,
                        what)
            same_swa_spec(ours.forward_metadata.swa_spec_metadata, theirs.forward_metadata.swa_spec_metadata, n * D,
                          what)
    if not topk:
        return
    # EAGLE's draft decode: each step's child backend (SGLang's, with the window) beside SGLang's own drafter's
    mine, theirs = s.draft_decode, s.own_drafters("fa3")[0]
    assert all(c.has_swa for c in (*mine.attn_backends, *theirs.attn_backends, s.draft_extend))
    for step, n, children in draft_rounds(s, rng, mine, theirs):
        for k, (a, b) in enumerate(children):
            same(a.forward_metadata, b.forward_metadata, n, P, f"window draft step {k} ({step})", key_indptr=topk == 1)


def draft_rounds(s: Server, rng: random.Random, mine, theirs, writes: bool = False):
    """EAGLE's draft decode through attnmeta's drafter ``mine`` and SGLang's own ``theirs``, each captured as
    SGLang's draft runner captures it, six rounds eager and replayed: yields (round, requests, the two drafters'
    children side by side). ``writes``: each round's KV plan bound to its write slots (a window pool reads them)."""
    P, L = s.runner.page_size, s.model_config.context_len
    runners = [Runners(s, mine, "fa3", 1), Runners(s, theirs, "fa3", 1)]
    with s.active():
        for r in runners:
            r.capture(lambda bs: draft_decode(s, [0] * bs, [1] * bs), "draft")
    for step in range(6):
        n = rng.randint(1, max(s.sizes))
        rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L - s.spec.speculative_num_steps - P)
        with s.active():
            for r in runners:
                fb = draft_decode(s, rows, seq)
                drive(r, writing(s, fb, fb.out_cache_loc, s.draft_runner) if writes else fb, "draft", n, step % 3 != 2)
        assert mine._ours is not None  # attnmeta's compiled round served it
        yield step, n, zip(mine.attn_backends, theirs.attn_backends, strict=True)


def test_the_window_comparison_can_fail(fa3):
    """The comparison above sees a wrong key length: SGLang's own fa3 on the same window server, one step served
    with every length one longer, differs from attnmeta's."""
    s = Server(["--attention-backend", "attnmeta_fa3"], seed=4, window=W)
    modes, pairs, _ = side_by_side(s, "fa3")
    rows, seq = [3, 7], [W + 5, 12]
    serve(s, pairs["decode"][:1], "decode", rows, seq, 0, True, False)
    serve(s, pairs["decode"][1:], "decode", rows, [x + 1 for x in seq], 0, True, False)
    with pytest.raises(AssertionError, match="cache_seqlens_int32"):
        same(pairs["decode"][0].backend.forward_metadata, pairs["decode"][1].backend.forward_metadata, 2, 1, "off")


def test_what_attnmeta_fa3_does_not_plan_of_windows_is_refused_by_name(fa3):
    with pytest.raises(OptionsError, match=r"topk > 1 at page size > 1.*--attention-backend fa3"):
        Server(["--attention-backend", "attnmeta_fa3", "--page-size", "16", *eagle(4)], window=W)
    with pytest.raises(OptionsError, match=r"--speculative-draft-attention-backend fa3"):
        Server(["--attention-backend", "attnmeta_fa3", *eagle(4)], window=W, window_pool=True)


def _swa_same(ours, theirs, live: int, tokens: int, P: int, what: str) -> None:
    """The window pool's fields: each live row's pages (as many as its keys cover; a tree verify has none, its
    window attention's are translated instead) and the step's write slots."""
    assert (ours.swa_page_table is None) is (theirs.swa_page_table is None), what
    for i, k in enumerate(theirs.cache_seqlens_int32[:live].tolist() if theirs.swa_page_table is not None else []):
        pages = -(-k // P)
        assert ours.swa_page_table[i, :pages].tolist() == theirs.swa_page_table[i, :pages].tolist(), \
            (what, "swa_page_table", i)
    assert ours.swa_out_cache_loc[:tokens].tolist() == theirs.swa_out_cache_loc[:tokens].tolist(), \
        (what, "swa_out_cache_loc")


@pytest.mark.parametrize("page, topk", [(1, 0), (16, 0), (16, 1), (1, 4)],
                         ids=["page1", "page16", "page16-eagle", "page1-topk4"])
def test_window_pool_steps_equal_sglangs_own_fa3(fa3, page, topk):
    """SGLang's ``SWAKVPool``: the window layers read every page translated into their pool and write the step's
    slots translated; decode, and under EAGLE (SGLang's own fa3 drafter, as the drafter error says) the target's
    verify and attnmeta_fa3's draft extend built on the draft runner, eager and replayed, beside SGLang's own."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from tests.integrations.sglang_server import decode, draft_extend, verify

    flags = ["--attention-backend", "attnmeta_fa3", "--page-size", str(page)]
    if topk:  # topk > 1: SGLang's own drafter, as attnmeta's drafter's error says
        flags += [*eagle(topk), *(["--speculative-draft-attention-backend", "fa3"] if topk > 1 else [])]
    s = Server(flags, seed=31 + page, window=W, window_pool=True)
    assert s.backend.use_sliding_window_kv_pool and s.backend.attnmeta.compiled.options.window_pool
    D = s.spec.speculative_num_draft_tokens if topk else 1
    makers = {"decode": lambda rows, seq, seed: decode(s, rows, seq),
              "verify": lambda rows, seq, seed: verify(s, rows, seq, random.Random(seed)),
              "extend": lambda rows, seq, seed: draft_extend(s, rows, seq)}
    if topk:
        with s.active():
            ext = ATTENTION_BACKENDS["attnmeta_fa3"](s.draft_runner)
        pairs = {"verify": (Runners(s, s.backend, "f", D), Runners(s, s.own("fa3"), "f", D)),
                 "extend": (Runners(s, ext, "e", D), Runners(s, s.own("fa3", s.draft_runner), "e", D))}
    else:
        pairs = {"decode": (Runners(s, s.backend, "f", 1), Runners(s, s.own("fa3"), "f", 1))}
    with s.active():
        for key, pair in pairs.items():
            for r in pair:
                r.capture(lambda bs, r=r, key=key: makers[key]([0] * bs, [1 if key == "extend" else r.fill] * bs, bs),
                          key)
    rng, P, L = random.Random(page + topk), s.runner.page_size, s.model_config.context_len
    keys = list(pairs)
    for step in range(16):
        key, replayed = keys[step % len(keys)], step % 4 != 3
        n = rng.randint(1, max(s.sizes))
        rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L - 2 * D)
        loc = torch.tensor(rng.sample(range(1, s.slots), n * D))  # the step's write slots
        with s.active():
            for r in pairs[key]:
                drive(r, writing(s, makers[key](rows, seq, step), loc, s.draft_runner if key == "extend" else None),
                      key, n, replayed)
        ours, theirs = (r.backend.forward_metadata for r in pairs[key])
        what = f"window pool page {P} {key} step {step} replayed={replayed}"
        same(ours, theirs, n, P, what)
        _swa_same(ours, theirs, n, n * D, P, what)
        if key == "verify" and topk > 1:
            same_swa_spec(ours.swa_spec_metadata, theirs.swa_spec_metadata, n * D, what)
    if topk != 1:
        return
    # attnmeta's drafter: every step's pages in the window pool and the step's draft write slot, translated
    mine_d, theirs_d = s.draft_decode, s.own_drafters("fa3")[0]
    assert mine_d.attnmeta.compiled.options.window_pool
    for step, n, children in draft_rounds(s, rng, mine_d, theirs_d, writes=True):
        for k, (a, b) in enumerate(children):
            what = f"window pool draft step {k} ({step})"
            same(a.forward_metadata, b.forward_metadata, n, P, what)
            _swa_same(a.forward_metadata, b.forward_metadata, n, n, P, what)


def test_the_window_pool_comparison_can_fail(fa3):
    """Without the full-to-window translation (the window pool read as the full one), the comparison fails."""
    from attnmeta.backends.flashattention import spec

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spec, "window_pool", lambda b, page_table, options, tokens: {
            "swa_page_table": b.copy(page_table, name="swa_page_table"),
            "swa_out_cache_loc": b.copy(b.input("out_cache_loc", spec.I64, [tokens], fill=0, kind=spec.Kind.slot),
                                        name="swa_out_cache_loc")})
        with pytest.raises(AssertionError, match="swa_"):
            test_window_pool_steps_equal_sglangs_own_fa3(None, 1, 0)
