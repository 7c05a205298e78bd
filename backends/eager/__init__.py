"""Hand-written eager twins of the specs: baselines and independent oracles."""

from .flashinfer import EagerFlashInferDecode

EAGER = {"flashinfer": EagerFlashInferDecode}


def get_eager(name: str):
    try:
        return EAGER[name]
    except KeyError:
        raise KeyError(f"no eager twin for backend {name!r}; known: {sorted(EAGER)}") from None
