"""FlashInfer behind a compiled backend (GPU, optional extra ``flashinfer``).

One graph-mode decode wrapper per batch size, built on the compiled
backend's static buffers (``kv_indptr``, ``kv_indices``,
``kv_last_page_len`` views of that size), sharing one float workspace. The
spec's ``host_call("flashinfer.decode_plan", ...)`` dispatches to ``plan``
here, in out_graph, before capture and before every replay, from host
indptrs only; the plan's result, the wrapper, becomes the ``plan`` metadata
field, whose ``run`` the captured model calls.

Traps this handles: the decode wrapper's buffer keywords end in ``_buffer``
(the prefill wrapper's in ``_buf``); in graph mode ``plan()`` copies the
indptr and indices it is given into the bound buffers, so it gets the host
indptr it needs anyway and an empty indices view (the graph writes the
indices itself: copying them again would cost a device copy per step).
"""

from __future__ import annotations

import torch

from attnmeta.compiler.modes import ForwardMode

PLANNER = "flashinfer.decode_plan"


class FlashInferDecodeAdapter:
    def __init__(self, backend, num_qo_heads: int, num_kv_heads: int, head_dim: int, q_dtype=torch.bfloat16,
                 kv_dtype=torch.bfloat16, workspace_bytes: int = 128 << 20):
        import flashinfer  # the optional extra: fail here, clearly, not deep inside a step

        self.fi, self.backend = flashinfer, backend
        self.heads = (num_qo_heads, num_kv_heads, head_dim)
        self.dtypes = (q_dtype, kv_dtype)
        self.workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=backend.device)
        self.wrappers: dict[int, object] = {}
        backend.planners[PLANNER] = self.plan

    def wrapper(self, bs: int):
        w = self.wrappers.get(bs)
        if w is None:
            m = self.backend.bound(ForwardMode.DECODE, bs).meta
            w = self.wrappers[bs] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=m.kv_indptr,
                paged_kv_indices_buffer=m.kv_indices, paged_kv_last_page_len_buffer=m.kv_last_page_len)
            w.attnmeta_empty_indices = m.kv_indices[:0]
        return w

    def plan(self, indptr_host: torch.Tensor, last_page_len_host: torch.Tensor):
        w = self.wrapper(last_page_len_host.shape[0])
        hq, hkv, d = self.heads
        w.plan(indptr_host, w.attnmeta_empty_indices, last_page_len_host, hq, hkv, d, 1,
               q_data_type=self.dtypes[0], kv_data_type=self.dtypes[1])
        return w


def run_decode(wrapper, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor):
    """Attention through a planned wrapper; caches are token-slot pools [slots, kv_heads, head_dim]."""
    _, hkv, d = k_cache.shape
    kv = (k_cache.view(-1, 1, hkv, d), v_cache.view(-1, 1, hkv, d))  # page size 1 pages
    return wrapper.run(q, kv, out=out)
