"""FlashMLA metadata (SGLang's ``flashmla`` on Hopper, DeepSeek and Kimi), declared once.

FlashMLA reads a page table of 64-token pages (``block_kv_indices``: page ids, as SGLang's
``create_flashmla_kv_indices_triton`` writes them), the int32 key lengths (``cache_seqlens``),
and its tile scheduler's output (``tile_scheduler_metadata``, ``num_splits``), which SGLang
computes every step with FlashMLA's ``get_mla_metadata``. Here the scheduler is a kernel recorded
with the metadata (``backends/flashmla/planner.py``): its planner plans into the fields it binds and does
no host work. Keys: decode the sequence; target verify the prefix and the D drafts; draft extend
(V2) the prefix and a window of D, as SGLang aligns it. The scheduler's part count follows the
query tokens per KV head (heads x query tokens per request) and the device's SMs (``sm_count``).
"""

from __future__ import annotations

from attnmeta.backends.flashmla.planner import META_WORDS, SCHEDULER, num_sm_parts, standins
from attnmeta.compiler import BackendSpec, CompileOptions, ForwardMode
from attnmeta.compiler.ir import DType, Graph, SpecBuilder

from ..common import decode_inputs, extend_lens, verify_headroom

I32 = DType.int32
PAGE = 64  # FlashMLA's page size


def headroom(mode: ForwardMode, options: CompileOptions) -> int:
    """Keys past seq_lens: verify's D drafts; draft extend's window of D after at least one accepted
    token (seq - extend + D <= L): a sequence up to L - (D - 1) is served whatever its extend length,
    a longer one when its extend length covers the window (the bound ``build`` declares per row)."""
    return options.num_draft_tokens - 1 if mode.is_draft_extend() else verify_headroom(mode, options)


# draft extend reads seq - extend + D keys: the bound follows each row's own extend length, as SGLang's does
# (lengths L and L - 1 at a context of L are served after a full window of D accepted tokens)
DRAFT_EXTEND_KEYS = "L - D + extend_seq_lens"


def build(mode: ForwardMode, options: CompileOptions) -> Graph:
    b = SpecBuilder(f"flashmla.{mode.name.lower()}")
    seq_lens, rpi, req_to_token = decode_inputs(b, headroom(mode, options),
                                                hi=DRAFT_EXTEND_KEYS if mode.is_draft_extend() else None)
    D = options.num_draft_tokens
    q = D if mode.is_target_verify() or mode.is_draft_extend() else 1  # query tokens per request
    ext = extend_lens(b, hi="D") if mode.is_draft_extend() else None
    with b.in_graph():
        if mode.is_target_verify():
            keys = b.ewise("add", seq_lens, D, name="cache_seqlens")
        elif ext is not None:  # the prefix, then a window of D: keys end window-aligned
            keys = b.ewise("add", b.ewise("sub", seq_lens, ext), D, name="cache_seqlens")
        else:
            keys = seq_lens
        table = b.page_table(req_to_token, rpi, keys, page_size=PAGE, width=f"floor((L + {PAGE})/{PAGE})",
                             name="block_kv_indices")
        parts = num_sm_parts(options.sm_count, q * options.num_heads)
        meta = b.full(0, [parts, META_WORDS], I32, name="tile_scheduler_metadata")
        splits = b.full(0, ["bs + 1"], I32, name="num_splits")
    with b.out_graph():
        plan = b.host_call(SCHEDULER, name="plan", binds=dict(cache_seqlens=keys, tile_scheduler_metadata=meta,
                                                               num_splits=splits))
    b.outputs(block_kv_indices=table, cache_seqlens=keys, tile_scheduler_metadata=meta, num_splits=splits,
              plan=plan)
    return b.build()


SPEC = BackendSpec("flashmla", build, (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND),
                   doc="FlashMLA (Hopper MLA): 64-token page table, int32 key lengths, its tile scheduler in-graph",
                   headroom=headroom, page_sizes=(PAGE,), planners=standins())
