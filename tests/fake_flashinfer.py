"""A stand-in for FlashInfer 0.6's graph-mode wrappers on the CPU, so CI drives the adapter's
planning logic without a GPU: each wrapper keeps the attributes the adapter reads, and its
``plan()`` writes the int workspace with FlashInfer's planners as transcribed in
``tests/flashinfer_plan_oracle.py`` (and copies the host indptrs into the bound buffers, as graph
mode does). No attention runs; ``bug`` makes the planner disagree with FlashInfer's (the chunk
search's lower bound halved), to exercise the adapter's refusal of its device planner."""

from __future__ import annotations

import types

import torch

from tests import flashinfer_plan_oracle as oracle

WS = 1 << 16
MAX_GRID = 1056  # blocks per SM x SMs the CUDA-core decode kernel's occupancy gives (8 x 132)
SMS = 132


def _min_chunk(bug: bool) -> int:
    return 64 if bug else 128


class _Wrapper:
    bug = False

    def _write(self, info, buf) -> None:
        self._int_workspace_buffer.copy_(torch.from_numpy(buf))
        self._plan_info = info


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    def __init__(self, workspace, layout, use_cuda_graph=False, use_tensor_cores=False, paged_kv_indptr_buffer=None,
                 paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None, backend="fa2"):
        assert layout == "NHD"
        if not use_cuda_graph:  # an engine's own eager wrapper (SGLang builds some at start): never planned here
            return
        self.use_tensor_cores, self._backend, self._jit_module = use_tensor_cores, "fa2", None
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._int_workspace_buffer = torch.zeros(WS, dtype=torch.uint8)
        bs = paged_kv_indptr_buffer.numel() - 1
        self._qo_indptr_buf = torch.arange(bs + 1, dtype=torch.int32)

    def plan(self, indptr, indices, last_page_len, hq, hkv, d, page_size, q_data_type=None, kv_data_type=None):
        ind = indptr.tolist()
        if self.use_tensor_cores:
            info, buf, _ = oracle.prefill_plan(list(range(len(ind))), ind, SMS, (hq, hkv), d, page_size, WS,
                                               min_chunk=_min_chunk(self.bug))
        else:
            info, buf, _ = oracle.decode_plan(ind, MAX_GRID, hkv, page_size, WS, min_chunk=_min_chunk(self.bug))
        self._paged_kv_indptr_buf.copy_(indptr)
        self._write(info, buf)


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    def __init__(self, workspace, layout, use_cuda_graph=False, qo_indptr_buf=None, paged_kv_indptr_buf=None,
                 paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None, backend="fa2", custom_mask_buf=None,
                 mask_indptr_buf=None):
        assert backend == "fa2"
        self._eager = not use_cuda_graph
        if self._eager:  # an engine's own eager wrapper (prefill): its plan is recorded, nothing more
            return
        self._backend, self._jit_module = backend, None
        self._qo_indptr_buf, self._paged_kv_indptr_buf = qo_indptr_buf, paged_kv_indptr_buf
        self._custom_mask_buf = custom_mask_buf
        self._int_workspace_buffer = torch.zeros(WS, dtype=torch.uint8)

    def plan(self, qo, kv, indices, last_page_len, hq, hkv, d, page_size, packed_custom_mask=None, causal=False,
             q_data_type=None, kv_data_type=None, window_left=-1, **kwargs):
        # FlashInfer picks the kernel by these at plan (a window compiled in only where window_left >= 0; the tree
        # mask where the wrapper has a mask buffer): kept for tests to read
        self._causal, self._window_left = causal, window_left
        if self._eager:
            self.planned = (qo.clone(), kv.clone(), indices.clone())
            return
        info, buf, _ = oracle.prefill_plan(qo.tolist(), kv.tolist(), SMS, (hq, hkv), d, page_size, WS,
                                           min_chunk=_min_chunk(self.bug), window_left=window_left)
        self._qo_indptr_buf.copy_(qo)
        self._paged_kv_indptr_buf.copy_(kv)
        self._write(info, buf)

    begin_forward = plan  # FlashInfer's older name, which SGLang's prefill path calls


class _MLAModule:
    """The compiled MLA module a plan() picks: its C++ planner records the host arrays it is given."""

    def __init__(self, w):
        self.w = w

    def plan(self, fws, iws, pws, qo, kv, lens, heads, ckv, causal):
        for t in (qo, kv, lens):
            assert t.device.type == "cpu", "FlashInfer's MLA planner reads host arrays"
        self.w.plans.append((qo.tolist(), kv.tolist(), lens.tolist(), heads, ckv, causal))
        return ("plan", len(self.w.plans))


class BatchMLAPagedAttentionWrapper:
    """FlashInfer 0.6's MLA wrapper as far as planning goes: plan() picks a module, copies the arrays
    into the bound buffers in graph mode (device copies of them otherwise), and runs the module's
    planner on host copies; every planner call is recorded in ``plans``."""

    def __init__(self, workspace, use_cuda_graph=False, qo_indptr=None, kv_indptr=None, kv_indices=None,
                 kv_len_arr=None, backend="auto"):
        self._float_workspace_buffer = workspace
        self._int_workspace_buffer = torch.zeros(8, dtype=torch.uint8)
        self._pin_memory_int_workspace_buffer = torch.zeros(8, dtype=torch.uint8)
        self._use_cuda_graph = use_cuda_graph
        self._qo_indptr_buf, self._kv_indptr_buf, self._kv_indices_buf, self._kv_len_arr_buf = \
            qo_indptr, kv_indptr, kv_indices, kv_len_arr
        self.plans: list = []
        self.full_plans = 0

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_data_type, kv_data_type, use_profiler=False):
        self._cached_module = _MLAModule(self)
        self.full_plans += 1
        if self._use_cuda_graph:
            self._qo_indptr_buf.copy_(qo_indptr)
            self._kv_indptr_buf.copy_(kv_indptr)
            self._kv_indices_buf[: len(kv_indices)].copy_(kv_indices)
            self._kv_len_arr_buf.copy_(kv_len_arr)
        else:
            self._qo_indptr_buf, self._kv_indptr_buf = qo_indptr, kv_indptr
            self._kv_indices_buf, self._kv_len_arr_buf = kv_indices, kv_len_arr
        self._causal, self._page_size, self._sm_scale = causal, page_size, sm_scale
        self._plan_info = self._cached_module.plan(
            self._float_workspace_buffer, self._int_workspace_buffer, self._pin_memory_int_workspace_buffer,
            qo_indptr.to("cpu"), kv_indptr.to("cpu"), kv_len_arr.to("cpu"), num_heads, head_dim_ckv, causal)


