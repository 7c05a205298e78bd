"""Embedding a compiled backend in a serving loop: the three-method contract by hand.

    attnmeta compile examples/mine.py:SPEC --page-size 16 --max-bs 32 --out mine.attnmeta
    python examples/serve.py --artifact mine.attnmeta        # loads it: no pass runs at startup
    python examples/serve.py                                # compiles examples/mine.py in-process

Per captured size, the loop captures the metadata graph once (out_graph with in_capture=True,
then in_graph recorded). Every step stages the real rows (the backend pads them), then replays
the graph of the next captured size; the page table the kernel would read is checked against
the pool each step. On a CPU the graph is attnmeta's emulated one; on a GPU a CUDA graph.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch

from attnmeta.compiler import CompileOptions, compile_backend, load_compiled
from attnmeta.runtime import ForwardBatch, ForwardMode, ReplayView, new_graph

HERE = os.path.dirname(os.path.abspath(__file__))


def serve(compiled, steps: int, device: torch.device, seed: int = 0, started: float | None = None) -> int:
    opts = compiled.options
    L, P, rows = opts.max_context_len, opts.page_size, opts.max_bs + 1
    # the engine's pool: row 0 reserved for padding; request r's tokens in whole pages of its own
    req_to_token = torch.zeros(rows, L, dtype=torch.int32)
    for r in range(1, rows):
        req_to_token[r] = torch.arange(L, dtype=torch.int32) + r * L
    req_to_token = req_to_token.to(device)
    backend = compiled.instantiate(req_to_token, device=device)
    sizes = sorted(opts.sizes)
    graphs = {}
    for bs in sizes:  # capture: the batch only fixes shapes; replays recompute from the staged rows
        fb = batch(list(range(1, bs + 1)), [1] * bs, device)
        backend.init_forward_metadata_out_graph(fb, in_capture=True)
        graphs[bs] = new_graph(device)
        with graphs[bs].capture():
            backend.init_forward_metadata_in_graph(fb)
    rng = random.Random(seed)
    for step in range(steps):
        raw = rng.randint(1, max(sizes))
        reqs = rng.sample(range(1, rows), raw)
        lens = [rng.randint(1, L) for _ in reqs]
        fb = batch(reqs, lens, device)
        bs = min(s for s in sizes if s >= raw)  # the captured size this batch pads up to
        backend.init_forward_metadata_out_graph(ReplayView.of(fb, bs))
        graphs[bs].replay()
        if step == 0 and started is not None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            print(f"start to first replay: {time.perf_counter() - started:.2f} s")
        pt = backend.forward_metadata.page_table.cpu()
        for i, (r, n) in enumerate(zip(reqs, lens, strict=True)):  # what the kernel reads of each row
            pages = -(-n // P)
            assert pt[i, :pages].tolist() == (req_to_token[r, :pages * P:P] // P).tolist()
    return steps


def batch(reqs: list[int], lens: list[int], device) -> ForwardBatch:
    rows, seq = torch.tensor(reqs, dtype=torch.int64), torch.tensor(lens, dtype=torch.int32)
    return ForwardBatch(ForwardMode.DECODE, len(reqs), req_pool_indices=rows.to(device), req_pool_indices_cpu=rows,
                        seq_lens=seq.to(device), seq_lens_cpu=seq)


def _triton_cache() -> set[str]:
    d = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    return set(os.listdir(d)) if os.path.isdir(d) else set()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--artifact", help="a file written by `attnmeta compile ... --out` (default: compile here)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    started, kernels = time.perf_counter(), _triton_cache()
    if a.artifact:
        compiled = load_compiled(a.artifact)
    else:
        opts = CompileOptions(max_bs=32, capture_sizes=(1, 4, 16, 32), page_size=16, max_context_len=1024)
        compiled = compile_backend(os.path.join(HERE, "mine.py") + ":SPEC", opts)
    print(f"{'loaded' if a.artifact else 'compiled'} in {time.perf_counter() - started:.2f} s")
    n = serve(compiled, a.steps, torch.device(a.device), started=started)
    print(f"served {n} steps of {compiled.spec.name} on {a.device}: every page table checked")
    # Triton caches each compiled kernel in a directory of its own
    print(f"Triton kernels compiled by this start: {len(_triton_cache() - kernels)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
