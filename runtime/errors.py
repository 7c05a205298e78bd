"""The runtime's error for a batch it cannot serve (kept apart so the staging and the device guard share it)."""

from __future__ import annotations

from attnmeta.compiler.ir.errors import UserError


class BatchError(UserError):
    """A batch this backend cannot serve as given: names the field, the row, the value and the limit."""

    rule = "batch"
