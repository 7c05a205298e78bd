"""The runtime's error for a batch it cannot serve: the compiler's ``BatchError`` (the compiled artifact's
mode/size guard raises it too), named here where the staging and the device guard import it."""

from __future__ import annotations

from attnmeta.compiler.ir.errors import BatchError

__all__ = ["BatchError"]
