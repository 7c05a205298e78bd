"""``attnmeta_flashmla`` built by SGLang's registry from its flags and served through its graph runners'
capture and replay, against SGLang's own ``FlashMLABackend`` built the same way on the same runner and
batches.

Both sides are SGLang's class (attnmeta's subclasses it), so both need, on a CPU, the same stand-ins:
FlashMLA itself (``tests/fake_flash_mla.py``: its scheduler restated independently, the kernels absent)
and FlashInfer's MLA wrappers (the base class's ``__init__`` builds them). SGLang's own metadata code runs
as written: its page-table kernel in the Triton interpreter, its lengths, its scheduler call and copies
into its graph buffers. Compared on every step of decode, target verify and draft extend V2 interleaved,
eager and replayed: the pages each row's keys cover, draft extend's key lengths, and the whole tile
schedule FlashMLA's kernel reads (every part's seven words, ``num_splits``). The schedule itself is
checked against the real FlashMLA on the H200 (``tests/gpu/test_flashmla_schedule.py``)."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.trtllm_mla_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch

from attnmeta.backends.flashmla.planner import SCHEDULED
from attnmeta.compiler.ir.errors import OptionsError
from tests import fake_flash_mla
from tests.integrations.served_pairs import serve, side_by_side
from tests.integrations.sglang_server import ROWS, Server, decode
from tests.integrations.test_sglang_serving import lens

EAGLE = ["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "1", "--speculative-num-steps", "3",
         "--speculative-num-draft-tokens", "4"]
CASES = {"page64-eagle": ["--page-size", "64", *EAGLE], "no-page-size": []}


@pytest.fixture(scope="module", params=sorted(CASES))
def server(request):
    with pytest.MonkeyPatch.context() as mp:
        fake_flash_mla.into_sglang(mp)
        yield Server(["--attention-backend", "attnmeta_flashmla", *CASES[request.param]], seed=17,
                     model="deepseek-h128")


def test_sglang_built_attnmeta_flashmla_from_its_flags(server):
    from attnmeta.integrations.sglang.flashmla import FlashMLABackend

    s = server
    assert type(s.backend) is FlashMLABackend
    o = s.backend.attnmeta.compiled.options
    # FlashMLA's 64-token pages, set by SGLang's own page rule for the kind even where no page size was given
    assert s.runner.page_size == 64 and o.page_size == 64 and o.max_bs == max(s.sizes)
    assert o.num_heads == s.model_config.num_attention_heads and o.sm_count == fake_flash_mla.SMS
    if s.speculative:  # draft extend compiled; draft decode SGLang's own FlashMLA drafter
        assert isinstance(s.draft_extend, FlashMLABackend)
        assert not hasattr(s.draft_decode, "attnmeta")


def _same(ours, theirs, keys: list[int], rows: int, extend: bool, what: str) -> None:
    """``keys``: each live request's key count; ``rows``: the rows the schedule covers (a replay's padded)."""
    for i, k in enumerate(keys):
        pages = -(-k // 64)
        assert ours.block_kv_indices[i, :pages].tolist() == theirs.block_kv_indices[i, :pages].tolist(), (what, i)
    a, b = ours.flashmla_metadata, theirs.flashmla_metadata
    assert a.shape[0] == b.shape[0], (what, "parts")
    assert a[:, :SCHEDULED].tolist() == b[:, :SCHEDULED].tolist(), (what, "tile_scheduler_metadata")
    assert ours.num_splits[: rows + 1].tolist() == theirs.num_splits[: rows + 1].tolist(), (what, "num_splits")
    if extend:  # the kernel's key lengths come from the metadata in draft extend only
        assert ours.seq_lens_k[: len(keys)].tolist() == theirs.seq_lens_k[: len(keys)].tolist(), what


def test_every_step_equals_sglangs_own_flashmla(server):
    s, rng = server, random.Random(5)
    modes, pairs, D = side_by_side(s, "flashmla")
    L = s.model_config.context_len
    key_edges = [64, 65, 128, 129, 63, 127, L - D]  # keys at page and block edges (a verify's count its drafts)
    for step in range(20):
        mode, replayed = modes[step % len(modes)], step % 4 != 3
        n = rng.randint(1, max(s.sizes))
        rows = rng.sample(range(1, ROWS), n)
        extra = 0 if mode == "decode" else D
        seq = [rng.choice(key_edges) - extra for _ in range(n)] if step % 3 != 2 else lens(rng, n, L - 2 * D)
        runners = pairs[mode]
        serve(s, runners, mode, rows, seq, step, replayed, bare=step % 5 == 4)
        keys = seq if mode == "decode" else [x + D for x in seq]  # verify: the drafts; extend: its window
        _same(runners[0].backend.forward_metadata, runners[1].backend.forward_metadata, keys,
              runners[0].bucket(n) if replayed else n, mode == "extend", f"{mode} step {step} replayed={replayed}")


def test_an_fp8_cache_and_a_multi_head_model_are_refused_by_name(server):
    from attnmeta.integrations.sglang.registry import factory

    s = server
    with s.active():
        r = object.__new__(type(s.runner))
        r.__dict__.update(s.runner.__dict__)
        r.kv_cache_dtype = torch.float8_e4m3fn
        with pytest.raises(OptionsError, match="does not plan an FP8 KV cache; serve this configuration with "
                                               "SGLang's own backend"):
            factory("flashmla")(r)
        r.use_mla_backend = False
        with pytest.raises(OptionsError, match="attnmeta_flashmla serves MLA models"):
            factory("flashmla")(r)


def test_the_comparison_can_fail(server):
    """A schedule word, a split count and a page one off are each caught."""
    s = server
    with s.active():
        s.backend.init_forward_metadata(decode(s, [3, 5], [70, 700]))
    m = s.backend.forward_metadata
    _same(m, m, [70, 700], 2, False, "itself")
    for field, at in (("flashmla_metadata", (1, 3)), ("num_splits", (1,)), ("block_kv_indices", (1, 1))):
        twin = type(m)(m.flashmla_metadata.clone(), m.num_splits.clone(), m.block_kv_indices.clone())
        getattr(twin, field)[at] += 1
        with pytest.raises(AssertionError):
            _same(m, twin, [70, 700], 2, False, field)
