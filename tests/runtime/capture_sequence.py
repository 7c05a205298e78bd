"""SGLang's capture sequence over attnmeta's runtime, shared by the CPU test (emulated graph) and the H200
test (``torch.cuda.CUDAGraph``): one set of static buffers for every size (the graph runner's registry),
sizes largest first, each size: out_graph on the capture batch (``in_capture=True``), two eager in_graph
warm-ups with a synchronize, then the capture of in_graph (each graph with its own memory pool). Then live
batches copied into the same buffers (padded rows: request row 0, the fill length) and replayed."""

from __future__ import annotations

import random

import torch

from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ReplayView, new_graph
from tests.batches import make_pool

ROWS, L, SIZES = 24, 256, (8, 4, 2, 1)  # SGLang captures the largest size first


class Registry:
    """The runner's buffers at the largest size; a size's view is their first ``bs`` rows."""

    def __init__(self, device, fill: int):
        n = max(SIZES)
        self.fill = fill
        self.seq = torch.full((n,), fill, dtype=torch.int64, device=device)
        self.rows = torch.zeros(n, dtype=torch.int64, device=device)
        self.seq_cpu = torch.full((n,), fill, dtype=torch.int64)

    def load(self, rows: list[int], seq: list[int], bs: int) -> ReplayView:
        """A live batch copied in, the rest of ``bs`` padded, and the runner's view of it."""
        n = len(rows)
        self.seq[n:].fill_(self.fill)
        self.rows[n:].zero_()
        self.seq_cpu[n:] = self.fill
        self.seq[:n].copy_(torch.tensor(seq))
        self.rows[:n].copy_(torch.tensor(rows))
        self.seq_cpu[:n] = torch.tensor(seq)
        return ReplayView(bs, ForwardMode.DECODE, ForwardMode.DECODE, n, req_pool_indices=self.rows[:bs],
                          seq_lens=self.seq[:bs], seq_lens_cpu=self.seq_cpu[:bs])


def capture_like_sglang(name: str, device) -> tuple:
    """(backend, registry, graphs, pool) after SGLang's capture sequence (pages of one token)."""
    opts = CompileOptions(max_bs=max(SIZES), capture_sizes=SIZES, max_context_len=L)
    pool = make_pool(ROWS, L, 3).to(device)
    be = compile_backend(name, opts).instantiate(pool, device=device)
    reg, graphs = Registry(device, 1), {}
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for bs in SIZES:
        v = reg.load([], [], bs)
        be.init_forward_metadata_out_graph(v, in_capture=True)
        for _ in range(2):
            sync()
            be.init_forward_metadata_in_graph(v)
        sync()
        g = graphs[bs] = new_graph(device)
        with g.capture():
            be.init_forward_metadata_in_graph(v)
    return be, reg, graphs, pool, opts


def serve_replayed(name: str, device, steps: int = 12, seed: int = 0) -> None:
    """Replays on the registry's buffers, every step's kv indices on the live rows equal to a hand-built list."""
    be, reg, graphs, pool, opts = capture_like_sglang(name, device)
    rng = random.Random(seed)
    host = pool.cpu()
    for step in range(steps):
        n = rng.choice([1, 1, 2, 3, 5, 8])
        bs = min(s for s in SIZES if s >= n)
        rows, seq = rng.sample(range(1, ROWS), n), [rng.randint(1, L - 8) for _ in range(n)]
        be.init_forward_metadata_out_graph(reg.load(rows, seq, bs))  # the first replay is bs 1 on purpose
        graphs[bs].replay()
        got = be.forward_metadata
        # by hand (pages of one token): each request's slots, back to back
        want_ptr = torch.tensor([0, *torch.tensor(seq).cumsum(0).tolist()])
        want_idx = torch.cat([host[r, :s_] for r, s_ in zip(rows, seq, strict=True)])
        ptr = got.kv_indptr[: n + 1].cpu()
        assert torch.equal(ptr.long(), want_ptr), (name, step)
        assert torch.equal(got.kv_indices[: int(ptr[-1])].cpu().long(), want_idx.long()), (name, step)
