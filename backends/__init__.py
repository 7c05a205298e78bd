"""Backend specs (declared once) and their hand-written eager twins."""

from attnmeta.compiler import BackendSpec

from . import flashinfer
from .tbo import tbo

_SPECS: dict[str, BackendSpec] = {s.name: s for s in (flashinfer.SPEC, tbo(flashinfer.SPEC))}


def list_backends() -> list[str]:
    return sorted(_SPECS)


def get_spec(name: str) -> BackendSpec:
    try:
        return _SPECS[name]
    except KeyError:
        raise KeyError(f"unknown backend {name!r}; available: {list_backends()}") from None
