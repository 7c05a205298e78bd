"""Stand-ins for the pieces of SGLang's import graph that cannot load on the lent H200, installed in
every Python process started with this folder on ``PYTHONPATH`` (SGLang's engine spawns its scheduler
processes, which import this too). Each matches the decision SGLang itself makes on an H200:

- ``sglang.kernels.ops.gemm.cutedsl_dual_gemm``: the CuTe-DSL dual GEMM (Blackwell only; its
  ``nvidia-cutlass-dsl`` is not installed): ``can_use_dual_gemm`` answers no, as on a Hopper GPU;
- ``sglang.srt.layers.attention.flashmla_backend``, where FlashMLA's ``flash_mla`` (SGLang's
  ``sgl-flash-mla`` wheel, ``tools/h200.sh`` installs it from ``.whl``) is not installed: EAGLE's
  draft-extend setup imports its class for an ``isinstance`` list only; building one raises.

And one shim on SGLang's own code, for the FlashInfer this machine has: SGLang 0.5.23 is written for
FlashInfer 0.7, whose prefill ``plan`` takes one argument more (``uniform_q_len``, passed as 0, which is
0.6's behaviour) than 0.6.4's. SGLang's sync-free ``fast_prefill_plan`` (its EAGLE verify and
draft-extend graphs) passes all 20 and 0.6.4 refuses the call; under FlashInfer < 0.7 the shim hands
0.6.4 the first 19. It changes nothing else, and nothing at all under FlashInfer 0.7.

``sgl_kernel`` itself is the package beside this file.
"""

import enum
import importlib.abc
import importlib.machinery
import importlib.util
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


class _PlanOf19:
    """FlashInfer 0.6's cached prefill module as SGLang's 0.7-shaped ``fast_prefill_plan`` calls it."""

    def __init__(self, module):
        self._module = module

    def plan(self, *args):
        return self._module.plan(*args[:19])

    def __getattr__(self, name):
        return getattr(self._module, name)


def _flashinfer_06(m):
    import flashinfer

    if tuple(int(x) for x in flashinfer.__version__.split(".")[:2]) >= (0, 7):
        return
    sglangs = m.fast_prefill_plan

    def fast_prefill_plan(self, *a, **k):
        module, self._cached_module = self._cached_module, _PlanOf19(self._cached_module)
        try:
            return sglangs(self, *a, **k)
        finally:
            self._cached_module = module

    m.fast_prefill_plan = fast_prefill_plan  # its identity checks read the module global, so they agree


AFTER_IMPORT = {"sglang.srt.layers.attention.flashinfer_backend": _flashinfer_06}

STANDINS = {"sglang.kernels.ops.gemm.cutedsl_dual_gemm": _dual_gemm}
if importlib.util.find_spec("flash_mla") is None:  # FlashMLA's wheel (sgl-flash-mla) is not installed
    STANDINS["sglang.srt.layers.attention.flashmla_backend"] = _flashmla


class _Patched(importlib.abc.Loader):
    """The real module's loader, then the shim on what it loaded."""

    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in AFTER_IMPORT:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is not None:
                spec.loader = _Patched(spec.loader, AFTER_IMPORT[fullname])
            return spec
        return importlib.machinery.ModuleSpec(fullname, self) if fullname in STANDINS else None

    def create_module(self, spec):
        return types.ModuleType(spec.name)

    def exec_module(self, module):
        STANDINS[module.__name__](module)


sys.meta_path.insert(0, _Finder())
