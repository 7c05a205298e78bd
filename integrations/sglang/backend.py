"""SGLang's attention backends with their captured modes' metadata compiled by attnmeta.

``TritonBackend`` *is* SGLang's ``TritonAttnBackend`` and ``FlashInferBackend`` *is* SGLang's
``FlashInferAttnBackend`` (subclasses, built by SGLang's own ``__init__`` from the model runner);
``CompiledModes`` (``served.py``) routes the batches attnmeta compiles (decode, idle, target verify,
draft extend V2) to the compiled backend and everything else (prefill, extend, mixed, eager batches
past the largest captured size) to SGLang's own code. Attention is SGLang's own kernels, reading
``forward_metadata``, which is SGLang's own metadata class over the compiled buffers and SGLang's
scratch (split-KV logits, the verify mask buffer, FlashInfer's workspace).

The compile options are what SGLang resolved, read off the built backend (``_wanted``): a
disagreement with a compiled artifact is an ``OptionsError`` naming both values.
"""

from __future__ import annotations

import torch

from attnmeta.backends.flashinfer.spec import FlashInferOptions
from attnmeta.backends.triton.spec import TritonOptions
from attnmeta.runtime import BatchError
from attnmeta.runtime.engine import Path

from .kinds import sglang
from .options import rank_heads, resolved_options, sliding_window
from .served import CAPTURED, CompiledModes

_SGLangFlashInfer = sglang("sglang.srt.layers.attention.flashinfer_backend", "FlashInferAttnBackend")
_SGLangTriton = sglang("sglang.srt.layers.attention.triton_backend", "TritonAttnBackend")

class TritonBackend(CompiledModes, _SGLangTriton):
    """SGLang's Triton backend; its decode, idle, target verify and draft extend V2 metadata compiled
    (``kv_indptr``, ``kv_indices``, ``num_kv_splits`` and ``uneven_batch`` by SGLang's heuristic on the
    device, ``qo_indptr``, ``mask_indptr``) in one recorded kernel instead of SGLang's per-step
    launches. Scratch (split-KV logits, lean buffers) and the verify mask buffer are SGLang's own."""

    spec_name, sglang_name = "triton", "triton"

    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, *, compiled=None, **kw):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf, **kw)
        static = self.static_kv_splits or self.device_core_count <= 0
        window, pools = sliding_window(self)
        wanted = resolved_options(model_runner, self, num_heads=self.num_head, num_kv_heads=self.num_kv_head,
                                  sm_count=0 if static else self.device_core_count, **window,
                                  backend=TritonOptions(max_kv_splits=self.max_kv_splits))
        self._attach(compiled, wanted, self.req_to_token, model_runner.device, **pools)
        self._eager_scratch: dict = {}

    def unserved(self) -> list[str]:
        checks = ((self.use_mla, "MLA models"),
                  (self.use_sliding_window_kv_pool and self.token_to_kv_pool.full_to_swa_index_mapping is None,
                   "a sliding-window pool without its full-to-window slot table"),
                  (self.dcp_size > 1, "decode context parallelism"), (self.dllm_block_size is not None,
                                                                     "diffusion LLM decoding"),
                  (self.kv_index_translator.is_translating, "a translated (unified) KV pool"),
                  (self.split_tile_size is not None, "a fixed split tile size (deterministic inference)"),
                  (self.use_verify_splitkv or self.use_verify_shared_kv, "the split-KV verify kernels"))
        return [name for bad, name in checks if bad]

    def _shape(self, m, v):
        from sglang.srt.layers.attention.triton_backend import ForwardMetadata

        window = self._window(m, v.forward_mode.is_decode_or_idle())
        if v.forward_mode.is_decode_or_idle():
            logits, lse, mp, lp, op, locks = split_scratch(self, self.attnmeta.max_bs, self._eager_scratch)
            return ForwardMetadata(attn_logits=logits, attn_lse=lse, max_extend_len=None,
                                   num_kv_splits=m.num_kv_splits, kv_indptr=m.kv_indptr, kv_indices=m.kv_indices,
                                   qo_indptr=None, custom_mask=None, mask_indptr=None, lean_Mp=mp, lean_Lp=lp,
                                   lean_Op=op, lean_locks=locks, uneven_batch=m.uneven_batch.view(1), **window)
        verify = v.forward_mode.is_target_verify()
        return ForwardMetadata(attn_logits=None, attn_lse=None, max_extend_len=int(m.max_extend_len),
                               num_kv_splits=None, kv_indptr=m.kv_indptr, kv_indices=m.kv_indices,
                               qo_indptr=m.qo_indptr, custom_mask=None, mask_indptr=m.mask_indptr if verify else None,
                               **window)

    def _window(self, m, decode: bool) -> dict:
        """The window layers' fields of SGLang's ``ForwardMetadata`` over the bound plan ``m`` (from the same kernel
        as the full layers'): all None without a window; decode's split counts (and SGLang's own logits scratch
        for window heads of another value width), or verify's and draft extend's first window columns."""
        if not self.attnmeta.compiled.options.sliding_window:
            return dict(window_kv_indptr=None, window_kv_indices=None, window_num_kv_splits=None,
                        window_kv_offsets=None)
        out = dict(window_kv_indptr=m.window_kv_indptr, window_kv_indices=m.window_kv_indices,
                   swa_out_cache_loc=getattr(m, "swa_out_cache_loc", None))
        if decode:
            return out | dict(window_num_kv_splits=m.window_num_kv_splits, window_kv_offsets=None,
                              swa_attn_logits=swa_scratch(self, self.attnmeta.max_bs, self._eager_scratch))
        return out | dict(window_num_kv_splits=None, window_kv_offsets=m.window_kv_offsets)

    def _per_step(self, meta, m, v, in_capture: bool) -> None:
        if v.forward_mode.is_target_verify():
            meta.custom_mask = verify_mask(self, v, in_capture)

    def _replay_requires(self, v):
        return mask_in_place(v, getattr(self, "verify_mask", None))


