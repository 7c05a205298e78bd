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

from attnmeta.compiler.ir.errors import OptionsError
from tests import fake_fa3
from tests.integrations.served_pairs import serve, side_by_side
from tests.integrations.sglang_server import ROWS, Runners, Server, draft_decode, draft_decode_view
from tests.integrations.test_sglang_fa3_served import eagle, same
from tests.integrations.test_sglang_triton_window import W, lens


@pytest.fixture
def fa3():
    with pytest.MonkeyPatch.context() as mp:
        fake_fa3.into_sglang(mp)
        yield


@pytest.mark.parametrize("page, topk", [(1, 0), (16, 0), (16, 1)], ids=["page1", "page16", "page16-eagle"])
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
        same(ours.forward_metadata, theirs.forward_metadata, n, P, f"window page {P} {mode} step {step}")
    if not topk:
        return
    # EAGLE's draft decode: each step's child backend (SGLang's, with the window) beside SGLang's own drafter's
    mine, theirs = s.draft_decode, s.own_drafters("fa3")[0]
    assert all(c.has_swa for c in (*mine.attn_backends, *theirs.attn_backends, s.draft_extend))
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
                if step % 3 == 2:
                    r.backend.init_forward_metadata(fb)
                else:
                    r.replay(fb, "draft", draft_decode_view(fb, r.bucket(n), r.fill))
        assert mine._ours is not None  # attnmeta's compiled round served it
        for k, (a, b) in enumerate(zip(mine.attn_backends, theirs.attn_backends, strict=True)):
            same(a.forward_metadata, b.forward_metadata, n, P, f"window draft step {k} ({step})")


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
    with pytest.raises(OptionsError, match=r"sliding-window KV pool .*--attention-backend fa3"):
        Server(["--attention-backend", "attnmeta_fa3"], window=W, window_pool=True)
    with pytest.raises(OptionsError, match="sliding-window attention with EAGLE topk > 1"):
        Server(["--attention-backend", "attnmeta_fa3", *eagle(4)], window=W)
