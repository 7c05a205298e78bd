"""argparse as the command line uses it: one-line errors with a "did you mean", defaults shown where help
leaves them out, positive counts, the installed version."""

from __future__ import annotations

import argparse
import difflib
import re
from importlib.metadata import PackageNotFoundError, version


def project_version() -> str:
    try:
        return version("attnmeta")
    except PackageNotFoundError:
        return "unknown (not installed)"


class Defaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default unless its help already says it, or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class OneLine(argparse.ArgumentParser):
    """argparse's errors as one line (not the whole usage), with a "did you mean" for a mistyped
    choice (a backend, mode, pass, log part) or option."""

    def error(self, message: str):
        close = []
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'?([\w.:/-]+)'?", m.group(2))
            close = difflib.get_close_matches(m.group(1), choices, n=1)
        m = re.search(r"unrecognized arguments: (\S+)", message)
        owners: list[str] = []
        if m:
            opts = [o for a in self._actions for o in a.option_strings]
            for sp in (a for a in self._actions if isinstance(a, argparse._SubParsersAction)):
                for name, p in sp.choices.items():
                    theirs = [o for a in p._actions for o in a.option_strings]
                    owners += [name] if m.group(1) in theirs else []
                    opts += theirs
            # another command's option is not a typo of itself: name its command, suggest the nearest other
            close = difflib.get_close_matches(m.group(1), [o for o in opts if o != m.group(1)], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if owners:
            hint = f" ({m.group(1)} is an option of {', '.join(f'{self.prog} {o}' for o in owners)}" + \
                (f"; did you mean {close[0]!r}?)" if close else ")")
        self.exit(2, f"{self.prog}: {message}{hint}; {self.prog} --help for usage\n")


def positive(text: str) -> int:
    """An int of at least 1 (a count of steps, a batch size)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n
