"""Which tensors the copy nodes of a captured demo graph read: for an initcheck report of a "cudaMemcpy
source" inside ``cudaGraphLaunch`` (docs/RELIABILITY.md). Captures ``tests/gpu/test_cuda_graphs.py``'s
setup for one backend with torch's graph debug mode on, dumps each graph as DOT, and prints every memcpy
and memset node with the CUDA tensors alive in the process that hold its addresses.

    bash tools/h200.sh python3 tools/graph_copies.py flashinfer [bs ...]
"""

from __future__ import annotations

import gc
import os
import re
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attnmeta.runtime.graphs as graphs  # noqa: E402
from attnmeta.compiler import CompileOptions, compile_backend  # noqa: E402
from attnmeta.sim import DecodeModel, GraphRunner  # noqa: E402
from tests.batches import make_pool  # noqa: E402

L, ROWS, MAX_BS, SIZES = 512, 80, 64, (1, 2, 4, 8, 16, 32, 48)


class DebugGraph(graphs.CudaGraph):
    def __init__(self, pool=None) -> None:
        super().__init__(pool)
        # keep_graph: torch keeps the captured cudaGraph_t after instantiating it (debug mode alone did not on
        # torch 2.14: debug_dump found no graph and wrote nothing)
        self.graph = torch.cuda.CUDAGraph(keep_graph=True)
        self.graph.enable_debug_mode()


def owners(ptr: int, tensors: list) -> list[str]:
    out = []
    for t in tensors:
        base = t.untyped_storage().data_ptr()
        if base <= ptr < base + t.untyped_storage().nbytes():
            out.append(f"{tuple(t.shape)} {t.dtype} (storage of {t.untyped_storage().nbytes()} bytes, +{ptr - base})")
    return sorted(set(out))[:4] or ["no live tensor (a graph-pool temporary)"]


def main(argv: list[str]) -> None:
    kind = argv[0] if argv else "flashinfer"
    sizes = [int(x) for x in argv[1:]] or [2]
    graphs.CudaGraph = DebugGraph
    dev = torch.device("cuda")
    pool = make_pool(ROWS, L, seed=3, device=dev)
    be = compile_backend(kind, CompileOptions(max_bs=MAX_BS, capture_sizes=SIZES, max_context_len=L)).instantiate(
        pool, device=dev)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(ROWS * L + 1, 4, 64, generator=g).to(dev)
    v = torch.randn(ROWS * L + 1, 4, 64, generator=g).to(dev)
    runner = GraphRunner(be, DecodeModel(k, v, MAX_BS, L), SIZES, dev)
    runner.capture()
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    for (mode, bs), graph in runner.graphs.items():
        if bs not in sizes:
            continue
        path = os.path.join(tempfile.mkdtemp(), f"{mode.name}-{bs}.dot")
        graph.graph.debug_dump(path)
        if not os.path.exists(path):
            print(f"== {kind} {mode.name} bs {bs}: torch wrote no DOT file (its warnings above say why)")
            continue
        text = open(path).read()
        nodes = re.findall(r'"?(\w+)"?\s*\[[^\]]*label="([^"]*)"', text)
        kinds = [lab.split("|")[0].strip("{} \\n") for _, lab in nodes]
        print(f"== {kind} {mode.name} bs {bs}: {len(nodes)} nodes: {kinds}")
        for _, label in nodes:
            if "MEMCPY" in label.upper() or "MEMSET" in label.upper():
                print("  ", re.sub(r"\\n|\s+", " ", label)[:400])
                for addr in sorted(set(re.findall(r"0x[0-9a-fA-F]{12,}", label))):
                    print(f"     {addr}: {'; '.join(owners(int(addr, 16), tensors))}")


if __name__ == "__main__":
    main(sys.argv[1:])
