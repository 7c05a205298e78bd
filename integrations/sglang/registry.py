"""Plugging the backends into SGLang: its attention-backend registry and its EAGLE draft factory.

``register()`` adds ``attnmeta_triton``, ``attnmeta_flashinfer`` and ``attnmeta_dsv4`` to SGLang's
registry and to the names ``--attention-backend`` (and ``--decode-attention-backend``,
``--prefill-attention-backend``) accept, and teaches SGLang's ``DraftBackendFactory`` the same names
for EAGLE's draft decode and draft extend. SGLang then builds them from its ``ModelRunner`` as it
builds its own kinds: each is SGLang's own backend of that kind (``backend.py``), compiled at start
from what SGLang resolved or, with ``ATTNMETA_ARTIFACT=path`` (an artifact of ``attnmeta compile ...
--out path``), loaded without compiling and checked against the server.
"""

from __future__ import annotations

import os

from attnmeta.compiler.compile import load_compiled
from attnmeta.compiler.ir.errors import OptionsError

KINDS = ("triton", "flashinfer", "dsv4")


def backend_class(kind: str):
    """The SGLang-facing class of ``kind`` (each imports SGLang's backend of that kind: only when asked)."""
    if kind == "dsv4":
        from .dsv4_backend import DSV4Backend

        return DSV4Backend
    from .backend import KINDS as classes

    return classes[kind]


def _artifact(artifact: str | None):
    path = artifact or os.environ.get("ATTNMETA_ARTIFACT")
    return load_compiled(path) if path else None


def factory(kind: str, artifact: str | None = None):
    """SGLang's factory signature: ``create(model_runner) -> AttentionBackend``, as SGLang's own factory
    of that kind builds it (FlashInfer: a new workspace when the runner asks, the plan stream EAGLE uses)."""

    def create(runner):
        if getattr(runner, "use_mla_backend", False) and kind != "dsv4":
            raise OptionsError(f"attnmeta_{kind} serves multi-head attention models; this model uses MLA: serve it "
                               f"with SGLang's own {kind} backend")
        cls = backend_class(kind)
        if kind == "flashinfer":
            _plan_stream(runner)
            return cls(runner, init_new_workspace=runner.init_new_workspace, compiled=_artifact(artifact))
        return cls(runner, compiled=_artifact(artifact))

    create.__name__ = f"create_attnmeta_{kind}_backend"
    return create


def _plan_stream(runner) -> None:
    """SGLang's FlashInfer factory gives an EAGLE runner a stream for planning; so does this one."""
    from sglang.srt.runtime_context import get_spec

    if get_spec().speculative_algorithm == "EAGLE" and not getattr(runner, "plan_stream_for_flashinfer", None):
        import torch

        runner.plan_stream_for_flashinfer = torch.cuda.Stream() if torch.cuda.is_available() else None


def register(prefix: str = "attnmeta_", artifact: str | None = None) -> list[str]:
    """Register every kind as ``prefix + kind`` (returns the names), in SGLang's attention registry, its
    ``--attention-backend`` choices and its EAGLE draft factory."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    from .draft import patch_draft_factory

    names = []
    for kind in KINDS:
        name = prefix + kind
        register_attention_backend(name)(factory(kind, artifact))
        if name not in choices.ATTENTION_BACKEND_CHOICES:
            choices.ATTENTION_BACKEND_CHOICES.append(name)
        names.append(name)
    patch_draft_factory(prefix)
    return names
