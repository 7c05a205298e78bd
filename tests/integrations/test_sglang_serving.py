"""SGLang's serving flow through attnmeta's backends, from the flags docs/SGLANG.md documents.

Each case starts from a command line, resolved by SGLang (``sglang_server.Server``), builds the
backends through SGLang's own setup code, registry and EAGLE draft factory, and serves what the
server sends: prefill and chunked/mixed extend, decode, idle, target verify, EAGLE draft decode and
draft extend V2, eagerly and under the three graph runners (padded, viewed, replayed). Every step's
metadata is compared with **SGLang's own backend of the same kind**, built on the same runner and
handed the same batch (eagerly, or through the same runner view after the same capture): on the rows
its kernels read, values equal."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch

from attnmeta.backends.triton.spec import TritonOptions
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.integrations.sglang.backend import TritonBackend
from attnmeta.integrations.sglang.draft import TritonDraftBackend
from tests.integrations.sglang_server import (
    ROWS,
    Runners,
    Server,
    decode,
    decode_view,
    draft_decode,
    draft_decode_view,
    draft_extend,
    draft_extend_view,
    prefill,
    rows_read,
    verify,
)

# the launch flags of docs/SGLANG.md (tests/integrations/test_sglang_docs.py holds the doc to these)
FLAGS = {
    "plain": ["--attention-backend", "attnmeta_triton"],
    "page16": ["--attention-backend", "attnmeta_triton", "--page-size", "16"],
    "tp2": ["--attention-backend", "attnmeta_triton", "--tp-size", "2"],
    "hybrid": ["--prefill-attention-backend", "triton", "--decode-attention-backend", "attnmeta_triton"],
    "eagle": ["--attention-backend", "attnmeta_triton", "--speculative-algorithm", "EAGLE"],
    "eagle-page16": ["--attention-backend", "attnmeta_triton", "--page-size", "16", "--speculative-algorithm",
                     "EAGLE"],
    "eagle-topk1": ["--attention-backend", "attnmeta_triton", "--speculative-algorithm", "EAGLE",
                    "--speculative-eagle-topk", "1", "--speculative-num-steps", "3",
                    "--speculative-num-draft-tokens", "4"],
}


def lens(rng: random.Random, n: int, hi: int) -> list[int]:
    """Lengths at 1, around the page and split edges, and the longest a mode allows."""
    edges = [1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 257, hi - 1, hi]
    return [rng.choice(edges) if rng.random() < 0.5 else rng.randint(1, hi) for _ in range(n)]


def same(ours, theirs, fields, live: int, what: str) -> None:
    """Field by field, on the rows kernels read (``sglang_runners.rows_read``)."""
    for f in fields:
        a, b = rows_read(ours, theirs, f, live)
        if not isinstance(b, torch.Tensor):
            assert a == b, (what, f, a, b)
            continue
        bad = (a.long() != b.long()).nonzero().flatten().tolist() if a.shape == b.shape else "shape"
        assert torch.equal(a.long(), b.long()), (what, f, live, a.shape, b.shape, bad[:4] if bad != "shape" else bad,
                                                 [(a[i].item(), b[i].item()) for i in bad[:4]] if bad != "shape" else 0)


DECODE_FIELDS = ("kv_indptr", "kv_indices", "num_kv_splits", "max_extend_len", "qo_indptr", "mask_indptr")
VERIFY_FIELDS = ("kv_indptr", "kv_indices", "qo_indptr", "mask_indptr", "custom_mask", "max_extend_len")
EXTEND_FIELDS = ("kv_indptr", "kv_indices", "qo_indptr", "max_extend_len")


@pytest.fixture(scope="module", params=sorted(FLAGS))
def server(request):
    return Server(FLAGS[request.param], seed=len(request.param))


def target(server):
    """attnmeta's decode-side backend (the hybrid wrapper's decode child)."""
    return getattr(server.backend, "decode_backend", server.backend)


def test_sglang_built_attnmeta_from_its_resolved_flags(server):
    """The backend is SGLang's own triton backend, built by SGLang's setup from the flags, compiled
    with what SGLang resolved: heads per attention-TP rank, capture sizes, the request table's
    width, EAGLE's model-dependent defaults."""
    be = target(server)
    assert isinstance(be, TritonBackend)
    o, own = be.attnmeta.compiled.options, server.own("triton")
    assert (o.num_heads, o.num_kv_heads, o.of(TritonOptions).max_kv_splits) == (own.num_head, own.num_kv_head,
                                                                                own.max_kv_splits)
    assert o.max_context_len == server.runner.req_to_token_pool.req_to_token.shape[1] > server.model_config.context_len
    assert o.capture_sizes == server.sizes and o.max_bs == max(server.sizes)
    assert o.page_size == server.runner.page_size
    if server.speculative:
        s = server.spec
        assert (o.num_draft_tokens, o.topk, o.num_steps) == (s.speculative_num_draft_tokens,
                                                             s.speculative_eagle_topk, s.speculative_num_steps)
        assert isinstance(server.draft_decode, TritonDraftBackend) and isinstance(server.draft_extend, TritonBackend)
    if server.args.tp_size == 2:
        assert o.num_heads == server.model_config.num_attention_heads // 2