class BatchPrefillWithRaggedKVCacheWrapper:
    """An engine's own ragged prefill wrapper (SGLang builds one at start): its plan is recorded, nothing more."""

    def __init__(self, workspace, layout, backend="auto"):
        pass

    def plan(self, qo_indptr, kv_indptr, *args, **kwargs):
        self.planned = (qo_indptr.clone(), kv_indptr.clone())

    begin_forward = plan


def fast_decode_plan(*args, **kwargs):
    raise AssertionError("SGLang's own FlashInfer decode planner ran in a test of attnmeta's")


def into_sglang(monkeypatch, bug: bool = False) -> types.ModuleType:
    """This stand-in as ``flashinfer`` and as the names SGLang's FlashInfer backend module imports from it
    on a GPU (it imports none on a CPU), so SGLang can build its FlashInfer backend here."""
    import sglang.srt.layers.attention.flashinfer_backend as sgl

    fi = module(bug)
    monkeypatch.setitem(__import__("sys").modules, "flashinfer", fi)
    for name in ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper"):
        monkeypatch.setattr(sgl, name, getattr(fi, name), raising=False)
    monkeypatch.setattr(sgl, "BatchPrefillWithRaggedKVCacheWrapper", BatchPrefillWithRaggedKVCacheWrapper,
                        raising=False)
    monkeypatch.setattr(sgl, "fast_decode_plan", fast_decode_plan, raising=False)
    monkeypatch.setattr(sgl, "torch", _OnTheCPU())  # its graph buffers are made on "cuda" whatever the runner's
    return fi


def into_sglang_mla(monkeypatch) -> types.ModuleType:
    """This stand-in where SGLang's FlashInfer MLA backend module imports FlashInfer's MLA and ragged
    wrappers on a GPU, and ``torch`` there making its ``"cuda"`` buffers on the CPU."""
    import sglang.srt.layers.attention.flashinfer_mla_backend as sgl

    fi = module()
    monkeypatch.setitem(__import__("sys").modules, "flashinfer", fi)
    monkeypatch.setattr(sgl, "BatchMLAPagedAttentionWrapper", fi.BatchMLAPagedAttentionWrapper, raising=False)
    monkeypatch.setattr(sgl, "BatchPrefillWithRaggedKVCacheWrapper", BatchPrefillWithRaggedKVCacheWrapper,
                        raising=False)
    monkeypatch.setattr(sgl, "torch", _OnTheCPU())
    return fi


def into_sglang_trtllm(monkeypatch) -> types.ModuleType:
    """What SGLang's TRT-LLM MHA / MLA and CuTe-DSL MLA backends need at ``__init__`` that a CPU lacks, stood
    in: FlashInfer's wrappers (their base classes' ``__init__`` build them) and ``flashinfer.utils``'s SM
    count and trtllm-gen counter size (the persistent multi-CTA counter buffer they allocate), and TRT-LLM
    MLA's JIT build of its zero-KV fix-up kernel (nvcc for a GPU). No kernel of these runs here: only their
    metadata code does."""
    import sglang.srt.layers.attention.trtllm_mha_backend as mha
    import sglang.srt.layers.attention.trtllm_mla_backend as mla

    fi = into_sglang(monkeypatch)
    into_sglang_mla(monkeypatch)
    fi.utils = types.SimpleNamespace(get_device_sm_count=lambda device: 132,
                                     get_trtllm_gen_multi_ctas_kv_counter_bytes=lambda *a, **k: 4096)
    for m in (mha, mla):
        monkeypatch.setattr(m, "flashinfer", fi, raising=False)
    monkeypatch.setattr(mla, "_jit_fixup_module", lambda dtype: None)
    return fi


class _OnTheCPU:
    """``torch`` as SGLang's FlashInfer module sees it on a CPU: tensors it makes on ``"cuda"`` are made
    on the CPU (SGLang names the device outright in its CUDA-graph buffers)."""

    def __getattr__(self, name):
        fn = getattr(torch, name)
        if name not in ("zeros", "empty", "ones", "full", "arange", "tensor"):
            return fn

        def made_here(*args, **kwargs):
            if kwargs.get("device") == "cuda":
                kwargs["device"] = "cpu"
            if not torch.cuda.is_available():  # pinned host memory needs a driver
                kwargs.pop("pin_memory", None)
            return fn(*args, **kwargs)
        return made_here


def module(bug: bool = False, version: str = "0.6.4") -> types.ModuleType:
    fi = types.ModuleType("flashinfer")
    fi.__version__ = version
    for cls in (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper):
        setattr(fi, cls.__name__, type(cls.__name__, (cls,), {"bug": bug}))
    fi.BatchMLAPagedAttentionWrapper = BatchMLAPagedAttentionWrapper
    return fi
