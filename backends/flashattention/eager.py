"""Eager twin of backends/flashattention/spec.py, the way engines write it: the
page table gathered at the width of the longest sequence (a host max)."""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import torch

from attnmeta.runtime.metadata import Metadata, step_prefix


class EagerFlashAttentionDecode:
    strided_extend = False  # draft extend's queries: each request's accepted tokens

    def __init__(self, req_to_token: torch.Tensor, max_bs: int, page_size: int = 1, draft_tokens: int = 4,
                 attention_chunk: int = 0):
        self.req_to_token, self.page_size, self.D = req_to_token, page_size, draft_tokens
        self.chunk = attention_chunk  # chunked local attention's chunk (decode, verify), 0: none
        L = req_to_token.shape[1]
        self.strided = torch.arange(0, L, page_size, device=req_to_token.device)

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        bs, P = fb.batch_size, self.page_size
        verify = fb.forward_mode.is_target_verify()
        spec = verify or fb.forward_mode.is_draft_extend()
        T = self.D if spec else 1  # query tokens per request; in verify the D drafts' keys follow the prefix
        extra = self.D if verify else 0
        seq = fb.seq_lens[:bs] + extra
        cu_k = torch.nn.functional.pad(torch.cumsum(seq, 0, dtype=torch.int32), (1, 0))
        max_k = int(fb.seq_lens_cpu[:bs].max()) + extra if bs else 0  # host mirror: no device sync
        n = -(-max_k // P)
        rows = fb.req_pool_indices[:bs].long()
        page_table = (self.req_to_token[rows[:, None], self.strided[:n]] // P).to(torch.int32)
        cu_q = torch.arange(0, (bs + 1) * T, T, dtype=torch.int32, device=seq.device)
        if fb.forward_mode.is_draft_extend() and not self.strided_extend:  # queries: each request's accepted tokens
            cu_q = torch.nn.functional.pad(torch.cumsum(fb.extend_seq_lens[:bs], 0, dtype=torch.int32), (1, 0))
        out = SimpleNamespace(cache_seqlens_int32=seq.to(torch.int32), cu_seqlens_k=cu_k, cu_seqlens_q=cu_q,
                              page_table=page_table, max_seq_len_q=T, max_seq_len_k=max_k)
        return self.local(fb, out, extra) if self.chunk and not fb.forward_mode.is_draft_extend() else out

    def local(self, fb, out: SimpleNamespace, drafts: int = 0) -> SimpleNamespace:
        """Chunked local attention, request by request (a verify's ``drafts`` follow the prefix and are its queries,
        else the last token is): each chunk a request's queries fall in is
        a batch item, with those of its queries, the chunk's tokens up to its last query as keys, and the pages
        they are on (``local_block_table`` holds only those; the rest of a row is the kernel's to ignore)."""
        bs, P, C = fb.batch_size, self.page_size, self.chunk
        queries = drafts or 1
        cu, keys, tables = [0], [], []
        for row, n in zip(fb.req_pool_indices[:bs].tolist(), fb.seq_lens_cpu[:bs].tolist(), strict=True):
            end = n + drafts  # one past the last query
            pos = end - queries
            while pos < end:
                start = pos // C * C  # this chunk's first token
                last = min(end, start + C)  # one past its last query
                cu.append(cu[-1] + last - pos)
                keys.append(last - start)
                tables.append((self.req_to_token[row, start:last:P] // P).to(torch.int32))
                pos = last
        out.local_query_start_loc = torch.tensor(cu, dtype=torch.int32)
        out.local_seqused_k = torch.tensor(keys, dtype=torch.int32)
        out.local_block_table = tables  # per batch item, its chunk's pages
        return out


class EagerFlashAttentionTreeVerify(EagerFlashAttentionDecode):
    """Target verify with EAGLE topk > 1, the way FA3's engine code builds it: the prefix as decode's over
    seq_lens (no drafts), and per draft query the drafts its tree-mask row shows, found by gathering the
    mask's draft columns and sorting visible before hidden. ``fb.custom_mask`` is the drafter's flat mask
    (request i: D rows of seq_i + D)."""

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        bs, P, D = fb.batch_size, self.page_size, self.D
        seq = fb.seq_lens[:bs].long()
        rows = fb.req_pool_indices[:bs].long()
        max_k = int(fb.seq_lens_cpu[:bs].max()) if bs else 0
        page_table = (self.req_to_token[rows[:, None], self.strided[: -(-max_k // P)]] // P).to(torch.int32)
        cu_k = torch.nn.functional.pad(torch.cumsum(seq, 0, dtype=torch.int32), (1, 0))
        cols = seq[:, None] + torch.arange(D, device=seq.device)  # the drafts' key columns, per request
        row_start = torch.nn.functional.pad(torch.cumsum((seq + D).repeat_interleave(D), 0), (1, 0))[:-1]
        where = cols.repeat_interleave(D, dim=0) + row_start[:, None]
        mask = fb.custom_mask.reshape(-1)[where].bool()  # [bs * D, D]
        j = torch.arange(D, device=seq.device).expand(mask.shape[0], D)
        order = torch.sort(torch.where(mask, j, j + D), dim=1).indices
        slots = self.req_to_token[rows[:, None], cols].repeat_interleave(D, dim=0)
        lens = mask.sum(dim=1).to(torch.int32)
        return SimpleNamespace(cache_seqlens_int32=seq.to(torch.int32), cu_seqlens_k=cu_k, page_table=page_table,
                               cu_seqlens_q=torch.arange(0, (bs + 1) * D, D, dtype=torch.int32, device=seq.device),
                               max_seq_len_q=D, max_seq_len_k=max_k,
                               expand_cache_seqlens_int32=lens, expand_page_table=slots.gather(1, order),
                               expand_cu_seqlens_k=torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32),
                                                                           (1, 0)),
                               expand_cu_seqlens_q=torch.arange(bs * D + 1, dtype=torch.int32, device=seq.device))


class EagerTRTLLMMHA(EagerFlashAttentionDecode):
    """TRT-LLM MHA's step, as SGLang's TRTLLMHAAttnBackend computes it: FlashAttention's, with draft
    extend's queries T per request (strided), whatever each request accepted."""

    strided_extend = True


class EagerFlashAttentionDraft:
    """Draft decode steps, the way a multi-step draft backend loops over its steps."""

    def __init__(self, req_to_token: torch.Tensor, max_bs: int, page_size: int = 1, num_steps: int = 3):
        self.step = EagerFlashAttentionDecode(req_to_token, max_bs, page_size)
        self.num_steps = num_steps

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        out = Metadata(max_seq_len_q=1)
        for i in range(self.num_steps):
            m = self.step.init_forward_metadata(attrs.evolve(fb, seq_lens=fb.seq_lens + i + 1,
                                                             seq_lens_cpu=fb.seq_lens_cpu + i + 1))
            out.cu_seqlens_q = m.cu_seqlens_q
            for field in ("cache_seqlens_int32", "cu_seqlens_k", "page_table"):
                setattr(out, step_prefix(i) + field, getattr(m, field))
        return out


class EagerFlashAttentionTreeDraft:
    """EAGLE's draft decode with topk > 1, the way FA3's engine code builds each step: the prefix up to its last
    whole page for every branch's query, then per branch the drafted slots of ``out_cache_loc`` (``[bs * K, S]``)
    reduced to their distinct pages by a scatter of each run's page to its run index."""

    def __init__(self, req_to_token: torch.Tensor, max_bs: int, page_size: int = 1, num_steps: int = 3,
                 topk: int = 4):
        self.req_to_token, self.P, self.S, self.K = req_to_token, page_size, num_steps, topk

    def init_forward_metadata(self, fb) -> Metadata:
        bs, P, K, S = fb.batch_size, self.P, self.K, self.S
        seq = fb.seq_lens[:bs].long()
        last = seq % P
        prefix = seq - last
        n = -(-int(prefix.max()) // P) if bs else 0
        rows = fb.req_pool_indices[:bs].long()
        cols = torch.arange(0, n * P, P, device=seq.device)
        dev = seq.device
        out = Metadata(cache_seqlens_int32=prefix.to(torch.int32), max_seq_len_q=K,
                       cu_seqlens_q=torch.arange(0, bs * K + 1, K, dtype=torch.int32, device=dev),
                       cu_seqlens_k=torch.nn.functional.pad(torch.cumsum(prefix, 0, dtype=torch.int32), (1, 0)),
                       page_table=(self.req_to_token[rows[:, None], cols] // P).to(torch.int32),
                       expand_cu_seqlens_q=torch.arange(bs * K + 1, dtype=torch.int32, device=dev))
        loc = fb.out_cache_loc[: bs * K * S].view(-1, S)
        for s in range(S - 1):
            pages = loc[:, : s + 1] // P
            change = torch.ones_like(pages, dtype=torch.bool)
            change[:, 1:] = pages[:, 1:] != pages[:, :-1]
            table = torch.zeros(bs * K, s + 1 + (P > 1), dtype=torch.int32, device=dev)
            table.scatter_(1, change.long().cumsum(1) - 1, pages.to(torch.int32))
            p = step_prefix(s)
            setattr(out, p + "expand_cache_seqlens_int32", (s + 1 + last.repeat_interleave(K)).to(torch.int32))
            setattr(out, p + "expand_page_table", table)
            setattr(out, p + "expand_cu_seqlens_k",
                    torch.arange(0, bs * K * (s + 1) + 1, s + 1, dtype=torch.int32, device=dev))
        return out
