"""FlashInfer's attention kernels as the demo model calls them (GPU, FlashInfer installed): a planned
decode wrapper run on token-slot pools, and the XQA decode kernel over a page table. Attention, not
metadata: the wrappers and page tables they read are what attnmeta's backends plan."""

from __future__ import annotations

import torch

from attnmeta.backends.flashinfer_lib import FlashInferVersionError, _flashinfer


def run_decode(wrapper, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor):
    """Attention through a planned wrapper; caches are token-slot pools [slots, kv_heads, head_dim]."""
    _, hkv, d = k_cache.shape
    kv = (k_cache.view(-1, 1, hkv, d), v_cache.view(-1, 1, hkv, d))  # page size 1 pages
    return wrapper.run(q, kv, out=out)


class XQADecode:
    """FlashInfer's XQA decode kernel over a page table and sequence lengths: no ``plan()``, so no
    host work per step. It reads exactly what the flashattention spec records in its graph
    (``page_table`` at the static width, ``cache_seqlens_int32``, viewed as the uint32 XQA takes),
    so it is captured with the metadata and replayed with it. Paged pools only (pages of 16 or more
    tokens); SGLang's token-slot layout (page size 1) keeps the planned wrapper."""

    def __init__(self, device, workspace_bytes: int = 256 << 20):
        fi = _flashinfer()
        try:
            from flashinfer.decode import xqa_batch_decode_with_kv_cache
        except ImportError:
            raise FlashInferVersionError(f"FlashInfer {fi.__version__} has no XQA decode "
                                         "(flashinfer.decode.xqa_batch_decode_with_kv_cache); use the planned "
                                         "decode wrapper (FlashInferDecodeAdapter) or upgrade FlashInfer") from None
        self._xqa = xqa_batch_decode_with_kv_cache
        self.workspace = torch.zeros(workspace_bytes, dtype=torch.uint8, device=device)  # zero before first use

    def __call__(self, q, k_cache, v_cache, page_table, cache_seqlens, page_size: int, max_seq_len: int, out):
        """q, out [bs, H, D]; caches are token-slot pools [slots, kv_heads, D] whose pages are P slots."""
        _, hkv, d = k_cache.shape
        pages = (k_cache.view(-1, page_size, hkv, d), v_cache.view(-1, page_size, hkv, d))
        bs = q.shape[0]
        return self._xqa(q, pages, self.workspace, page_table[:bs], cache_seqlens[:bs].view(torch.uint32),
                         max_seq_len, bmm1_scale=d ** -0.5, out=out)
