"""A new backend, complete: paged decode metadata for a kernel that reads a page table and
per-request lengths (the shape of FlashAttention's or an XQA-style decode), plus the host indptr
a planner would want. Compile it with

    attnmeta compile examples/mine.py:SPEC --max-bs 64 --page-size 16
    attnmeta compile examples/mine.py:SPEC --out mine.attnmeta     # ahead of serving

and serve it with examples/serve.py.
"""

from attnmeta.compiler import BackendSpec, ForwardMode
from attnmeta.compiler.ir import DType, Kind, Placement, SpecBuilder


def build(mode, options):
    b = SpecBuilder(f"mine.{mode.name.lower()}")
    # the batch, as the engine hands it: device tensors with their host mirrors
    seq_lens = b.input("seq_lens", DType.int32, ["bs"], fill=1, mirror="seq_lens_cpu", kind=Kind.length)
    seq_lens_cpu = b.input("seq_lens_cpu", DType.int32, ["bs"], Placement.host, fill=1, kind=Kind.length)
    rows = b.input("req_pool_indices", DType.int64, ["bs"], fill=0, mirror="req_pool_indices_cpu", kind=Kind.row)
    req_to_token = b.pool("req_to_token", DType.int32, ["R", "L"])
    with b.in_graph():  # recorded into the CUDA graph: every replay recomputes it from the staged batch
        # the page of each P-token block, as many columns as the longest sequence can need: ceil(L/P)
        page_table = b.page_table(req_to_token, rows, seq_lens, page_size=options.page_size, width="W")
        cache_seqlens = b.copy(seq_lens)
        cu_seqlens_k = b.cumsum(seq_lens)
    with b.out_graph():  # host work before every replay: only what a host planner reads
        indptr_host = b.cumsum(seq_lens_cpu)
    b.outputs(page_table=page_table, cache_seqlens=cache_seqlens, cu_seqlens_k=cu_seqlens_k,
              kv_indptr_host=indptr_host)
    return b.build()


SPEC = BackendSpec("mine", build, (ForwardMode.DECODE,), doc="paged decode: page table, lengths, indptrs")
