"""SGLang attention backends whose metadata attnmeta compiles.

Each class subclasses SGLang's real ``AttentionBackend`` and serves SGLang's ``ForwardBatch`` (and
its graph runner's replay view) in every mode SGLang captures: decode, idle, target verify, draft
extend V2. The compiled backend does the metadata (out_graph: staging and planners; in_graph: the
recorded kernel); ``forward_metadata`` is built in the shape of SGLang's own backend of that kind,
so SGLang's kernels and model code read it unchanged.
"""

from __future__ import annotations

import os

import torch

from attnmeta.compiler import compile_backend
from attnmeta.compiler.ir.errors import OptionsError
from attnmeta.runtime import BatchError

from .attention import decode_by_indices, decode_by_page_table, extend_by_indices, extend_by_page_table
from .batch import BatchView
from .options import compile_options

try:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend as _SGLangBackend
except ImportError as e:  # the optional extra: say so once, at import
    raise ImportError(f"attnmeta.integrations.sglang needs SGLang ({e}); pip install 'attnmeta[sglang]'") from e


class AttnmetaBackend(_SGLangBackend):
    """The three-method contract over a compiled attnmeta backend of kind ``spec_name``."""

    spec_name: str = ""

    def __init__(self, compiled, req_to_token: torch.Tensor, *, num_heads: int, num_kv_heads: int, head_dim: int,
                 v_head_dim: int | None = None, device=None, planners=None):
        if compiled.spec.name != self.spec_name:
            raise OptionsError(f"{type(self).__name__} serves attnmeta's {self.spec_name!r} spec; got a backend "
                               f"compiled from {compiled.spec.name!r}")
        self.compiled, self.options = compiled, compiled.options
        self.inner = compiled.instantiate(req_to_token, device=device, planners=planners)
        self.device = self.inner.device
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.v_head_dim = v_head_dim or head_dim
        self._view = BatchView()
        first = next(iter(compiled.generic.values()))
        self._fill = first.input("seq_lens").fill
        self.max_num_tokens = None
        self.forward_metadata = None
        # (mode, bs, mask given) -> (the bound plan's fields, the SGLang-shaped object over them): every field
        # is a static view, so the object is built once per plan, not every step
        self._shaped: dict[tuple, tuple] = {}

    @classmethod
    def from_runner(cls, runner, compiled=None, **overrides):
        """Built from SGLang's ``ModelRunner``: its server args, model config, pools and device. A
        ``compiled`` backend (e.g. ``load_compiled(path)`` of an artifact) skips compiling."""
        mc, tp = runner.model_config, getattr(runner, "tp_size", 1)
        wanted = compile_options(runner.server_args, mc, **overrides)
        if compiled is None:
            compiled = compile_backend(cls.spec_name, wanted)
        else:  # an artifact compiled ahead must match the server it is loaded into
            _check_matches(compiled.options, wanted)
        return cls(compiled, runner.req_to_token_pool.req_to_token, num_heads=mc.num_attention_heads // tp,
                   num_kv_heads=mc.get_num_kv_heads(tp), head_dim=mc.head_dim,
                   v_head_dim=getattr(mc, "v_head_dim", None), device=runner.device)

    # --- SGLang's graph-runner hooks ---
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        if max_bs > self.options.max_bs:
            raise OptionsError(f"SGLang captures batches up to {max_bs} but the backend was compiled for "
                               f"max_bs={self.options.max_bs}; compile with max_bs >= {max_bs} "
                               "(compile_options(server_args) reads --cuda-graph-max-bs-decode)")
        self.max_num_tokens = max_num_tokens

    def get_cuda_graph_seq_len_fill_value(self):
        return self._fill

    # --- the contract ---
    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        v = self._view.fill(forward_batch)
        mask = getattr(v.spec_info, "custom_mask", None) if v.forward_mode.is_target_verify() else None
        if mask is not None:  # before planning: a planner (FlashInfer's) packs the mask it finds there
            buf = getattr(self.inner.bound(v.forward_mode, v.batch_size).meta, "custom_mask", None)
            if buf is not None:  # a spec without one (flashattention) verifies a chain causally (topk 1)
                _write_mask(buf, mask)
        self.inner.init_forward_metadata_out_graph(v, in_capture)
        m, key = self.inner.forward_metadata, (v.forward_mode, v.batch_size, mask is not None)
        hit = self._shaped.get(key)
        if hit is None or hit[0] is not m:  # first step of this plan, or its buffers were bound again
            hit = self._shaped[key] = (m, self._metadata(m, v))
        self.forward_metadata = hit[1]

    def init_forward_metadata_in_graph(self, forward_batch):
        self.inner.init_forward_metadata_in_graph(self._view.require(forward_batch))

    def _metadata(self, m, v: BatchView):
        """``forward_metadata`` in the shape SGLang's backend of this kind hands its kernels."""
        raise NotImplementedError

    # --- attention ---
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        return self._attend(self._decode, q, k, v, layer, forward_batch, save_kv_cache)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        return self._attend(self._extend, q, k, v, layer, forward_batch, save_kv_cache)

    @staticmethod
    def _attend(kernel, q, k, v, layer, forward_batch, save_kv_cache: bool):
        """Save the new tokens' K/V first (the metadata's keys include them), then ``kernel`` over the pool."""
        pool = forward_batch.token_to_kv_pool
        if save_kv_cache and k is not None:
            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        q3 = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        o = q.new_empty((q3.shape[0], layer.tp_q_head_num, layer.v_head_dim))
        kernel(q3, pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id), o, layer)
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def _decode(self, q, k_buf, v_buf, o, layer):
        raise NotImplementedError

    def _extend(self, q, k_buf, v_buf, o, layer):
        raise NotImplementedError(f"{type(self).__name__} computes attention in decode only")


