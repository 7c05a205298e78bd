"""The paged-KV metadata a FlashInfer-style kernel reads, from vLLM's block table, declared once.

vLLM keeps one block table row per scheduled request (row i of its persistent table is request i
of the batch), so the rows are ``arange(bs)``, a constant, and the table is a pool bound once.
Per request: ``ceil(seq / P)`` pages; ``paged_kv_indptr`` their cumulative sum,
``paged_kv_indices`` the pages themselves, ``paged_kv_last_page_len`` the tokens in the last page
(0 for an empty request). All three in the recorded kernel; the planner's host copies of the
indptr and last-page lengths come from the host lengths in out_graph.
"""

from __future__ import annotations

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, Kind, Placement, SpecBuilder

I32, I64 = DType.int32, DType.int64


def _last_page(b: SpecBuilder, seq, pages, P: int):
    """seq - (pages - 1) * P, which is P for an empty request: min() with seq makes it 0."""
    return b.ewise("min", b.ewise("sub", seq, b.ewise("mul", b.ewise("sub", pages, 1), P)), seq)


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    b = SpecBuilder(f"vllm_paged.{mode.name.lower()}")
    P = options.page_size
    seq = b.input("seq_lens", I32, ["bs"], fill=0, mirror="seq_lens_cpu", kind=Kind.length)
    seq_cpu = b.input("seq_lens_cpu", I32, ["bs"], Placement.host, fill=0, kind=Kind.length)
    table = b.pool("block_table", I32, ["R", "W"])
    with b.in_graph():
        pages = b.ewise("ceildiv", seq, P)
        indptr = b.cumsum(pages, name="paged_kv_indptr")
        rows = b.arange("bs", dtype=I64)
        indices = b.ragged_gather(table, rows, pages, indptr, capacity="max_bs*W", name="paged_kv_indices")
        last = _last_page(b, seq, pages, P)
    with b.out_graph():
        pages_cpu = b.ewise("ceildiv", seq_cpu, P)
        indptr_cpu = b.cumsum(pages_cpu, name="paged_kv_indptr_cpu")
        last_cpu = _last_page(b, seq_cpu, pages_cpu, P)
    b.outputs(paged_kv_indptr=indptr, paged_kv_indices=indices, paged_kv_last_page_len=last,
              paged_kv_indptr_cpu=indptr_cpu, paged_kv_last_page_len_cpu=last_cpu,
              ragged={"paged_kv_indices": "paged_kv_indptr"})
    return b.build()


SPEC = BackendSpec("vllm_paged", build, (ForwardMode.DECODE,),
                   doc="vLLM paged KV (FlashInfer layout): paged_kv_indptr/indices/last_page_len from the block table")
