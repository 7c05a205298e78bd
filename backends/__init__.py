"""Backend specs (declared once) and their hand-written eager twins."""

from attnmeta.compiler import BackendSpec

from . import dsv4, flashattention, flashinfer, triton
from .multistep import multistep
from .tbo import tbo

_BASE = (flashinfer.SPEC, flashattention.SPEC, triton.SPEC)
_EXTRA = (dsv4.SPEC, flashattention.DRAFT_SPEC, multistep(flashinfer.SPEC), multistep(triton.SPEC))
_SPECS: dict[str, BackendSpec] = {s.name: s for s in (*_BASE, *(tbo(b) for b in _BASE), *_EXTRA)}


def list_backends() -> list[str]:
    return sorted(_SPECS)


def get_spec(name: str) -> BackendSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}; available: {list_backends()}") from None
