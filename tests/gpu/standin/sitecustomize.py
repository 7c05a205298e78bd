"""Stand-ins for the pieces of SGLang's import graph that cannot load on the lent H200, installed in
every Python process started with this folder on ``PYTHONPATH`` (SGLang's engine spawns its scheduler
processes, which import this too). Each matches the decision SGLang itself makes on an H200:

- ``sglang.kernels.ops.gemm.cutedsl_dual_gemm``: the CuTe-DSL dual GEMM (Blackwell only; its
  ``nvidia-cutlass-dsl`` is not installed): ``can_use_dual_gemm`` answers no, as on a Hopper GPU;
- ``sglang.srt.layers.attention.flashmla_backend``: FlashMLA's backend (its ``flash_mla`` library is in
  SGLang's kernel package): EAGLE's draft-extend setup imports its class for an ``isinstance`` list
  only; building one raises.

``sgl_kernel`` itself is the package beside this file.
"""

import enum
import importlib.abc
import importlib.machinery
import sys
import types


def _dual_gemm(m):
    class DualGemmQuantMode(enum.IntEnum):
        STATIC_PER_TENSOR, STATIC_PER_TOKEN, DYNAMIC_PER_TENSOR, DYNAMIC_PER_TOKEN, UNQUANT = range(5)

        @property
        def is_quantized(self):
            return self is not DualGemmQuantMode.UNQUANT

    m.DualGemmQuantMode, m.MAX_DUAL_GEMM_DECODE_TOKENS = DualGemmQuantMode, 0
    m.can_use_dual_gemm = lambda *a, **k: False


def _flashmla(m):
    class FlashMLABackend:
        def __init__(self, *a, **k):
            raise RuntimeError("FlashMLA is not installed here (the stand-in flashmla_backend)")

    m.FlashMLABackend = FlashMLABackend


STANDINS = {"sglang.kernels.ops.gemm.cutedsl_dual_gemm": _dual_gemm,
            "sglang.srt.layers.attention.flashmla_backend": _flashmla}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in STANDINS else None

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        STANDINS[module.__name__](module)


sys.meta_path.insert(0, _Finder())
