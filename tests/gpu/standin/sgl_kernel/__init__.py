"""A torch-only stand-in for SGLang's GPU kernel package ``sgl_kernel`` (536 MB, not installable on the
lent H200), for running SGLang's real engine in the GPU tier (``tests/gpu/test_sglang_engine.py``).

Real bodies, in torch, for what a dense model's forward calls (norms, activations, rotary embedding,
state merging, stream and tensor helpers); every other name imports (``from sgl_kernel import x``,
any ``sgl_kernel.sub`` module) and raises ``StandInCalled`` naming itself if it is ever called, so a
test that reaches a kernel this package does not implement fails loudly instead of computing
nonsense. Put its parent folder on ``PYTHONPATH``; SGLang's version check is off with
``SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

import torch
import torch.nn.functional as F

__version__ = "0.0.0+attnmeta.standin"


class StandInCalled(RuntimeError):
    """A kernel of SGLang's package that this stand-in does not implement was called."""


def _stub(name: str):
    def call(*args, **kwargs):
        raise StandInCalled(f"sgl_kernel.{name} was called; the stand-in sgl_kernel does not implement it")

    call.__name__ = name.rsplit(".", 1)[-1]
    call.__qualname__ = call.__name__
    return call


def _rms(x, w, eps, gemma=False):
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * ((1.0 + w.float()) if gemma else w.float())).to(x.dtype)


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    y = _rms(input, weight, eps)
    return y if out is None else out.copy_(y)


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps))


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    y = _rms(input, weight, eps, gemma=True)
    return y if out is None else out.copy_(y)


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    residual.add_(input)
    input.copy_(_rms(residual, weight, eps, gemma=True))


def _gated(act):
    def fn(input, out=None, enable_pdl=None):
        d = input.shape[-1] // 2
        y = (act(input[..., :d].float()) * input[..., d:].float()).to(input.dtype)
        return y if out is None else out.copy_(y)
    return fn


silu_and_mul = _gated(F.silu)
gelu_and_mul = _gated(lambda x: F.gelu(x))
gelu_tanh_and_mul = _gated(lambda x: F.gelu(x, approximate="tanh"))


def _rope(positions, x, head_size, cache, is_neox):
    """Rotate ``x`` [tokens, heads * head_size] in place; ``cache`` [max_pos, rot] holds cos | sin."""
    n = x.shape[0]
    xv = x.view(n, -1, head_size)
    cs = cache.index_select(0, positions.reshape(-1).long()).float()
    rot = cs.shape[-1]
    cos, sin = cs[:, None, : rot // 2], cs[:, None, rot // 2 :]
    r = xv[..., :rot].float()
    if is_neox:
        a, b = r[..., : rot // 2], r[..., rot // 2 :]
        out = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    else:
        a, b = r[..., 0::2], r[..., 1::2]
        out = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
    xv[..., :rot] = out.to(x.dtype)


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox=True, **_):
    _rope(positions, query, head_size, cos_sin_cache, is_neox)
    if key is not None:
        _rope(positions, key, head_size, cos_sin_cache, is_neox)


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache, is_neox)


def merge_state_v2(v_a, s_a, v_b, s_b, v_merged=None, s_merged=None):
    """Two partial attentions (values [n, h, d], log-sum-exps [n, h], base 2) into one."""
    sa, sb = s_a.float(), s_b.float()
    m = torch.maximum(sa, sb)
    wa, wb = torch.exp2(sa - m), torch.exp2(sb - m)
    v = ((v_a.float() * wa[..., None] + v_b.float() * wb[..., None]) / (wa + wb)[..., None]).to(v_a.dtype)
    s = m + torch.log2(wa + wb)
    if v_merged is not None:
        v_merged.copy_(v)
        v = v_merged
    if s_merged is not None:
        s_merged.copy_(s)
        s = s_merged
    return v, s


merge_state = merge_state_v2


def weak_ref_tensor(t):
    return t


def get_cuda_stream():
    return torch.cuda.current_stream().cuda_stream


