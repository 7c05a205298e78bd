"""attnmeta's backend of a kind beside SGLang's own of the same kind, on one server, driven step by step as
SGLang's graph runners and scheduler drive them: the served tests of the kinds whose EAGLE draft decode
stays SGLang's own (FlashMLA, TRT-LLM MHA and MLA, CuTe-DSL MLA) share this."""

from __future__ import annotations

import random

from tests.integrations.sglang_server import (
    Runners,
    Server,
    decode,
    decode_view,
    draft_decode_view,
    draft_extend,
    draft_extend_view,
    verify,
    without_host_lengths,
)


def side_by_side(s: Server, kind: str) -> tuple[list[str], dict[str, list[Runners]], int]:
    """``(modes, runners, D)``: the modes this server serves through its graphs (an EAGLE target verifies,
    its draft runner draft-extends; a plain server decodes) and for each, ``[attnmeta's, SGLang's own]``
    runners with every size captured; ``D`` the query rows per request of verify and draft extend."""
    D = s.spec.speculative_num_draft_tokens if s.speculative else 1
    target = [Runners(s, s.backend, kind, D), Runners(s, s.own(kind), kind, D)]
    with s.active():
        for r in target:
            if s.speculative:
                r.capture(lambda bs, r=r: verify(s, [0] * bs, [r.fill] * bs, random.Random(bs)), "verify")
            else:
                r.capture(lambda bs, r=r: decode(s, [0] * bs, [r.fill] * bs), "decode")
    if not s.speculative:
        return ["decode"], {"decode": target}, D
    extenders = [Runners(s, s.draft_extend, kind, D), Runners(s, s.own_drafters(kind)[1], kind, D)]
    with s.active():
        for r in extenders:
            r.capture(lambda bs: draft_extend(s, [0] * bs, [1] * bs), "extend")
    return ["verify", "extend"], {"verify": target, "extend": extenders}, D


def serve(s: Server, runners: list[Runners], mode: str, rows: list[int], seq: list[int], step: int,
          replayed: bool, bare: bool) -> None:
    """One step of ``mode`` through each runner: eager, or padded to its captured size and replayed on the
    runner's view. ``bare``: without host lengths, as SGLang's scheduler serves a backend that declares
    ``needs_cpu_seq_lens = False`` (these kinds inherit it from SGLang's classes)."""
    with s.active():
        for r in runners:
            fb = decode(s, rows, seq) if mode == "decode" else draft_extend(s, rows, seq) \
                if mode == "extend" else verify(s, rows, seq, random.Random(step))
            drive(r, fb, mode, len(rows), replayed, bare)


def drive(r: Runners, fb, mode: str, n: int, replayed: bool, bare: bool = False) -> None:
    """Batch ``fb`` of ``n`` requests through runner ``r`` as SGLang's runner of ``mode`` drives it (inside the
    server's ``active()``): eager, or padded to its captured size, viewed (decode and verify: SGLang's replay
    view; draft extend's and draft decode's runners' own) and replayed. ``bare``: without host lengths."""
    if not replayed:
        r.backend.init_forward_metadata(without_host_lengths(fb) if bare else fb)
        return
    bs = r.bucket(n)
    v = draft_extend_view(fb, bs, r.fill, r.width) if mode == "extend" else \
        draft_decode_view(fb, bs, r.fill) if mode == "draft" else decode_view(fb, bs, r.fill, r.width)
    r.replay(fb, mode, without_host_lengths(v) if bare else v)
