"""Logging: standard ``logging``, one named logger per part, switched on in the spirit of TORCH_LOGS.

    ATTNMETA_LOGS=compile,runtime      INFO from those parts (to stderr)
    ATTNMETA_LOGS=+runtime             + for DEBUG (every plan bound)
    ATTNMETA_LOGS=all                  every part

Parts: ``compile`` (what compiled, sizes compiled on demand), ``runtime`` (plans bound, eager
fallbacks, refused batches; the serving-time loggers of the rooms above it are its children, named for
their room: ``attnmeta.runtime.backends`` for the planners, ``.integrations`` for the engine adapters,
``.sim`` for the demo engine). A step logs nothing: staging is on the hot path. Without the variable
attnmeta configures nothing: an application's own logging setup decides, as for any library.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys

from .ir.errors import OptionsError

PARTS = ("compile", "runtime")


def configure(spec: str | None = None, strict: bool = True) -> list[str]:
    """Apply an ATTNMETA_LOGS value (``spec``, else the variable); returns the loggers switched on. An
    unknown part is an ``OptionsError``, or with ``strict=False`` (at import: a typo in a variable must
    not break ``import attnmeta``) one line on stderr, and the part is skipped."""
    spec = os.environ.get("ATTNMETA_LOGS", "") if spec is None else spec
    on = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        debug = item.startswith("+")
        name = item.lstrip("+")
        for part in PARTS if name == "all" else (name,):
            if part not in PARTS:
                close = difflib.get_close_matches(name, [*PARTS, "all"], n=1)
                msg = (f"ATTNMETA_LOGS: unknown part {name!r}{f' (did you mean {close[0]!r}?)' if close else ''}; "
                       f"parts: {', '.join(PARTS)}, all")
                if strict:
                    raise OptionsError(msg)
                print(f"attnmeta: {msg}; ignored", file=sys.stderr)
                continue
            logging.getLogger(f"attnmeta.{part}").setLevel(logging.DEBUG if debug else logging.INFO)
            on.append(f"attnmeta.{part}")
    root = logging.getLogger("attnmeta")
    if on and not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        root.addHandler(handler)
        root.propagate = False
    return on
