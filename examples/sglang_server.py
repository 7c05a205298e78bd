"""Serve a model with SGLang using attnmeta's backends: register them, then launch SGLang as usual.

    attnmeta compile triton --max-bs 160 --max-context-len 8192 --out triton.attnmeta   # optional
    ATTNMETA_ARTIFACT=triton.attnmeta python examples/sglang_server.py \\
        --model-path <model> --attention-backend attnmeta_triton

``register()`` runs at import, so SGLang's worker processes (started with ``spawn``, which
re-imports this file) see the backends too. Without ``ATTNMETA_ARTIFACT`` each worker compiles the
backend from the server's arguments at startup (about a second). Needs a GPU and a model: the
test suite imports this file and checks the registration, it does not start a server.
"""

from __future__ import annotations

import sys

from attnmeta.integrations.sglang import register

BACKENDS = register()  # attnmeta_triton, attnmeta_flashinfer, attnmeta_flashattention, attnmeta_dsv4


def main(argv=None) -> None:
    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args

    run_server(prepare_server_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
