"""Field-by-field comparison of compiled metadata against an eager twin."""

from __future__ import annotations

import torch

from attnmeta.runtime import ForwardBatch, ForwardMode


def padded(fb: ForwardBatch, bs: int, mode: ForwardMode = ForwardMode.DECODE, per: int = 1) -> ForwardBatch:
    """The batch a graph of size ``bs`` computes on: the live rows, then rows of the specs' fill
    values (sequence length 1, pool row 0, KV slot 0). IDLE has no live rows. ``per``: write slots
    (``out_cache_loc`` entries) per request (verify and draft extend write one per draft token)."""
    raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
    dev = fb.seq_lens.device if fb.seq_lens is not None else torch.device("cpu")
    seq, rpi = torch.ones(bs, dtype=torch.int32), torch.zeros(bs, dtype=torch.int64)
    loc = torch.zeros(bs * per, dtype=torch.int64)
    ext = torch.ones(bs, dtype=torch.int32)
    if raw:
        seq[:raw], rpi[:raw] = fb.seq_lens_cpu[:raw], fb.req_pool_indices[:raw].cpu()
        if fb.out_cache_loc is not None:
            loc[: raw * per] = fb.out_cache_loc[: raw * per].cpu()
        if fb.extend_seq_lens_cpu is not None:
            ext[:raw] = fb.extend_seq_lens_cpu[:raw]
    return ForwardBatch(mode, bs, req_pool_indices=rpi.to(dev), seq_lens=seq.to(dev), seq_lens_cpu=seq,
                        seq_lens_sum=int(seq.sum()), out_cache_loc=loc.to(dev), extend_seq_lens=ext.to(dev),
                        extend_seq_lens_cpu=ext)


def compare_metadata(meta, ref, seq_lens_cpu: torch.Tensor, page_size: int = 1) -> list[str]:
    """Fields of the twin's metadata that differ from the compiled one, bit-exact on what is
    defined: ragged indices up to the indptr's end, page-table columns covering each row's
    tokens, ``max_seq_len_k`` as a bound (compiled: static L; eager: this step's host max)."""
    bad = []
    for field, want in vars(ref).items():  # wrapped backends prefix their fields (tbo0_, step2_)
        got = getattr(meta, field)
        if field.endswith("max_seq_len_k"):
            ok = int(got) >= want
        elif isinstance(want, int):
            ok = int(got) == want
        elif field.endswith(("page_table", "block_kv_indices")):  # the pages each row's length covers
            got, want = got.cpu(), want.cpu()
            ok = all(torch.equal(got[i, : -(-s // page_size)], want[i, : -(-s // page_size)])
                     for i, s in enumerate(_key_lens(ref, field, seq_lens_cpu)))
        elif field.endswith("kv_indices"):
            n = int(getattr(ref, field[: -len("kv_indices")] + "kv_indptr")[-1])
            ok = torch.equal(got[:n].cpu(), want[:n].cpu())
        elif want.dim() == 0:
            ok = torch.equal(got.reshape(()).cpu(), want.cpu())
        else:
            ok = torch.equal(got[: want.shape[0]].cpu(), want.cpu())
        if not ok:
            bad.append(field)
    return bad


def _key_lens(ref, field: str, seq_lens_cpu: torch.Tensor) -> list[int]:
    """The key length of each row a page table covers: the twin's own (a verify's prefix and drafts),
    where its metadata has them beside the table, else the batch's lengths."""
    prefix = field[: -len("page_table")] if field.endswith("page_table") else field[: -len("block_kv_indices")]
    for name in ("cache_seqlens_int32", "seq_lens_k"):
        lens = getattr(ref, prefix + name, None)
        if isinstance(lens, torch.Tensor):
            return lens.cpu().tolist()
    return seq_lens_cpu.tolist()
