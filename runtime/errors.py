"""The runtime's errors: ``BatchError``, for a batch a backend cannot serve as given (the staging's checks, the
device record's reports, and a mode or size the backend was not compiled for)."""

from __future__ import annotations

from attnmeta.compiler.ir.errors import UserError


class BatchError(UserError):
    """A batch a backend cannot serve as given: names the field, the row, the value and the limit (or the mode
    or size it was not compiled for)."""

    rule = "batch"


__all__ = ["BatchError"]
