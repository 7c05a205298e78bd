"""attnmeta's own backends: one folder each (``<kind>/spec.py``, its planner where it has one, its hand-written
eager twin ``eager.py``), and what they share (``common.py``, ``tbo.py``, ``multistep.py`` and its twin,
``reference.py``'s stand-in planners, ``flashinfer_lib.py``).

The specs reach the compiler through the ``attnmeta.backends`` entry point (``SPECS``), like any installed
package's specs; ``get_spec`` and ``list_backends`` are the compiler's registry. ``get_eager`` is a backend's
twin: the baseline the benchmarks measure and an oracle independent of the compiler."""

from attnmeta.compiler import BackendSpec, get_spec, list_backends, register_backend
from attnmeta.compiler.ir.errors import UnknownName

from .dsv4 import eager as dsv4_eager
from .dsv4 import spec as dsv4
from .flashattention import eager as flashattention_eager
from .flashattention import spec as flashattention
from .flashinfer import eager as flashinfer_eager
from .flashinfer import spec as flashinfer
from .flashinfer_mla import eager as flashinfer_mla_eager
from .flashinfer_mla import spec as flashinfer_mla
from .flashmla import eager as flashmla_eager
from .flashmla import spec as flashmla
from .multistep import multistep
from .multistep_eager import EagerMultiStep
from .tbo import tbo
from .triton import eager as triton_eager
from .triton import spec as triton
from .trtllm_mla import eager as trtllm_mla_eager
from .trtllm_mla import spec as trtllm_mla

_BASE = (flashinfer.SPEC, flashattention.SPEC, triton.SPEC, flashinfer_mla.SPEC, trtllm_mla.SPEC,
         trtllm_mla.CUTEDSL_SPEC, flashmla.SPEC, flashattention.TRTLLM_MHA_SPEC)
# fields an engine's drafter computes once per round over the prefix (as the multistep specs declare them)
PER_ROUND = {"triton": ("num_kv_splits", "uneven_batch")}
_EXTRA = (dsv4.SPEC, flashattention.DRAFT_SPEC, multistep(flashinfer.SPEC), multistep(flashinfer_mla.SPEC),
          multistep(triton.SPEC, per_round=PER_ROUND["triton"], windows=True))
SPECS: dict[str, BackendSpec] = {s.name: s for s in (*_BASE, *(tbo(b) for b in _BASE), *_EXTRA)}

EAGER = {"flashinfer": flashinfer_eager.EagerFlashInferDecode,
         "flashinfer_mla": flashinfer_mla_eager.EagerFlashInferMLA,
         "flashattention": flashattention_eager.EagerFlashAttentionDecode, "triton": triton_eager.EagerTritonDecode,
         "trtllm_mla": trtllm_mla_eager.EagerTRTLLMMLA, "cutedsl_mla": trtllm_mla_eager.EagerTRTLLMMLA,
         "trtllm_mha": flashattention_eager.EagerTRTLLMMHA, "dsv4": dsv4_eager.EagerDSV4Decode,
         "flashattention_draft": flashattention_eager.EagerFlashAttentionDraft,
         "flashmla": flashmla_eager.EagerFlashMLA}


def get_eager(name: str):
    """The twin of a backend; a TBO-wrapped backend's parent metadata is its inner backend's."""
    if name.startswith("multistep_"):
        inner = get_eager(name[len("multistep_"):])
        per_round = PER_ROUND.get(name[len("multistep_"):], ())
        return lambda pool, max_bs, num_steps=3, topk=1, page_size=1: EagerMultiStep(
            lambda: inner(pool, max_bs * topk), num_steps, topk, page_size, per_round)
    try:
        return EAGER[name.removeprefix("tbo_")]
    except KeyError:
        raise UnknownName(f"no eager twin for backend {name!r}; known: {sorted(EAGER)}") from None


__all__ = ["EAGER", "SPECS", "get_eager", "get_spec", "list_backends", "register_backend"]