def _check_matches(have, want) -> None:
    """The options that shape metadata, the artifact's against the server's; a mismatch names each."""
    names = ("page_size", "max_context_len", "num_heads", "num_kv_heads", "num_draft_tokens", "topk", "num_steps")
    bad = [f"{n}: artifact {getattr(have, n)}, server {getattr(want, n)}" for n in names
           if getattr(have, n) != getattr(want, n)]
    missing = sorted(m.name.lower() for m in set(want.modes) - set(have.modes))
    if missing:
        bad.append(f"modes {missing} are not in the artifact")
    if have.max_bs < want.max_bs:
        bad.append(f"max_bs: artifact {have.max_bs}, server captures up to {want.max_bs}")
    if bad:
        raise OptionsError("the compiled artifact does not match this server (" + "; ".join(bad) + "); recompile it "
                           "with the server's options (attnmeta compile ... --out) or unset ATTNMETA_ARTIFACT")


def _write_mask(buf, mask):
    """The drafter's tree mask into the static buffer the captured kernel (or the planner) reads, as
    SGLang copies it into its verify-mask buffer."""
    n = mask.numel()
    if n > buf.numel():
        raise BatchError(f"spec_info.custom_mask has {n} entries; the verify mask buffer holds {buf.numel()} "
                         "(max_bs * D * (L + D)): the batch is longer than the backend was compiled for")
    buf[:n].copy_(mask.reshape(-1), non_blocking=True)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class TritonBackend(AttnmetaBackend):
    """SGLang's Triton backend's metadata (``triton_backend.ForwardMetadata``); attention by SGLang's
    own split-KV decode kernel reading it (on a CPU, under ``TRITON_INTERPRET=1``)."""

    spec_name = "triton"
    max_kv_splits = 8  # the spec's MAX_SPLITS, SGLang's default --triton-attention-num-kv-splits

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        super().init_cuda_graph_state(max_bs, max_num_tokens)
        self._scratch(max_num_tokens)

    def _scratch(self, tokens: int):
        have = getattr(self, "attn_logits", None)
        if have is None or have.shape[0] < tokens:
            f32 = dict(dtype=torch.float32, device=self.device)
            self._shaped.clear()  # shaped metadata holding the old scratch
            self.attn_logits = torch.zeros((tokens, self.num_heads, self.max_kv_splits, self.v_head_dim), **f32)
            self.attn_lse = torch.zeros((tokens, self.num_heads, self.max_kv_splits), **f32)
        return self.attn_logits, self.attn_lse

    def _metadata(self, m, v):
        from sglang.srt.layers.attention.triton_backend import ForwardMetadata

        mode, none = v.forward_mode, dict(window_kv_indptr=None, window_kv_indices=None, window_num_kv_splits=None,
                                          window_kv_offsets=None)
        if mode.is_decode_or_idle():
            logits, lse = self._scratch(self.max_num_tokens or self.options.max_bs)
            return ForwardMetadata(attn_logits=logits, attn_lse=lse, max_extend_len=None,
                                   num_kv_splits=m.num_kv_splits, kv_indptr=m.kv_indptr, kv_indices=m.kv_indices,
                                   qo_indptr=None, custom_mask=None, mask_indptr=None, **none)
        verify = mode.is_target_verify()
        mask = m.custom_mask if verify and getattr(v.spec_info, "custom_mask", None) is not None else None
        return ForwardMetadata(attn_logits=None, attn_lse=None, max_extend_len=int(m.max_extend_len),
                               num_kv_splits=None, kv_indptr=m.kv_indptr, kv_indices=m.kv_indices,
                               qo_indptr=m.qo_indptr, custom_mask=mask,
                               mask_indptr=m.mask_indptr if verify else None, **none)

    def _decode(self, q, k_buf, v_buf, o, layer):
        m = self.forward_metadata
        if self.device.type == "cpu" and not _interpreted():  # no Triton on a CPU without the interpreter
            return decode_by_indices(q, k_buf, v_buf, m.kv_indptr, m.kv_indices, self.options.max_context_len,
                                     layer.scaling, o)
        from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

        decode_attention_fwd(q, k_buf, v_buf, o, m.kv_indptr, m.kv_indices, m.attn_logits, m.attn_lse,
                             m.num_kv_splits, self.max_kv_splits, layer.scaling,
                             getattr(layer, "k_scale_float", None) or 1.0, getattr(layer, "v_scale_float", None) or 1.0,
                             logit_cap=getattr(layer, "logit_cap", 0.0) or 0.0)
        return o


    def _extend_with(self, q, k, v, o, k_buf, v_buf, layer):
        """Target verify (the tree mask over the prefix and the drafts) and draft extend (causal over the
        new tokens) by SGLang's own extend kernel: the prefix from the pool through ``kv_indices``, the
        new tokens' K/V as given (on a CPU, under ``TRITON_INTERPRET=1``)."""
        if self.device.type == "cpu" and not _interpreted():
            raise NotImplementedError("TritonBackend's extend attention runs SGLang's Triton kernel: on a CPU set "
                                      "TRITON_INTERPRET=1 (before Triton is imported)")
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

        m = self.forward_metadata
        extend_attention_fwd(q, k.contiguous(), v.contiguous(), o, k_buf, v_buf, m.qo_indptr,
                             m.kv_indptr, m.kv_indices, m.custom_mask, True, m.mask_indptr, m.max_extend_len,
                             1.0, 1.0, sm_scale=layer.scaling, logit_cap=getattr(layer, "logit_cap", 0.0) or 0.0)
        return o

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        """As SGLang's Triton backend: save the new tokens' K/V, then attend with them given directly."""
        pool = forward_batch.token_to_kv_pool
        k_buf, v_buf = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
        if k is None or v is None:  # read back what an earlier layer stored
            k, v = k_buf[forward_batch.out_cache_loc], v_buf[forward_batch.out_cache_loc]
        elif save_kv_cache:
            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        q3 = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        o = q.new_empty((q3.shape[0], layer.tp_q_head_num, layer.v_head_dim))
        kv = (k.view(q3.shape[0], -1, layer.qk_head_dim), v.view(q3.shape[0], -1, layer.v_head_dim))
        self._extend_with(q3, *kv, o, k_buf, v_buf, layer)
        return o.view(-1, layer.tp_q_head_num * layer.v_head_dim)


