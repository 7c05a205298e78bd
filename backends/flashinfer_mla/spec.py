"""FlashInfer MLA metadata (DeepSeek-V2/V3/R1, Kimi: multi-head latent attention), declared once.

SGLang serves an MLA model's ``--attention-backend flashinfer`` with FlashInfer's
``BatchMLAPagedAttentionWrapper``: a query indptr, a kv indptr, token-slot kv indices (FlashInfer
is told pages of one token, whatever the pool's page size) and each request's kv length. Its
``plan()`` reads the two indptrs and the lengths on the host; here all three come from the host
mirror ``seq_lens_cpu``, never from copying device values back. Decode attends one query per
request, not causal; target verify D queries over the prefix and the D drafts, causal (SGLang's
MLA path takes no tree mask: EAGLE topk 1); draft extend (V2) T query slots per request at a
fixed stride over the whole sequence, causal. The planner (``backends/flashinfer_mla/planner.py``) plans
into the four fields its ``binds`` name; its stand-in serves where FlashInfer is absent.
"""

from __future__ import annotations

from attnmeta.backends.flashinfer_mla.planner import MLA_PLANNER, standins
from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, Placement, SpecBuilder

from ..common import decode_inputs, host_seq_lens, verify_headroom

I32 = DType.int32


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    b = SpecBuilder(f"flashinfer_mla.{mode.name.lower()}")
    room = verify_headroom(mode, options)
    seq_lens, rpi, req_to_token = decode_inputs(b, room)
    seq_lens_cpu = host_seq_lens(b, room)
    D = options.num_draft_tokens
    verify = mode.is_target_verify()
    q = D if verify or mode.is_draft_extend() else 1  # query rows per request
    with b.in_graph():
        kv_lens = b.ewise("add", seq_lens, D, name="kv_lens") if verify else seq_lens
        qo_indptr = b.arange("bs + 1", step=q, name="qo_indptr")
        kv_indptr = b.cumsum(kv_lens, name="kv_indptr")
        kv_indices = b.ragged_gather(req_to_token, rpi, kv_lens, kv_indptr, capacity="max_bs*L", name="kv_indices")
    with b.out_graph():
        qo_host = b.arange("bs + 1", step=q, placement=Placement.host, name="qo_indptr_host")
        kv_lens_host = b.ewise("add", seq_lens_cpu, D, name="kv_lens_host") if verify else seq_lens_cpu
        kv_host = b.cumsum(kv_lens_host, name="kv_indptr_host")
        plan = b.host_call(MLA_PLANNER, qo_host, kv_host, kv_lens_host, name="plan", binds=dict(
            qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_lens=kv_lens))
    b.outputs(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_lens=kv_lens, plan=plan,
              qo_indptr_host=qo_host, kv_indptr_host=kv_host, kv_lens_host=kv_lens_host,
              ragged={"kv_indices": "kv_indptr"})
    return b.build()


MODES = (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND)
SPEC = BackendSpec("flashinfer_mla", build, MODES,
                   doc="FlashInfer MLA (DeepSeek, Kimi): qo/kv indptr, kv indices, kv lengths, host MLA plan()",
                   headroom=verify_headroom, planners=standins())