def test_prefill_and_mixed_are_sglangs_own(server):
    """Prefill and mixed batches are SGLang's code paths: attnmeta's backend leaves them to its own
    class, whose metadata equals SGLang's backend's."""
    rng = random.Random(1)
    with server.active():
        own = server.own("triton")
        for mixed in (False, True):
            rows = rng.sample(range(1, ROWS), 3)
            prefix, new = [0, 17, 300], [5, 64, 1]
            for be in (server.backend, own):
                be.init_forward_metadata(prefill(server, rows, prefix, new, mixed))
            prefill_side = getattr(server.backend, "prefill_backend", server.backend)
            same(prefill_side.forward_metadata, own.forward_metadata, EXTEND_FIELDS, 3, "prefill")


def test_every_step_equals_sglangs_own_backend(server):
    """Modes interleaved step by step, eager and replayed, against SGLang's own triton backend (and
    drafters) on the same runner and batches."""
    rng = random.Random(7)
    be, own = target(server), server.own("triton")
    spec = server.spec if server.speculative else None
    L = server.model_config.context_len
    D = spec.speculative_num_draft_tokens if spec else 1
    mine_r, own_r = Runners(server, be, "triton", D), Runners(server, own, "triton", D)
    with server.active():
        for r in (mine_r, own_r):
            r.capture(lambda bs, r=r: decode(server, [0] * bs, [r.fill] * bs), "decode")
            if spec:
                r.capture(lambda bs, r=r: verify(server, [0] * bs, [r.fill] * bs, random.Random(bs)), "verify")
    drafters = None
    if spec:
        own_dd, own_de = server.own_drafters("triton")
        K = spec.speculative_eagle_topk
        drafters = [(Runners(server, server.draft_decode, "d", K), Runners(server, own_dd, "d", K)),
                    (Runners(server, server.draft_extend, "e", D), Runners(server, own_de, "e", D))]
        with server.active():
            for r in drafters[0]:
                r.capture(lambda bs: draft_decode(server, [0] * bs, [1] * bs), "draft")
            for r in drafters[1]:
                r.capture(lambda bs: draft_extend(server, [0] * bs, [1] * bs), "extend")
    modes = ["decode", "idle"] + (["verify", "draft_decode", "draft_extend"] if spec else [])
    seen = set()
    for step in range(40):
        mode, replayed = modes[step % len(modes)] if step < 2 * len(modes) else rng.choice(modes), step % 3 != 2
        seen.add((mode, replayed or mode == "idle"))
        n = rng.randint(1, max(server.sizes))
        rows = rng.sample(range(1, ROWS), n)
        with server.active():
            if mode in ("decode", "idle"):
                fb = decode(server, rows, lens(rng, n, L), idle=mode == "idle")
                if mode == "idle":  # an idle rank replays the decode graph (SGLang's eager path needs rows)
                    n, replayed = 0, True
                check_pair(mine_r, own_r, fb, replayed, "decode", decode_view, DECODE_FIELDS, n, 1)
            elif mode == "verify":
                seq = lens(rng, n, L)
                for r in (mine_r, own_r):
                    fb = verify(server, rows, seq, random.Random(step))
                    drive(r, fb, replayed, "verify", decode_view, D)
                same(be.forward_metadata, theirs(own_r, fb, replayed), VERIFY_FIELDS, n, f"verify {step}")
            elif mode == "draft_decode":
                seq = lens(rng, n, L - spec.speculative_eagle_topk * spec.speculative_num_steps)
                mine, sglangs = drafters[0]
                for r in drafters[0]:
                    fb = draft_decode(server, rows, seq)
                    drive(r, fb, replayed, "draft", draft_decode_view, None)
                for i, s_mine in enumerate(mine.backend.attn_backends):
                    same(s_mine.forward_metadata, theirs(sglangs, fb, replayed, i), ("kv_indptr", "kv_indices",
                         "num_kv_splits"), n * spec.speculative_eagle_topk, f"draft decode {step} step {i}")
            else:
                prefix = lens(rng, n, L)
                for r in drafters[1]:
                    fb = draft_extend(server, rows, prefix)
                    drive(r, fb, replayed, "extend", draft_extend_view, D)
                same(drafters[1][0].backend.forward_metadata, theirs(drafters[1][1], fb, replayed), EXTEND_FIELDS,
                     n, f"draft extend {step}")
    # every mode eager and replayed (idle: replayed only)
    assert seen >= {(m, r) for m in modes for r in ((True, False) if m != "idle" else (True,))}, seen


