"""attnmeta inside vLLM (0.33): ``AttnmetaPagedMetadataBuilder``, a vLLM attention-metadata builder
whose paged-KV metadata attnmeta compiles (see docs/VLLM.md). The spec needs no vLLM; the builder does."""

from .spec import SPEC

__all__ = ["SPEC", "AttnmetaPagedMetadata", "AttnmetaPagedMetadataBuilder", "options_from_vllm"]


def __getattr__(name):  # the builder imports vLLM: only when asked for
    if name in ("AttnmetaPagedMetadata", "AttnmetaPagedMetadataBuilder", "options_from_vllm"):
        from . import builder

        return getattr(builder, name)
    raise AttributeError(name)