def device_planned(partition: str) -> bool:
    """Compile FlashInfer specs without host indptrs (``plan_on_device``) where the installed FlashInfer's
    partition is one attnmeta plans on the GPU: SGLang's EAGLE workers hand the backends no host lengths
    (``seq_lens_cpu`` is None), and then a host planner would have nothing to plan from."""
    if partition != "device":
        return False
    from attnmeta.backends.flashinfer.planner import DEVICE_PLAN_VERSIONS, _flashinfer, _version

    return _version(_flashinfer()) in DEVICE_PLAN_VERSIONS


def host_planned(backend) -> bool:
    """A FlashInfer kind's ``_reads_host_lengths``: with the partition planned on the GPU a replayed step reads
    the device lengths alone (an eager step without host lengths copies them back); FlashInfer's host
    planner plans from them every step."""
    return not backend.attnmeta.compiled.options.backend.plan_on_device


def split_scratch(b, rows: int, made: dict) -> tuple:
    """SGLang Triton backend ``b``'s split-KV logits, LSE and lean buffers for up to ``rows`` decode
    rows: its CUDA-graph buffers once it has made them (``init_cuda_graph_state``), else ones made here
    once (kept in ``made``) in the shapes SGLang's eager path allocates every step."""
    if hasattr(b, "cuda_graph_attn_logits"):
        return (b.cuda_graph_attn_logits, b.cuda_graph_attn_lse, b.cuda_graph_lean_Mp, b.cuda_graph_lean_Lp,
                b.cuda_graph_lean_Op, b.cuda_graph_lean_locks)
    key = (id(b), rows)
    if key not in made:
        f32, lean = dict(dtype=torch.float32, device=b.device), (b.lean_total_programs, b.lean_block_m)
        made[key] = (torch.empty((rows, b.num_head, b.max_kv_splits, b.v_head_dim), **f32),
                     torch.empty((rows, b.num_head, b.max_kv_splits), **f32), torch.empty(lean, **f32),
                     torch.empty(lean, **f32), torch.empty((*lean, b.v_head_dim), **f32),
                     torch.zeros(lean[:1], dtype=torch.int32, device=b.device))
    return made[key]


def swa_scratch(b, rows: int, made: dict):
    """The window layers' split-KV logits where their value heads differ from the full layers' (SGLang's
    ``swa_v_head_dim``), else None: SGLang's CUDA-graph buffer once it has made it, else one made here once."""
    if getattr(b, "swa_v_head_dim", None) is None:
        return None
    if getattr(b, "cuda_graph_swa_attn_logits", None) is not None:
        return b.cuda_graph_swa_attn_logits
    key = (id(b), rows, "swa")
    if key not in made:
        made[key] = torch.empty((rows, b.num_head, b.max_kv_splits, b.swa_v_head_dim), dtype=torch.float32,
                                device=b.device)
    return made[key]


