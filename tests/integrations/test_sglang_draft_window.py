"""attnmeta's triton drafter under SGLang's draft window (``--speculative-draft-window-size`` W,
``--speculative-draft-sink-size`` S: the drafter, not the target, attends to each prefix's first S tokens and last
W, then its drafts), against SGLang's own triton drafter on the same runner: every draft step's ``kv_indptr`` and
``kv_indices`` and the round's split counts, topk 1 and 4, pages 1 and 16, eager and replayed through each drafter's
graph runner; prefixes shorter than S, than W + S, and longer. A drafter whose sink jump is dropped fails it."""

import pytest

pytest.importorskip("sglang.srt.layers.attention.base_attn_backend", reason="SGLang is not installed here; "
                    "make test-sglang runs these")

import random

import torch

from tests.integrations.served_pairs import drive
from tests.integrations.sglang_server import ROWS, Runners, Server, draft_decode, rows_read

W, S = 24, 4


def lens(rng: random.Random, n: int, hi: int) -> list[int]:
    edges = [1, S - 1, S, S + 1, W, W + S - 1, W + S, W + S + 1, 2 * (W + S), hi]
    return [rng.choice(edges) if rng.random() < 0.6 else rng.randint(1, hi) for _ in range(n)]


@pytest.mark.parametrize("page, topk", [(1, 1), (16, 4)], ids=["page1-topk1", "page16-topk4"])
def test_draft_window_steps_equal_sglangs_own_drafter(page, topk):
    s = Server(["--attention-backend", "attnmeta_triton", "--speculative-algorithm", "EAGLE",
                "--speculative-eagle-topk", str(topk), "--speculative-num-steps", "3",
                "--speculative-num-draft-tokens", "4" if topk == 1 else "6", "--page-size", str(page),
                "--speculative-draft-window-size", str(W), "--speculative-draft-sink-size", str(S)], seed=3 + page)
    mine, own = s.draft_decode, s.own_drafters("triton")[0]
    o = mine.attnmeta.compiled.options.backend
    assert (o.draft_window, o.draft_sink) == (W, S) == (own.draft_window_size, own.draft_sink_size)
    steps, K = s.spec.speculative_num_steps, topk
    runners = [Runners(s, mine, "d", K), Runners(s, own, "d", K)]
    with s.active():
        for r in runners:
            r.capture(lambda bs: draft_decode(s, [0] * bs, [1] * bs), "draft")
    rng, L, seen, cut = random.Random(page + topk), s.model_config.context_len, set(), 0
    for step in range(6):
        replayed = step % 3 != 2
        n = rng.randint(1, max(s.sizes))
        rows = rng.sample(range(1, ROWS), n)
        seq = lens(rng, n, L - steps - (K - 1) * -(-(page - 1 + steps) // page) * page)
        with s.active():
            for r in runners:
                drive(r, draft_decode(s, rows, seq), "draft", n, replayed)
        seen.add(replayed)
        for k in range(steps - 1):  # SGLang's drafter runs S - 1 attention steps
            a, b = mine.attn_backends[k].forward_metadata, own.attn_backends[k].forward_metadata
            if replayed:  # what SGLang's captured steps read: its drafter's buffers
                b = type("Read", (), {"kv_indptr": own.kv_indptr[k], "kv_indices": own.cuda_graph_kv_indices[k],
                                      "num_kv_splits": own.attn_backends[-1].cuda_graph_num_kv_splits})
            for f in ("kv_indptr", "kv_indices", "num_kv_splits"):
                x, y = rows_read(a, b, f, n * K)
                assert torch.equal(x.long(), y.long()), (step, k, f, replayed, x[:12].tolist(), y[:12].tolist())
        cut += sum(q > W + S for q in seq)
    assert seen == {True, False} and cut  # replayed and eager; some prefixes were cut to their sink and window
