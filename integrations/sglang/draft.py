"""EAGLE's draft decode through attnmeta: SGLang's own multi-step draft backends, every step's
metadata compiled into one recorded kernel.

``TritonDraftBackend`` is SGLang's ``TritonMultiStepDraftBackend`` and ``FlashInferDraftBackend``
SGLang's ``FlashInferMultiStepDraftBackend`` (subclasses, built by SGLang's ``__init__``; their
per-step children are SGLang's own backends, whose attention runs the steps). Instead of SGLang's
per-round index kernel, split heuristic and (FlashInfer) per-step ``plan()`` calls, a compiled
``multistep_<kind>`` backend plans every step of a round (``step<s>_*`` fields over the ``bs * topk``
branch rows, each branch's drafted slots after the prefix as SGLang lays them out), and each child's
``forward_metadata`` is SGLang's metadata object over step ``s``'s buffers.

``patch_draft_factory`` teaches SGLang's ``DraftBackendFactory`` the ``attnmeta_*`` names, for draft
decode and for draft extend (the target's kind of backend, built on the draft runner).
"""

from __future__ import annotations

import logging

from attnmeta.backends.flashinfer.spec import FlashInferOptions
from attnmeta.backends.triton.spec import TritonOptions
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime.engine import Fed, Path

from .backend import device_planned, host_planned, split_scratch, swa_scratch
from .kinds import KINDS, sglang
from .options import rank_heads, resolved_options, sliding_window
from .served import CompiledModes

log = logging.getLogger("attnmeta.runtime.integrations")

_SGLangFlashInferDraft = sglang("sglang.srt.layers.attention.flashinfer_backend", "FlashInferMultiStepDraftBackend")
_SGLangTritonDraft = sglang("sglang.srt.layers.attention.triton_backend", "TritonMultiStepDraftBackend")


class _Drafter(CompiledModes):
    """Mixin before SGLang's multi-step draft backend class: the routing of ``CompiledModes`` (a draft
    round is a decode batch), every step's metadata handed to that step's own SGLang backend."""

    sglang_name = ""
    # SGLang's EagleDraftCudaGraphRunner copies a round's rows, lengths and slots into its buffers, then hands
    # out_graph the batch itself when it padded no row (``num_padding`` 0) and replays that size's graph
    fed = Fed(Path(("num_padding",)), 0)

    def _shape(self, m, v):
        return [self._step_shape(m, s) for s in range(len(self.attn_backends))]

    def _publish(self, shaped) -> None:
        for child, meta in zip(self.attn_backends, shaped, strict=True):
            child.forward_metadata = meta

    def _step_shape(self, m, step: int):
        raise NotImplementedError


def _step(m, s: int, field: str):
    return getattr(m.step(s), field)


class TritonDraftBackend(_Drafter, _SGLangTritonDraft):
    """SGLang's Triton multi-step drafter; each step's ``kv_indptr``/``kv_indices`` and the round's
    split counts (planned once over the prefix, as SGLang plans them) from ``multistep_triton``."""

    spec_name = "multistep_triton"

    def __init__(self, model_runner, topk: int, speculative_num_steps: int, *, compiled=None):
        super().__init__(model_runner, topk, speculative_num_steps)
        c = self.attn_backends[0]
        static = c.static_kv_splits or c.device_core_count <= 0
        window, pools = sliding_window(c)  # the window rail: each step's window over its keys, its write slot's
        wanted = resolved_options(model_runner, c, modes=("decode", "idle"), topk=topk,
                                  num_steps=speculative_num_steps, num_heads=c.num_head, num_kv_heads=c.num_kv_head,
                                  sm_count=0 if static else c.device_core_count, **window,
                                  # a draft window (SGLang resolves it off where the model has a window of its own)
                                  backend=TritonOptions(max_kv_splits=c.max_kv_splits,
                                                        draft_window=self.draft_window_size,
                                                        draft_sink=self.draft_sink_size))
        self._attach(compiled, wanted, model_runner.req_to_token_pool.req_to_token, model_runner.device, **pools)
        self._eager_scratch: dict = {}

    def _step_shape(self, m, s: int):
        from sglang.srt.layers.attention.triton_backend import ForwardMetadata

        rows = self.attnmeta.max_bs * self.topk
        logits, lse, mp, lp, op, locks = split_scratch(self.attn_backends[s], rows, self._eager_scratch)
        return ForwardMetadata(attn_logits=logits, attn_lse=lse, max_extend_len=None,
                               num_kv_splits=_step(m, s, "num_kv_splits"), kv_indptr=_step(m, s, "kv_indptr"),
                               kv_indices=_step(m, s, "kv_indices"), qo_indptr=None, custom_mask=None,
                               mask_indptr=None, window_kv_offsets=None, lean_Mp=mp, lean_Lp=lp, lean_Op=op,
                               lean_locks=locks, uneven_batch=_step(m, s, "uneven_batch").view(1),
                               **self._step_window(m, s, rows))

    def _step_window(self, m, s: int, rows: int) -> dict:
        """Step ``s``'s window rail (its keys' last min(seq + s + 1, W) slots, translated into a window pool with its
        write slot), or all None without a window."""
        if not self.attnmeta.compiled.options.sliding_window:
            return dict(window_kv_indptr=None, window_kv_indices=None, window_num_kv_splits=None)
        return dict(window_kv_indptr=_step(m, s, "window_kv_indptr"),
                    window_kv_indices=_step(m, s, "window_kv_indices"),
                    window_num_kv_splits=_step(m, s, "window_num_kv_splits"),
                    swa_out_cache_loc=getattr(m.step(s), "swa_out_cache_loc", None),
                    swa_attn_logits=swa_scratch(self.attn_backends[s], rows, self._eager_scratch))


