"""A positive control for compute-sanitizer's initcheck: a kernel that reads device memory nobody wrote.

    compute-sanitizer --tool initcheck --check-api-memory-access no python3 tools/initcheck_control.py

must report errors; ``tools/h200_verify.sh``'s initrace stage runs it before the real tests, so a clean
result there means "no kernel read unwritten memory", not "the tool saw nothing"."""

import torch

if __name__ == "__main__":
    x = torch.empty(1 << 16, device="cuda")  # fresh from the allocator: never written
    y = x + 1  # an elementwise kernel reads every element of it
    torch.cuda.synchronize()
    print("read", y.numel(), "unwritten floats")
