"""Plugging the backends into SGLang: its attention-backend registry and its EAGLE draft factory.

``register()`` adds ``attnmeta_<kind>`` for every kind of the table in ``kinds.py`` to SGLang's registry
and to the names ``--attention-backend`` (and ``--decode-attention-backend``,
``--prefill-attention-backend``) accept, and teaches SGLang's ``DraftBackendFactory`` the same names
for EAGLE's draft decode and draft extend, and lets its speculative-decoding checks and its page-size rule
take each name for the kind it is (``_rules_see_kinds``). SGLang then builds them from its ``ModelRunner``
as it builds its own kinds: each is SGLang's own backend of that kind (the class its row names), compiled
at start from what SGLang resolved or, with ``ATTNMETA_ARTIFACT=path`` (an artifact of ``attnmeta compile
... --out path``), loaded without compiling and checked against the server.
"""

from __future__ import annotations

import os

from attnmeta.compiler.compile import load_compiled
from attnmeta.compiler.ir.errors import OptionsError

from .kinds import DRAFT_KINDS, KIND, NAMES
from .options import partition


def _artifact(artifact: str | None):
    path = artifact or os.environ.get("ATTNMETA_ARTIFACT")
    return load_compiled(path) if path else None


def factory(kind: str, artifact: str | None = None):
    """SGLang's factory signature: ``create(model_runner) -> AttentionBackend``, as SGLang's own factory
    of that kind builds it (FlashInfer: a new workspace when the runner asks, the plan stream EAGLE uses)."""

    def create(runner):
        row, mla = KIND[kind], getattr(runner, "use_mla_backend", False)
        why = row.refusal(mla)
        if why:
            raise OptionsError(why)
        cls = row.face_class(mla)  # FlashInfer on an MLA model is FlashInfer MLA, as in SGLang's own factory
        if row.flashinfer and not mla:
            _plan_stream(runner)
            return cls(runner, init_new_workspace=runner.init_new_workspace, compiled=_artifact(artifact),
                       **partition())
        return cls(runner, compiled=_artifact(artifact), **(partition() if row.flashinfer else {}))

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
    ``--attention-backend`` choices, its EAGLE draft factory and its ``--speculative-draft-attention-backend``
    choices (the kinds the draft factory builds)."""
    from sglang.srt.arg_groups import choices
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    from .draft import patch_draft_factory

    names = []
    for kind in NAMES:
        name = prefix + kind
        register_attention_backend(name)(factory(kind, artifact))
        if name not in choices.ATTENTION_BACKEND_CHOICES:
            choices.ATTENTION_BACKEND_CHOICES.append(name)
        names.append(name)
    patch_draft_factory(prefix)
    for kind in DRAFT_KINDS:  # --speculative-draft-attention-backend, and SGLang's draft worker's own check
        if prefix + kind not in choices.DRAFT_ATTENTION_BACKEND_CHOICES:
            choices.DRAFT_ATTENTION_BACKEND_CHOICES.append(prefix + kind)
    _rules_see_kinds(prefix)
    return names


_BACKEND_FIELDS = ("attention_backend", "decode_attention_backend", "prefill_attention_backend",
                   "speculative_draft_attention_backend")


class _KindView:
    """SGLang's resolved view of the server arguments, with ``prefix + kind`` read as ``kind``."""

    def __init__(self, view, prefix: str):
        self._view, self._prefix = view, prefix

    def __getattr__(self, name):
        value = getattr(self._view, name)
        if name in _BACKEND_FIELDS and isinstance(value, str) and value.startswith(self._prefix):
            kind = value[len(self._prefix):]
            return kind if kind in NAMES else value
        return value


def _rules_see_kinds(prefix: str) -> None:
    """SGLang decides some things by backend name, and attnmeta's backends are those kinds compiling the
    same layout, so two of its rules read ``prefix + kind`` as ``kind`` (every other rule sees the real
    name). Its speculative-decoding hook: which kinds serve what (for instance EAGLE with topk > 1 on pages
    > 1: only its triton, flashinfer and fa3, whose draft metadata reads each branch's page-aligned
    region). Its MLA page-size rule: the page size a kind's kernels need, set for the user (FlashMLA's 64,
    TRT-LLM MLA's and CuTe-DSL's 32 or 64, TRT-LLM MHA's 16 to 128). Idempotent."""
    import functools

    from sglang.srt.arg_groups import attention_hook, speculative_hook

    real = speculative_hook.resolved_view
    if not getattr(real, "attnmeta", False):
        def resolved_view(server_args):
            return _KindView(real(server_args), prefix)

        resolved_view.attnmeta = True
        speculative_hook.resolved_view = resolved_view
    pages = attention_hook._mla_backend_page_constraints
    if not getattr(pages, "attnmeta", False):
        @functools.wraps(pages)  # SGLang records the rule's decisions under its name
        def page_constraints(view) -> dict:
            return pages(_KindView(view, prefix))

        page_constraints.attnmeta = True
        attention_hook._mla_backend_page_constraints = page_constraints
