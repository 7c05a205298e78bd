"""The tools' one timer: the median host µs of ``fn`` after a warm-up, the GPU drained around it."""
import statistics
import time

import torch


def median_us(fn, n: int = 3000, warmup: int = 300) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return round(statistics.median(ts) * 1e6, 2)
