"""``attnmeta_fa3`` built by SGLang's registry from its flags and served through its graph runners' capture and
replay, against SGLang's own ``FlashAttentionBackend`` (``--attention-backend fa3``) built the same way on the
same runner and batches.

Both sides are SGLang's class (attnmeta's subclasses it), so both need, on a CPU, the stand-ins of
``fake_fa3`` (SGLang's kernel package, a Hopper's compute capability). SGLang's own metadata code runs as
written (its Triton page-table and metadata kernels in the interpreter); no attention kernel runs. Compared
on every step of decode, target verify (EAGLE topk 1, and topk 4 with its tree expansion) and draft extend V2
interleaved, eager and replayed, with and without host lengths: what FlashAttention-3's kernel reads (key
lengths, query and key indptrs, the longest query, the pages each row's keys cover; with topk 4 also the
drafts each query's tree-mask row shows, by token slot). ``max_seq_len_k`` is not compared: FA3's
kernel does not read it (attnmeta's is the context, SGLang's the batch's longest)."""

import pytest

# SGLang's FlashAttention module imports sgl_kernel, which fake_fa3 stands in: probe SGLang itself
pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch

from attnmeta.compiler.ir.errors import OptionsError
from tests import fake_fa3
from tests.integrations.served_pairs import serve, side_by_side
from tests.integrations.sglang_server import ROWS, Runners, Server, decode, draft_decode, draft_decode_view, prefill
from tests.integrations.test_sglang_serving import lens


def eagle(topk: int) -> list[str]:
    # topk 4 drafts 4 steps: a branch's three drafts at step 2 can fill the end of one page and start the next
    return ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", str(topk), "--speculative-num-steps",
            "3" if topk == 1 else "4", "--speculative-num-draft-tokens", "4" if topk == 1 else "8"]


# page size, EAGLE's topk (0: plain decoding)
CASES = {"page1": (1, 0), "page16-eagle": (16, 1), "page64": (64, 0), "page1-eagle": (1, 1), "page1-topk4": (1, 4),
         "page16-topk4": (16, 4), "page64-topk4": (64, 4)}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    page, topk = CASES[request.param]
    with pytest.MonkeyPatch.context() as mp:
        fake_fa3.into_sglang(mp)
        yield Server(["--attention-backend", "attnmeta_fa3", "--page-size", str(page), *(eagle(topk) if topk else [])],
                     seed=17)


