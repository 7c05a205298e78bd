"""The hand-written eager twin of backends/flashinfer/spec.py, written the way
serving engines write it today: persistent indptr buffers, a fresh
``kv_indices`` sized by the host-known token sum, a host indptr for plan().
It is the benchmark baseline and a second, independent oracle."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import torch

from attnmeta.compiler.modes import ForwardMode

from ..common import gather_kv_indices


class EagerFlashInferDecode:
    def __init__(self, req_to_token: torch.Tensor, max_bs: int, draft_tokens: int = 4, sliding_window: int = 0,
                 full_to_swa: torch.Tensor | None = None):
        dev = req_to_token.device
        self.req_to_token, self.D = req_to_token, draft_tokens
        # a sliding window (0: none): the window layers' wrapper reads the current token and the W before it; their
        # KV in a pool of its own when ``full_to_swa`` maps the full pool's slots into it
        self.window, self.full_to_swa = sliding_window, full_to_swa
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        if fb.forward_mode.is_target_verify():
            return self.verify(fb)
        if fb.forward_mode.is_draft_extend():
            return self.draft_extend(fb)
        if fb.forward_mode is ForwardMode.EXTEND:
            return self.extend(fb)
        bs = fb.batch_size
        seq_lens = fb.seq_lens[:bs]
        self.kv_indptr[1 : bs + 1] = torch.cumsum(seq_lens, 0)
        kv_indptr = self.kv_indptr[: bs + 1]
        total = int(fb.seq_lens_cpu[:bs].sum())  # host mirror: no device sync
        kv_indices = gather_kv_indices(self.req_to_token, fb.req_pool_indices[:bs], seq_lens, kv_indptr, total)
        indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        indptr_host[1:] = torch.cumsum(fb.seq_lens_cpu[:bs], 0)
        out = SimpleNamespace(kv_indptr=kv_indptr, kv_indices=kv_indices,
                              kv_last_page_len=self.kv_last_page_len[:bs], kv_indptr_host=indptr_host)
        return self.window_of(fb, out) if self.window else out

    def window_of(self, fb, out: SimpleNamespace, q: int = 1) -> SimpleNamespace:
        """``out`` with the window wrapper's stream, request by request: each row's last min(keys, W + q) slots,
        where its ``q`` queries are its last keys (decode: the current token, whose keys are seq; verify: the D
        drafts after seq; draft extend: the T slots seq counts), translated into the window pool where there is
        one, with the step's write slots (q per request)."""
        bs = fb.batch_size
        rows = fb.req_pool_indices[:bs].tolist()
        ends = [e + (q if fb.forward_mode.is_target_verify() else 0) for e in fb.seq_lens_cpu[:bs].tolist()]
        keep = [min(e, self.window + q) for e in ends]
        dev = self.req_to_token.device
        idx = torch.cat([self.req_to_token[r, e - k: e].long() for r, e, k in zip(rows, ends, keep, strict=True)]
                        + [torch.zeros(0, dtype=torch.long, device=dev)])
        if self.full_to_swa is not None:
            idx = self.full_to_swa[idx]
            out.swa_out_cache_loc = self.full_to_swa[fb.out_cache_loc[: bs * q].long()]
        host = torch.tensor([0, *itertools.accumulate(keep)], dtype=torch.int32)
        out.window_kv_indptr, out.window_kv_indices, out.window_kv_indptr_host = host.to(dev), idx, host
        return out

    def verify(self, fb) -> SimpleNamespace:
        bs, D = fb.batch_size, self.D
        kv_lens = fb.seq_lens[:bs] + D
        kv_indptr = torch.nn.functional.pad(torch.cumsum(kv_lens, 0, dtype=torch.int32), (1, 0))
        total = int(fb.seq_lens_cpu[:bs].sum()) + D * bs
        kv_indices = gather_kv_indices(self.req_to_token, fb.req_pool_indices[:bs], kv_lens, kv_indptr, total)
        host = torch.nn.functional.pad(torch.cumsum(fb.seq_lens_cpu[:bs] + D, 0, dtype=torch.int32), (1, 0))
        out = SimpleNamespace(
            qo_indptr=torch.arange(0, (bs + 1) * D, D, dtype=torch.int32, device=kv_lens.device),
            kv_indptr=kv_indptr, kv_indices=kv_indices,
            mask_indptr=torch.nn.functional.pad(torch.cumsum(kv_lens * D, 0, dtype=torch.int32), (1, 0)),
            kv_last_page_len=self.kv_last_page_len[:bs], kv_indptr_host=host)
        if self.window and getattr(fb, "custom_mask", None) is not None:
            return self.tree_window_of(fb, out)
        return self.window_of(fb, out, D) if self.window else out

    def tree_window_of(self, fb, out: SimpleNamespace) -> SimpleNamespace:
        """``out`` with a tree verify's window stream (topk > 1), draft query by draft query: the last min(seq, W)
        cached slots, then the slots of the drafts its row of the engine's tree mask shows, in draft order;
        translated into the window pool where there is one."""
        bs, D = fb.batch_size, self.D
        seqs, rows = fb.seq_lens_cpu[:bs].tolist(), fb.req_pool_indices[:bs].tolist()
        mask, at, parts, lens = fb.custom_mask.cpu(), 0, [], []
        for r, s in zip(rows, seqs, strict=True):
            tree = mask[at: at + D * (s + D)].view(D, s + D)[:, s:]
            at += D * (s + D)
            for j in range(D):
                shown = [s + c for c in range(D) if tree[j, c]]
                parts.append(self.req_to_token[r, [*range(s - min(s, self.window), s), *shown]].long())
                lens.append(len(parts[-1]))
        idx = torch.cat(parts)
        if self.full_to_swa is not None:
            idx = self.full_to_swa[idx]
            out.swa_out_cache_loc = self.full_to_swa[fb.out_cache_loc[: bs * D].long()]
        dev = self.req_to_token.device
        out.window_kv_indptr = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev)
        out.window_kv_indices = idx
        out.window_qo_indptr = torch.arange(bs * D + 1, dtype=torch.int32, device=dev)
        return out

    def draft_extend(self, fb) -> SimpleNamespace:
        bs = fb.batch_size
        seq = fb.seq_lens[:bs]
        pad = torch.nn.functional.pad
        kv_indptr = pad(torch.cumsum(seq, 0, dtype=torch.int32), (1, 0))
        total = int(fb.seq_lens_cpu[:bs].sum())
        qo = torch.arange(0, (bs + 1) * self.D, self.D, dtype=torch.int32)  # V2: T slots per request
        out = SimpleNamespace(
            qo_indptr=qo.to(seq.device), qo_indptr_host=qo,
            kv_indptr=kv_indptr,
            kv_indices=gather_kv_indices(self.req_to_token, fb.req_pool_indices[:bs], seq, kv_indptr, total),
            kv_last_page_len=self.kv_last_page_len[:bs],
            kv_indptr_host=pad(torch.cumsum(fb.seq_lens_cpu[:bs], 0, dtype=torch.int32), (1, 0)))
        return self.window_of(fb, out, self.D) if self.window else out

    def extend(self, fb) -> SimpleNamespace:
        bs, pad = fb.batch_size, torch.nn.functional.pad
        prefix = fb.extend_prefix_lens[:bs]
        kv_indptr = pad(torch.cumsum(prefix, 0, dtype=torch.int32), (1, 0))
        total = int(fb.extend_prefix_lens_cpu[:bs].sum())
        return SimpleNamespace(
            qo_indptr=pad(torch.cumsum(fb.extend_seq_lens[:bs], 0, dtype=torch.int32), (1, 0)),
            kv_indptr=kv_indptr,
            kv_indices=gather_kv_indices(self.req_to_token, fb.req_pool_indices[:bs], prefix, kv_indptr, total),
            kv_last_page_len=self.kv_last_page_len[:bs],
            qo_indptr_host=pad(torch.cumsum(fb.extend_seq_lens_cpu[:bs], 0, dtype=torch.int32), (1, 0)),
            kv_indptr_host=pad(torch.cumsum(fb.extend_prefix_lens_cpu[:bs], 0, dtype=torch.int32), (1, 0)))
