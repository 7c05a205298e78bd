"""FlashInfer decode metadata, declared once.

SGLang plans every FlashInfer wrapper with page_size 1 and a constant
all-ones ``kv_last_page_len``, so ``kv_indices`` are token-slot indices even
on a paged pool. ``plan()`` needs the indptr on the host: it is computed from
the host mirror ``seq_lens_cpu``, never by copying the device indptr back.
"""

from __future__ import annotations

from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, Placement, SpecBuilder

from .common import decode_inputs

I32, I64 = DType.int32, DType.int64
PLANNER = "flashinfer.decode_plan"


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    b = SpecBuilder(f"flashinfer.{mode.name.lower()}")
    seq_lens, rpi, req_to_token = decode_inputs(b)
    seq_lens_cpu = b.input("seq_lens_cpu", I32, ["bs"], Placement.host, fill=1)
    with b.in_graph():
        kv_indptr = b.cumsum(seq_lens, name="kv_indptr")
        kv_indices = b.ragged_gather(req_to_token, rpi, seq_lens, kv_indptr, capacity="max_bs*L", name="kv_indices")
        last_page_len = b.full(1, ["bs"], I32, name="kv_last_page_len")
    with b.out_graph():
        indptr_host = b.cumsum(seq_lens_cpu, name="kv_indptr_host")
        last_page_len_host = b.full(1, ["bs"], I32, Placement.host, name="kv_last_page_len_host")
        plan = b.host_call(PLANNER, indptr_host, last_page_len_host, name="plan")
    b.outputs(kv_indptr=kv_indptr, kv_indices=kv_indices, kv_last_page_len=last_page_len,
              kv_indptr_host=indptr_host, plan=plan, ragged={"kv_indices": "kv_indptr"})
    return b.build()


SPEC = BackendSpec("flashinfer", build, (ForwardMode.DECODE,),
                   doc="FlashInfer paged decode: kv_indptr, kv_indices, kv_last_page_len, host plan()")
