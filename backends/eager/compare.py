"""Field-by-field comparison of compiled metadata against an eager twin."""

from __future__ import annotations

import torch


def compare_metadata(meta, ref, seq_lens_cpu: torch.Tensor, page_size: int = 1) -> list[str]:
    """Fields of the twin's metadata that differ from the compiled one, bit-exact on what is
    defined: ragged indices up to the indptr's end, page-table columns covering each row's
    tokens, ``max_seq_len_k`` as a bound (compiled: static L; eager: this step's host max)."""
    bad = []
    for field, want in vars(ref).items():
        got = getattr(meta, field)
        if field == "max_seq_len_k":
            ok = int(got) >= want
        elif isinstance(want, int):
            ok = int(got) == want
        elif field == "kv_indices":
            n = int(ref.kv_indptr[-1])
            ok = torch.equal(got[:n].cpu(), want[:n].cpu())
        elif field == "page_table":
            got, want = got.cpu(), want.cpu()
            ok = all(torch.equal(got[i, : -(-s // page_size)], want[i, : -(-s // page_size)])
                     for i, s in enumerate(seq_lens_cpu.tolist()))
        else:
            ok = torch.equal(got[: want.shape[0]].cpu(), want.cpu())
        if not ok:
            bad.append(field)
    return bad
