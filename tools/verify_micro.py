"""FlashInfer target verify on the host, part by part (GPU machine): python tools/verify_micro.py."""

import torch
from timing import median_us

from attnmeta.backends.flashinfer.planner import FlashInferDecodeAdapter, pack_mask
from attnmeta.compiler import CompileOptions, ForwardMode, compile_backend
from attnmeta.runtime import ForwardBatch, ReplayView


def t(fn):
    return median_us(fn, 300, 30)


L, D, dev, V = 4096, 4, torch.device("cuda"), ForwardMode.TARGET_VERIFY
pool = torch.randperm(257 * L).to(torch.int32).view(257, L).to(dev)
pool[0] = 0
cb = compile_backend("flashinfer", CompileOptions(max_bs=256, capture_sizes=(1, 64), max_context_len=L,
                                                  modes=("target_verify",), num_draft_tokens=D))
be = cb.instantiate(pool, device=dev)
ad = FlashInferDecodeAdapter(be, 32, 8, 128, workspace_bytes=1 << 30)
BF = dict(q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)


def parts(bs: int) -> None:
    seq = torch.randint(D, L // 2, (bs,), dtype=torch.int32)
    rpi = torch.randperm(256)[:bs].long() + 1
    fb = ForwardBatch(V, bs, req_pool_indices=rpi.to(dev), req_pool_indices_cpu=rpi, seq_lens=seq.to(dev),
                      seq_lens_cpu=seq, seq_lens_sum=int(seq.sum()))
    be.init_forward_metadata_out_graph(fb, in_capture=True)
    qo = torch.arange(0, (bs + 1) * D, D, dtype=torch.int32)
    kv = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(seq + D, 0, dtype=torch.int32)])
    site = be.bound(V, bs).sites["plan"]
    w = ad.prefill_wrapper(site)
    mask, ones, empty = site.field("custom_mask"), torch.ones(bs, dtype=torch.int32), site.state.empty
    out, ind = w._custom_mask_buf, w._mask_indptr_buf
    rows = {"out_graph (stage + plan)": lambda: be.init_forward_metadata_out_graph(ReplayView.of(fb, bs)),
            "pack_mask (in the graph, issued eagerly)":
                lambda: pack_mask(mask, qo.cuda(), kv.cuda(), out, ind, D * (L + D)),
            "plan() with the packed mask": lambda: w.plan(qo, kv, empty, ones, 32, 8, 128, 1,
                                                          packed_custom_mask=out, causal=False, **BF),
            "plan() causal, no mask": lambda: w.plan(qo, kv, empty, ones, 32, 8, 128, 1, causal=True, **BF)}
    for label, fn in rows.items():
        print(f"bs {bs:3d} {label:40s} {t(fn):8.1f} us")


for size in (1, 64):
    parts(size)
