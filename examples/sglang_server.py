"""Serve a model with SGLang using attnmeta's backends: register them, then launch SGLang as usual.

    python examples/sglang_server.py --model-path <model> --attention-backend attnmeta_triton
    python examples/sglang_server.py --model-path <model> --attention-backend attnmeta_flashinfer \\
        --speculative-algorithm EAGLE --speculative-draft-model-path <draft>

``register()`` runs at import, so SGLang's worker processes (started with ``spawn``, which
re-imports this file) see the backends too. Each worker compiles its backends at startup from what
SGLang resolved (about a second), or loads ``ATTNMETA_ARTIFACT`` and checks it against the server.
Needs a GPU and a model: the CPU tests import this file and check the registration;
``tests/gpu/test_sglang_engine.py`` serves through SGLang's engine on an H200.
"""

from __future__ import annotations

import sys

from attnmeta.integrations.sglang import register

BACKENDS = register()  # attnmeta_triton, attnmeta_flashinfer, attnmeta_dsv4, the TRT-LLM and CuTe-DSL kinds


def main(argv=None) -> None:
    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args

    run_server(prepare_server_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