_REAL = {n: globals()[n] for n in (
    "rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "silu_and_mul", "gelu_and_mul",
    "gelu_tanh_and_mul", "apply_rope_with_cos_sin_cache_inplace", "rotary_embedding", "merge_state_v2",
    "merge_state", "weak_ref_tensor", "get_cuda_stream")}
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                            return_softmax_lse=False, sinks=None, out=None, ver=3, **_):
    """FlashAttention-3's attention over a paged KV cache, in torch, reading what FA3 reads: the page table
    (``k_cache`` is ``[pages, P, Hkv, D]``), each request's key count ``cache_seqlens``, its queries
    ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]`` (the last of them at key position ``cache_seqlens[b] - 1``),
    causal, the window ``(left, right)``, the soft cap, the scale. Capturable: no host read of a device
    value (the padded query width is ``max_seqlen_q``, the key width the page table's). ``cu_seqlens_k_new``
    is read only with new keys, which SGLang never passes (it writes the cache itself)."""
    unsupported = dict(k=k, v=v, qv=qv, rotary_cos=rotary_cos, cache_batch_idx=cache_batch_idx,
                       cache_leftpad=cache_leftpad, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                       sinks=sinks)
    bad = [n for n, x in unsupported.items() if x is not None] + (["attention_chunk"] if attention_chunk else [])
    if bad:
        raise StandInCalled(f"sgl_kernel.flash_attn.flash_attn_with_kvcache with {bad}: the stand-in reads a "
                            "paged cache with none of these")
    shape4 = cu_seqlens_q is None
    if shape4:  # [B, Sq, H, D]: every request Sq queries
        B, Sq = q.shape[:2]
        cu_seqlens_q = torch.arange(B + 1, device=q.device, dtype=torch.int32) * Sq
        max_seqlen_q = Sq
    H, D = q.shape[-2:]
    flat = q.reshape(-1, H, D)
    B, T = cu_seqlens_q.shape[0] - 1, flat.shape[0]
    Hkv, Dv = k_cache.shape[-2], v_cache.shape[-1]
    if page_table is None:
        K, V = k_cache[:B], v_cache[:B]
    else:
        P, pages = k_cache.shape[1], k_cache.shape[0]
        page_table = _key_width(page_table, P)
        slots = (page_table.long().clamp(0, pages - 1)[:, :, None] * P
                 + torch.arange(P, device=q.device)).reshape(B, -1)
        K, V = k_cache.reshape(-1, Hkv, D)[slots], v_cache.reshape(-1, Hkv, Dv)[slots]
    g = H // Hkv
    K, V = K.float().repeat_interleave(g, dim=2), V.float().repeat_interleave(g, dim=2)  # [B, Sk, H, D]
    cu = cu_seqlens_q.long()
    t = torch.arange(T, device=q.device)
    bid = torch.searchsorted(cu[1:], t, right=True).clamp(max=B - 1)
    row, mq = t - cu[bid], int(max_seqlen_q)
    # a token past cu_seqlens_q[-1] (a captured draft extend's padding, its extend lengths not yet written) or
    # past max_seqlen_q belongs to no request: FA3's varlen kernel never reads it and writes zeros there; it
    # lands in a spare column here, so that no index leaves the tensor under capture
    real = (t < cu[B]) & (row < mq)
    row = torch.where(real, row, mq)
    Q = torch.zeros(B, mq + 1, H, D, dtype=torch.float32, device=q.device)
    Q[bid, row] = flat.float()
    Q = Q[:, :mq]
    row = row.clamp(max=max(mq - 1, 0))
    s = torch.einsum("bqhd,bkhd->bhqk", Q, K) * (softmax_scale or D ** -0.5)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    lens, nq = cache_seqlens.long(), cu[1:] - cu[:-1]
    kpos = torch.arange(K.shape[1], device=q.device)
    qpos = lens[:, None] - nq[:, None] + torch.arange(Q.shape[1], device=q.device)  # [B, q]
    ok = kpos[None, None, :] < lens[:, None, None]
    left, right = window_size
    if causal:
        ok = ok & (kpos[None, None, :] <= qpos[:, :, None])
    elif right >= 0:
        ok = ok & (kpos[None, None, :] <= qpos[:, :, None] + right)
    if left >= 0:
        ok = ok & (kpos[None, None, :] >= qpos[:, :, None] - left)
    s = s.masked_fill(~ok[:, None], float("-inf"))
    lse = torch.logsumexp(s, -1)  # [B, H, q]; natural log, as FA3's
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # a query row with no key attends to nothing
    o = (torch.einsum("bhqk,bkhd->bqhd", p, V)[bid, row] * real[:, None, None]).to(q.dtype)  # [T, H, Dv]
    if out is not None:
        out.copy_(o.view(out.shape))
        o = out
    elif shape4:
        o = o.view(*q.shape[:2], H, Dv)
    if return_softmax_lse:
        return o, lse.permute(1, 0, 2)[:, bid, row]  # [H, T]
    return o


def _key_width(page_table: torch.Tensor, P: int) -> torch.Tensor:
    """The page table padded to ``ATTNMETA_STANDIN_KEYS`` tokens (unset: as given). FA3 reads a row's first
    ``cache_seqlens`` keys whatever the table's width, but this stand-in reduces over the whole width, whose
    rounding follows it: two backends whose tables differ only in width (attnmeta_fa3's verify table is a few
    pages wider than SGLang's) would round differently, and a near-tie token flip after a hundred tokens says
    nothing about their metadata. One fixed width makes equal metadata compute bitwise equal."""
    keys = int(os.environ.get("ATTNMETA_STANDIN_KEYS") or 0)
    width = -(-keys // P)
    if not keys or page_table.shape[1] == width:
        return page_table
    if page_table.shape[1] > width:
        raise StandInCalled(f"a page table of {page_table.shape[1]} pages of {P} is wider than "
                            f"ATTNMETA_STANDIN_KEYS={keys} tokens: raise it")
    return F.pad(page_table, (0, width - page_table.shape[1]))


def get_scheduler_metadata(**_):
    """FlashAttention-3's precomputed split schedule: none. ``flash_attn_with_kvcache`` takes
    ``scheduler_metadata=None`` as "plan inside the kernel", which is what FA3 does without it."""
    return None


_SUB_REAL = {"utils": {"is_arch_support_pdl": lambda *a, **k: False, "get_cuda_stream": get_cuda_stream},
             "elementwise": {k: _REAL[k] for k in ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul")},
             "flash_attn": {"get_scheduler_metadata": get_scheduler_metadata,
                            "flash_attn_with_kvcache": flash_attn_with_kvcache}}


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    fn = _stub(name)
    globals()[name] = fn
    return fn


class _Sub(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        real = _SUB_REAL.get(self.__name__.split(".", 1)[1], {})
        fn = real.get(name) or _stub(f"{self.__name__.split('.', 1)[1]}.{name}")
        setattr(self, name, fn)
        return fn


# submodules whose absence SGLang handles itself (it falls back to its own definitions): not stood in
ABSENT = {"scalar_type"}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Any ``sgl_kernel.<sub>`` imports, as a module of stubs (with the real bodies above)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[1:2] and fullname.split(".")[1] in ABSENT:
            return None
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _Sub(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
ops = types.SimpleNamespace()  # torch.ops.sgl_kernel is never registered here
