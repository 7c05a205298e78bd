"""Hand-written eager twins of the specs: baselines and independent oracles."""

from .dsv4 import EagerDSV4Decode
from .flashattention import EagerFlashAttentionDecode, EagerFlashAttentionDraft
from .flashinfer import EagerFlashInferDecode
from .triton import EagerTritonDecode

EAGER = {"flashinfer": EagerFlashInferDecode, "flashattention": EagerFlashAttentionDecode,
         "triton": EagerTritonDecode, "dsv4": EagerDSV4Decode, "flashattention_draft": EagerFlashAttentionDraft}


def get_eager(name: str):
    """The twin of a backend; a TBO-wrapped backend's parent metadata is its inner backend's."""
    try:
        return EAGER[name.removeprefix("tbo_")]
    except KeyError:
        raise KeyError(f"no eager twin for backend {name!r}; known: {sorted(EAGER)}") from None
