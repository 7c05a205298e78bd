"""The verify tree mask packed to bits as FlashInfer's prefill kernel reads it, against NumPy's
packbits per request (little bit order, each request from a byte boundary)."""

import numpy as np
import torch

from attnmeta.runtime.flashinfer_adapter import pack_mask


def test_pack_mask_equals_numpy_packbits_per_request():
    rng = np.random.default_rng(0)
    for _ in range(20):
        bs, D = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        seq = rng.integers(1, 70, bs)
        qo = np.concatenate([[0], np.cumsum(np.full(bs, D))]).astype(np.int32)
        kv = np.concatenate([[0], np.cumsum(seq + D)]).astype(np.int32)
        sizes = D * (seq + D)
        mask = rng.random(int(sizes.sum()) + 13) < 0.5  # a buffer longer than the batch's mask
        packed, indptr = pack_mask(torch.from_numpy(mask), torch.from_numpy(qo), torch.from_numpy(kv))
        want, off = [], 0
        for n in sizes:
            want.append(np.packbits(mask[off : off + n], bitorder="little"))
            off += n
        assert packed.dtype == torch.uint8 and packed.numpy().tolist() == np.concatenate(want).tolist()
        assert indptr.tolist() == [0, *np.cumsum([len(w) for w in want]).tolist()]
