"""Field-by-field comparison of compiled metadata against an eager twin (test helper)."""

from __future__ import annotations

import torch

from attnmeta.runtime import ForwardBatch, ForwardMode


def padded(fb: ForwardBatch, bs: int, fills=None) -> ForwardBatch:
    """The batch the graph sees: live rows, then rows of fill values (seq_len 1, pool row 0)."""
    raw = 0 if fb.forward_mode.is_idle() else fb.batch_size
    dev = fb.seq_lens.device if fb.seq_lens is not None else torch.device("cpu")
    seq = torch.ones(bs, dtype=torch.int32)
    rpi = torch.zeros(bs, dtype=torch.int64)
    if raw:
        seq[:raw], rpi[:raw] = fb.seq_lens_cpu[:raw], fb.req_pool_indices[:raw].cpu()
    return ForwardBatch(ForwardMode.DECODE, bs, req_pool_indices=rpi.to(dev), seq_lens=seq.to(dev),
                        seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))


def assert_metadata_equal(meta, ref, seq_lens_cpu: torch.Tensor, page_size: int = 1) -> None:
    """Every field of the twin's metadata against the compiled one, bit-exact on what is defined."""
    for field, want in vars(ref).items():
        got = getattr(meta, field)
        if field == "max_seq_len_k":  # compiled: the static bound L; eager: this step's host max
            assert int(got) >= want
            continue
        if isinstance(want, int):
            assert int(got) == want, field
            continue
        got, want = got.cpu(), want.cpu()
        if field == "kv_indices":
            n = int(ref.kv_indptr[-1])
            assert torch.equal(got[:n], want[:n]), field
        elif field == "page_table":  # defined columns: pages covering each row's tokens
            for i, s in enumerate(seq_lens_cpu.tolist()):
                k = -(-s // page_size)
                assert torch.equal(got[i, :k], want[i, :k]), f"page_table row {i}"
        else:
            assert torch.equal(got[: want.shape[0]], want), field