class FlashInferDraftBackend(_Drafter, _SGLangFlashInferDraft):
    """SGLang's FlashInfer multi-step drafter; each step's wrapper planned once, then on the GPU from
    that step's compiled ``kv_indptr`` (``multistep_flashinfer``), no host indptr copied back per round."""

    spec_name = "multistep_flashinfer"

    def __init__(self, model_runner, topk: int, speculative_num_steps: int, *, compiled=None, partition="device"):
        if getattr(model_runner, "sliding_window_size", None):
            # SGLang 0.5.23's own FlashInfer drafter cannot be built there either: its children share one indptr
            # buffer per step, which it allows for one wrapper only (an assertion in FlashInferAttnBackend)
            raise OptionsError("EAGLE's FlashInfer drafter has no sliding-window form (SGLang's own is built with one "
                               "wrapper per step); keep --attention-backend attnmeta_flashinfer for the target and "
                               "draft with --speculative-draft-attention-backend attnmeta_triton")
        super().__init__(model_runner, topk, speculative_num_steps)

        from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter

        c, mc = self.attn_backends[0], model_runner.model_config
        if self.draft_window_size > 0 or c.num_wrappers != 1:
            raise OptionsError("attnmeta's multistep_flashinfer does not plan a draft window or two wrappers "
                               "(sliding-window or cross attention); serve this draft with SGLang's flashinfer")
        heads = (*rank_heads(model_runner), mc.head_dim)
        wanted = resolved_options(model_runner, c, modes=("decode", "idle"), topk=topk,
                                  num_steps=speculative_num_steps, num_heads=heads[0], num_kv_heads=heads[1],
                                  backend=FlashInferOptions(plan_on_device=device_planned(partition)))
        self._attach(compiled, wanted, model_runner.req_to_token_pool.req_to_token, model_runner.device)
        self.adapter = FlashInferDecodeAdapter(self.attnmeta, *heads, q_dtype=mc.dtype,
                                               kv_dtype=c.flashinfer_kv_cache_dtype, workspace=c.workspace_buffer,
                                               use_tensor_cores=c.decode_use_tensor_cores, partition=partition)

    _reads_host_lengths = host_planned

    def _step_shape(self, m, s: int):
        from sglang.srt.layers.attention.flashinfer_backend import DecodeMetadata

        return DecodeMetadata(decode_wrappers=[_step(m, s, "plan")])


def patch_draft_factory(prefix: str = "attnmeta_") -> None:
    """SGLang's ``DraftBackendFactory`` picks a backend from a table of its own kinds; teach it
    ``prefix + kind`` for draft decode (the multi-step drafters above) and draft extend (the kind's
    backend on the draft runner). Idempotent."""
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    if getattr(DraftBackendFactory._create_backend, "attnmeta", False):
        return
    original = DraftBackendFactory._create_backend

    def _create_backend(self, backend_name, backend_map, error_template, stamps_children=False):
        from .options import partition

        runner, extra = self.draft_model_runner, {}
        mla = getattr(runner, "use_mla_backend", False)
        for row in (k for k in KINDS if k.drafts):
            name = prefix + row.name
            fi = partition() if row.flashinfer else {}  # ATTNMETA_PLANNER reaches FlashInfer's kinds only
            if stamps_children and row.drafter is None:
                extra[name] = backend_map[row.name]  # SGLang's own multi-step drafter of that kind
            elif stamps_children:  # draft decode: a multi-step container (on MLA, SGLang's own: no planner choice)
                if mla and row.drafter_on_mla:
                    log.info("EAGLE draft decode on an MLA model: SGLang's own %s drafter serves it", row.name)
                extra[name] = (lambda r=row, n=name, fi=fi: (n, r.drafter_class(mla)(
                                   runner, self.topk, self.speculative_num_steps, **({} if mla else fi)))
                               if self.speculative_num_steps > 1 else (n, None))
            else:
                extra[name] = lambda r=row, n=name, fi=fi: (n, r.extender_class(mla)(runner, skip_prefill=False,
                                                                                       **fi))
        return original(self, backend_name, {**backend_map, **extra}, error_template, stamps_children)

    _create_backend.attnmeta = True
    DraftBackendFactory._create_backend = _create_backend


__all__ = ["FlashInferDraftBackend", "TritonDraftBackend", "patch_draft_factory"]