def checked_mask(v, D: int, in_capture: bool):
    """The drafter's tree mask of verify batch ``v``, refused by name when it cannot be one: not boolean
    (SGLang's are bool or uint8), or shorter than its rows need (``D * (seq + D)`` per request, known
    from the host lengths when the batch has them). A capture batch's mask is the runner's own buffer."""
    src = getattr(v.spec_info, "custom_mask", None)
    if src is None or in_capture:
        return src
    if src.dtype not in (torch.bool, torch.uint8):
        raise BatchError(f"spec_info.custom_mask must be bool or uint8 (one entry per query x key), got {src.dtype}: "
                         "a float mask would be cast, NaN included")
    seq = v.seq_lens_cpu
    if seq is not None:
        need = int((D * (seq[: v.raw_batch_size].long() + D)).sum())
        if src.numel() < need:
            raise BatchError(f"spec_info.custom_mask has {src.numel()} entries; the batch's {v.raw_batch_size} "
                             f"requests need {need} (D x (seq_len + D) each, D = {D})")
    return src


def verify_mask(backend, v, in_capture: bool):
    """The tree mask a verify step's kernel reads, as SGLang's own backends choose it: none without a
    drafter's mask; SGLang's verify-mask buffer once the graph runner made it (the drafter's tree
    kernel writes it in place; a mask given elsewhere is copied in, as SGLang copies it); else the
    drafter's mask itself (an eager step)."""
    src = checked_mask(v, backend.attnmeta.compiled.options.num_draft_tokens, in_capture)
    if src is None:
        return None
    vm = getattr(backend, "verify_mask", None)
    if vm is None:
        if in_capture:
            raise BatchError("a verify batch with a tree mask is being captured before init_cuda_graph_state made "
                             "SGLang's verify-mask buffer")
        return src
    return copy_mask(src, vm.buffer)


def mask_in_place(v, vm) -> tuple | None:
    """A verify replay with nothing to do needs the drafter's mask written in place into ``vm``'s buffer (as
    SGLang's EAGLE worker writes it when the backend owns one); other modes need nothing more."""
    if not v.forward_mode.is_target_verify():
        return ()
    return None if vm is None else ((CUSTOM_MASK, vm.buffer),)


CUSTOM_MASK = Path(("spec_info", "custom_mask"))


def own_verify_mask(backend):
    """SGLang's ``VerifyMask`` over the verify plans' ``custom_mask`` field, for a backend whose compiled verify
    reads the tree mask: SGLang's EAGLE worker then writes the mask straight into the buffer the compiled graph
    reads (SGLang's own FlashInfer backend has none, so its worker allocates a mask each round and the backend
    copies it; its own FA3 gathers from a buffer of its own). None where this backend verifies nothing."""
    from attnmeta.compiler.modes import ForwardMode

    verifies = ForwardMode.TARGET_VERIFY in backend.attnmeta.compiled.generic
    if getattr(backend, "is_draft_runner", False) or backend.skip_prefill or not verifies:
        return None
    from sglang.srt.layers.attention.verify_mask import VerifyMask
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    n = backend.attnmeta.max_bs
    buf = backend.attnmeta.bound(ForwardMode.TARGET_VERIFY, n).field("custom_mask")
    return VerifyMask(buffer=buf.view(-1), mode=TreeMaskMode.FULL_MASK, max_bs=n, is_read=True)


def mask_into_plan(backend, v, in_capture: bool) -> None:
    """A verify step's tree mask into the plan's ``custom_mask`` field, which the step reads (a planner, or the
    recorded kernel); nothing to copy where the drafter wrote it there in place."""
    if v.forward_mode.is_target_verify():
        src = checked_mask(v, backend.attnmeta.compiled.options.num_draft_tokens, in_capture)
        if src is not None:
            copy_mask(src, backend.attnmeta.bound(v.forward_mode, v.batch_size).field("custom_mask"))


def copy_mask(src, buf):
    """The drafter's mask into the static buffer a captured kernel (or a planner) reads, as SGLang copies
    it into its own; nothing to copy where the drafter wrote the buffer in place."""
    n = src.numel()
    if n > buf.numel():
        raise BatchError(f"spec_info.custom_mask has {n} entries; the verify mask buffer holds {buf.numel()} "
                         "(max_bs * D * (L + D)): the batch is larger or longer than the backend was built for")
    if src.data_ptr() != buf.data_ptr():
        buf[:n].copy_(src.reshape(-1), non_blocking=True)
    return buf


