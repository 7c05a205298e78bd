"""attnmeta's own backend specs (declared once) and their hand-written eager twins.

They reach the compiler through the ``attnmeta.backends`` entry point (``SPECS``), like any
installed package's specs; ``get_spec`` and ``list_backends`` are the compiler's registry."""

from attnmeta.compiler import BackendSpec, get_spec, list_backends, register_backend

from . import dsv4, flashattention, flashinfer, flashinfer_mla, flashmla, triton, trtllm_mla
from .multistep import multistep
from .tbo import tbo

_BASE = (flashinfer.SPEC, flashattention.SPEC, triton.SPEC, flashinfer_mla.SPEC, trtllm_mla.SPEC,
         trtllm_mla.CUTEDSL_SPEC, flashmla.SPEC, flashattention.TRTLLM_MHA_SPEC)
_EXTRA = (dsv4.SPEC, flashattention.DRAFT_SPEC, multistep(flashinfer.SPEC), multistep(flashinfer_mla.SPEC),
          multistep(triton.SPEC, per_round=("num_kv_splits", "uneven_batch")))
SPECS: dict[str, BackendSpec] = {s.name: s for s in (*_BASE, *(tbo(b) for b in _BASE), *_EXTRA)}

__all__ = ["SPECS", "get_spec", "list_backends", "register_backend"]