def drive(r: Runners, fb, replayed: bool, key: str, view, width) -> None:
    """One step through runner ``r``: eagerly, or padded to its bucket, viewed and replayed."""
    if not replayed:
        r.backend.init_forward_metadata(fb)
        return
    bs = r.bucket(max(fb.batch_size, 1))
    v = view(fb, bs, r.fill) if width is None else view(fb, bs, r.fill, width)
    r.replay(fb, key, v)


def check_pair(mine_r, own_r, fb, replayed, key, view, fields, live, width) -> None:
    for r in (mine_r, own_r):
        drive(r, fb, replayed, key, view, width)
    same(mine_r.backend.forward_metadata, theirs(own_r, fb, replayed), fields, live, f"{key} replayed={replayed}")


def theirs(r: Runners, fb, replayed: bool, step: int | None = None):
    """SGLang's metadata for the step just driven: after an eager step its ``forward_metadata``; after a
    replay what its captured kernels read, which SGLang's own ``_build_cuda_graph_forward_metadata``
    names (its ``forward_metadata`` object still holds the last capture's views)."""
    b = r.backend if step is None else r.backend.attn_backends[step]
    if not replayed:
        return b.forward_metadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = r.bucket(max(fb.batch_size, 1))
    if step is not None:  # a drafter's step i: its row of the multi-step buffers, the shared split counts
        K = r.backend.topk
        return type(b.forward_metadata)(**{**vars(b.forward_metadata), "kv_indptr": r.backend.kv_indptr[step,
                                          : bs * K + 1], "kv_indices": r.backend.cuda_graph_kv_indices[step],
                                          "num_kv_splits": r.backend.attn_backends[-1].cuda_graph_num_kv_splits})
    mode = ForwardMode.DECODE if fb.forward_mode.is_idle() else fb.forward_mode
    return b._build_cuda_graph_forward_metadata(bs, mode, fb.spec_info)


def test_the_comparison_can_fail():
    """``same`` is the oracle's judge: one wrong index, split count, mask bit or indptr entry fails it."""
    from types import SimpleNamespace

    base = dict(kv_indptr=torch.tensor([0, 3, 5]), kv_indices=torch.arange(5), num_kv_splits=torch.tensor([2, 1]),
                mask_indptr=torch.tensor([0, 4, 8]), custom_mask=torch.ones(8, dtype=torch.bool), max_extend_len=4)
    fields = tuple(base)
    same(SimpleNamespace(**base), SimpleNamespace(**base), fields, 2, "equal")
    for f, bad in (("kv_indices", torch.tensor([0, 1, 2, 3, 9])), ("num_kv_splits", torch.tensor([2, 2])),
                   ("custom_mask", torch.tensor([1, 1, 1, 1, 1, 0, 1, 1], dtype=torch.bool)),
                   ("kv_indptr", torch.tensor([0, 3, 6])), ("max_extend_len", 5)):
        with pytest.raises(AssertionError):
            same(SimpleNamespace(**{**base, f: bad}), SimpleNamespace(**base), fields, 2, f)


def test_a_compiled_artifact_that_disagrees_is_refused_by_name(tmp_path, monkeypatch):
    """ATTNMETA_ARTIFACT compiled for other options than the server resolved: an OptionsError naming
    each option with both values, at start, never a different stride at the first step."""
    from attnmeta.compiler import CompileOptions, compile_backend

    compile_backend("triton", CompileOptions(max_bs=8, num_draft_tokens=4, topk=1, num_steps=3,
                                             modes=("decode", "idle", "target_verify"))).save(
        str(tmp_path / "a.attnmeta"))
    monkeypatch.setenv("ATTNMETA_ARTIFACT", str(tmp_path / "a.attnmeta"))
    with pytest.raises(OptionsError) as e:
        Server(FLAGS["eagle"])
    for named in ("num_draft_tokens: compiled 4, SGLang 8", "topk: compiled 1, SGLang 4", "num_heads: compiled 32",
                  "max_context_len: compiled 4096"):
        assert named in str(e.value)


def test_padding_larger_than_the_batch_is_refused():
    from types import SimpleNamespace

    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from attnmeta.integrations.sglang.batch import BatchView
    from attnmeta.runtime import BatchError

    fb = SimpleNamespace(batch_size=2, forward_mode=ForwardMode.DECODE, num_padding=3, req_pool_indices=None,
                         seq_lens=None, seq_lens_cpu=None)
    with pytest.raises(BatchError, match="num_padding=3 for a batch of 2 rows"):
        BatchView().fill(fb)

