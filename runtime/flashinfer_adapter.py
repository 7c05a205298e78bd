"""FlashInfer behind a compiled backend (GPU, optional extra ``flashinfer``).

One graph-mode decode wrapper per planner node and batch size, built on the
compiled backend's static buffers, sharing one float workspace. The spec's
``host_call("flashinfer.decode_plan", ...)`` dispatches to ``plan`` here, in
out_graph, before capture and before every replay, from host indptrs only;
the plan's result, the wrapper, becomes the planner's metadata field, whose
``run`` the captured model calls. The planner node's name says which fields
it plans: ``plan`` binds ``kv_indptr``, ``kv_indices`` and
``kv_last_page_len``; ``step2_plan`` (MultiStep) the ``step2_`` ones;
``tbo0_plan`` (TBO) a child's.

Traps this handles: the decode wrapper's buffer keywords end in ``_buffer``
(the prefill wrapper's in ``_buf``); in graph mode ``plan()`` copies the
indptr and indices it is given into the bound buffers, so it gets the host
indptr it needs anyway and an empty indices view (the graph writes the
indices itself: copying them again would cost a device copy per step).
"""

from __future__ import annotations

import torch

from attnmeta.compiler.ir.errors import UserError

from .planners import PlanError

PLANNER = "flashinfer.decode_plan"
# The graph-mode decode wrapper's buffer keywords (paged_kv_*_buffer) and plan() signature this
# adapter calls are those of FlashInfer 0.6; it was checked against 0.6.4 on an H200.
MIN_VERSION = (0, 6)


class FlashInferVersionError(UserError):
    """FlashInfer is missing, or older than the API this adapter calls."""


def _flashinfer():
    try:
        import flashinfer
    except ImportError as e:
        raise FlashInferVersionError(f"FlashInfer is not installed ({e}); pip install 'attnmeta[flashinfer]', or "
                                     "serve a backend without a host planner (triton, flashattention)") from None
    raw = getattr(flashinfer, "__version__", "0")
    parts = tuple(int(p) for p in raw.split("+")[0].split(".")[:2] if p.isdigit())
    if parts < MIN_VERSION:
        raise FlashInferVersionError(f"FlashInfer {raw} is older than {'.'.join(map(str, MIN_VERSION))}, whose "
                                     "graph-mode decode wrapper this adapter binds (paged_kv_*_buffer keywords); "
                                     "pip install -U 'flashinfer-python>=0.6'")
    return flashinfer


class FlashInferDecodeAdapter:
    def __init__(self, backend, num_qo_heads: int, num_kv_heads: int, head_dim: int, q_dtype=torch.bfloat16,
                 kv_dtype=torch.bfloat16, workspace_bytes: int = 128 << 20):
        self.fi, self.backend = _flashinfer(), backend  # the optional extra: fail here, not inside a step
        self.heads = (num_qo_heads, num_kv_heads, head_dim)
        self.dtypes = (q_dtype, kv_dtype)
        self.workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=backend.device)
        self.wrappers: dict[tuple, object] = {}
        backend.planners[PLANNER] = self.plan

    def wrapper(self, key: str):
        """The wrapper of planner node ``key`` in the binding being planned (mode and batch size)."""
        b = self.backend.planning
        prefix = key.removesuffix("plan")
        wkey = (b.mode, b.plan.graph.env["bs"], prefix)
        w = self.wrappers.get(wkey)
        if w is None:
            m = b.meta
            try:
                bufs = [getattr(m, prefix + f) for f in ("kv_indptr", "kv_indices", "kv_last_page_len")]
            except AttributeError:
                raise PlanError(f"planner node {key!r} has no {prefix}kv_indptr/kv_indices/kv_last_page_len "
                               "fields to bind a FlashInfer decode wrapper to") from None
            w = self.wrappers[wkey] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=bufs[0],
                paged_kv_indices_buffer=bufs[1], paged_kv_last_page_len_buffer=bufs[2])
            w.attnmeta_empty_indices = bufs[1][:0]
        return w

    def plan(self, indptr_host: torch.Tensor, last_page_len_host: torch.Tensor, key: str = "plan"):
        w = self.wrapper(key)
        hq, hkv, d = self.heads
        w.plan(indptr_host, w.attnmeta_empty_indices, last_page_len_host, hq, hkv, d, 1,
               q_data_type=self.dtypes[0], kv_data_type=self.dtypes[1])
        return w


def run_decode(wrapper, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor):
    """Attention through a planned wrapper; caches are token-slot pools [slots, kv_heads, head_dim]."""
    _, hkv, d = k_cache.shape
    kv = (k_cache.view(-1, 1, hkv, d), v_cache.view(-1, 1, hkv, d))  # page size 1 pages
    return wrapper.run(q, kv, out=out)
