"""Eager twin of backends/dsv4/spec.py: the raw->full upgrade written as plain
torch on the batch, the way the engine's eager path computes it."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from attnmeta.backends.dsv4.compress import ring_size  # the rings' sizes: a configuration table, not a formula
from attnmeta.runtime.metadata import ratio_prefix

PAGE, SWA, ALIGN = 256, 128, 64

SWA_FIELDS = ("positions", "seq_lens_casual", "raw_out_loc", "swa_topk_lengths", "swa_page_indices",
              "swa_out_cache_loc", "page_table")


def pad_to_64(x: torch.Tensor) -> torch.Tensor:
    """The sparse kernels read index tables whose width is a multiple of 64; the rest is -1."""
    return torch.nn.functional.pad(x, (0, -x.shape[1] % ALIGN), value=-1)


class EagerDSV4Decode:
    def __init__(self, req_to_token: torch.Tensor, max_bs: int, full_to_swa: torch.Tensor | None = None,
                 draft_tokens: int = 4, index_topk: int = 512, speculative: bool = False, sm_count: int = 132,
                 ratios: tuple[int, ...] = (4, 128)):
        self.req_to_token, self.D, self.topk, self.sm_count = req_to_token, draft_tokens, index_topk, sm_count
        self.ratios = ratios  # the pool's compression ratios: no field of another ratio is built
        self.rings = {r: ring_size(r, speculative) for r in ratios}
        slots = int(req_to_token.max()) + 1
        self.full_to_swa = full_to_swa if full_to_swa is not None else swa_table(slots, req_to_token.device)

    def init_forward_metadata(self, fb) -> SimpleNamespace:
        bs = fb.batch_size
        seq, rpi = fb.seq_lens[:bs].int(), fb.req_pool_indices[:bs].long()
        j = torch.arange(self.D, device=seq.device, dtype=torch.int32)
        if fb.forward_mode.is_target_verify():  # D query tokens after the prefix, as the engine expands them
            seq, rpi = (seq[:, None] + 1 + j).reshape(-1), rpi.repeat_interleave(self.D)
        elif fb.forward_mode.is_draft_extend():  # V2: the last T = D positions, ending at seq - 1
            seq, rpi = (seq[:, None] - self.D + 1 + j).reshape(-1), rpi.repeat_interleave(self.D)
        loc = fb.out_cache_loc[: seq.shape[0]] if fb.out_cache_loc is not None else torch.zeros_like(seq).long()
        m = self.upgrade(seq, rpi, loc)
        if fb.forward_mode.is_draft_extend():  # SWA only, no compression
            return SimpleNamespace(**{k: getattr(m, k) for k in SWA_FIELDS})
        if 4 in self.ratios:
            m.c4_indexer_schedule = self.indexer_schedule(m.c4_topk_lengths_raw)
        for r, ring in self.rings.items():
            if fb.forward_mode.is_target_verify():
                c, w = self.verify_plan(seq - 1, rpi, r, ring)
                setattr(m, ratio_prefix(r) + "plan_c", c)
                setattr(m, ratio_prefix(r) + "plan_w", w)
            else:
                setattr(m, ratio_prefix(r) + "plan_d", self.decode_plan(seq, rpi, r, ring))
        return m

    def indexer_schedule(self, lens):
        """Where each SM's share of the indexer's 256-key blocks starts: (row, block offset)."""
        ends = torch.cumsum((lens.long().clamp(min=0) + 255) // 256, 0)
        total, sm = int(ends[-1]) if len(ends) else 0, self.sm_count
        i = torch.arange(sm + 1)
        start = i * (total // sm) + (i - (sm - total % sm)).clamp(min=0)
        q = torch.searchsorted(ends.cpu(), start, right=True)
        before = torch.cat([torch.zeros(1, dtype=torch.long), ends.cpu()])[q]
        return torch.stack([q, torch.where(start < total, start - before, 0)], 1).int().to(lens.device)

    def ring_loc(self, pos, rid, r: int, ring: int):
        """Where position ``pos`` of pool row ``rid`` keeps its compressor state."""
        if r == 128:
            return rid * ring + pos % ring
        s = self.full_to_swa[self.req_to_token[rid, pos].long()].long()
        return s // 256 * ring + s % ring

    def decode_plan(self, seq, rpi, r: int, ring: int):
        p1 = seq.long() - 1
        write = self.ring_loc(p1, rpi, r, ring)
        read0 = self.ring_loc((p1 - r).clamp(min=0), rpi, r, ring) // r
        return torch.stack([seq.long(), write, read0, write // r], 1).int()

    def verify_plan(self, pos, rpi, r: int, ring: int):
        """The compress entries (tokens completing a block) and write entries (tokens the ring keeps)
        of D query tokens per request at positions ``pos``, in token order, then invalid entries."""
        pos, n = pos.long(), pos.shape[0]
        j = torch.arange(n, device=pos.device) % self.D
        window = 2 * r if r == 4 else r
        buf = window - (j + 1).clamp(max=window)
        end = pos - j + self.D
        pad = ring - window + 2 if ring > window else 0
        keep_w = pos >= torch.minimum(end // r * r - (r if r == 4 else 0), end - pad)
        if r == 4:
            keep_w |= pos % 256 >= 256 - r
        read = torch.stack([self.ring_loc((pos - r).clamp(min=0), rpi, r, ring) // r,
                            self.ring_loc(pos, rpi, r, ring) // r], 1)
        own = torch.stack([torch.full_like(pos, -1), torch.arange(n, device=pos.device) // self.D], 1)
        c = torch.cat([(pos + 1)[:, None], (torch.arange(n, device=pos.device) + (buf << 16))[:, None],
                       torch.where((buf > 0)[:, None], read, own)], 1)
        w = torch.stack([torch.arange(n, device=pos.device), self.ring_loc(pos, rpi, r, ring)], 1)
        c = c[(pos + 1) % r == 0]
        w = w[keep_w]
        c_out = torch.tensor([-1, 0, -1, -1], device=pos.device).repeat(n, 1)
        w_out = torch.full((n, 2), -1, device=pos.device, dtype=torch.long)
        c_out[: c.shape[0]], w_out[: w.shape[0]] = c, w
        return c_out.int(), w_out.int()

    def upgrade(self, seq, rpi, loc) -> SimpleNamespace:
        tokens, L = seq.shape[0], self.req_to_token.shape[1]
        rows = self.req_to_token[rpi]  # [tokens, L]
        pos = seq - 1
        off = pos[:, None] - torch.arange(SWA, device=seq.device)
        tok = torch.where(off >= 0, rows.gather(1, off.clamp(min=0).long()), -1)
        swa = torch.where(tok >= 0, self.full_to_swa[tok.clamp(min=0).long()], -1)
        n_pages = -(-L // PAGE)
        page_table = rows[:, ::PAGE][:, :n_pages] // PAGE
        page_table = torch.where(torch.arange(n_pages, device=seq.device) * PAGE < seq[:, None], page_table, 0)
        m = SimpleNamespace(positions=pos, seq_lens_casual=seq, raw_out_loc=loc,
                            swa_topk_lengths=seq.clamp(max=SWA), swa_page_indices=pad_to_64(swa.int()),
                            swa_out_cache_loc=self.full_to_swa[loc.long()], page_table=page_table.int())
        for r in self.ratios:
            setattr(m, ratio_prefix(r) + "topk_lengths_clamp1", (seq // r).clamp(min=1))
            setattr(m, ratio_prefix(r) + "out_loc", torch.where(seq % r == 0, loc // r, 0))
        if 128 in self.ratios:
            j = torch.arange(2 * n_pages, device=seq.device)
            slots = page_table[:, j // 2] * 2 + j % 2
            m.c128_page_indices = pad_to_64(torch.where(j < (seq // 128)[:, None], slots, -1).int())
        if 4 in self.ratios:
            m.c4_topk_lengths_raw = seq // 4
            m.c4_sparse_topk_lengths = m.c4_topk_lengths_clamp1.clamp(max=self.topk)
            m.c4_sparse_page_indices = torch.full((tokens, self.topk), -1, dtype=torch.int32, device=seq.device)
        return m


def swa_table(slots: int, device) -> torch.Tensor:
    """A full->SWA slot translation for tests and the demo: a fixed permutation."""
    g = torch.Generator().manual_seed(7)
    return torch.randperm(slots, generator=g).to(torch.int32).to(device)