def same(ours, theirs, live: int, P: int, what: str, key_indptr: bool = True) -> None:
    """``key_indptr=False``: the prefix of a topk > 1 draft step, whose key indptr FA3 is not handed (SGLang's
    replay leaves it unwritten; attnmeta's is the running sum of the key lengths)."""
    keys = theirs.cache_seqlens_int32[:live].tolist()
    assert ours.cache_seqlens_int32[:live].tolist() == keys, (what, "cache_seqlens_int32")
    for i, k in enumerate(keys):
        pages = -(-k // P)
        assert ours.page_table[i, :pages].tolist() == theirs.page_table[i, :pages].tolist(), (what, "page_table", i)
    for f in ("cu_seqlens_q", "cu_seqlens_k")[: 2 if key_indptr else 1]:
        assert getattr(ours, f)[: live + 1].tolist() == getattr(theirs, f)[: live + 1].tolist(), (what, f)
    assert int(ours.max_seq_len_q) == int(theirs.max_seq_len_q), (what, "max_seq_len_q")
    assert ours.window_size == theirs.window_size == (-1, -1), what


def same_expand(ours, theirs, rows: int, what: str, pages: int = 1) -> None:
    """topk > 1's second attention (verify: per draft query, the drafts its tree-mask row shows; draft decode: per
    branch, its drafts so far): over ``rows`` rows the key counts and the pages (``pages``: tokens a page-table
    entry holds; the verify's entries are token slots) FA3 reads, the query indptr, one query per row. The
    verify's key indptr too (the draft decode's is a constant SGLang's kernel does not read)."""
    keys = theirs.cache_seqlens_int32[:rows].tolist()
    assert ours.cache_seqlens_int32[:rows].tolist() == keys, (what, "expand cache_seqlens_int32")
    for r, k in enumerate(keys):
        n = -(-k // pages)
        assert ours.page_table[r, :n].tolist() == theirs.page_table[r, :n].tolist(), (what, "expand page_table", r)
    for f in ("cu_seqlens_q", "cu_seqlens_k")[: 2 if pages == 1 else 1]:
        assert getattr(ours, f)[: rows + 1].tolist() == getattr(theirs, f)[: rows + 1].tolist(), (what, "expand", f)
    assert int(ours.max_seq_len_q) == int(theirs.max_seq_len_q) == 1, what


def test_sglang_built_attnmeta_fa3_from_its_flags(case):
    from attnmeta.integrations.sglang.fa3 import FA3Backend

    s = case
    assert type(s.backend) is FA3Backend
    o = s.backend.attnmeta.compiled.options
    assert (o.page_size, o.max_bs) == (s.runner.page_size, max(s.sizes))
    if s.speculative:  # draft extend and every draft decode step compiled
        from attnmeta.integrations.sglang.fa3 import FA3DraftBackend

        assert isinstance(s.draft_extend, FA3Backend) and isinstance(s.draft_decode, FA3DraftBackend)
        assert len(s.draft_decode.attn_backends) == s.spec.speculative_num_steps - 1
        assert s.draft_decode.attnmeta.compiled.options.topk == s.spec.speculative_eagle_topk


def test_every_step_equals_sglangs_own_fa3(case):
    s, rng = case, random.Random(6)
    P, L = s.runner.page_size, s.model_config.context_len
    modes, pairs, D = side_by_side(s, "fa3")
    for step in range(16):
        mode, replayed = modes[step % len(modes)], step % 4 != 3
        n = rng.randint(1, max(s.sizes))
        rows = rng.sample(range(1, ROWS), n)
        seq = lens(rng, n, L - 2 * D)
        runners = pairs[mode]
        serve(s, runners, mode, rows, seq, step, replayed, bare=step % 5 == 4)
        ours, theirs = runners[0].backend, runners[1].backend
        assert ours._ours is not None  # attnmeta's compiled plan served it, not SGLang's code
        what = f"fa3 page {P} {mode} step {step} replayed={replayed}"
        same(ours.forward_metadata, theirs.forward_metadata, n, P, what)
        tree = mode == "verify" and s.spec.speculative_eagle_topk > 1
        assert (ours.forward_metadata_spec_decode_expand is None) is (not tree), what
        if tree:
            same_expand(ours.forward_metadata_spec_decode_expand, theirs.forward_metadata_spec_decode_expand, n * D,
                        what)


def test_every_draft_decode_step_equals_sglangs_own_fa3_drafter(case):
    """EAGLE's draft decode (topk 1): each step's metadata, SGLang's child backend of that step beside
    attnmeta's, eager and replayed."""
    s, rng = case, random.Random(8)
    if not s.speculative:
        pytest.skip("a plain server drafts nothing")
    P, L, S = s.runner.page_size, s.model_config.context_len, s.spec.speculative_num_steps
    K = s.spec.speculative_eagle_topk
    pair = [Runners(s, s.draft_decode, "fa3", 1), Runners(s, s.own_drafters("fa3")[0], "fa3", 1)]
    with s.active():
        for r in pair:
            r.capture(lambda bs: draft_decode(s, [0] * bs, [1] * bs), "draft")
    for step in range(8):
        replayed = step % 3 != 2
        n = rng.randint(1, max(s.sizes))
        rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L - K * (S + P))
        if P > 1:  # half the prefixes end a token or two before a page's end: the branches' drafts cross into the next
            seq = [x - x % P + P - 1 - j % 2 if j % 2 == 0 or x % 3 == 0 else x for j, x in enumerate(seq)]
        with s.active():
            for r in pair:
                fb = draft_decode(s, rows, seq)
                if replayed:
                    r.replay(fb, "draft", draft_decode_view(fb, r.bucket(n), r.fill))
                else:
                    r.backend.init_forward_metadata(fb)
        assert pair[0].backend._ours is not None  # attnmeta's compiled round served it
        for i, (ours, theirs) in enumerate(zip(pair[0].backend.attn_backends, pair[1].backend.attn_backends,
                                               strict=True)):
            what = f"draft step {i}, round {step}, replayed={replayed}"
            same(ours.forward_metadata, theirs.forward_metadata, n, P, what, key_indptr=K == 1)
            if K == 1:
                assert theirs.forward_metadata.cache_seqlens_int32[:n].tolist() == [x + i + 1 for x in seq]
                assert ours.forward_metadata_spec_decode_expand is None, what
                continue
            # topk > 1: the prefix up to its last whole page, the same every step; each branch's drafts so far
            assert theirs.forward_metadata.cache_seqlens_int32[:n].tolist() == [x - x % P for x in seq]
            e_ours, e_theirs = ours.forward_metadata_spec_decode_expand, theirs.forward_metadata_spec_decode_expand
            assert e_theirs.cache_seqlens_int32[: n * K].tolist() == [x % P + i + 1 for x in seq for _ in range(K)]
            same_expand(e_ours, e_theirs, n * K, what, pages=P)


def test_prefill_and_mixed_are_sglangs_own_fa3(case):
    """A server's first request is a prefill: SGLang's own FA3 code builds its metadata (attnmeta compiles
    the captured modes only), equal to SGLang's own backend's, mixed batches too."""
    s, rng = case, random.Random(2)
    P = s.runner.page_size
    with s.active():
        own = s.own("fa3")
        for mixed in (False, True):
            rows = rng.sample(range(1, ROWS), 3)
            for be in (s.backend, own):
                be.init_forward_metadata(prefill(s, rows, [0, 17, 300], [5, 64, 1], mixed))
            assert s.backend._ours is None  # routed to SGLang's code
            ours, theirs = s.backend.forward_metadata, own.forward_metadata
            assert ours.cache_seqlens_int32.tolist() == theirs.cache_seqlens_int32.tolist() == [5, 81, 301]
            for f in ("cu_seqlens_q", "cu_seqlens_k"):
                assert getattr(ours, f).tolist() == getattr(theirs, f).tolist(), f
            assert ours.max_seq_len_q == theirs.max_seq_len_q == 64
            for i, k in enumerate([5, 81, 301]):
                pages = -(-k // P)
                assert ours.page_table[i, :pages].tolist() == theirs.page_table[i, :pages].tolist()


def test_the_comparison_can_fail(case):
    """A page one off and a key length one off are caught."""
    s = case
    with s.active():
        s.backend.init_forward_metadata(decode(s, [3, 5], [70, 130]))
    m = s.backend.forward_metadata
    twin = type(m)(**{**vars(m), "page_table": m.page_table.clone(),
                      "cache_seqlens_int32": m.cache_seqlens_int32.clone()})
    twin.page_table[1, 0] += 1
    with pytest.raises(AssertionError):
        same(m, twin, 2, s.runner.page_size, "page")
    twin.page_table[1, 0] -= 1
    same(m, twin, 2, s.runner.page_size, "restored")
    twin.cache_seqlens_int32[0] += 1
    with pytest.raises(AssertionError):
        same(m, twin, 2, s.runner.page_size, "key")
    assert torch.equal(m.cache_seqlens_int32, torch.tensor([70, 130], dtype=torch.int32))


def test_what_attnmeta_fa3_does_not_serve_is_refused_by_name():
    with pytest.MonkeyPatch.context() as mp:
        fake_fa3.into_sglang(mp)
        with pytest.raises(OptionsError, match="serves multi-head attention models"):
            Server(["--attention-backend", "attnmeta_fa3"], model="deepseek")
        import sglang.srt.layers.attention.flashattention_backend as fa

        mp.setattr(fa, "get_device_capability", lambda *a, **k: (12, 0))  # a Blackwell workstation GPU
        with pytest.raises(OptionsError, match=r"compute capability 12\.x .*attnmeta_flashinfer"):
            Server(["--attention-backend", "attnmeta_fa3"])
