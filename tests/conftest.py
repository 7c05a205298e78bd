import os

import torch

os.environ["ATTNMETA_VERIFY"] = "1"  # verify after every pass, in every test
if not torch.cuda.is_available():  # the test process checks the Triton kernels themselves, in the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, max_examples=300)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
