"""Random batches over a random, non-contiguous KV pool (test helper)."""

from __future__ import annotations

import torch

from attnmeta.runtime import ForwardBatch, ForwardMode


def make_pool(rows: int, L: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """req_to_token with row 0 all zero (reserved) and other rows a random slot permutation."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randperm(rows * L, generator=g).to(torch.int32).view(rows, L) + 1
    t[0] = 0
    return t.to(device)


def make_batch(bs: int, L: int, rows: int, seed: int, device="cpu", mode=ForwardMode.DECODE,
               max_len: int | None = None) -> ForwardBatch:
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(1, (max_len or L) + 1, (bs,), generator=g, dtype=torch.int32)
    rpi = torch.randperm(rows - 1, generator=g)[:bs].to(torch.int64) + 1
    return ForwardBatch(mode, bs, req_pool_indices=rpi.to(device), req_pool_indices_cpu=rpi, seq_lens=seq.to(device),
                        seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))


def interp_inputs(fb: ForwardBatch, bs: int, req_to_token: torch.Tensor, fills: dict[str, int]) -> dict:
    """The batch padded to ``bs`` rows with the spec's fill values, as interpreter inputs."""
    raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
    out = {"req_to_token": req_to_token.cpu()}
    for name, fill in fills.items():
        src = getattr(fb, name)
        pad = torch.full((bs - raw,), fill, dtype=torch.int64 if name == "req_pool_indices" else torch.int32)
        if src is None and name.endswith("_cpu"):
            src = getattr(fb, name[: -len("_cpu")])
        live = src[:raw].cpu() if src is not None else pad[:0]
        out[name] = torch.cat([live, pad.to(live.dtype)])
    return out


def capture(backend, fb):
    """out_graph at capture, then in_graph recorded into an emulated graph, as a runner does."""
    from attnmeta.runtime import EmulatedGraph

    backend.init_forward_metadata_out_graph(fb, in_capture=True)
    g = EmulatedGraph()
    with g.capture():
        backend.init_forward_metadata_in_graph(fb)
    return g


def capture_graph(be, fb, dev):
    """What a CUDA graph runner does: out_graph at capture, an eager in_graph (Triton compiles before the capture),
    then in_graph recorded into a new graph of ``dev``."""
    import torch

    from attnmeta.runtime import new_graph

    be.init_forward_metadata_out_graph(fb, in_capture=True)
    be.init_forward_metadata_in_graph(fb)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    g = new_graph(dev)
    with g.capture():
        be.init_forward_metadata_in_graph(fb)
    return g


def capture_on_cuda(be, bs: int, L: int, rows: int, mode, per: int, dev):
    """A plan of ``bs`` rows captured on a real CUDA graph as a runner captures it: a short batch (``per`` write
    slots per request, one accepted token each), out_graph at capture, one warm-up in_graph (Triton compiles
    before the capture), then in_graph recorded."""
    from attnmeta.runtime import CudaGraph

    cap = make_batch(bs, L, rows, seed=bs, max_len=4, mode=mode, device=dev)
    cap.out_cache_loc = torch.zeros(bs * per, dtype=torch.int64, device=dev)
    cap.extend_seq_lens_cpu = torch.ones(bs, dtype=torch.int32)
    cap.extend_seq_lens = cap.extend_seq_lens_cpu.to(dev)
    be.init_forward_metadata_out_graph(cap, in_capture=True)
    be.init_forward_metadata_in_graph(cap)
    torch.cuda.synchronize()
    g = CudaGraph()
    with g.capture():
        be.init_forward_metadata_in_graph(cap)
    return g


def spec_step(raw: int, L: int, rows: int, seed: int, mode, per: int, slots: int, D: int, dev) -> ForwardBatch:
    """A live batch for a captured plan: lengths up to L - D, ``per`` random write slots below ``slots`` per
    request, and 1..D accepted tokens per request (never more than its length)."""
    fb = make_batch(raw, L, rows, seed=seed, mode=mode, device=dev, max_len=L - D)
    fb.out_cache_loc = torch.randint(0, slots, (raw * per,), device=dev)
    fb.extend_seq_lens_cpu = torch.minimum(torch.randint(1, D + 1, (raw,), dtype=torch.int32), fb.seq_lens_cpu)
    fb.extend_seq_lens = fb.extend_seq_lens_cpu.to(dev)
    return fb


def dsv4_special_lengths(L: int, D: int) -> list[int]:
    """Lengths DSV4's fields turn on: 1, multiples of 4/64/128/256 and one either side, the longest."""
    return sorted({1, 2, L - D, L - D - 1} | {m * k + d for m in (4, 64, 128, 256) for k in (1, 2, 4)
                                            for d in (-1, 0, 1) if 1 <= m * k + d <= L - D})


def dsv4_batch(mode, raw: int, rng, L: int, D: int, rows: int) -> ForwardBatch:
    """A DSV4 batch: special lengths 60% of the time (verify leaves D of headroom), distinct pool
    rows, a KV slot per query token (D per request in verify and draft extend)."""
    hi = L - D if mode is ForwardMode.TARGET_VERIFY else L
    special = dsv4_special_lengths(L, D)
    seq = torch.tensor([rng.choice(special + [hi]) if rng.random() < 0.6 else rng.randint(1, hi)
                        for _ in range(raw)], dtype=torch.int32)
    rpi = torch.tensor(rng.sample(range(1, rows), raw), dtype=torch.int64)
    per = 1 if mode is ForwardMode.DECODE else D
    loc = torch.tensor([rng.randrange(rows * L) for _ in range(raw * per)], dtype=torch.int64)
    return ForwardBatch(mode, raw, req_pool_indices=rpi, req_pool_indices_cpu=rpi.clone(), seq_lens=seq,
                        seq_lens_cpu=seq.clone(), seq_lens_sum=int(seq.sum()), out_cache_loc=loc)


def paged_pool(rows: int, L: int, P: int, seed: int) -> torch.Tensor:
    """req_to_token as a paged allocator fills it: each row's pages are whole pages (slot = page * P + offset),
    in random order; row 0 reserved."""
    g = torch.Generator().manual_seed(seed)
    pages = torch.randperm(rows * L // P, generator=g)[: (rows - 1) * L // P].view(rows - 1, L // P) + 1
    t = torch.zeros(rows, L, dtype=torch.int32)
    t[1:] = (pages[:, :, None] * P + torch.arange(P)).reshape(rows - 1, L).to(torch.int32)
    return t


def window_table(rows: int, L: int, P: int, seed: int) -> torch.Tensor:
    """full_to_swa: page-aligned, as SWAKVPool's allocator hands window pages out (slot 0 to 0)."""
    g = torch.Generator().manual_seed(seed)
    n = rows * L // P + 1
    perm = torch.cat([torch.zeros(1, dtype=torch.int64), torch.randperm(n - 1, generator=g) + 1])
    return (perm[:, None] * P + torch.arange(P)).reshape(-1)


def replay_then_eager(be, g, bs: int, make, check) -> None:
    """A captured plan of ``bs`` rows replayed on another full batch, a padded one, an idle one and a full one
    again, then two eager steps at a size never captured (3); ``make(raw, seed)`` draws a batch, ``check(fb, bs)``
    compares what the backend published."""
    from attnmeta.compiler import ForwardMode
    from attnmeta.runtime import ForwardBatch, ReplayView

    for seed, raw in [(11, bs), (12, bs - 1), (13, 0), (14, bs)]:
        fb = make(raw, seed) if raw else ForwardBatch(ForwardMode.IDLE, 0)
        be.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        g.replay()
        check(fb, bs)
    for seed in (21, 22):
        fb = make(3, seed)
        be.init_forward_metadata(fb)
        check(fb, 3)

