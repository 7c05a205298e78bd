"""What SGLang's FlashAttention backend (``fa3``) needs at import and ``__init__`` that a CPU lacks, stood
in for the integration tests: SGLang's kernel package ``sgl_kernel`` (the torch stand-in of
``tests/gpu/standin``, whose FlashAttention-3 schedule is "none": the kernel plans itself) and a Hopper's
compute capability (SGLang's registry and the backend ask for 8.x or 9.x). No attention kernel runs here:
only the metadata code, SGLang's and attnmeta's."""

from __future__ import annotations

import importlib.util
import os
import sys

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu", "standin", "sgl_kernel", "__init__.py")


def _sgl_kernel():
    """The stand-in package, loaded once; its finder (any ``sgl_kernel.<sub>`` import) is taken back out of
    ``sys.meta_path`` so that only the modules set here are visible, for the duration of a test."""
    if "mod" not in _sgl_kernel.__dict__:
        before = list(sys.meta_path)
        spec = importlib.util.spec_from_file_location("sgl_kernel", STANDIN, submodule_search_locations=[])
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sgl_kernel"] = mod
        try:
            spec.loader.exec_module(mod)
        finally:
            del sys.modules["sgl_kernel"]
            finder = [f for f in sys.meta_path if f not in before]
            sys.meta_path[:] = before
        _sgl_kernel.mod, _sgl_kernel.finder = mod, finder[0]
    return _sgl_kernel.mod, _sgl_kernel.finder


def into_sglang(monkeypatch) -> None:
    mod, finder = _sgl_kernel()
    monkeypatch.setitem(sys.modules, "sgl_kernel", mod)
    for sub in ("sgl_kernel.flash_attn",):
        monkeypatch.setitem(sys.modules, sub, finder.create_module(finder.find_spec(sub)))
    import sglang.srt.layers.attention.attention_registry as registry
    import sglang.srt.layers.attention.flashattention_backend as fa

    hopper = lambda *a, **k: (9, 0)  # noqa: E731
    monkeypatch.setattr(registry, "get_device_capability", hopper)
    monkeypatch.setattr(fa, "get_device_capability", hopper)
