"""The verify tree mask packed to bits as FlashInfer's prefill kernel reads it, against NumPy's
packbits per request (little bit order, each request from a byte boundary). The packing runs in the
recorded graph over a fixed number of output bytes (one Triton kernel, here in Triton's
interpreter), a program per request and chunk; nothing past the batch's packed bytes is written."""

import numpy as np
import torch

from attnmeta.backends.flashinfer.planner import pack_mask


def test_pack_mask_equals_numpy_packbits_per_request():
    rng = np.random.default_rng(0)
    # short requests (one chunk of 256 bytes each), then long ones: many chunks, of which the shorter requests of a
    # step leave most empty (each such program leaves early), and a first request with no mask entries
    for case in range(26):
        bs, D = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        seq = rng.integers(1, 70 if case < 20 else 4000, bs)
        q = np.full(bs, D)
        if case == 25:
            q[0] = 0
        qo = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
        kv = np.concatenate([[0], np.cumsum(seq + D)]).astype(np.int32)
        sizes = q * (seq + D)
        mask = rng.random(int(sizes.sum()) + 13) < 0.5  # a buffer longer than the batch's mask
        cap = len(mask) // 8 + bs + 1 + int(rng.integers(0, 9))  # the buffer: room to spare
        out, indptr = torch.full((cap,), 255, dtype=torch.uint8), torch.zeros(bs + 1, dtype=torch.int32)
        pack_mask(torch.from_numpy(mask), torch.from_numpy(qo), torch.from_numpy(kv), out, indptr, int(sizes.max()))
        want, off = [], 0
        for n in sizes:
            want.append(np.packbits(mask[off : off + n], bitorder="little"))
            off += n
        want = np.concatenate(want)
        assert out[: len(want)].numpy().tolist() == want.tolist() and (out[len(want):] == 255).all()  # no more
        assert indptr.tolist() == [0, *np.cumsum(-(-sizes // 8)).tolist()]
