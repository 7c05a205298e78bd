"""Plugging the backends into SGLang's attention-backend registry.

``register()`` adds ``attnmeta_triton``, ``attnmeta_flashinfer``, ``attnmeta_flashattention`` and
``attnmeta_dsv4`` (SGLang's DeepSeek-V4 backend, its captured-mode metadata compiled) to SGLang's
registry and to the names its ``--attention-backend`` accepts. SGLang then builds them from its
``ModelRunner`` as it builds its own: the compile options come from the server arguments
and the model config, or, with ``ATTNMETA_ARTIFACT=path`` (an artifact written by ``attnmeta compile
... --out path``), from the artifact, loaded without compiling.
"""

from __future__ import annotations

import os

from attnmeta.compiler.compile import load_compiled

from .backend import KINDS


def backend_class(kind: str):
    """The SGLang-facing class of ``kind``; DSV4's imports SGLang's DSV4 backend, so only when asked for."""
    if kind == "dsv4":
        from .dsv4_backend import DSV4Backend

        return DSV4Backend
    return KINDS[kind]


def factory(kind: str, artifact: str | None = None):
    """SGLang's factory signature: ``create(model_runner) -> AttentionBackend``."""

    def create(runner):
        path = artifact or os.environ.get("ATTNMETA_ARTIFACT")
        return backend_class(kind).from_runner(runner, compiled=load_compiled(path) if path else None)

    create.__name__ = f"create_attnmeta_{kind}_backend"
    return create


def register(prefix: str = "attnmeta_", artifact: str | None = None) -> list[str]:
    """Register every kind as ``prefix + kind``; returns the names."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    names = []
    for kind in (*KINDS, "dsv4"):
        name = prefix + kind
        register_attention_backend(name)(factory(kind, artifact))
        for table in (choices.ATTENTION_BACKEND_CHOICES,):
            if name not in table:
                table.append(name)
        names.append(name)
    return names
