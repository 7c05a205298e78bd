"""One diagnostics model for every layer.

Every attnmeta error derives from ``AttnmetaError``. A ``UserError`` is something the user gave
(a spec, options, .ir text, a batch, a pool, the order of calls): it carries ``diagnostics``,
records of (rule, value, origin, message, fix) like check-split's violations, and the command
line prints it as one line, exit code 2. An ``InternalError`` is a bug in attnmeta (a pass
crashed, lowering found no place for a value): the command line says so and names the repro
bundle, exit code 3. Each user error also derives from the built-in class callers would catch
(``ValueError``, ``KeyError``, ``RuntimeError``), so existing ``except`` clauses keep working.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Diagnostic:
    rule: str  # a stable id: a check-split rule, or the kind of error ("batch", "parse", "options" ...)
    value: str  # the IR value, input, field or option concerned ("" when none)
    origin: str  # the spec line, or line:column of .ir text ("" when none)
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = f" ({self.origin})" if self.origin else ""
        fix = f"\n      fix: {self.fix}" if self.fix else ""
        return f"[{self.rule}] %{self.value}{where}: {self.message}{fix}" if self.value else \
            f"[{self.rule}]{where} {self.message}{fix}"


class AttnmetaError(Exception):
    """The base of every attnmeta error."""

    def __str__(self) -> str:  # KeyError quotes its argument; attnmeta messages are meant to be read
        return str(self.args[0]) if self.args else ""


class UserError(AttnmetaError, ValueError):
    """Something the user gave is wrong; ``diagnostics`` say what, where and how to fix it."""

    rule = "user-error"

    def __init__(self, message: str, diagnostics=()):
        super().__init__(message)
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics) or (Diagnostic(self.rule, "", "", message),)


class InternalError(AttnmetaError, RuntimeError):
    """A bug in attnmeta, not in what the user gave. ``repro`` names a bundle that re-runs it."""

    repro: str | None = None


class ShapeError(UserError):
    """An op applied to inputs its shape rule rejects."""

    rule = "shape"


class OptionsError(UserError):
    rule = "options"


class UnknownName(UserError, KeyError):
    """A backend, pass or planner name nothing is registered under."""

    rule = "unknown-name"


class NotCompiled(UserError):
    """A (mode, batch size) a compiled backend was not compiled for: names what it was (the runtime raises it to a
    serving loop as its ``BatchError``)."""

    rule = "not-compiled"


class ContractError(UserError, RuntimeError):
    """The three-method contract called out of order (in_graph before out_graph, replay before capture)."""

    rule = "contract"
