"""Micro-timings of the pieces of one staging step (GPU host): where do the microseconds go?"""
import statistics
import time

import torch


def t(fn, n=2000):
    for _ in range(200):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return round(statistics.median(ts) * 1e6, 2)


host = torch.zeros(4096, dtype=torch.uint8, pin_memory=True)
dev = torch.zeros(4096, dtype=torch.uint8, device="cuda")
hv, dv = host[:1088], dev[:1088]
ev = torch.cuda.Event()
ev.record()
nph = host.numpy()
src = torch.arange(8, dtype=torch.int32)
view = host[:32].view(torch.int32)
npv = view.numpy()
s = torch.cuda.current_stream()
print("h2d copy_ 1KB", t(lambda: dv.copy_(hv, non_blocking=True)))
print("event record", t(lambda: ev.record()))
print("event record(stream)", t(lambda: ev.record(s)))
print("event synchronize", t(lambda: ev.synchronize()))
print("event query", t(lambda: ev.query()))
print("numpy write 8", t(lambda: npv.__setitem__(slice(0, 8), src.numpy()[:8])))
print("src.numpy()", t(lambda: src.numpy()))
print("torch copy 8", t(lambda: view[:8].copy_(src)))
print("numpy fill", t(lambda: npv.__setitem__(slice(8, None), 1)))
print("getattr+shape", t(lambda: (s.cuda_stream, src.shape[0])))
