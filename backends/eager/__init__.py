"""Hand-written eager twins of the specs: baselines and independent oracles."""

from attnmeta.compiler.ir.errors import UnknownName

from .dsv4 import EagerDSV4Decode
from .flashattention import EagerFlashAttentionDecode, EagerFlashAttentionDraft, EagerTRTLLMMHA
from .flashinfer import EagerFlashInferDecode
from .flashinfer_mla import EagerFlashInferMLA
from .flashmla import EagerFlashMLA
from .multistep import EagerMultiStep
from .triton import EagerTritonDecode
from .trtllm_mla import EagerTRTLLMMLA

EAGER = {"flashinfer": EagerFlashInferDecode, "flashinfer_mla": EagerFlashInferMLA,
         "flashattention": EagerFlashAttentionDecode, "triton": EagerTritonDecode, "trtllm_mla": EagerTRTLLMMLA,
         "cutedsl_mla": EagerTRTLLMMLA, "trtllm_mha": EagerTRTLLMMHA,
         "dsv4": EagerDSV4Decode, "flashattention_draft": EagerFlashAttentionDraft, "flashmla": EagerFlashMLA}
# fields an engine's drafter computes once per round over the prefix (as the multistep specs declare them)
PER_ROUND = {"triton": ("num_kv_splits", "uneven_batch")}


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