class FlashInferBackend(AttnmetaBackend):
    """SGLang's FlashInfer backend's metadata (``DecodeMetadata`` / ``PrefillMetadata`` of planned
    wrappers). With FlashInfer installed (GPU) the planners are FlashInfer's real ``plan()`` on
    graph-mode wrappers bound to the compiled buffers; without it, attnmeta's stand-in planner,
    and attention by the torch reference over ``kv_indptr``/``kv_indices``."""

    spec_name = "flashinfer"

    def __init__(self, compiled, req_to_token, *, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16, **kw):
        super().__init__(compiled, req_to_token, **kw)
        self.flashinfer = None
        if self.device.type == "cuda":
            from attnmeta.runtime.flashinfer_adapter import FlashInferDecodeAdapter

            self.flashinfer = FlashInferDecodeAdapter(self.inner, self.num_heads, self.num_kv_heads, self.head_dim,
                                                      q_dtype=q_dtype, kv_dtype=kv_dtype)

    def _metadata(self, m, v):
        from sglang.srt.layers.attention.flashinfer_backend import DecodeMetadata, PrefillMetadata

        if v.forward_mode.is_decode_or_idle():
            out = DecodeMetadata(decode_wrappers=[m.plan])
        else:
            out = PrefillMetadata(prefill_wrappers=[m.plan], use_ragged=False, extend_no_prefix=False)
        out.fields = m  # the planned buffers (kv_indptr, kv_indices, kv_last_page_len, ...)
        return out

    def _decode(self, q, k_buf, v_buf, o, layer):
        m = self.forward_metadata
        w = m.decode_wrappers[0]
        if self.flashinfer is not None:
            _, hkv, d = k_buf.shape
            return o.copy_(w.forward(q, (k_buf.view(-1, 1, hkv, d), v_buf.view(-1, 1, hkv, d)),
                                     sm_scale=layer.scaling))
        f = m.fields
        return decode_by_indices(q, k_buf, v_buf, f.kv_indptr, f.kv_indices, self.options.max_context_len,
                                 layer.scaling, o)

    def _extend(self, q, k_buf, v_buf, o, layer):
        """Target verify (the drafter's tree mask, no causal mask) and draft extend (causal), over keys
        that are all in the pool once the new tokens are saved: FlashInfer's planned paged prefill
        wrapper on a GPU, the torch reference without FlashInfer."""
        m = self.forward_metadata
        f, verify = m.fields, getattr(m.fields, "custom_mask", None) is not None
        if self.flashinfer is not None:
            _, hkv, d = k_buf.shape
            return o.copy_(m.prefill_wrappers[0].forward(q, (k_buf.view(-1, 1, hkv, d), v_buf.view(-1, 1, hkv, d)),
                                                         causal=not verify, sm_scale=layer.scaling))
        return extend_by_indices(q, k_buf, v_buf, f.qo_indptr, f.kv_indptr, f.kv_indices,
                                 self.options.max_context_len, layer.scaling, o,
                                 mask=f.custom_mask if verify else None, mask_indptr=f.mask_indptr if verify else None)


