"""``attnmeta_fa3`` on a chunked-local-attention model (Llama 4's iRoPE layers), against SGLang's own ``fa3`` on the
same runner.

SGLang's model config says the model has local attention and its chunk (``attention_chunk_size``, which its runner
also takes as the sliding window: Llama 4's chunked layers are its window layers, their KV in ``SWAKVPool`` unless
the hybrid memory is off); its FA3 backend then gives those layers each request's current chunk as a batch item of
its own (``local_attn_metadata``: query indptr, the chunk's keys so far, its pages). Decode and idle, one pool at
page 1 and SWAKVPool at page 16, eager and replayed through SGLang's decode graph runner: the local fields the
kernel reads equal SGLang's own, beside every other field. EAGLE's target verify at topk 1 (its drafts may run into
a second chunk): equal to SGLang's own eager verify, whose captured verify has no chunks; topk > 1 is refused by
name."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

from attnmeta.compiler.ir.errors import OptionsError
from tests import fake_fa3
from tests.integrations.served_pairs import drive, serve, side_by_side
from tests.integrations.sglang_server import ROWS, Server, verify
from tests.integrations.test_sglang_fa3_served import eagle, same

C = 64  # tokens: lengths below, at and past a chunk, and past a page


def lens(rng: random.Random, n: int, hi: int) -> list[int]:
    edges = [1, 2, C - 1, C, C + 1, 2 * C, 2 * C + 1, 17, hi - 1, hi]
    return [rng.choice(edges) if rng.random() < 0.5 else rng.randint(1, hi) for _ in range(n)]


def same_local(ours, theirs, n: int, P: int, what: str) -> None:
    """The local batch items the kernel reads: one query each, the chunk's keys, its first ceil(keys / P) pages."""
    assert ours is not None and theirs is not None, (what, "local_attn_metadata")
    assert ours.local_query_start_loc[: n + 1].tolist() == theirs.local_query_start_loc[: n + 1].tolist(), what
    keys = theirs.local_seqused_k[:n].tolist()
    assert ours.local_seqused_k[:n].tolist() == keys, (what, "local_seqused_k")
    for r, k in enumerate(keys):
        pages = -(-k // P)
        assert ours.local_block_table[r, :pages].tolist() == theirs.local_block_table[r, :pages].tolist(), \
            (what, "local_block_table", r)
    assert int(ours.local_max_query_len) == int(theirs.local_max_query_len) == 1, what


# each layout at one page size (CI's time is short)
@pytest.mark.parametrize("page, window_pool", [(1, False), (16, True)], ids=["page1-one-pool", "page16-window-pool"])
def test_local_attention_equals_sglangs_own_fa3(page, window_pool):
    with pytest.MonkeyPatch.context() as mp:
        fake_fa3.into_sglang(mp)
        s = Server(["--attention-backend", "attnmeta_fa3", "--page-size", str(page)], seed=5 + page, window=C,
                   window_pool=window_pool, chunk=C)
        own = s.own("fa3")
        assert s.backend.has_local_attention and own.has_local_attention and own.attention_chunk_size == C
        rng, P, L = random.Random(page + window_pool), s.runner.page_size, s.model_config.context_len
        modes, pairs, _ = side_by_side(s, "fa3")
        seen = set()
        for step in range(10):
            replayed = step % 4 != 3
            n = rng.randint(1, max(s.sizes))
            rows, seq = rng.sample(range(1, ROWS), n), lens(rng, n, L)
            runners = pairs["decode"]
            serve(s, runners, "decode", rows, seq, step, replayed, bare=step % 5 == 4)
            ours, theirs = runners[0].backend, runners[1].backend
            assert ours._ours is not None  # attnmeta's compiled plan served it
            what = f"local page {P} step {step}"
            same(ours.forward_metadata, theirs.forward_metadata, n, P, what)
            same_local(ours.forward_metadata.local_attn_metadata, theirs.forward_metadata.local_attn_metadata, n, P,
                       what)
            seen.add(replayed)
        assert seen == {True, False} and modes == ["decode"]


def items(m, n: int, P: int) -> list[tuple[int, int, list[int]]]:
    """The batch items of ``n`` of them (or the first ``n`` requests' of attnmeta's two per request) the kernel reads:
    (queries, keys, first ceil(keys / P) pages); empty items (no queries, no keys) left out."""
    cu, keys = m.local_query_start_loc.tolist(), m.local_seqused_k.tolist()
    out = []
    for i in range(n):
        if cu[i + 1] > cu[i]:
            out.append((cu[i + 1] - cu[i], keys[i], m.local_block_table[i, : -(-keys[i] // P)].tolist()))
        else:
            assert keys[i] == 0, ("an empty item has keys", i)
    return out


def verify_lens(rng: random.Random, n: int, hi: int, D: int) -> list[int]:
    """Prefixes whose drafts start a chunk, fill its end, or run into the next one."""
    edges = [1, C - D, C - D + 1, C - 2, C - 1, C, 2 * C - 1, hi - 1]
    return [rng.choice(edges) if rng.random() < 0.6 else rng.randint(1, hi) for _ in range(n)]


@pytest.mark.parametrize("page, window_pool", [(1, False), (16, True)], ids=["page1-one-pool", "page16-window-pool"])
def test_verify_chunks_equal_sglangs_own_eager_verify(page, window_pool):
    """EAGLE topk 1 on a chunked model: attnmeta's target verify (eager and replayed through SGLang's verify graph
    runner) gives each chunk a request's drafts fall in as a batch item, equal to what SGLang's own fa3 builds for an
    eager verify, beside every other field. SGLang's own captured verify carries no chunks at all (its replay
    leaves ``local_attn_metadata`` unset, so its chunked layers would attend the whole prefix): recorded here."""
    with pytest.MonkeyPatch.context() as mp:
        fake_fa3.into_sglang(mp)
        s = Server(["--attention-backend", "attnmeta_fa3", "--page-size", str(page), *eagle(1)], seed=9 + page,
                   window=C, window_pool=window_pool, chunk=C)
        assert s.backend.has_local_attention and not s.draft_extend.has_local_attention  # the draft is a plain Llama
        rng, P, D = random.Random(page), s.runner.page_size, s.spec.speculative_num_draft_tokens
        hi = s.model_config.context_len - D
        modes, pairs, _ = side_by_side(s, "fa3")
        ours_r, own_r = pairs["verify"]
        seen, straddled = set(), 0
        for step in range(10):
            replayed = step % 4 != 3
            n = rng.randint(1, max(s.sizes))
            rows, seq = rng.sample(range(1, ROWS), n), verify_lens(rng, n, hi, D)
            with s.active():
                drive(ours_r, verify(s, rows, seq, random.Random(step)), "verify", n, replayed, bare=step % 5 == 4)
                drive(own_r, verify(s, rows, seq, random.Random(step)), "verify", n, replayed=False)
            ours, theirs = ours_r.backend, own_r.backend
            assert ours._ours is not None
            what = f"verify page {P} step {step}"
            same(ours.forward_metadata, theirs.forward_metadata, n, P, what)
            mine, want = ours.forward_metadata.local_attn_metadata, theirs.forward_metadata.local_attn_metadata
            want_items = items(want, want.local_seqused_k.numel(), P)
            assert items(mine, 2 * n, P) == want_items, what
            assert int(mine.local_max_query_len) >= int(want.local_max_query_len), what  # a bound of FA3's grid
            straddled += len(want_items) - n
            seen.add(replayed)
            if replayed:  # SGLang's own, replayed on the same batch: no chunks
                with s.active():
                    drive(own_r, verify(s, rows, seq, random.Random(step)), "verify", n, replayed=True)
                assert own_r.backend.forward_metadata.local_attn_metadata is None, what
        assert seen == {True, False} and straddled, (seen, straddled)


def test_eagle_topk4_on_a_local_attention_model_is_refused():
    with pytest.MonkeyPatch.context() as mp:
        fake_fa3.into_sglang(mp)
        with pytest.raises(OptionsError, match="chunked local attention under EAGLE topk > 1"):
            Server(["--attention-backend", "attnmeta_fa3", *eagle(4)], seed=1, window=C, chunk=C)


def test_an_artifact_without_the_chunk_is_refused_by_name():
    import attrs

    from attnmeta.compiler import compile_backend

    with pytest.MonkeyPatch.context() as mp:
        fake_fa3.into_sglang(mp)
        from attnmeta.integrations.sglang.fa3 import FA3Backend

        s = Server(["--attention-backend", "attnmeta_fa3"], seed=1, window=C, chunk=C)
        other = compile_backend("flashattention", attrs.evolve(s.backend.attnmeta.compiled.options, backend=None))
        with s.active(), pytest.raises(OptionsError, match=f"attention_chunk: compiled 0, SGLang {C}"):
            FA3Backend(s.runner, compiled=other)
