"""The generated staging code against the general path it stands in for: the same staged bytes for
every batch, the same error for every bad one, and the general path taken only where it must be."""

import random

import pytest
import torch

from attnmeta.backends.dsv4.eager import swa_table
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import BatchError, ForwardBatch, ReplayView
from attnmeta.runtime.stagegen import generate, source
from tests.batches import make_pool

L, ROWS, MAX_BS, D = 300, 12, 8, 3
M = ForwardMode


class Counting:
    """A stager's general path, counted."""

    def __init__(self, stager):
        self.general, self.calls = stager.stage, 0

    def __call__(self, *a):
        self.calls += 1
        return self.general(*a)


def backend(name: str):
    modes = ("decode", "idle", "target_verify", "draft_extend")
    opts = CompileOptions(max_bs=MAX_BS, capture_sizes=(4, MAX_BS), max_context_len=L, num_draft_tokens=D,
                          modes=modes if name in ("dsv4", "flashinfer", "triton") else ("decode", "idle"))
    pools = {"full_to_swa": swa_table(ROWS * L + 1, "cpu")} if name == "dsv4" else None
    return compile_backend(name, opts).instantiate(make_pool(ROWS, L, 1), pools=pools)


def batch(mode, raw: int, rng: random.Random, **bad) -> ForwardBatch:
    per = D if mode in (M.TARGET_VERIFY, M.DRAFT_EXTEND) else 1
    seq = torch.tensor([rng.randint(D + 1, L - D) for _ in range(raw)], dtype=torch.int32)
    rpi = torch.tensor(rng.sample(range(1, ROWS), raw), dtype=torch.int64)
    ext = torch.tensor([rng.randint(1, D) for _ in range(raw)], dtype=torch.int32)
    loc = torch.tensor([rng.randrange(1, ROWS * L) for _ in range(raw * per)], dtype=torch.int64)
    fields = dict(req_pool_indices=rpi, req_pool_indices_cpu=rpi.clone(), seq_lens=seq, seq_lens_cpu=seq.clone(),
                  seq_lens_sum=int(seq.sum()), out_cache_loc=loc, extend_seq_lens=ext, extend_seq_lens_cpu=ext.clone())
    return ForwardBatch(mode, raw, **(fields | bad))


def staged(stager) -> list[bytes]:
    return [bytes(host.numpy().tobytes()) for _, host in stager.copies]


def outcome(fn, view, bs, raw):
    try:
        fn(view, bs, raw)
    except BatchError as e:
        return str(e)
    return None


def variants(mode, raw: int, rng: random.Random):
    """A good batch, then the ways engines get a batch wrong or merely unusual."""
    good = batch(mode, raw, rng)
    yield "good", good
    yield "list", batch(mode, raw, rng, seq_lens_cpu=good.seq_lens_cpu.tolist())
    yield "int64 lengths", batch(mode, raw, rng, seq_lens_cpu=good.seq_lens_cpu.long())
    yield "strided", batch(mode, raw, rng, seq_lens_cpu=torch.stack([good.seq_lens_cpu] * 2, 1)[:, 0])
    yield "too long", batch(mode, raw, rng, seq_lens_cpu=good.seq_lens_cpu + L)
    yield "negative row", batch(mode, raw, rng, req_pool_indices_cpu=-good.req_pool_indices_cpu)
    yield "row 0", batch(mode, raw, rng, req_pool_indices_cpu=good.req_pool_indices_cpu * 0)
    yield "short", batch(mode, raw, rng, seq_lens_cpu=good.seq_lens_cpu[: raw - 1])
    yield "no mirror", batch(mode, raw, rng, seq_lens_cpu=None, req_pool_indices_cpu=None)


def edges(st, mode, raw: int, rng: random.Random):
    """Each checked field at its bound and one past it, in the last live row."""
    for s in st.slots:
        for v in (s.hi, s.hi + 1, s.lo - 1):
            fb = batch(mode, raw, rng)
            x = getattr(fb, s.source)
            if x is not None and s.slot.kind.value != "value":
                x = x.clone()
                x[raw * s.per_row - 1] = v
                setattr(fb, s.source, x)
                yield f"{s.source} = {v}", fb


@pytest.mark.parametrize("name", ["flashattention", "flashinfer", "triton", "dsv4", "tbo_flashinfer"])
def test_generated_staging_equals_the_general_path(name):
    be = backend(name)
    rng = random.Random(name)
    modes = [m for m in (M.DECODE, M.TARGET_VERIFY, M.DRAFT_EXTEND) if m in be.compiled.generic]
    fails = []
    for step in range(12):
        mode, raw = modes[step % len(modes)], rng.randint(1, MAX_BS)
        bs = 4 if raw <= 4 else MAX_BS
        st = be.bound(mode, bs).stager
        for what, fb in [*variants(mode, raw, rng), *edges(st, mode, raw, rng)]:
            view = ReplayView.of(fb, bs)
            fast = outcome(st.fast, view, bs, raw)
            got = staged(st)
            slow = outcome(st.stage, view, bs, raw)
            if (fast, got) != (slow, staged(st)):
                fails.append((step, mode.name, raw, what, fast, slow))
    assert not fails, fails


@pytest.mark.parametrize("name", ["flashattention", "dsv4"])
def test_the_common_case_never_takes_the_general_path(name):
    be = backend(name)
    rng = random.Random(7)
    for mode in (M.DECODE, M.TARGET_VERIFY) if name == "dsv4" else (M.DECODE,):
        for bs in (4, MAX_BS):
            st = be.bound(mode, bs).stager
            count = Counting(st)
            st.stage = count  # the generated code binds the general path when it is generated
            st.fast = generate(st)
            for raw in (1, 3, bs, bs, 2):  # shrinking batches leave rows to pad with the fill
                if raw > bs:
                    continue
                st.fast(ReplayView.of(batch(mode, raw, rng), bs), bs, raw)
            st.fast(ReplayView.of(ForwardBatch(M.IDLE, 0), bs), bs, 0)
            assert count.calls == 1, (mode, bs)  # IDLE only: it has no rows to copy
            assert "general(" in source(st) and "memmove(P0" in source(st)


def test_padding_rows_hold_the_fill_and_full_batches_skip_the_pad():
    """Sizes of one mode share the staging buffer: after any sequence of batch sizes, the rows past
    the live ones up to the plan's size hold each slot's fill (read back from the staged bytes). A
    full batch below the buffer's capacity calls no pad: it has nothing to pad (it used to call a
    no-op pad per slot every step)."""
    be = backend("flashattention")
    rng = random.Random(3)
    calls = []

    def counted(slot):
        def pad(live, total):
            calls.append(slot.source)
            slot.pad(live, total)
        return pad

    for bs in (4, MAX_BS):
        st = be.bound(M.DECODE, bs).stager
        for i, slot in enumerate(st.slots):
            st.fast.__globals__[f"PAD{i}"] = counted(slot)
    for step, (bs, raw) in enumerate([(8, 8), (4, 1), (8, 6), (4, 4), (8, 2), (8, 8), (4, 3), (4, 4), (4, 4)]):
        st = be.bound(M.DECODE, bs).stager
        calls.clear()
        st.fast(ReplayView.of(batch(M.DECODE, raw, rng), bs), bs, raw)
        for s in st.slots:
            assert (s.np[raw * s.per_row : bs * s.per_row] == s.fill).all(), (step, s.source)
        if step == 8:  # the same full batch of 4 again (the buffer holds 8 rows): nothing to pad
            assert calls == [], calls