class FlashAttentionBackend(AttnmetaBackend):
    """SGLang's FlashAttention backend's metadata (``FlashAttentionMetadata``: cache_seqlens_int32,
    cu_seqlens_q/k, page_table, max_seq_len_q/k). Attention, in every mode, by the torch reference
    over the page table: FlashAttention-3 ships in SGLang's GPU kernel package, which this
    integration does not need."""

    spec_name = "flashattention"

    def _metadata(self, m, v):
        return FlashAttentionMetadata(cache_seqlens_int32=m.cache_seqlens_int32, max_seq_len_q=int(m.max_seq_len_q),
                                      max_seq_len_k=int(m.max_seq_len_k), cu_seqlens_q=m.cu_seqlens_q,
                                      cu_seqlens_k=m.cu_seqlens_k, page_table=m.page_table)

    def _decode(self, q, k_buf, v_buf, o, layer):
        m = self.forward_metadata
        return decode_by_page_table(q, k_buf, v_buf, m.page_table, m.cache_seqlens_int32, self.options.page_size,
                                    self.options.max_context_len, layer.scaling, o)

    def _extend(self, q, k_buf, v_buf, o, layer):
        """Verify (a chain of drafts: causal, the drafts' K/V already in the pool) and draft extend
        (the accepted tokens, packed by ``cu_seqlens_q``), by the torch reference."""
        m = self.forward_metadata
        return extend_by_page_table(q, k_buf, v_buf, m.cu_seqlens_q, m.page_table, m.cache_seqlens_int32,
                                    self.options.page_size, self.options.max_context_len, layer.scaling, o)


def _flash_attention_metadata():
    """SGLang's class where it imports (it needs SGLang's GPU kernel package), else one with its fields."""
    try:
        from sglang.srt.layers.attention.flashattention_backend import FlashAttentionMetadata as cls
    except ImportError:
        import dataclasses

        cls = dataclasses.make_dataclass("FlashAttentionMetadata", [
            ("cache_seqlens_int32", torch.Tensor, None), ("max_seq_len_q", int, 1), ("max_seq_len_k", int, 0),
            ("cu_seqlens_q", torch.Tensor, None), ("cu_seqlens_k", torch.Tensor, None),
            ("window_size", tuple, (-1, -1)), ("page_table", torch.Tensor, None)])
    return cls


FlashAttentionMetadata = _flash_attention_metadata()
KINDS = {c.spec_name: c for c in (TritonBackend, FlashInferBackend, FlashAttentionBackend)}