class FlashInferBackend(CompiledModes, _SGLangFlashInfer):
    """SGLang's FlashInfer backend; its decode, idle, target verify and draft extend V2 metadata
    compiled, planned into graph-mode FlashInfer wrappers bound to the compiled buffers and sharing
    SGLang's workspace (``FlashInferDecodeAdapter``: ``plan()`` once per wrapper, then the split-KV
    partition on the GPU in the recorded graph). ``forward_metadata`` is SGLang's ``DecodeMetadata``
    / ``PrefillMetadata`` of those wrappers, so SGLang's ``forward_decode``/``forward_extend`` run them."""

    spec_name, sglang_name = "flashinfer", "flashinfer"

    def __init__(self, model_runner, skip_prefill: bool = False, kv_indptr_buf=None, kv_last_page_len_buf=None,
                 init_new_workspace: bool = False, *, compiled=None, partition: str = "device"):
        super().__init__(model_runner, skip_prefill, kv_indptr_buf, kv_last_page_len_buf, init_new_workspace)
        mc = model_runner.model_config
        self.num_head, self.num_kv_head = rank_heads(model_runner)
        self.head_dim = mc.head_dim
        window, pools = sliding_window(self, model_runner.sliding_window_size)
        if window["sliding_window"]:
            # prefills stay SGLang's code, whose ragged path drops the window: a prefill with nothing cached runs
            # its ragged wrapper without window_left (every prompt token attended), one with a cached prefix
            # counts the cached part's window from the new tokens' count, not their positions. Its paged path
            # passes the window as decode does, so a window model's prefills take it (SGLang's own switch,
            # SGLANG_FLASHINFER_USE_PAGED; docs/SGLANG.md)
            self.use_paged = True
        wanted = resolved_options(model_runner, self, num_heads=self.num_head, num_kv_heads=self.num_kv_head,
                                  backend=FlashInferOptions(plan_on_device=device_planned(partition)), **window)
        self._attach(compiled, wanted, self.req_to_token_pool.req_to_token, model_runner.device, **pools)
        from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter

        self.adapter = FlashInferDecodeAdapter(self.attnmeta, self.num_head, self.num_kv_head, self.head_dim,
                                               q_dtype=mc.dtype, kv_dtype=self.flashinfer_kv_cache_dtype,
                                               workspace=self.workspace_buffer,
                                               use_tensor_cores=self.decode_use_tensor_cores, partition=partition)

    _reads_host_lengths = host_planned

    def unserved(self) -> list[str]:
        from sglang.srt.layers.attention.flashinfer_backend import WrapperDispatch

        # a sliding window's two wrappers (window layers first, as SGLang indexes them) are planned; cross
        # attention's are not
        checks = ((self.num_wrappers != 1 and self.dispatch_reason != WrapperDispatch.SLIDING_WINDOW,
                   "cross attention (two wrappers)"),
                  (self.use_sliding_window_kv_pool and self.token_to_kv_pool.full_to_swa_index_mapping is None,
                   "a sliding-window pool without its full-to-window slot table"),
                  (self.is_dllm_model, "diffusion LLM decoding"),
                  (self.kv_index_translator.is_translating, "a translated (unified) KV pool"),
                  (self.prefill_uses_dequant_workspace or self.decode_uses_dequant_workspace,
                   "a dequantizing (FP4) KV cache"),
                  (self.enable_deterministic, "deterministic inference (fixed split sizes)"))
        return [name for bad, name in checks if bad]

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args, **kwargs):
        super().init_cuda_graph_state(max_bs, max_num_tokens, *args, **kwargs)
        self._verify_mask = own_verify_mask(self)

    @property
    def verify_mask(self):
        return getattr(self, "_verify_mask", None)

    def _replay_requires(self, v):
        return mask_in_place(v, self.verify_mask)

    def _before_staging(self, v, in_capture: bool) -> None:
        mask_into_plan(self, v, in_capture)  # FlashInfer's plan() (and the device packer) read the bound mask

    def _shape(self, m, v):
        from sglang.srt.layers.attention.flashinfer_backend import DecodeMetadata, PrefillMetadata

        if v.forward_mode.is_decode_or_idle():
            if not self.attnmeta.compiled.options.sliding_window:
                return DecodeMetadata(decode_wrappers=[m.plan])
            # SGLang's wrapper index of a layer is whether it is a full one: the window layers' wrapper first; with a
            # window pool, their KV writes go to the step's slots translated into it
            return DecodeMetadata(decode_wrappers=[m.plan_window, m.plan],
                                  swa_out_cache_loc=getattr(m, "swa_out_cache_loc", None))
        if not self.attnmeta.compiled.options.sliding_window:
            return PrefillMetadata(prefill_wrappers=[m.plan], use_ragged=False, extend_no_prefix=False)
        # verify and draft extend on a window model: the window layers' wrapper first, planned with FlashInfer's
        # window over the last min(keys, W + queries) slots (SGLang 0.5.23's own plans the row's first ones)
        return PrefillMetadata(prefill_wrappers=[m.plan_window, m.plan], use_ragged=False, extend_no_prefix=False,
                               swa_out_cache_loc=getattr(m, "swa_out_cache_loc", None))


__all__ = ["CAPTURED", "FlashInferBackend", "TritonBackend", "device_planned", "mask_in_place", "mask_into_plan",
           "own_verify_mask", "resolved_options", "split_scratch", "verify_mask"]
