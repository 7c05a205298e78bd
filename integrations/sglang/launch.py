"""``attnmeta-sglang``: SGLang's server with attnmeta's backends registered (installed as a command).

    attnmeta-sglang --model-path <model> --attention-backend attnmeta_triton
    attnmeta-sglang --model-path <model> --attention-backend attnmeta_flashinfer \\
        --speculative-algorithm EAGLE --speculative-draft-model-path <draft>

Every argument is SGLang's (``python -m sglang.launch_server``'s). ``register()`` runs at import, so
SGLang's worker processes (started with ``spawn``, which re-imports the entry module) see the backends
too. Each worker compiles its backends at startup from what SGLang resolved (about a second), or loads
``ATTNMETA_ARTIFACT`` and checks it against the server.
"""

from __future__ import annotations

import importlib.util
import sys

from . import register

# attnmeta_triton, attnmeta_flashinfer, attnmeta_dsv4, the TRT-LLM and CuTe-DSL kinds; none where SGLang is missing
# (main() then says what to install)
BACKENDS = register() if importlib.util.find_spec("sglang") is not None else []

INSTALL = ("attnmeta-sglang runs SGLang's server, and SGLang is not installed in this environment "
           f"({sys.executable}): install it beside attnmeta (from a clone: pip install -e '.[sglang]'; "
           "docs/SGLANG.md), or run this command from the environment that has it")


def main(argv=None) -> None:
    if importlib.util.find_spec("sglang") is None:
        print(f"attnmeta-sglang: {INSTALL}", file=sys.stderr)
        raise SystemExit(2)
    from sglang.launch_server import run_server
    from sglang.srt.server_args import prepare_server_args

    run_server(prepare_server_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
