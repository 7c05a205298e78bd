"""Serve a model with SGLang using attnmeta's backends: the same as the installed ``attnmeta-sglang``
command (``attnmeta.integrations.sglang.launch``), kept as a file to run from a checkout.

    python examples/sglang_server.py --model-path <model> --attention-backend attnmeta_triton

Needs a GPU and a model: the CPU tests import this file and check the registration;
``tests/gpu/test_sglang_engine.py`` serves through SGLang's engine on an H200.
"""

from __future__ import annotations

from attnmeta.integrations.sglang.launch import BACKENDS, main

__all__ = ["BACKENDS", "main"]

if __name__ == "__main__":
    main()
