"""SGLang's own metadata kernels, loaded from its released wheel, as an independent oracle.

SGLang's package cannot be imported on a CPU machine without a long list of serving
dependencies, but its metadata kernels are self-contained modules (torch, Triton, and
``msgspec`` for one result type): the DSV4 backend's, the Triton backend's split heuristic and
the kv-indices gather its FlashInfer and Triton backends share. This loads exactly those files from the wheel that
``make oracles`` downloads (``pip download --no-deps sglang==0.5.23``), by path, without
running SGLang's package ``__init__``. The one other SGLang import they make,
``sglang.srt.utils.common.async_h2d``, is used only on their CUDA path; while loading, it is
a placeholder that raises if anything calls it. Nothing of SGLang is copied into this
repository: the wheel is read at test time.

Without the wheel the tests that use it skip, except where ``ATTNMETA_REQUIRE_SGLANG=1``
(CI) makes a missing oracle a failure.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
import types
import zipfile

VERSION = "0.5.23"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL_DIR = os.environ.get("ATTNMETA_SGLANG_WHEEL_DIR", os.path.join(ROOT, ".cache", "sglang"))
REQUIRED = os.environ.get("ATTNMETA_REQUIRE_SGLANG") == "1"
DSV4 = "sglang/kernels/ops/attention/dsv4/"


def wheel() -> str | None:
    found = sorted(glob.glob(os.path.join(WHEEL_DIR, f"sglang-{VERSION}-*.whl")))
    return found[-1] if found else None


def _placeholder(name: str) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__path__ = []  # a package, so that submodules resolve under it

    def async_h2d(*a, **k):
        raise RuntimeError("SGLang's async_h2d (CUDA path) is not available in the CPU oracle")

    m.async_h2d = async_h2d
    return m


def load(member: str, name: str):
    """The module ``member`` of SGLang's wheel (a path inside it), loaded by path as ``name``."""
    path = wheel()
    if path is None:
        raise FileNotFoundError(f"no sglang-{VERSION} wheel in {WHEEL_DIR}: run `make oracles`")
    out = os.path.join(WHEEL_DIR, "extracted")
    target = os.path.join(out, member)
    if not os.path.exists(target):
        with zipfile.ZipFile(path) as z:
            z.extract(member, out)
    stubs = ["sglang", "sglang.srt", "sglang.srt.utils", "sglang.srt.utils.common"]
    added = [s for s in stubs if s not in sys.modules]
    for s in added:
        sys.modules[s] = _placeholder(s)
    try:
        spec = importlib.util.spec_from_file_location(name, target)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for s in added:
            del sys.modules[s]
    return module


def dsv4_kernels():
    """(metadata_kernel, attn_metadata_kernels) of SGLang's DSV4 backend."""
    return (load(DSV4 + "metadata_kernel.py", "sglang_oracle_metadata_kernel"),
            load(DSV4 + "attn_metadata_kernels.py", "sglang_oracle_attn_metadata_kernels"))


def attention_kernels():
    """(metadata, kv_indices): SGLang's Triton backend's split heuristic (``get_num_kv_splits_triton``)
    and the FlashInfer/Triton backends' kv-indices gather (``create_flashinfer_kv_indices_triton``)."""
    base = "sglang/kernels/ops/attention/"
    return (load(base + "metadata.py", "sglang_oracle_attention_metadata"),
            load(base + "kv_indices.py", "sglang_oracle_kv_indices"))
