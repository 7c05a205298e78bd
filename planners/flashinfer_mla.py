"""FlashInfer's MLA planner behind a compiled backend (GPU, optional extra ``flashinfer``), and its
stand-in.

One graph-mode ``BatchMLAPagedAttentionWrapper`` per planner site, built on the four fields the
spec binds (``qo_indptr``, ``kv_indptr``, ``kv_indices``, ``kv_lens``), sharing one float
workspace. The first call of a site runs FlashInfer's ``plan()`` (it picks the kernel module and
fills the wrapper's plan); every later one only FlashInfer's C++ planner on the host arrays,
as SGLang's replay path does: ``plan()`` would also copy the indptrs, the lengths and the indices
into the bound buffers, which the recorded graph writes itself. Causal everywhere but decode,
as SGLang plans it.
"""

from __future__ import annotations

import torch

from attnmeta.runtime.planning import PlanError, Site

from .flashinfer import WORKSPACE_BYTES, _flashinfer, _version
from .reference import RecordingPlanner, require_host

MLA_PLANNER = "flashinfer.mla_plan"
LEAN_VERSIONS = ((0, 6),)  # FlashInfer versions whose MLA plan() internals the lean call repeats


class ReferenceMLAPlanner(RecordingPlanner):
    """Stand-in for the MLA ``plan()``: host query and kv indptrs and kv lengths, consistent with
    each other (FlashInfer 0.7 refuses lengths that disagree with the kv indptr)."""

    def __call__(self, site: Site, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor,
                  kv_lens_host: torch.Tensor):
        for name, t in (("qo_indptr", qo_indptr_host), ("kv_indptr", kv_indptr_host), ("kv_len_arr", kv_lens_host)):
            require_host(name, t)
        bs = kv_lens_host.shape[0]
        if qo_indptr_host.shape[0] != bs + 1 or kv_indptr_host.shape[0] != bs + 1:
            raise PlanError(f"MLA plan(): qo_indptr {tuple(qo_indptr_host.shape)} and kv_indptr "
                            f"{tuple(kv_indptr_host.shape)} need {bs + 1} entries for {bs} kv lengths")
        if not torch.equal(kv_indptr_host[1:] - kv_indptr_host[:-1], kv_lens_host.to(kv_indptr_host.dtype)):
            raise PlanError("MLA plan(): the kv lengths disagree with the kv indptr's steps")
        return self._record(site, bs, int(kv_indptr_host[-1]))


def standins() -> dict:
    return {MLA_PLANNER: ReferenceMLAPlanner}


class FlashInferMLAAdapter:
    """FlashInfer's MLA wrappers for every MLA planner site of a compiled backend.

    ``num_heads``: query heads on this rank; ``kv_lora_rank`` and ``qk_rope_head_dim``: the
    compressed-KV and rope widths (DeepSeek-V3: 512 and 64); ``sm_scale``: the model's softmax
    scale (SGLang's ``model_config.scaling``). A site's state holds its wrapper (``wrapper``), the
    indices view plan() is handed (``empty``) and the lean planner (``lean``)."""

    def __init__(self, backend, num_heads: int, kv_lora_rank: int = 512, qk_rope_head_dim: int = 64,
                 sm_scale: float | None = None, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
                 workspace: torch.Tensor | None = None, workspace_bytes: int = WORKSPACE_BYTES):
        self.fi = _flashinfer()
        self.heads, self.ckv, self.kpe = num_heads, kv_lora_rank, qk_rope_head_dim
        # the scale of the unabsorbed head (nope 128 + rope 64 in DeepSeek-V3) is the model's; by default
        # that of the absorbed query width, which a caller serving a real model replaces
        self.sm_scale = sm_scale if sm_scale is not None else (kv_lora_rank + qk_rope_head_dim) ** -0.5
        self.dtypes = (q_dtype, kv_dtype)
        self.workspace = workspace if workspace is not None else \
            torch.empty(workspace_bytes, dtype=torch.uint8, device=backend.device)
        self.sites: list[Site] = []
        backend.set_planner(MLA_PLANNER, self.plan)

    def wrapper(self, site: Site):
        w = site.state.get("wrapper")
        if w is None:
            qo, kv, idx, lens = (site.field(r) for r in ("qo_indptr", "kv_indptr", "kv_indices", "kv_lens"))
            w = site.state["wrapper"] = self.fi.BatchMLAPagedAttentionWrapper(
                self.workspace, use_cuda_graph=True, qo_indptr=qo, kv_indptr=kv, kv_indices=idx, kv_len_arr=lens,
                backend="auto")
            site.state.update(empty=idx[:0], lean=None)
            self.sites.append(site)
        return w

    def plan(self, site: Site, qo_indptr_host: torch.Tensor, kv_indptr_host: torch.Tensor,
             kv_lens_host: torch.Tensor):
        w, st = self.wrapper(site), site.state
        if kv_lens_host.shape[0] == 0:  # no rows (an idle step, a TBO child of a batch of one)
            return w
        if st["lean"] is not None:  # every step after the first: the C++ planner alone
            st["lean"](qo_indptr_host, kv_indptr_host, kv_lens_host)
            return w
        causal = not site.mode.is_decode_or_idle()  # fixed per site: the lean planner keeps it
        w.plan(qo_indptr_host, kv_indptr_host, st["empty"], kv_lens_host, self.heads, self.ckv, self.kpe, 1, causal,
               self.sm_scale, *self.dtypes)
        st["lean"] = lean_mla_planner(self.fi, w, self.heads, self.ckv, causal)
        return w


def lean_mla_planner(fi, w, heads: int, ckv: int, causal: bool):
    """What a graph-mode MLA wrapper's ``plan()`` does per step once its first call has set it up,
    for the FlashInfer versions whose internals this repeats: FlashInfer's C++ planner on the host
    arrays. Else None: ``plan()`` every step."""
    if _version(fi) not in LEAN_VERSIONS or getattr(w, "_cached_module", None) is None:
        return None
    module, fws, iws, pws = w._cached_module, w._float_workspace_buffer, w._int_workspace_buffer, \
        w._pin_memory_int_workspace_buffer

    def plan(qo_indptr_host, kv_indptr_host, kv_lens_host) -> None:
        w._plan_info = module.plan(fws, iws, pws, qo_indptr_host, kv_indptr_host, kv_lens_host, heads, ckv, causal)
    return plan
