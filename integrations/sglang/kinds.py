"""The kinds attnmeta serves inside SGLang, one row each, and the one guard on importing SGLang.

A row says everything the wing needs to know about a kind: SGLang's name for it (registered as
``attnmeta_<name>``), attnmeta's class of it, the models SGLang builds it for, the class on an MLA model
where that differs, EAGLE's draft decode (attnmeta's multi-step drafter, or SGLang's own) and draft extend
classes, and what SGLang's factory of the kind hands it. The registry (``registry.py``), the draft factory
(``draft.py``) and the package's lazy names (``__init__.py``) read this table; adding a kind is its class
and one row here. Nothing here imports SGLang: a class is loaded when a server asks for the kind.
"""

from __future__ import annotations

import importlib

import attrs

SGLANG_EXTRA = "pip install 'attnmeta[sglang]'"


def sglang(module: str, *names: str, needs: str = "SGLang", install: str = SGLANG_EXTRA):
    """SGLang's ``names`` from ``module`` (one, or a tuple): the optional extra's import guard, one message."""
    try:
        m = importlib.import_module(module)
        found = tuple(getattr(m, n) for n in names)
    except (ImportError, AttributeError) as e:
        raise ImportError(f"attnmeta.integrations.sglang needs {needs} ({e}); {install}") from e
    return found[0] if len(found) == 1 else found


def load(where: str):
    """A class by ``"module:Class"``: a module of this package, or a dotted module path (SGLang's own)."""
    module, name = where.split(":")
    return getattr(importlib.import_module(module if "." in module else f"{__package__}.{module}"), name)


@attrs.frozen
class Kind:
    name: str  # SGLang's name of the kind; registered as attnmeta_<name>
    face: str  # attnmeta's class of the kind, "module:Class"
    models: str = "both"  # the models SGLang builds the kind for: "mha", "mla" or "both"
    on_mla: str | None = None  # the class on an MLA model, where the kind serves both (FlashInfer's MLA)
    drafter: str | None = None  # attnmeta's EAGLE multi-step draft decode; None: SGLang's own drafter serves
    drafter_on_mla: str | None = None  # the draft decode on an MLA model (SGLang's own where attnmeta has none)
    extender: str | None = None  # draft extend's class when not the kind's own (CuTe-DSL MLA: TRT-LLM MLA's)
    flashinfer: bool = False  # SGLang's factory hands it a workspace and EAGLE a plan stream; ATTNMETA_PLANNER
    drafts: bool = True  # --speculative-draft-attention-backend may name it

    def face_class(self, mla: bool):
        return load(self.on_mla if mla and self.on_mla else self.face)

    def extender_class(self, mla: bool):
        return load(self.on_mla if mla and self.on_mla else self.extender or self.face)

    def drafter_class(self, mla: bool):
        return load(self.drafter_on_mla if mla and self.drafter_on_mla else self.drafter)

    def refusal(self, mla: bool) -> str | None:
        """Why SGLang's model cannot be served by this kind (MLA or not), or None."""
        if mla and self.models == "mha":
            return (f"attnmeta_{self.name} serves multi-head attention models; this model uses MLA: serve it with "
                    f"{_names('mla')} or SGLang's own {self.name} backend")
        if not mla and self.models == "mla":
            return (f"attnmeta_{self.name} serves MLA models (DeepSeek, Kimi); this model has multi-head attention: "
                    f"serve it with {_names('mha')}")
        return None


KINDS = (
    Kind("triton", "backend:TritonBackend", models="mha", drafter="draft:TritonDraftBackend"),
    Kind("flashinfer", "backend:FlashInferBackend", on_mla="mla:FlashInferMLABackend",
         drafter="draft:FlashInferDraftBackend", flashinfer=True,
         drafter_on_mla="sglang.srt.layers.attention.flashinfer_mla_backend:FlashInferMLAMultiStepDraftBackend"),
    Kind("dsv4", "dsv4_backend:DSV4Backend", drafts=False),
    Kind("flashmla", "flashmla:FlashMLABackend", models="mla"),
    Kind("trtllm_mha", "trtllm:TRTLLMMHABackend", models="mha"),
    Kind("fa3", "fa3:FA3Backend", models="mha", drafter="fa3:FA3DraftBackend"),  # FlashAttention-3
    Kind("trtllm_mla", "trtllm:TRTLLMMLABackend", models="mla"),
    # CuTe-DSL MLA serves decode only: SGLang's draft extend falls back to TRT-LLM MLA, and so does attnmeta's
    Kind("cutedsl_mla", "trtllm:CuteDSLMLABackend", models="mla", extender="trtllm:TRTLLMMLABackend"),
)
KIND = {k.name: k for k in KINDS}
NAMES = tuple(KIND)
DRAFT_KINDS = tuple(k.name for k in KINDS if k.drafts)  # what --speculative-draft-attention-backend may name


def _names(models: str) -> str:
    """The attnmeta kinds that serve ``models`` (for a refusal's "serve it with")."""
    served = [f"attnmeta_{k.name}" for k in KINDS if k.models in (models, "both") and k.name != "dsv4"]
    return ", ".join(served[:-1]) + f" or {served[-1]}"


def classes() -> dict[str, str]:
    """Every class the wing defines, by name -> its module (the package's lazy names)."""
    out = {}
    for k in KINDS:
        for where in (k.face, k.on_mla, k.drafter, k.extender):
            if where and "." not in where.split(":")[0]:
                module, name = where.split(":")
                out[name] = module
    return out
