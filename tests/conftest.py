import os

import torch

os.environ["ATTNMETA_VERIFY"] = "1"  # verify after every pass, in every test
if not torch.cuda.is_available():  # the test process checks the Triton kernels themselves, in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tests.interpreter import SANITIZE, lighter_interpreter, sanitize_overflow  # noqa: E402

sanitize_overflow(SANITIZE)
lighter_interpreter()


@pytest.fixture(autouse=True)
def _overflow_checked(request):
    if SANITIZE or request.node.get_closest_marker("overflow_checked") is None:
        yield
        return
    sanitize_overflow(True)
    try:
        yield
    finally:
        sanitize_overflow(False)


@pytest.fixture(autouse=True)
def _free_gpu_memory(request):
    """A GPU test's graphs, pools and backends are released when it ends: a case holds tens of GiB (captured
    graphs keep their private pools), and under compute-sanitizer the next cases ran out of memory."""
    yield
    if torch.cuda.is_available() and request.node.get_closest_marker("cuda") is not None:
        import gc

        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
