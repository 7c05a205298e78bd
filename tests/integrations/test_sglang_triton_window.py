"""``attnmeta_triton`` on a sliding-window model, against SGLang's own triton backend on the same runner.

SGLang's runner resolves the model's window (``sliding_window_size``) and its memory layout: one plain pool, or
``SWAKVPool`` (the window layers' KV in a pool of their own, reached from the full pool's slots through the
allocator's ``full_to_swa_index_mapping``). Both backends are built by SGLang's registry from the same flags;
decode and idle steps, eager and through SGLang's decode graph runner (captured, padded, viewed, replayed), are
compared on every field the kernels read, the window's included: ``window_kv_indptr``, ``window_kv_indices``,
``window_num_kv_splits`` and, with a window pool, the step's window write slots ``swa_out_cache_loc``."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import attrs
import torch

from attnmeta.compiler.ir.errors import OptionsError
from tests.integrations.served_pairs import drive
from tests.integrations.sglang_server import ROWS, Runners, Server, decode, decode_view, rows_read

W = 40  # tokens: lengths below, at and past it, and past a page
FIELDS = ("kv_indptr", "kv_indices", "num_kv_splits", "window_kv_indptr", "window_kv_indices",
          "window_num_kv_splits", "swa_out_cache_loc")


def lens(rng: random.Random, n: int, hi: int) -> list[int]:
    edges = [1, 2, W - 1, W, W + 1, 2 * W, 16, 17, hi - 1, hi]
    return [rng.choice(edges) if rng.random() < 0.5 else rng.randint(1, hi) for _ in range(n)]


def writing(server: Server, fb, loc: torch.Tensor, runner=None):
    """``fb`` writing its tokens at ``loc`` (as the allocator hands slots out), its KV plan bound again to them as
    ``ForwardBatch.init_new`` binds it on the ``runner`` that serves it (the target's by default; SGLang reads the
    window write slots through the plan, with that runner's translator)."""
    fb.out_cache_loc = loc.clone().to(fb.seq_lens.device)
    t = (runner or server.runner).kv_index_translator
    t.own_plan(fb).bind(fb, t, cols=None)
    return fb


def same(ours, theirs, live: int, what: str) -> None:
    for f in FIELDS:
        a, b = rows_read(ours, theirs, f, live)
        if b is None:
            assert a is None, (what, f, "attnmeta set a field SGLang leaves None")
            continue
        assert a is not None, (what, f, "attnmeta left None a field SGLang sets")
        assert torch.equal(a.long(), b.long()), (what, f, live, a[:8].tolist(), b[:8].tolist())


def theirs(r: Runners, fb, replayed: bool, live: int):
    """SGLang's metadata for the step just driven: eager, its ``forward_metadata``; replayed, what its captured
    kernels read (its own ``_build_cuda_graph_forward_metadata``, and the window write slots its replay refilled
    into ``cuda_graph_swa_out_cache_loc``)."""
    b = r.backend
    if not replayed:
        return b.forward_metadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    m = b._build_cuda_graph_forward_metadata(r.bucket(max(fb.batch_size, 1)), ForwardMode.DECODE, None)
    if b.use_sliding_window_kv_pool:
        m.swa_out_cache_loc = b.cuda_graph_swa_out_cache_loc[:live]
    return m


@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
@pytest.mark.parametrize("page", [1, 16])
def test_window_decode_equals_sglangs_own(page, window_pool):
    server = Server(["--attention-backend", "attnmeta_triton", "--page-size", str(page)], seed=page, window=W,
                    window_pool=window_pool)
    be, own = server.backend, server.own("triton")
    assert be.attnmeta.compiled.options.sliding_window == W and own.sliding_window_size == W
    assert be.use_sliding_window_kv_pool is window_pool is own.use_sliding_window_kv_pool
    mine_r, own_r = Runners(server, be, "triton"), Runners(server, own, "triton")
    with server.active():
        for r in (mine_r, own_r):
            r.capture(lambda bs, r=r: decode(server, [0] * bs, [r.fill] * bs), "decode")
    rng, L, seen = random.Random(page + window_pool), server.model_config.context_len, set()
    slots = server.slots
    for step in range(24):
        replayed, idle = step % 3 != 2, step % 7 == 6
        n = rng.randint(1, max(server.sizes))
        rows = rng.sample(range(1, ROWS), n)
        seq = lens(rng, n, L)
        loc = torch.tensor(rng.sample(range(1, slots), n))  # the step's write slots, as the allocator hands them
        with server.active():
            for r in (mine_r, own_r):
                fb = decode(server, rows, seq, idle=idle)
                if not idle:
                    fb = writing(server, fb, loc)
                if idle or replayed:
                    bs = r.bucket(max(fb.batch_size, 1))
                    r.replay(fb, "decode", decode_view(fb, bs, r.fill, 1))
                else:
                    r.backend.init_forward_metadata(fb)
        live = 0 if idle else n
        seen.add((replayed or idle, idle))
        same(be.forward_metadata, theirs(own_r, fb, replayed or idle, live), live, f"step {step}")
    assert seen >= {(True, False), (False, False), (True, True)}, seen


def test_the_window_comparison_can_fail():
    """The same comparison catches a window one token short: SGLang's own backend on a runner whose window is
    W - 1 (the same seeded pools) differs from attnmeta's at W, while SGLang's own at W equals it."""
    flags = ["--attention-backend", "attnmeta_triton"]
    at_w, short = Server(flags, seed=3, window=W, window_pool=True), Server(flags, seed=3, window=W - 1,
                                                                            window_pool=True)
    metas = []
    for server, backend in ((at_w, at_w.backend), (at_w, at_w.own("triton")), (short, short.own("triton"))):
        with server.active():
            backend.init_forward_metadata(writing(server, decode(server, [1, 2], [W + 5, 3]), torch.tensor([5, 9])))
        metas.append(backend.forward_metadata)
    same(metas[0], metas[1], 2, "the same window")
    with pytest.raises(AssertionError, match="window_kv_indptr"):
        same(metas[0], metas[2], 2, "W - 1")


def test_an_artifact_for_another_window_is_refused_by_name():
    from attnmeta.compiler import compile_backend
    from attnmeta.integrations.sglang.backend import TritonBackend

    server = Server(["--attention-backend", "attnmeta_triton"], seed=3, window=W)
    other = compile_backend("triton", attrs.evolve(server.backend.attnmeta.compiled.options, sliding_window=W - 1))
    with server.active(), pytest.raises(OptionsError, match="sliding_window"):
        TritonBackend(server.runner, compiled=other)


EAGLE = ["--attention-backend", "attnmeta_triton", "--speculative-algorithm", "EAGLE"]
SPEC_FIELDS = ("kv_indptr", "kv_indices", "qo_indptr", "mask_indptr", "max_extend_len", "window_kv_indptr",
               "window_kv_indices", "window_kv_offsets", "swa_out_cache_loc")


DRAFT_FIELDS = ("kv_indptr", "kv_indices", "window_kv_indptr", "window_kv_indices")


# SGLang's window rail kernel runs in Triton's interpreter here (slow): a few layouts, page sizes and topks
@pytest.mark.parametrize("page, window_pool, topk", [(1, False, 1), (16, True, 1), (1, True, 4), (16, False, 4)],
                         ids=["page1-one-pool", "page16-window-pool", "page1-window-pool-topk4", "page16-topk4"])
def test_draft_decode_window_rail_equals_sglangs_own_drafter(page, window_pool, topk):
    """attnmeta's triton drafter on a window model beside SGLang's own (its window rail): every step's keys and
    window (of each branch, the last min(seq + step + 1, W) of the prefix and its own drafts so far: with topk > 1
    a branch's window starts in the prefix and jumps over the other branches' drafts), and with a window pool
    each branch's write slot of the step translated; eager and replayed through each drafter's graph runner."""
    from tests.integrations.sglang_server import draft_decode

    server = Server([*EAGLE, "--speculative-eagle-topk", str(topk), "--speculative-num-steps", "3",
                     "--speculative-num-draft-tokens", "4" if topk == 1 else "6", "--page-size", str(page)],
                    seed=7 + page, window=W, window_pool=window_pool)
    S, K = server.spec.speculative_num_steps, topk
    mine, own = server.draft_decode, server.own_drafters("triton")[0]
    assert mine.attnmeta.compiled.options.sliding_window == W and own.window_rail
    runners = [Runners(server, mine, "d", K), Runners(server, own, "d", K)]
    with server.active():
        for r in runners:
            r.capture(lambda bs: draft_decode(server, [0] * bs, [1] * bs), "draft")
    rng, L, seen = random.Random(page * 2 + window_pool), server.model_config.context_len, set()
    for step in range(4):
        replayed = step % 3 != 2
        n = rng.randint(1, max(server.sizes))
        # the longest prefix whose last branch's drafts still fit the row (its page offset at the worst)
        rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L - S - (K - 1) * -(-(page - 1 + S) // page) * page)
        loc = torch.tensor(rng.sample(range(1, server.slots), n * K * S))  # each branch's S draft slots in a row
        with server.active():
            for r in runners:
                drive(r, writing(server, draft_decode(server, rows, seq), loc, server.draft_runner), "draft", n,
                      replayed)
        seen.add(replayed)
        for k in range(S - 1):  # SGLang's drafter runs S - 1 attention steps (the last draft is never attended)
            a, b = mine.attn_backends[k].forward_metadata, own.attn_backends[k].forward_metadata
            if replayed:  # what SGLang's captured steps read: its drafter's buffers (the capture's views are shorter)
                b = type("Read", (), {"kv_indptr": own.kv_indptr[k], "kv_indices": own.cuda_graph_kv_indices[k],
                                      "window_kv_indptr": own.window_kv_indptr[k],
                                      "window_kv_indices": own.cuda_graph_window_kv_indices[k]})
            for f in DRAFT_FIELDS:
                x, y = rows_read(a, b, f, n * K)
                assert torch.equal(x.long(), y.long()), (step, k, f, replayed, x[:8].tolist(), y[:8].tolist())
            if window_pool:
                want = server.runner.token_to_kv_pool.full_to_swa_index_mapping[loc.view(n, K, S)[:, :, k].flatten()]
                assert torch.equal(a.swa_out_cache_loc[: n * K].long(), want.long()), (step, k)
    assert seen == {True, False}


@pytest.mark.parametrize("window_pool", [False, True], ids=["one-pool", "window-pool"])
def test_eagle_verify_and_draft_extend_windows_equal_sglangs_own(window_pool):
    """EAGLE on a window model as docs/SGLANG.md says to serve it: attnmeta_triton the target (decode, verify),
    SGLang's own triton drafter. The target's verify, and attnmeta_triton's draft extend built on the draft
    runner as SGLang's factory builds a draft extend backend, against SGLang's own triton on the same runners:
    eager and replayed, window fields, offsets and the window write slots of every draft token."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    from tests.integrations.sglang_server import draft_extend, verify

    server = Server([*EAGLE, "--speculative-draft-attention-backend", "triton", "--page-size", "16"], seed=5,
                    window=W, window_pool=window_pool)
    D = server.spec.speculative_num_draft_tokens
    with server.active():
        ext_mine = ATTENTION_BACKENDS["attnmeta_triton"](server.draft_runner)
    pairs = {"verify": (Runners(server, server.backend, "t", D), Runners(server, server.own("triton"), "t", D)),
             "extend": (Runners(server, ext_mine, "e", D), Runners(server, server.own("triton", server.draft_runner),
                                                                   "e", D))}
    makers = {"verify": lambda rows, seq, seed: verify(server, rows, seq, random.Random(seed)),
              "extend": lambda rows, seq, seed: draft_extend(server, rows, seq)}
    with server.active():
        for key, pair in pairs.items():
            for r in pair:
                r.capture(lambda bs, r=r, key=key: makers[key]([0] * bs, [r.fill if key == "verify" else 1] * bs, bs),
                          key)
    rng, L = random.Random(9), server.model_config.context_len
    for step in range(16):
        key, replayed = ("verify", "extend")[step % 2], step % 4 < 2
        n = rng.randint(1, max(server.sizes))
        rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L - D)
        loc = torch.tensor(rng.sample(range(1, server.slots), n * D))
        mine, sglangs = pairs[key]
        with server.active():
            for r in pairs[key]:
                fb = writing(server, makers[key](rows, seq, step), loc)
                drive(r, fb, key, n, replayed)
        theirs_m = sglangs.backend.forward_metadata
        if replayed:
            b = sglangs.backend
            theirs_m = b._build_cuda_graph_forward_metadata(sglangs.bucket(n), fb.forward_mode, fb.spec_info)
            if window_pool:
                theirs_m.swa_out_cache_loc = b.cuda_graph_swa_out_cache_loc[: n * D]
        for f in SPEC_FIELDS:
            a, b = rows_read(mine.backend.forward_metadata, theirs_m, f, n)
            if f == "swa_out_cache_loc" and b is not None:
                a, b = getattr(mine.backend.forward_metadata, f)[: n * D], getattr(theirs_m, f)[: n * D]
            if not isinstance(b, torch.Tensor):
                assert a == b, (key, step, f, a, b)
                continue
            assert torch.equal(a.long(), b.long()), (key, step, replayed, f, a[:8].tolist(), b[:8].tolist())
